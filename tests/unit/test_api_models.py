"""The DisaggregatedDeployment models: defaults, aliases, and every invalid spec rejected naming its field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from disagg.api.common import Condition, describe_validation_error, set_condition
from disagg.api.deployment import DisaggregatedDeployment, RoleStatus, format_ratio

ROOT = Path(__file__).resolve().parents[2]
TABLE = yaml.safe_load((ROOT / "tests" / "golden" / "invalid_specs.yaml").read_text())


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def minimal() -> dict[str, Any]:
    return copy.deepcopy(TABLE["base"])


def test_minimal_spec_gets_documented_defaults() -> None:
    doc = minimal()
    del doc["spec"]["prefill"], doc["spec"]["decode"]
    dd = DisaggregatedDeployment.model_validate(doc)
    assert (dd.spec.prefill.replicas, dd.spec.prefill.tensor_parallel_size) == (1, 1)
    assert dd.spec.kv_transfer.load_failure_policy == "recompute"
    assert (dd.spec.kv_transfer.bootstrap_port, dd.spec.kv_transfer.side_channel_port) == (8998, 5600)
    assert (dd.spec.router.port, dd.spec.router.service_type, dd.spec.router.replicas) == (
        8000,
        "ClusterIP",
        1,
    )
    assert dd.spec.model.served == "meta-llama/Llama-3.1-8B-Instruct"
    assert dd.spec.autoscaling is None
    assert dd.namespace == "default" and dd.name == "invalid-case"


def test_round_trip_uses_camel_case_and_keeps_max_gpus_spelling() -> None:
    doc = merge_patch(
        minimal(),
        {"spec": {"autoscaling": {"enabled": True, "policyRef": {"name": "p"}, "maxGPUs": 16}}},
    )
    dd = DisaggregatedDeployment.model_validate(doc)
    dumped = dd.to_api()
    assert dumped["spec"]["kvTransfer"]["connector"] == "nixl"
    assert dumped["spec"]["prefill"]["tensorParallelSize"] == 1
    assert dumped["spec"]["autoscaling"]["maxGPUs"] == 16
    assert DisaggregatedDeployment.model_validate(dumped) == dd


def test_whole_object_with_status_from_the_api_server_validates() -> None:
    doc = merge_patch(
        minimal(),
        {
            "metadata": {"namespace": "ns", "uid": "x", "generation": 3, "managedFields": []},
            "spec": {"autoscaling": {"enabled": True, "policyRef": {"name": "p"}}},
            "status": {
                "observedGeneration": 3,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "AllReady",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
                "prefill": {"replicas": 1, "ready": 1, "desired": 1, "display": "1/1"},
                "ratio": "1:1",
                "autoscaling": {
                    "mode": "active",
                    "desiredReplicas": {"prefill": 2, "decode": 1},
                    "decisions": [],
                },
                "kopf": {"progress": {}},
            },
        },
    )
    dd = DisaggregatedDeployment.model_validate(doc)
    assert dd.status is not None and dd.status.autoscaling is not None
    assert dd.status.autoscaling.desired_replicas is not None
    assert dd.status.autoscaling.desired_replicas.prefill == 2
    assert dd.namespace == "ns"


def test_every_example_is_valid() -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert len(examples) >= 3  # one per accepted engine x connector (tests/golden/test_golden.py)
    for path in examples:
        dd = DisaggregatedDeployment.model_validate(yaml.safe_load(path.read_text()))
        assert dd.name, path


@pytest.mark.parametrize("case", TABLE["cases"], ids=lambda c: c["name"])
def test_invalid_spec_is_rejected_naming_the_field(case: dict[str, Any]) -> None:
    doc = merge_patch(minimal(), case["patch"])
    with pytest.raises(ValidationError) as info:
        DisaggregatedDeployment.model_validate(doc)
    text = "\n".join(describe_validation_error(info.value))
    for expected in case["expect"]:
        assert expected in text, f"{case['name']}: {expected!r} not in {text!r}"


def test_unknown_field_is_rejected_by_name() -> None:
    doc = merge_patch(minimal(), {"spec": {"prefill": {"replica": 2}}})
    with pytest.raises(ValidationError) as info:
        DisaggregatedDeployment.model_validate(doc)
    assert "spec.prefill.replica: Extra inputs are not permitted" in describe_validation_error(info.value)


def test_gpu_quantity_equal_to_tp_is_accepted_as_int_or_string() -> None:
    for value in (4, "4"):
        doc = merge_patch(
            minimal(),
            {
                "spec": {
                    "prefill": {"tensorParallelSize": 4, "resources": {"limits": {"nvidia.com/gpu": value}}}
                }
            },
        )
        assert DisaggregatedDeployment.model_validate(doc).spec.prefill.gpus_per_replica == 4


def test_role_status_display_and_ratio() -> None:
    status = RoleStatus.of(desired=3, replicas=3, ready=2)
    assert status.display == "2/3"
    assert format_ratio(2, 3) == "2:3"


def test_set_condition_keeps_transition_time_unless_status_changes() -> None:
    from datetime import UTC, datetime

    t0, t1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC)
    conds: list[Condition] = set_condition([], "Ready", "False", "Starting", "m", 1, t0)
    same = set_condition(conds, "Ready", "False", "StillStarting", "m2", 2, t1)
    flipped = set_condition(same, "Ready", "True", "AllReady", "ok", 2, t1)
    assert same[0].last_transition_time == "2026-01-01T00:00:00Z" and same[0].reason == "StillStarting"
    assert flipped[0].last_transition_time == "2026-01-02T00:00:00Z" and len(flipped) == 1


def test_status_keys_added_by_other_writers_do_not_make_the_object_unreadable() -> None:
    doc = merge_patch(
        minimal(),
        {"status": {"prefill": {"ready": 1, "note": "x"}, "autoscaling": {"mode": "active", "extra": 1}}},
    )
    dd = DisaggregatedDeployment.model_validate(doc)
    assert dd.status is not None and dd.status.prefill is not None and dd.status.prefill.ready == 1


def test_parallelism_sizes_gpus_per_pod_and_per_replica() -> None:
    wide = {"data": 32, "dataParallelAttention": True, "expert": 32, "nodesPerReplica": 4}
    doc = merge_patch(minimal(), {"spec": {"decode": {"parallelism": wide}}})
    decode = DisaggregatedDeployment.model_validate(doc).spec.decode
    assert (decode.tensor_size, decode.data_size, decode.expert_size) == (1, 32, 32)
    # gpusPerNode defaults to the ranks over the nodes; the replica (what the GPU budget counts) is all four
    assert (decode.gpus_per_node, decode.nodes_per_replica, decode.gpus_per_replica) == (8, 4, 32)
    assert decode.multi_node and decode.data_parallel_attention


def test_tensor_parallel_size_stays_the_shorthand_for_parallelism_tensor() -> None:
    plain = DisaggregatedDeployment.model_validate(
        merge_patch(minimal(), {"spec": {"prefill": {"tensorParallelSize": 4}}})
    ).spec.prefill
    assert (plain.tensor_size, plain.gpus_per_node, plain.gpus_per_replica, plain.multi_node) == (
        4,
        4,
        4,
        False,
    )
    assert plain.parallelism is None and plain.expert_size is None
    for prefill in ({"parallelism": {"tensor": 4}}, {"tensorParallelSize": 4, "parallelism": {"tensor": 4}}):
        spec = DisaggregatedDeployment.model_validate(
            merge_patch(minimal(), {"spec": {"prefill": prefill}})
        ).spec
        assert (spec.prefill.tensor_size, spec.prefill.gpus_per_replica) == (4, 4)


def test_explicit_gpus_per_node_counts_the_whole_group() -> None:
    par = {"tensor": 2, "pipeline": 2, "data": 4, "dataParallelAttention": True, "expert": 8}
    doc = merge_patch(
        minimal(), {"spec": {"prefill": {"parallelism": {**par, "nodesPerReplica": 2, "gpusPerNode": 8}}}}
    )
    prefill = DisaggregatedDeployment.model_validate(doc).spec.prefill
    assert (prefill.gpus_per_node, prefill.gpus_per_replica, prefill.pipeline_size) == (8, 16, 2)
