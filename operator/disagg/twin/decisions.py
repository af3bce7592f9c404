"""What the policy decided during a simulation and when a bound held it back.

:class:`DecisionRecord` is one ``disagg.policy.decide`` call in the loop (targets, primary cause, every
reason). :func:`cause_counts` counts the primary causes; :func:`bound_spans` finds the spans during which
a pool sat at its maxReplicas, or both pools at the GPU budget, while the SLO was missed: the requests
arriving in the span met it less often than the SLO percentile.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from disagg.policy.types import ROLES, Bounds
from disagg.twin.sim import SimResult


@dataclass(frozen=True)
class DecisionRecord:
    time: float
    prefill: int
    decode: int
    cause: str
    reasons: tuple[tuple[str, str, str | None], ...]  # (code, message, role)
    changed: bool
    advisory: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "time": self.time,
            "prefill": self.prefill,
            "decode": self.decode,
            "cause": self.cause,
            "reasons": [{"code": c, "message": m, "role": r} for c, m, r in self.reasons],
            "changed": self.changed,
            "advisory": self.advisory,
        }


@dataclass(frozen=True)
class BoundSpan:
    bound: str  # "prefill maxReplicas (4)", "decode maxReplicas (2)", "GPU budget (32)"
    start: float
    end: float
    evaluations: int
    requests: int
    good: int

    @property
    def attainment(self) -> float:
        return self.good / self.requests if self.requests else math.nan

    def describe(self, percentile: float) -> str:
        minutes = (self.end - self.start) / 60
        return (
            f"{self.bound} bound from {self.start:.0f} s to {self.end:.0f} s ({minutes:.1f} min, "
            f"{self.evaluations} evaluations) while the SLO was missed: {self.attainment:.1%} of the "
            f"{self.requests} requests arriving then met it (target {percentile:.0%})"
        )


def cause_counts(records: Sequence[DecisionRecord]) -> list[tuple[str, int]]:
    """Primary causes, most frequent first."""
    return Counter(r.cause for r in records).most_common()


def bound_spans(
    result: SimResult,
    records: Sequence[DecisionRecord],
    bounds: Bounds,
    budget: int | None,
    ttft_s: float,
    itl_s: float,
    percentile: float,
) -> list[BoundSpan]:
    """Spans (merged consecutive evaluation intervals) where a bound held and the SLO was missed.

    Each decision holds from its time to the next decision (the last one to the end of the run); a bound
    holds when the decision's target is the pool's maxReplicas, or when no further replica of either pool
    fits the GPU budget (or the decision says BudgetClamp)."""
    if not records:
        return []
    good = result.met_slo(ttft_s, itl_s)
    g = {"prefill": bounds.prefill.gpus_per_replica, "decode": bounds.decode.gpus_per_replica}
    ends = [r.time for r in records[1:]] + [max(result.duration_s, records[-1].time)]
    spans: list[BoundSpan] = []
    open_: dict[str, BoundSpan] = {}
    for rec, end in zip(records, ends, strict=True):
        held: list[str] = []
        for role in ROLES:
            target = rec.prefill if role == "prefill" else rec.decode
            top = bounds.role(role).max_replicas
            if target >= top:
                held.append(f"{role} maxReplicas ({top})")
        if budget is not None:
            used = rec.prefill * g["prefill"] + rec.decode * g["decode"]
            if any(c == "BudgetClamp" for c, _, _ in rec.reasons) or used + min(g.values()) > budget:
                held.append(f"GPU budget ({budget})")
        arriving = (result.arrival >= rec.time) & (result.arrival < end)
        n, ok = int(arriving.sum()), int((good & arriving).sum())
        missed = n > 0 and ok / n < percentile
        for name in list(open_):
            if not (missed and name in held):
                spans.append(open_.pop(name))
        if not missed:
            continue
        for name in held:
            prev = open_.get(name)
            open_[name] = (
                BoundSpan(name, rec.time, end, 1, n, ok)
                if prev is None
                else BoundSpan(name, prev.start, end, prev.evaluations + 1, prev.requests + n, prev.good + ok)
            )
    spans.extend(open_.values())
    return sorted(spans, key=lambda s: (s.start, s.bound))
