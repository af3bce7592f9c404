"""What the demo sees at each moment (a :class:`Sample`) and what a run showed (:class:`Outcome`). Pure."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from disagg.demo.scenario import DemoSettings


@dataclass(frozen=True)
class Sample:
    """What the demo shows at one moment."""

    elapsed_s: float
    phase: str
    prefill: int  # desired replicas of the prefill child Deployment
    decode: int
    prefill_ready: int
    decode_ready: int
    ttft_s: float | None  # user TTFT at the policy percentile, from Prometheus (None: no data)
    itl_s: float | None
    cause: str  # the latest evaluation's cause (status.autoscaling.lastEvaluation), e.g. NoChange
    decisions: int  # decisions (moves) recorded so far
    message: str = ""  # ... and its message


@dataclass(frozen=True)
class Outcome:
    """What the run showed, summarised from the samples (used by the report and the e2e test)."""

    start_prefill: int
    start_decode: int
    peak_prefill: int
    final_prefill: int
    final_decode: int
    breached_after_shift: bool  # TTFT went over the SLO during the documents phase
    recovered: bool  # ... and came back under it later in that phase
    attainment: float | None  # fraction of samples (with data) meeting both SLOs

    @property
    def moved_toward_prefill(self) -> bool:
        return self.peak_prefill > self.start_prefill or (
            self.final_prefill / max(self.final_decode, 1) > self.start_prefill / max(self.start_decode, 1)
        )


def summarise(samples: Sequence[Sample], settings: DemoSettings, shift_phase: str = "documents") -> Outcome:
    """The run's outcome: the ratio's move, whether TTFT breached after the shift and recovered."""
    if not samples:
        raise ValueError("samples: the run produced no samples")
    first, last = samples[0], samples[-1]
    shifted = [s for s in samples if s.phase == shift_phase]
    breach_at = next(
        (i for i, s in enumerate(shifted) if s.ttft_s is not None and s.ttft_s > settings.ttft_slo_s), None
    )
    recovered = breach_at is not None and any(
        s.ttft_s is not None and s.ttft_s <= settings.ttft_slo_s for s in shifted[breach_at + 1 :]
    )
    measured = [(s.ttft_s, s.itl_s) for s in samples if s.ttft_s is not None and s.itl_s is not None]
    good = [1 for ttft, itl in measured if ttft <= settings.ttft_slo_s and itl <= settings.itl_slo_s]
    return Outcome(
        start_prefill=first.prefill,
        start_decode=first.decode,
        peak_prefill=max(s.prefill for s in samples),
        final_prefill=last.prefill,
        final_decode=last.decode,
        breached_after_shift=breach_at is not None,
        recovered=recovered,
        attainment=len(good) / len(measured) if measured else None,
    )
