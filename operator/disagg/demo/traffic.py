"""The demo's traffic: each phase's Poisson requests sent through the released router, and what became of
them (``sent / ok / failed / cut off``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from disagg.demo.scenario import DemoSettings, Phase
from disagg.twin.live.load import LoadReport, LoadRequest, LoadSettings, poisson_requests, run_load


def phase_requests(phase: Phase, seed: int) -> list[LoadRequest]:
    """The phase's Poisson arrivals: those that fall within its duration."""
    count = int(phase.rate_rps * phase.duration_s * 1.5) + 10  # more than the phase can send
    every = poisson_requests(phase.rate_rps, count, phase.prompt_tokens, phase.output_tokens, seed=seed)
    return [r for r in every if r.arrival_s < phase.duration_s]


@dataclass(frozen=True)
class PhaseReport:
    """One phase's traffic: every request that arrived within the phase, and what became of it.

    ``failed`` requests got an error answer (or a broken connection); ``cut_off`` ones were still
    running when the phase's drain ran out (the load generator cancels those without a result).
    """

    phase: str
    sent: int
    load: LoadReport

    @property
    def ok(self) -> int:
        return self.load.ok

    @property
    def failed(self) -> int:
        return self.load.failed

    @property
    def cut_off(self) -> int:
        return self.sent - len(self.load.results)

    def errors(self) -> dict[str, int]:
        """Error text -> count, over the failed requests."""
        counts: dict[str, int] = {}
        for result in self.load.results:
            if not result.ok:
                counts[result.error[:80]] = counts.get(result.error[:80], 0) + 1
        return counts

    def summary(self) -> str:
        ok = self.load.ok
        text = (
            f"{self.phase}: sent {self.sent}, ok {ok}, failed {self.failed}, cut off {self.cut_off} "
            f"(still running when the drain ended) in {self.load.wall_s:.1f} s wall"
        )
        latencies = self.load.summary().split("; ", 1)[-1]  # "TTFT p50 ... (engine seconds)"
        errors = ", ".join(f"{count} x {error}" for error, count in self.errors().items())
        return f"{text}; {latencies}" + (f"; errors: {errors}" if errors else "")


def run_traffic(
    router_url: str, settings: DemoSettings, on_phase: Callable[[str], None] | None = None
) -> list[PhaseReport]:
    """Each phase's Poisson load through the released router, one after the other (blocking).

    A phase sends the requests arriving within its duration, then lets the ones in flight finish
    (at most ``drain_s``) before the next phase starts, so every request it sent is counted.
    """
    reports: list[PhaseReport] = []
    for index, phase in enumerate(settings.phases):
        requests = phase_requests(phase, seed=index)
        load = LoadSettings(
            target=router_url,
            max_requests=max(1, len(requests)),
            max_duration_s=phase.duration_s + settings.drain_s,
            model=settings.served_model,
        )
        if on_phase is not None:
            on_phase(phase.name)
        reports.append(PhaseReport(phase.name, len(requests), asyncio.run(run_load(requests, load))))
    return reports
