"""bench/tune_policy.py's pure parts: candidates override RatioPolicy fields and policy constants, and the
summary counts the target misses policy_goodput.py's verdicts name."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest

import disagg.policy.model_based as model_based


@pytest.fixture(scope="module")
def tune(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("tune_policy")


def test_overrides_merge_into_nested_fields(tune: ModuleType) -> None:
    base = {"algorithm": "model-based", "modelBased": {"targetUtilization": 0.85, "lookaheadSeconds": 60}}
    merged = tune._merge(base, {"modelBased": {"targetUtilization": 0.9}, "tolerance": 0.05})
    assert merged == {
        "algorithm": "model-based",
        "modelBased": {"targetUtilization": 0.9, "lookaheadSeconds": 60},
        "tolerance": 0.05,
    }
    assert base["modelBased"]["targetUtilization"] == 0.85  # the base is not changed


def test_constants_are_set_by_name_and_unknown_ones_refused(
    tune: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(model_based, "RECURRENCE_S", model_based.RECURRENCE_S)  # restored after
    tune.set_constants("model_based.RECURRENCE_S=900.0; ")
    assert model_based.RECURRENCE_S == 900.0
    with pytest.raises(SystemExit, match="no constant NOPE"):
        tune.set_constants("model_based.NOPE=1")


def test_the_summary_counts_misses_as_the_bench_does(tune: ModuleType) -> None:
    outcomes = [
        # below 90% where static reaches it, above static and the schedule, 3 reversals: 4 misses
        tune.Outcome("a", "cold", 0.85, tune.Verdict(False, 1.2, 1.3, 3)),
        # within every target
        tune.Outcome("a", "warm", 0.95, tune.Verdict(True, 0.9, 1.05, 1)),
        # static never reaches 90%: its attainment is no miss and no worst case
        tune.Outcome("b", "cold", 0.5, tune.Verdict(None, 1.0, 1.0, 0)),
    ]
    line = tune.summary(outcomes)
    assert "worst SLO  85.0%" in line
    assert "/static worst 1.20 mean 1.03" in line
    assert "misses 4 (1 attainment)" in line


def test_where_above_sums_each_pools_excess_by_reason(tune: ModuleType) -> None:
    outcomes = [
        tune.Outcome(
            "a",
            "cold",
            0.95,
            tune.Verdict(True, 1.2, 1.3, 1),
            {"prefill": {"ModelCapacity": 1.0, "Stabilizing": 0.5}, "decode": {}},
        ),
        tune.Outcome(
            "a",
            "warm",
            0.95,
            tune.Verdict(True, 1.1, 1.2, 1),
            {"prefill": {"Stabilizing": 1.0}, "decode": {}},
        ),
    ]
    assert tune.where_above(outcomes) == (
        "GPU-h above the schedule: prefill 2.5 (Stabilizing 1.5, ModelCapacity 1.0); decode 0.0"
    )
