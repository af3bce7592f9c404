"""disagg.twin.decisions: the spans a bound held while the SLO was missed (hand-made runs, exact)."""

from __future__ import annotations

import numpy as np

from disagg.policy.types import Bounds, RoleBounds
from disagg.twin.decisions import DecisionRecord, bound_spans, cause_counts, held_bounds, policy_trace
from disagg.twin.sim import LogHistogram, PoolSpec, SimDeployment, SimResult

BOUNDS = Bounds(RoleBounds(1, 4, 4), RoleBounds(1, 2, 8), max_gpus=32)


def result(good_per_interval: list[bool], per_interval: int = 10, interval: float = 30.0) -> SimResult:
    """``per_interval`` requests arriving in each 30 s interval, all good or all missing the TTFT target."""
    n = len(good_per_interval) * per_interval
    arrival = np.array([i * interval / per_interval for i in range(n)])
    ttft = np.array([0.1 if good_per_interval[i // per_interval] else 5.0 for i in range(n)])
    dep = SimDeployment(model="llama-3.1-70b", prefill=PoolSpec(2, 4), decode=PoolSpec(1, 8))
    return SimResult(
        deployment=dep,
        arrival=arrival,
        prompt=np.full(n, 100.0),
        output=np.full(n, 10.0),
        ttft=ttft,
        e2e=ttft + 1.0,
        itl_mean=np.full(n, 0.01),
        preemptions=np.zeros(n),
        itl_hist=LogHistogram(),
        ttft_hist=LogHistogram(),
        gpu_hours=1.0,
        duration_s=len(good_per_interval) * interval,
        timeline=[],
        replicas=[],
        decisions=[],
    )


def record(t: float, prefill: int, decode: int, cause: str = "Steady") -> DecisionRecord:
    return DecisionRecord(t, prefill, decode, cause, ((cause, "", None),), False, False)


def test_a_pool_at_its_max_while_the_slo_is_missed_is_one_merged_span() -> None:
    # intervals: 0 ok at 2 prefill; 1-3 missed at 4 (max); 4 ok at 4; 5 missed at 3
    res = result([True, False, False, False, True, False])
    records = [
        record(0, 2, 1),
        *(record(30 * k, 4, 1, "TTFTBreach") for k in (1, 2, 3, 4)),
        record(150, 3, 1),
    ]
    (span,) = bound_spans(res, records, BOUNDS, None, 1.0, 0.05, 0.9)
    assert (span.bound, span.start, span.end, span.evaluations) == ("prefill maxReplicas (4)", 30, 120, 3)
    assert (span.requests, span.good, span.attainment) == (30, 0, 0.0)
    assert "from 30 s to 120 s" in span.describe(0.9)
    assert cause_counts(records) == [("TTFTBreach", 4), ("Steady", 2)]


def test_the_gpu_budget_binds_when_no_further_replica_fits() -> None:
    res = result([False, False])
    # 3 x 4 + 2 x 8 = 28 GPUs: another TP4 prefill replica would need 32 > 30
    spans = bound_spans(res, [record(0, 3, 2)], BOUNDS, 30, 1.0, 0.05, 0.9)
    assert [s.bound for s in spans] == ["GPU budget (30)", "decode maxReplicas (2)"]
    assert all((s.start, s.end, s.requests) == (0, 60, 20) for s in spans)
    # with room for one more prefill replica the budget does not bind; a BudgetClamp decision does
    assert bound_spans(res, [record(0, 3, 1)], BOUNDS, 32, 1.0, 0.05, 0.9) == []
    clamped = bound_spans(res, [record(0, 3, 1, "BudgetClamp")], BOUNDS, 32, 1.0, 0.05, 0.9)
    assert [s.bound for s in clamped] == ["GPU budget (32)"]


def test_no_span_when_the_slo_is_met_at_the_bound_or_without_decisions() -> None:
    res = result([True, True])
    assert bound_spans(res, [record(0, 4, 2)], BOUNDS, 24, 1.0, 0.05, 0.9) == []
    assert bound_spans(result([False]), [], BOUNDS, None, 1.0, 0.05, 0.9) == []


def test_every_held_span_met_or_missed_and_the_pending_ceiling() -> None:
    res = result([True, False, True])
    limited = DecisionRecord(
        60,
        3,
        1,
        "Steady",
        (("ScalingLimited", "prefill pods stay Pending; holding at 3", "prefill"),),
        False,
        False,
    )
    records = [record(0, 4, 1), record(30, 4, 1), limited]
    assert held_bounds(limited, BOUNDS, None) == ["prefill Pending ceiling"]
    (missed,) = bound_spans(res, records, BOUNDS, None, 1.0, 0.05, 0.9)
    assert (missed.bound, missed.start, missed.end) == ("prefill maxReplicas (4)", 30, 60)
    held = bound_spans(res, records, BOUNDS, None, 1.0, 0.05, 0.9, missed_only=False)
    assert [(s.bound, s.start, s.end, s.requests, s.good) for s in held] == [
        ("prefill maxReplicas (4)", 0, 60, 20, 10),
        ("prefill Pending ceiling", 60, 90, 10, 10),
    ]
    trace = policy_trace(res, records, BOUNDS, None, 1.0, 0.05, 0.9)
    assert trace.decisions == tuple(records) and trace.held == tuple(held) and trace.missed == (missed,)
