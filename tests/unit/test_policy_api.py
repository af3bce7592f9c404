"""The RatioPolicy model: defaults, camelCase wire format, and errors that name the field."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from disagg.api.ratiopolicy import Algorithm, Mode, RatioPolicy, RatioPolicySpec


def test_defaults_are_a_usable_policy() -> None:
    s = RatioPolicySpec()
    assert s.algorithm is Algorithm.MODEL_BASED and s.mode is Mode.ACTIVE
    assert s.slo.ttft.percentile == 90.0 and s.slo.ttft.target_seconds == 1.0
    assert s.scale_down.stabilization_window_seconds >= s.scale_up.stabilization_window_seconds
    assert 0.0 <= s.tolerance < 1.0


def test_whole_object_round_trips_in_camel_case() -> None:
    obj: dict[str, Any] = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "RatioPolicy",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {
            "slo": {"ttft": {"percentile": 95, "targetSeconds": 0.8}, "itl": {"targetSeconds": 0.04}},
            "algorithm": "fixed-ratio",
            "fixedRatio": {"prefill": 1, "decode": 3},
            "mode": "advisory",
            "scaleDown": {"stabilizationWindowSeconds": 600, "maxStep": {"prefill": 1, "decode": 2}},
            "gpuBudget": {"maxGPUs": 16},
        },
    }
    rp = RatioPolicy.model_validate(obj)
    assert rp.spec.fixed_ratio is not None and rp.spec.fixed_ratio.decode == 3
    assert rp.spec.gpu_budget is not None and rp.spec.gpu_budget.max_gpus == 16
    dumped = rp.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert dumped["spec"]["gpuBudget"] == {"maxGPUs": 16}
    assert dumped["spec"]["scaleDown"]["stabilizationWindowSeconds"] == 600
    assert dumped["spec"]["slo"]["ttft"]["targetSeconds"] == 0.8


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"slo": {"ttft": {"percentile": 100, "targetSeconds": 1}}}, "percentile"),
        ({"slo": {"itl": {"targetSeconds": 0}}}, "targetSeconds"),
        ({"tolerance": 1.0}, "tolerance"),
        ({"algorithm": "pid"}, "algorithm"),
        ({"mode": "dry-run"}, "mode"),
        ({"algorithm": "fixed-ratio"}, "fixedRatio"),
        ({"scaleUp": {"stabilizationWindowSeconds": 900}}, "scaleDown.stabilizationWindowSeconds"),
        ({"evaluationIntervalSeconds": 300, "metricWindowSeconds": 60}, "metricWindowSeconds"),
        ({"gpuBudget": {"maxGPUs": 0}}, "maxGPUs"),
        ({"tolerence": 0.2}, "tolerence"),
    ],
)
def test_bad_input_names_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RatioPolicySpec.model_validate(spec)
    assert field in str(err.value)


def test_schema_carries_cel_rules_and_descriptions() -> None:
    schema = RatioPolicySpec.model_json_schema(by_alias=True)
    rules = [r["rule"] for r in schema["x-kubernetes-validations"]]
    assert any("fixedRatio" in r for r in rules)
    assert any("stabilizationWindowSeconds" in r for r in rules)
    for name, prop in schema["properties"].items():
        assert "description" in prop, name
