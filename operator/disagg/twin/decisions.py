"""What the policy decided during a simulation and when a bound held it back.

:class:`DecisionRecord` is one ``disagg.policy.decide`` call in the loop (targets, primary cause, every
reason). :func:`cause_counts` counts the primary causes; :func:`bound_spans` finds the spans during which
a pool sat at its maxReplicas, or both pools at the GPU budget, or a pool at the ceiling its Pending pods
taught the policy, while the SLO was missed: the requests arriving in the span met it less often than the
SLO percentile (``missed_only=False``: every span a bound held). :class:`PolicyTrace` is what the report
draws of one policy run: every decision and both kinds of span.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from disagg.policy.types import ROLES, Bounds
from disagg.twin.sim import SimDeployment, SimResult


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


def held_bounds(rec: DecisionRecord, bounds: Bounds, budget: int | None) -> list[str]:
    """The bounds one decision ran into: a target at its pool's maxReplicas, no further replica of either
    pool fitting the GPU budget (or the decision says BudgetClamp), a pool held at the ceiling its Pending
    pods set (ScalingLimited)."""
    held: list[str] = []
    for role in ROLES:
        target = rec.prefill if role == "prefill" else rec.decode
        top = bounds.role(role).max_replicas
        if target >= top:
            held.append(f"{role} maxReplicas ({top})")
    if budget is not None:
        g = (bounds.prefill.gpus_per_replica, bounds.decode.gpus_per_replica)
        used = rec.prefill * g[0] + rec.decode * g[1]
        if any(c == "BudgetClamp" for c, _, _ in rec.reasons) or used + min(g) > budget:
            held.append(f"GPU budget ({budget})")
    held += [f"{role} Pending ceiling" for c, _, role in rec.reasons if c == "ScalingLimited" and role]
    return held


def bound_spans(
    result: SimResult,
    records: Sequence[DecisionRecord],
    bounds: Bounds,
    budget: int | None,
    ttft_s: float,
    itl_s: float,
    percentile: float,
    missed_only: bool = True,
) -> list[BoundSpan]:
    """Spans (merged consecutive evaluation intervals) where a bound held (:func:`held_bounds`) and the
    SLO was missed; with ``missed_only=False`` every span a bound held, met or missed.

    Each decision holds from its time to the next decision (the last one to the end of the run)."""
    if not records:
        return []
    good = result.met_slo(ttft_s, itl_s)
    ends = [r.time for r in records[1:]] + [max(result.duration_s, records[-1].time)]
    spans: list[BoundSpan] = []
    open_: dict[str, BoundSpan] = {}
    for rec, end in zip(records, ends, strict=True):
        held = held_bounds(rec, bounds, budget)
        arriving = (result.arrival >= rec.time) & (result.arrival < end)
        n, ok = int(arriving.sum()), int((good & arriving).sum())
        missed = (n > 0 and ok / n < percentile) or not missed_only
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


@dataclass(frozen=True)
class PolicyTrace:
    """What the report draws of one policy run: every decision, every span a bound held (``held``) and
    those spans in which the SLO was missed (``missed``, the warnings)."""

    decisions: tuple[DecisionRecord, ...]
    held: tuple[BoundSpan, ...]
    missed: tuple[BoundSpan, ...]


def policy_trace(
    result: SimResult,
    records: Sequence[DecisionRecord],
    bounds: Bounds,
    budget: int | None,
    ttft_s: float,
    itl_s: float,
    percentile: float,
) -> PolicyTrace:
    def spans(missed_only: bool) -> tuple[BoundSpan, ...]:
        return tuple(bound_spans(result, records, bounds, budget, ttft_s, itl_s, percentile, missed_only))

    return PolicyTrace(tuple(records), spans(False), spans(True))


def policy_run_trace(
    result: SimResult,
    records: Sequence[DecisionRecord],
    dep: SimDeployment,
    spec: Any,
    ttft_s: float,
    itl_s: float,
    percentile: float,
) -> PolicyTrace:
    """:func:`policy_trace` with the bounds a RatioPolicy ``spec`` gives the policy on ``dep`` (its pools'
    maxReplicas and the effective GPU budget), as ``disagg simulate`` runs it."""
    from disagg.policy.engine import effective_budget

    bounds = dep.policy_bounds()
    budget = effective_budget(spec, bounds)
    return policy_trace(result, records, bounds, budget, ttft_s, itl_s, percentile)
