"""The /scale subresource: spec.replicas (what HPA and KEDA write) split into the pools at the ratio.

Checked here without a cluster: the CRD's scale subresource paths, the split (ratio, bounds, GPU budget,
zero), that the reconciler's replicas follow it (with a RatioPolicy's decision as the ratio) and that the
status carries what /scale reads. The real HPA scaling through /scale is tests/e2e/test_hpa_scale.py.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from disagg.api.crd import crd_for, deployment_crd_spec
from disagg.api.deployment import DisaggregatedDeployment, ReplicaBounds
from disagg.controller.status import RoleState, build_status
from disagg.metrics.external import REQUESTS_IN_FLIGHT, adapter_config
from disagg.render import effective_replicas, scale_limit
from disagg.render.names import pools_selector
from disagg.render.scale import split_total

WIDE = {
    "prefill": ReplicaBounds(min_replicas=1, max_replicas=1000),
    "decode": ReplicaBounds(min_replicas=1, max_replicas=1000),
}


def make(
    replicas: int | None = None,
    autoscaling: dict[str, Any] | None = None,
    status: dict[str, Any] | None = None,
) -> DisaggregatedDeployment:
    spec: dict[str, Any] = {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-8B-Instruct"}},
        },
        "engine": {"type": "vllm"},
        "kvTransfer": {"connector": "nixl"},
        "prefill": {"replicas": 1, "tensorParallelSize": 2},
        "decode": {"replicas": 2, "tensorParallelSize": 1},
    }
    if replicas is not None:
        spec["replicas"] = replicas
    if autoscaling is not None:
        spec["autoscaling"] = autoscaling
    doc: dict[str, Any] = {"metadata": {"name": "llm", "namespace": "serving"}, "spec": spec}
    if status is not None:
        doc["status"] = status
    return DisaggregatedDeployment.model_validate(doc)


def test_the_crd_has_a_scale_subresource_on_spec_replicas_with_a_selector() -> None:
    version = crd_for(deployment_crd_spec())["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert schema["spec"]["properties"]["replicas"]["minimum"] == 0
    assert schema["status"]["properties"]["replicas"]["type"] == "integer"
    assert schema["status"]["properties"]["selector"]["type"] == "string"


def test_without_spec_replicas_the_pools_keep_their_own() -> None:
    dd = make()
    assert effective_replicas(dd) == {"prefill": 1, "decode": 2}
    assert scale_limit(dd) is None


def test_spec_replicas_is_split_at_the_spec_ratio() -> None:
    assert effective_replicas(make(replicas=6)) == {"prefill": 2, "decode": 4}
    assert effective_replicas(make(replicas=3)) == {"prefill": 1, "decode": 2}
    assert effective_replicas(make(replicas=9)) == {"prefill": 3, "decode": 6}


def test_an_active_policy_decision_gives_the_ratio_and_spec_replicas_the_total() -> None:
    auto = {
        "enabled": True,
        "policyRef": {"name": "chat"},
        "prefill": {"minReplicas": 1, "maxReplicas": 10},
        "decode": {"minReplicas": 1, "maxReplicas": 10},
    }
    status = {"autoscaling": {"mode": "active", "desiredReplicas": {"prefill": 3, "decode": 1}}}
    dd = make(replicas=8, autoscaling=auto, status=status)
    assert effective_replicas(dd) == {"prefill": 6, "decode": 2}
    # advisory: the decision is not applied, so the spec's 1:2 is the ratio
    advisory = make(replicas=8, autoscaling=auto, status={"autoscaling": {"mode": "advisory"}})
    assert effective_replicas(advisory) == {"prefill": 3, "decode": 5}


def test_bounds_and_the_gpu_budget_hold_the_total_and_say_so() -> None:
    auto = {
        "enabled": True,
        "policyRef": {"name": "chat"},
        "prefill": {"minReplicas": 1, "maxReplicas": 2},
        "decode": {"minReplicas": 1, "maxReplicas": 3},
    }
    dd = make(replicas=20, autoscaling=auto)
    assert effective_replicas(dd) == {"prefill": 2, "decode": 3}
    assert scale_limit(dd) == "spec.replicas 20 lowered to the pools' maxReplicas (5): prefill 2, decode 3"
    # prefill replicas use 2 GPUs, decode 1: 7 GPUs fit prefill 2 + decode 3
    budget = {
        **auto,
        "prefill": {"minReplicas": 1, "maxReplicas": 10},
        "decode": {"minReplicas": 1, "maxReplicas": 10},
        "maxGPUs": 7,
    }
    limited = make(replicas=12, autoscaling=budget)
    replicas = effective_replicas(limited)
    assert 2 * replicas["prefill"] + replicas["decode"] <= 7
    assert replicas == {"prefill": 2, "decode": 3}
    assert "spec.autoscaling.maxGPUs (7)" in str(scale_limit(limited))
    assert effective_replicas(make(replicas=1)) == {"prefill": 1, "decode": 1}
    assert "raised to the pools' minReplicas (2)" in str(scale_limit(make(replicas=1)))


def test_zero_scales_both_pools_to_zero() -> None:
    assert effective_replicas(make(replicas=0)) == {"prefill": 0, "decode": 0}
    assert scale_limit(make(replicas=0)) is None


@given(
    total=st.integers(min_value=2, max_value=400),
    prefill=st.integers(min_value=0, max_value=50),
    decode=st.integers(min_value=0, max_value=50),
)
def test_the_split_sums_to_the_total_and_follows_the_ratio(total: int, prefill: int, decode: int) -> None:
    split = split_total(total, {"prefill": prefill, "decode": decode}, WIDE)
    assert split.limit is None
    assert sum(split.replicas.values()) == total
    assert min(split.replicas.values()) >= 1
    if prefill + decode:
        share = prefill / (prefill + decode)
        # nearest replica, unless the one-replica floor of a pool binds
        assert abs(split.replicas["prefill"] - total * share) <= 0.5 or split.replicas["prefill"] in (
            1,
            total - 1,
        )


@pytest.mark.parametrize("total", [2, 5, 13, 40])
def test_a_larger_total_never_shrinks_a_pool(total: int) -> None:
    ratio = {"prefill": 2, "decode": 7}
    small, large = split_total(total, ratio, WIDE).replicas, split_total(total + 1, ratio, WIDE).replicas
    assert large["prefill"] >= small["prefill"] and large["decode"] >= small["decode"]


def test_status_carries_what_scale_reads() -> None:
    state = RoleState(desired=2, replicas=3, ready=2, updated=2, rolled_out=False)
    roles = {"prefill": state, "decode": RoleState(4, 4, 4, 4, True), "router": RoleState(1, 1, 1, 1, True)}
    now = datetime(2026, 1, 1, tzinfo=UTC)
    status = build_status({}, 1, roles, None, None, now, None, pools_selector("llm"))
    assert status["replicas"] == 7
    assert (
        status["selector"]
        == "app.kubernetes.io/instance=llm,app.kubernetes.io/name=disagg,disagg.dev/role in (prefill,decode)"
    )


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"


def test_the_adapter_config_example_is_what_the_code_generates() -> None:
    shipped = yaml.safe_load((EXAMPLES / "prometheus-adapter-config.yaml").read_text())
    assert shipped == adapter_config()
    rule = shipped["externalRules"][0]
    assert rule["name"]["as"] == REQUESTS_IN_FLIGHT
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "sglang:num_running_reqs"):
        assert name in rule["seriesQuery"] and name in rule["metricsQuery"]


@pytest.mark.parametrize("example", ["hpa.yaml", "keda-scaledobject.yaml"])
def test_the_autoscaler_examples_target_the_deployments_scale_and_its_metric(example: str) -> None:
    docs = [d for d in yaml.safe_load_all((EXAMPLES / example).read_text()) if d]
    scaler = next(d for d in docs if d["kind"] in ("HorizontalPodAutoscaler", "ScaledObject"))
    target = scaler["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("disagg.dev/v1alpha1", "DisaggregatedDeployment")
    for dd_doc in (d for d in docs if d["kind"] == "DisaggregatedDeployment"):
        dd = DisaggregatedDeployment.model_validate(dd_doc)
        assert dd.metadata["name"] == target["name"] and dd.spec.replicas
        assert sum(effective_replicas(dd).values()) == dd.spec.replicas
    if scaler["kind"] == "HorizontalPodAutoscaler":
        metric = scaler["spec"]["metrics"][0]["external"]["metric"]
        assert metric["name"] == REQUESTS_IN_FLIGHT
        assert metric["selector"]["matchLabels"] == {"disagg_deployment": target["name"]}
        assert scaler["spec"]["minReplicas"] >= 2  # one replica of each pool
    else:
        assert scaler["spec"]["minReplicaCount"] >= 2
        assert f'disagg_deployment="{target["name"]}"' in scaler["spec"]["triggers"][0]["metadata"]["query"]
