"""spec.common: the settings both pools inherit, the merge with a pool's own, and that every consumer
(the renderer, the policy's bounds, the twin) reads the same effective pool through spec.role()."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic import ValidationError

from disagg.api.common import describe_validation_error
from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.podtemplate import deep_merge
from disagg.controller.reconcile import validate
from disagg.policy.bounds import gpu_of
from disagg.render import render_children

BASE: dict[str, Any] = {
    "apiVersion": "disagg.dev/v1alpha1",
    "kind": "DisaggregatedDeployment",
    "metadata": {"name": "common-case", "namespace": "ns"},
    "spec": {
        "model": {
            "name": "meta-llama/Llama-3.1-8B-Instruct",
            "source": {"huggingFace": {"id": "meta-llama/Llama-3.1-8B-Instruct"}},
        },
        "engine": {"type": "vllm"},
        "kvTransfer": {"connector": "nixl"},
        "prefill": {"replicas": 1, "tensorParallelSize": 2},
        "decode": {"replicas": 1, "tensorParallelSize": 1},
    },
}
TOLERATION_A = {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}
TOLERATION_B = {"key": "decode-only", "operator": "Exists"}
AFFINITY_COMMON = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
AFFINITY_DECODE = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}


def _dd(common: dict[str, Any] | None = None, **roles: dict[str, Any]) -> DisaggregatedDeployment:
    body = copy.deepcopy(BASE)
    if common is not None:
        body["spec"]["common"] = common
    for role, extra in roles.items():
        body["spec"][role].update(extra)
    return DisaggregatedDeployment.model_validate(body)


def _env(dd: DisaggregatedDeployment, role: str) -> list[dict[str, Any]]:
    return [e.to_api() for e in dd.spec.role(role).env]  # type: ignore[arg-type]


def test_without_common_a_pool_is_its_own_object() -> None:
    dd = _dd()
    assert dd.spec.role("prefill") is dd.spec.prefill and dd.spec.role("decode") is dd.spec.decode


def test_each_field_merges_as_documented() -> None:
    dd = _dd(
        {
            "nodeSelector": {"pool": "gpu", "disagg.dev/gpu-type": "h100"},
            "tolerations": [TOLERATION_A],
            "affinity": AFFINITY_COMMON,
            "env": [{"name": "A", "value": "common"}, {"name": "B", "value": "common"}],
        },
        decode={
            "nodeSelector": {"disagg.dev/gpu-type": "h200"},
            "tolerations": [TOLERATION_B],
            "affinity": AFFINITY_DECODE,
            "env": [{"name": "C", "value": "decode"}, {"name": "A", "value": "decode"}],
        },
    )
    prefill, decode = dd.spec.role("prefill"), dd.spec.role("decode")
    assert prefill.node_selector == {"pool": "gpu", "disagg.dev/gpu-type": "h100"}
    assert decode.node_selector == {"pool": "gpu", "disagg.dev/gpu-type": "h200"}  # the pool's wins
    assert [t.to_api() for t in prefill.tolerations or []] == [TOLERATION_A]
    assert [t.to_api() for t in decode.tolerations or []] == [TOLERATION_A, TOLERATION_B]  # common's first
    assert prefill.affinity == AFFINITY_COMMON and decode.affinity == AFFINITY_DECODE  # replaced whole
    assert _env(dd, "prefill") == [{"name": "A", "value": "common"}, {"name": "B", "value": "common"}]
    # by name, the pool's value in common's position, the pool's new ones after
    assert _env(dd, "decode") == [
        {"name": "A", "value": "decode"},
        {"name": "B", "value": "common"},
        {"name": "C", "value": "decode"},
    ]
    # the fields as written are untouched
    assert [t.to_api() for t in dd.spec.decode.tolerations or []] == [TOLERATION_B]
    assert dd.spec.prefill.node_selector is None


def test_an_empty_affinity_on_a_pool_drops_commons() -> None:
    dd = _dd({"affinity": AFFINITY_COMMON}, decode={"affinity": {}})
    assert dd.spec.role("decode").affinity == {}
    decode_pod = _pod(dd, "decode")
    assert "affinity" not in decode_pod["spec"] and _pod(dd, "prefill")["spec"]["affinity"] == AFFINITY_COMMON


def _pod(dd: DisaggregatedDeployment, role: str) -> dict[str, Any]:
    for manifest in render_children(dd):
        if manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == f"{dd.name}-{role}":
            template: dict[str, Any] = manifest["spec"]["template"]
            return template
    raise AssertionError(f"no {role} Deployment")


def test_common_renders_as_the_same_settings_repeated_in_both_pools() -> None:
    common = {
        "nodeSelector": {"disagg.dev/gpu-type": "h100"},
        "tolerations": [TOLERATION_A],
        "affinity": AFFINITY_COMMON,
        "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
        "podTemplate": {
            "metadata": {"annotations": {"team": "ml"}},
            "spec": {"priorityClassName": "inference", "volumes": [{"name": "scratch", "emptyDir": {}}]},
        },
    }
    repeated = {
        "nodeSelector": common["nodeSelector"],
        "tolerations": common["tolerations"],
        "affinity": common["affinity"],
        "env": common["env"],
        "podTemplate": common["podTemplate"],
    }
    assert render_children(_dd(common)) == render_children(_dd(prefill=repeated, decode=repeated))


def test_pod_templates_merge_common_then_the_pool() -> None:
    common_template = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [
                {
                    "name": "engine",
                    "env": [{"name": "X", "value": "common"}],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
        },
    }
    decode_template = {
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
            "containers": [{"name": "engine", "env": [{"name": "X", "value": "decode"}]}],
        }
    }
    dd = _dd({"podTemplate": common_template}, decode={"podTemplate": decode_template})
    assert dd.spec.role("prefill").pod_template == common_template
    assert dd.spec.role("decode").pod_template == deep_merge(common_template, decode_template)
    pod = _pod(dd, "decode")
    engine = pod["spec"]["containers"][0]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert {"name": "X", "value": "decode"} in engine["env"]
    assert {"name": "scratch", "mountPath": "/scratch"} in engine["volumeMounts"]
    assert {"name": "scratch", "emptyDir": {"medium": "Memory"}} in pod["spec"]["volumes"]
    # the same as merging common's over the rendered pod, then the pool's over that
    plain = _pod(_dd(), "decode")
    assert pod == deep_merge(deep_merge(plain, common_template), decode_template)


def test_common_env_comes_after_the_engine_env_and_before_the_pools() -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["engine"]["env"] = [{"name": "A", "value": "engine"}, {"name": "B", "value": "engine"}]
    body["spec"]["common"] = {"env": [{"name": "A", "value": "common"}]}
    body["spec"]["prefill"]["env"] = [{"name": "B", "value": "prefill"}]
    env = _pod(DisaggregatedDeployment.model_validate(body), "prefill")["spec"]["containers"][0]["env"]
    assert {"name": "A", "value": "common"} in env and {"name": "B", "value": "prefill"} in env
    assert [e["name"] for e in env].count("A") == 1


def test_the_policy_reads_the_gpu_from_commons_node_selector() -> None:
    assert gpu_of(_dd({"nodeSelector": {"disagg.dev/gpu-type": "h200"}}).spec) == "h200"
    dd = _dd({"nodeSelector": {"disagg.dev/gpu-type": "h200"}}, decode={"nodeSelector": {"x": "y"}})
    assert gpu_of(dd.spec) == "h200"


def test_commons_env_is_checked_like_a_pools() -> None:
    with pytest.raises(ValidationError) as raised:
        _dd({"env": [{"name": "HF_TOKEN", "value": "hf_x"}]})
    assert describe_validation_error(raised.value)[0].startswith("spec.common.env: [0] HF_TOKEN")


@pytest.mark.parametrize(
    ("template", "where"),
    [
        ({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "spec.volumes[0]"),
        (
            {"spec": {"containers": [{"name": "engine", "env": [{"name": "HF_TOKEN", "value": "hf_x"}]}]}},
            "spec.containers[0].env[0]",
        ),
    ],
)
def test_a_common_pod_template_taking_the_operators_volumes_or_env_is_degraded(
    template: dict[str, Any], where: str
) -> None:
    body = copy.deepcopy(BASE)
    body["spec"]["common"] = {"podTemplate": template}
    dd, problem = validate(body)
    assert dd is None and problem is not None
    assert problem.reason == "InvalidSpec" and not problem.transient
    assert problem.message.startswith("spec.common.podTemplate: ")
    assert where in problem.message and "operator" in problem.message


@pytest.mark.parametrize(
    ("requests", "limits", "expected"),
    [
        ({"example.com/foo": "1"}, {}, "limits['example.com/foo'] must be set"),
        ({"hugepages-2Mi": "500m", "memory": "1Gi"}, {"hugepages-2Mi": "500m"}, "whole multiple of 2Mi"),
        ({"cpu": "48"}, {"cpu": "1"}, "requests['cpu'] (48) must not exceed limits['cpu'] (1)"),
        ({"foo": "1"}, {}, "requests['foo']: not a container resource"),
        ({"example.com/foo": "0.5"}, {"example.com/foo": "0.5"}, "must be a whole number"),
        ({"cpu": "32", "memory": "256Gi"}, {"memory": "384Gi"}, None),
        ({"nvidia.com/gpu": "4"}, {}, None),  # the operator sets the GPU limit itself
    ],
)
def test_container_resources_the_api_server_would_refuse_are_refused(
    requests: dict[str, str], limits: dict[str, str], expected: str | None
) -> None:
    """The API server's container resource rules (found by tests/integration/test_hostile_input.py: the
    CRD accepted these, and every apply of the pool failed)."""
    from disagg.api.common import resources_problem

    problem = resources_problem(requests, limits)
    assert (problem is None) if expected is None else (problem is not None and expected in problem), problem
