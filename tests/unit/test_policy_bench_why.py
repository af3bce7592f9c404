"""bench/policy_goodput.py's miss explanations: GPU-hours above the hindsight schedule are split by the
reason that had the last word on each pool, and a missed attainment names its worst windows."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bench(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("policy_goodput")


def entry(t: float, prefill: int, decode: int, *codes: tuple[str, str]) -> dict[str, Any]:
    return {
        "time": t,
        "current": {"prefill": prefill, "decode": decode},
        "targets": {"prefill": prefill, "decode": decode},
        "reasons": [{"code": c, "role": r, "message": ""} for r, c in codes],
    }


def test_last_word_is_the_last_reason_for_the_pool(bench: ModuleType) -> None:
    e = entry(
        0, 3, 2, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity"), ("prefill", "ReversalBudget")
    )
    assert bench.last_word(e, "prefill") == "ReversalBudget"
    assert bench.last_word(e, "decode") == "ModelCapacity"
    assert bench.last_word(entry(0, 1, 1), "decode") == "no reason"


def test_excess_is_split_by_the_code_that_held_the_pool(bench: ModuleType) -> None:
    # two 300 s windows; the schedule gives 2P:1D then 1P:1D; TP 2
    schedule = [(0.0, 300.0, (2, 1)), (300.0, 300.0, (1, 1))]
    log = [
        entry(0, 2, 1, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity")),
        # from 150 s prefill runs one above the schedule, asked for by the model
        entry(150, 3, 1, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity")),
        # from 300 s the schedule drops to 1P and a hold keeps 3: two above it
        entry(
            300, 3, 1, ("prefill", "ModelCapacity"), ("prefill", "Stabilizing"), ("decode", "ModelCapacity")
        ),
        # from 450 s prefill is back at the schedule's 1
        entry(450, 1, 1, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity")),
    ]
    out = bench.excess_gpu_hours(log, schedule, tp=2, interval_s=150.0)
    above, below, by_code = out["prefill"]
    assert by_code == pytest.approx({"ModelCapacity": 1 * 2 * 150 / 3600, "Stabilizing": 2 * 2 * 150 / 3600})
    assert above == pytest.approx(sum(by_code.values()))
    assert below == 0.0
    assert out["decode"] == (0.0, 0.0, {})


def test_below_the_schedule_is_counted_apart(bench: ModuleType) -> None:
    schedule = [(0.0, 300.0, (4, 2))]
    log = [entry(0, 2, 3, ("prefill", "ModelCapacity"), ("decode", "FlapDamping"))]
    out = bench.excess_gpu_hours(log, schedule, tp=1, interval_s=300.0)
    assert out["prefill"] == (0.0, pytest.approx(2 * 300 / 3600), {})
    assert out["decode"][0] == pytest.approx(300 / 3600)
    assert out["decode"][2] == {"FlapDamping": pytest.approx(300 / 3600)}


def test_times_outside_the_schedule_count_nothing(bench: ModuleType) -> None:
    schedule = [(0.0, 300.0, (1, 1)), (300.0, 300.0, None)]
    log = [entry(300, 5, 5, ("prefill", "ModelCapacity"))]
    assert bench.scheduled(schedule, 299.0) == (1, 1)
    assert bench.scheduled(schedule, 310.0) is None
    assert bench.excess_gpu_hours(log, schedule, tp=2, interval_s=30.0)["prefill"] == (0.0, 0.0, {})


def test_an_attainment_miss_names_the_worst_windows(bench: ModuleType) -> None:
    import numpy as np

    # three windows; the middle one loses 3 of its 4 requests while prefill sits at 1 against the
    # schedule's 3
    arrival = np.array([10.0, 20.0, 310.0, 320.0, 330.0, 340.0, 610.0, 620.0])
    ok = np.array([True, True, True, False, False, False, True, False])
    result = SimpleNamespace(
        arrival=arrival, met_ttft=lambda _slo: ok, met_itl=lambda _slo: np.ones_like(ok, dtype=bool)
    )
    case = SimpleNamespace(ttft_slo_s=2.0, itl_slo_s=0.05)
    setup = SimpleNamespace(tp=2, interval_s=300.0)
    schedule = [(0.0, 300.0, (1, 1)), (300.0, 300.0, (3, 1)), (600.0, 300.0, (1, 1))]
    log = [
        entry(0, 1, 1, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity")),
        entry(
            300,
            1,
            1,
            ("prefill", "ModelCapacity"),
            ("prefill", "ReversalBudget"),
            ("decode", "ModelCapacity"),
        ),
        entry(600, 1, 1, ("prefill", "ModelCapacity"), ("decode", "ModelCapacity")),
    ]
    verdict = bench.Verdict(False, 0.9, 1.0, 1)
    lines = bench.explain_misses("model-based", verdict, log, result, case, setup, schedule)
    assert lines == [
        "  why model-based: 300-600s met 25%: prefill 1 (schedule 3), ReversalBudget; decode 1 (schedule 1), "
        "ModelCapacity",
        "  why model-based: 600-900s met 50%: prefill 1 (schedule 1), ModelCapacity; decode 1 (schedule 1), "
        "ModelCapacity",
    ]
    # no miss, nothing to explain
    assert (
        bench.explain_misses(
            "model-based", bench.Verdict(True, 0.9, 1.0, 1), log, result, case, setup, schedule
        )
        == []
    )


def test_a_reversal_miss_names_the_moves_and_their_reasons(bench: ModuleType) -> None:
    import numpy as np

    # decode: 2 -> 3 (up), 3 -> 2 (a reversal), 2 -> 3 (another), 3 -> 2 (a third), all within an hour
    moves = [(60.0, 3), (600.0, 2), (1200.0, 3), (1800.0, 2)]
    result = SimpleNamespace(
        decisions=[(t, {"decode": n}) for t, n in moves],
        deployment=SimpleNamespace(decode=SimpleNamespace(replicas=2)),
        arrival=np.array([1.0]),
    )
    log = [entry(t, 2, n, ("decode", "ModelCapacity" if n == 3 else "IdleShrink")) for t, n in moves]
    assert bench.busiest_reversals(result) == ("decode", [(600.0, -1), (1200.0, 1), (1800.0, -1)])
    lines = bench.explain_misses(
        "slo-feedback",
        bench.Verdict(None, None, None, 3),
        log,
        result,
        SimpleNamespace(ttft_slo_s=2.0, itl_slo_s=0.05),
        SimpleNamespace(tp=2, interval_s=30.0),
        [],
    )
    assert lines == [
        "  why slo-feedback: decode reversed 3 times within an hour: down at 600s (IdleShrink), "
        "up at 1200s (ModelCapacity), down at 1800s (IdleShrink)"
    ]
