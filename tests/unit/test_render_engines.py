"""Rendering facts per engine and KV connector: command lines, environment, ports, probes, drain, labels."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from pydantic import ValidationError

from disagg.api.common import describe_validation_error
from disagg.api.deployment import DisaggregatedDeployment
from disagg.render import (
    build_pdb,
    build_prefill_deployment,
    build_role_service,
    build_router_deployment,
    build_router_rbac,
    build_router_service,
    effective_replicas,
    render_children,
    stale_decision,
)
from disagg.render.settings import DEFAULT_SETTINGS

CONTRACT_LABEL_KEYS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/part-of",
    "disagg.dev/role",
    "disagg.dev/deployment",
}


def make(engine_type: str = "vllm", connector: str = "nixl", **spec: Any) -> DisaggregatedDeployment:
    doc: dict[str, Any] = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {
            "model": {
                "name": "meta-llama/Llama-3.1-8B-Instruct",
                "servedName": "llama",
                "source": {
                    "huggingFace": {
                        "id": "meta-llama/Llama-3.1-8B-Instruct",
                        "tokenSecretRef": {"name": "hf"},
                    }
                },
            },
            "engine": {"type": engine_type},
            "kvTransfer": {"connector": connector},
            "prefill": {"replicas": 2, "tensorParallelSize": 2},
            "decode": {"replicas": 3, "tensorParallelSize": 4},
        },
    }
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return DisaggregatedDeployment.model_validate(doc)


def children_by_kind_name(dd: DisaggregatedDeployment) -> dict[tuple[str, str], dict[str, Any]]:
    return {(c["kind"], c["metadata"]["name"]): c for c in render_children(dd)}


def engine(deployment: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def kv_config(dd: DisaggregatedDeployment, role: str) -> dict[str, Any]:
    deployment = children_by_kind_name(dd)[("Deployment", f"llm-{role}")]
    parsed: dict[str, Any] = json.loads(flag(engine(deployment)["args"], "--kv-transfer-config"))
    return parsed


# ------------------------------------------------------------------------------------------------ vLLM


def test_vllm_nixl_kv_transfer_config() -> None:
    dd = make("vllm", "nixl", kvTransfer={"loadFailurePolicy": "fail"})
    prefill, decode = kv_config(dd, "prefill"), kv_config(dd, "decode")
    assert prefill["kv_connector"] == decode["kv_connector"] == "NixlConnector"
    assert (prefill["kv_role"], decode["kv_role"]) == ("kv_producer", "kv_consumer")
    assert prefill["kv_load_failure_policy"] == decode["kv_load_failure_policy"] == "fail"


def test_vllm_command_line() -> None:
    dd = make(
        "vllm", "nixl", model={"maxModelLen": 8192, "dtype": "bfloat16"}, engine={"args": ["--seed", "1"]}
    )
    container = engine(children_by_kind_name(dd)[("Deployment", "llm-decode")])
    args = container["args"]
    assert container["command"] == ["vllm"] and args[:2] == ["serve", "meta-llama/Llama-3.1-8B-Instruct"]
    assert flag(args, "--port") == "8000" and flag(args, "--host") == "0.0.0.0"
    assert flag(args, "--served-model-name") == "llama"
    assert flag(args, "--tensor-parallel-size") == "4"
    assert flag(args, "--max-model-len") == "8192" and flag(args, "--dtype") == "bfloat16"
    assert args[-2:] == ["--seed", "1"]  # user args last, so they win
    assert env(container)["HF_TOKEN"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert container["image"] == DEFAULT_SETTINGS.vllm_image


def test_vllm_nixl_side_channel_uses_pod_ip_and_exposes_port() -> None:
    dd = make("vllm", "nixl", kvTransfer={"sideChannelPort": 5700, "rdmaDevice": "mlx5_0:1"})
    for role in ("prefill", "decode"):
        container = engine(children_by_kind_name(dd)[("Deployment", f"llm-{role}")])
        values = env(container)
        assert values["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        assert values["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5700"
        assert values["UCX_NET_DEVICES"] == "mlx5_0:1"
        assert ports(container)["nixl"] == 5700


def test_vllm_pods_carry_no_bootstrap_annotation() -> None:
    children = children_by_kind_name(make("vllm", "nixl"))
    for role in ("prefill", "decode"):
        annotations = children[("Deployment", f"llm-{role}")]["spec"]["template"]["metadata"]["annotations"]
        assert not {"vllm.ai/bootstrap-port", "sglang.ai/bootstrap-port"} & set(annotations)


def test_vllm_extra_config_is_merged() -> None:
    dd = make("vllm", "nixl", kvTransfer={"extraConfig": {"kv_lease_duration": 60}})
    assert kv_config(dd, "prefill")["kv_connector_extra_config"] == {"kv_lease_duration": 60}


def test_graceful_drain_fits_in_the_grace_period() -> None:
    dd = make("vllm", "nixl", decode={"shutdownTimeoutSeconds": 300, "preStopSleepSeconds": 10})
    deployment = children_by_kind_name(dd)[("Deployment", "llm-decode")]
    pod = deployment["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert flag(container["args"], "--shutdown-timeout") == "300"
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pod["terminationGracePeriodSeconds"] >= 10 + 300


# ---------------------------------------------------------------------------------------------- SGLang


@pytest.mark.parametrize("connector", ["mooncake", "nixl"])
def test_sglang_command_line(connector: str) -> None:
    dd = make("sglang", connector, kvTransfer={"rdmaDevice": "mlx5_0"}, model={"maxModelLen": 4096})
    children = children_by_kind_name(dd)
    for role, tp in (("prefill", "2"), ("decode", "4")):
        container = engine(children[("Deployment", f"llm-{role}")])
        args = container["args"]
        assert container["command"] == ["python3"] and args[:2] == ["-m", "sglang.launch_server"]
        assert flag(args, "--model-path") == "meta-llama/Llama-3.1-8B-Instruct"
        assert (flag(args, "--host"), flag(args, "--port"), flag(args, "--tp-size")) == (
            "0.0.0.0",
            "30000",
            tp,
        )
        assert flag(args, "--disaggregation-mode") == role
        assert flag(args, "--disaggregation-transfer-backend") == connector
        assert flag(args, "--disaggregation-bootstrap-port") == "8998"
        assert flag(args, "--disaggregation-ib-device") == "mlx5_0"
        assert flag(args, "--context-length") == "4096"
        assert "--enable-metrics" in args
        assert ports(container)["http"] == 30000
    prefill_annotations = children[("Deployment", "llm-prefill")]["spec"]["template"]["metadata"][
        "annotations"
    ]
    decode_annotations = children[("Deployment", "llm-decode")]["spec"]["template"]["metadata"]["annotations"]
    assert prefill_annotations["sglang.ai/bootstrap-port"] == "8998"
    assert "sglang.ai/bootstrap-port" not in decode_annotations
    assert decode_annotations["prometheus.io/port"] == "30000"


def test_sglang_pvc_model_is_mounted_read_only() -> None:
    dd = DisaggregatedDeployment.model_validate(
        {
            "metadata": {"name": "llm"},
            "spec": {
                "model": {"name": "m", "source": {"pvc": {"claimName": "weights", "path": "llama/8b"}}},
                "engine": {"type": "sglang"},
                "kvTransfer": {"connector": "nixl"},
            },
        }
    )
    deployment = build_prefill_deployment(dd)
    pod = deployment["spec"]["template"]["spec"]
    assert flag(pod["containers"][0]["args"], "--model-path") == "/models/llama/8b"
    volume = next(v for v in pod["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}


# -------------------------------------------------------------------------------------------- routers


def test_sglang_router_pd_mode_with_kubernetes_discovery() -> None:
    dd = make("sglang", "mooncake", router={"args": ["--policy", "cache_aware"]})
    router = build_router_deployment(dd)
    container = router["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    assert command[:4] == ["python3", "-m", "sglang_router.launch_router", "--pd-disaggregation"]
    assert "--service-discovery" in command
    assert flag(command, "--service-discovery-namespace") == "$(POD_NAMESPACE)"
    assert flag(command, "--service-discovery-port") == "30000"
    i = command.index("--prefill-selector")
    assert command[i + 1 : i + 3] == ["disagg.dev/deployment=llm", "disagg.dev/role=prefill"]
    i = command.index("--decode-selector")
    assert command[i + 1 : i + 3] == ["disagg.dev/deployment=llm", "disagg.dev/role=decode"]
    assert command[-2:] == ["--policy", "cache_aware"]
    assert container["image"] == DEFAULT_SETTINGS.sglang_router_image == "lmsysorg/sglang-router:v0.3.2"
    assert "--kv-connector" not in command
    assert env(container)["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}


def test_vllm_router_default_and_override() -> None:
    command = build_router_deployment(make("vllm", "nixl"))["spec"]["template"]["spec"]["containers"][0]
    assert command["image"] == DEFAULT_SETTINGS.vllm_router_image == "vllm/vllm-router:v0.1.17"
    assert command["command"][:4] == ["vllm-router", "--vllm-pd-disaggregation", "--kv-connector", "nixl"]
    assert flag(command["command"], "--service-discovery-port") == "8000"
    custom = make(
        "vllm", "nixl", router={"image": "example.com/router:1", "port": 9000, "serviceType": "NodePort"}
    )
    container = build_router_deployment(custom)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "example.com/router:1" and flag(container["command"], "--port") == "9000"
    service = build_router_service(custom)
    assert service["spec"]["type"] == "NodePort"
    assert {"name": "http", "port": 9000, "targetPort": "http", "protocol": "TCP"} in service["spec"]["ports"]


def test_router_rbac_lets_its_service_account_watch_pods() -> None:
    dd = make()
    account, role, binding = build_router_rbac(dd)
    pod = build_router_deployment(dd)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "llm-router"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "llm-router", "namespace": "serving"}]


# ------------------------------------------------------------------------------------------ pod basics


@pytest.mark.parametrize("engine_type", ["vllm", "sglang"])
def test_pod_basics(engine_type: str) -> None:
    dd = make(
        engine_type,
        "nixl",
        prefill={"startupTimeoutSeconds": 3600, "nodeSelector": {"disagg.dev/gpu-type": "h100"}},
    )
    deployment = build_prefill_deployment(dd)
    template = deployment["spec"]["template"]
    pod, container = template["spec"], template["spec"]["containers"][0]
    startup = container["startupProbe"]
    assert startup["httpGet"]["path"] == "/health"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600
    readiness = "/health" if engine_type == "vllm" else "/ready"
    assert container["readinessProbe"]["httpGet"] == {"path": readiness, "port": "http"}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["timeoutSeconds"] >= 5, probe
    assert container["ports"][0]["name"] == "http"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert (
        container["resources"]["limits"]["nvidia.com/gpu"]
        == container["resources"]["requests"]["nvidia.com/gpu"]
        == "2"
    )
    assert pod["nodeSelector"] == {"disagg.dev/gpu-type": "h100"}
    annotations = template["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/path"] == "/metrics"
    assert deployment["spec"]["replicas"] == 2


def test_every_child_carries_the_contract_labels_and_no_owner_references() -> None:
    for child in render_children(make("sglang", "mooncake")):
        labels = child["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "llm" and labels["disagg.dev/deployment"] == "llm"
        assert "ownerReferences" not in child["metadata"]
        assert child["metadata"]["namespace"] == "serving"
        assert set(labels) >= CONTRACT_LABEL_KEYS, child["metadata"]["name"]
        if child["kind"] == "Deployment":
            pod_labels = child["spec"]["template"]["metadata"]["labels"]
            assert set(pod_labels) >= CONTRACT_LABEL_KEYS
            assert pod_labels["app.kubernetes.io/component"] == pod_labels["disagg.dev/role"]


def test_children_names_follow_the_contract() -> None:
    names = set(children_by_kind_name(make()))
    for role in ("prefill", "decode", "router"):
        assert ("Deployment", f"llm-{role}") in names and ("Service", f"llm-{role}") in names
    assert {("Service", "llm-prefill-headless"), ("Service", "llm-decode-headless")} <= names
    assert {("PodDisruptionBudget", "llm-prefill"), ("PodDisruptionBudget", "llm-decode")} <= names


def test_pdb_and_services_select_the_pool_pods() -> None:
    dd = make(prefill={"maxUnavailable": 2})
    pod_labels = build_prefill_deployment(dd)["spec"]["template"]["metadata"]["labels"]
    pdb = build_pdb(dd, "prefill")
    assert pdb["spec"]["maxUnavailable"] == 2
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    for headless in (False, True):
        service = build_role_service(dd, "prefill", headless=headless)
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert (service["spec"].get("clusterIP") == "None") is headless


def test_user_env_overrides_ours_without_duplicates() -> None:
    dd = make(
        "vllm",
        "nixl",
        kvTransfer={"connector": "nixl", "rdmaDevice": "mlx5_0"},
        decode={"env": [{"name": "UCX_NET_DEVICES", "value": "mlx5_1:1"}]},
    )
    container = engine(children_by_kind_name(dd)[("Deployment", "llm-decode")])
    names = [e["name"] for e in container["env"]]
    assert len(names) == len(set(names))
    assert env(container)["UCX_NET_DEVICES"] == "mlx5_1:1"


def test_env_the_operator_owns_is_refused_naming_the_field() -> None:
    # the side channel port is spec.kvTransfer.sideChannelPort (the pod declares that port); HF_TOKEN
    # would replace the Secret reference with plain text
    with pytest.raises(ValidationError) as raised:
        make("vllm", "nixl", decode={"env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "6000"}]})
    assert describe_validation_error(raised.value) == [
        "spec.decode.env: [0] VLLM_NIXL_SIDE_CHANNEL_PORT is set by the operator from "
        "spec.kvTransfer.sideChannelPort"
    ]
    with pytest.raises(ValidationError) as raised:
        make(
            engine={
                "type": "vllm",
                "env": [{"name": "X", "value": "1"}, {"name": "HF_TOKEN", "value": "hf_x"}],
            }
        )
    assert describe_validation_error(raised.value) == [
        "spec.engine.env: [1] HF_TOKEN is set by the operator from "
        "spec.model.source.huggingFace.tokenSecretRef (a Secret reference, never plain text)"
    ]


def test_pod_template_override_merges_containers_by_name_and_keeps_selector_labels() -> None:
    override = {
        "metadata": {"labels": {"team": "ml", "disagg.dev/role": "hijack"}},
        "spec": {
            "priorityClassName": "inference",
            "containers": [
                {"name": "engine", "securityContext": {"privileged": True}},
                {"name": "sidecar", "image": "busybox"},
            ],
        },
    }
    dd = make(prefill={"podTemplate": override})
    template = build_prefill_deployment(dd)["spec"]["template"]
    containers = {c["name"]: c for c in template["spec"]["containers"]}
    assert containers["engine"]["securityContext"] == {"privileged": True}
    assert containers["engine"]["args"][0] == "serve"  # merged, not replaced
    assert containers["sidecar"]["image"] == "busybox"
    assert template["spec"]["priorityClassName"] == "inference"
    assert template["metadata"]["labels"]["team"] == "ml"
    assert template["metadata"]["labels"]["disagg.dev/role"] == "prefill"


# ---------------------------------------------------------------------------------- effective replicas


def with_status(
    dd: DisaggregatedDeployment, autoscaling: dict[str, Any], status: dict[str, Any] | None
) -> DisaggregatedDeployment:
    doc = copy.deepcopy(dd.to_api())
    doc["spec"]["autoscaling"] = autoscaling
    if status is not None:
        doc["status"] = {"autoscaling": status}
    return DisaggregatedDeployment.model_validate(doc)


BOUNDS = {"prefill": {"minReplicas": 1, "maxReplicas": 4}, "decode": {"minReplicas": 2, "maxReplicas": 5}}


@pytest.mark.parametrize(
    ("enabled", "status", "expected"),
    [
        (
            False,
            {"mode": "active", "desiredReplicas": {"prefill": 3, "decode": 4}},
            {"prefill": 2, "decode": 3},
        ),
        (
            True,
            {"mode": "active", "desiredReplicas": {"prefill": 3, "decode": 4}},
            {"prefill": 3, "decode": 4},
        ),
        (
            True,
            {"mode": "active", "desiredReplicas": {"prefill": 9, "decode": 0}},
            {"prefill": 4, "decode": 2},
        ),
        (
            True,
            {"mode": "advisory", "desiredReplicas": {"prefill": 3, "decode": 4}},
            {"prefill": 2, "decode": 3},
        ),
        (True, {"mode": "active"}, {"prefill": 2, "decode": 3}),
        (True, None, {"prefill": 2, "decode": 3}),
    ],
)
def test_effective_replicas(enabled: bool, status: dict[str, Any] | None, expected: dict[str, int]) -> None:
    autoscaling = {"enabled": enabled, "policyRef": {"name": "p"}, **BOUNDS}
    dd = with_status(make(), autoscaling, status)
    assert effective_replicas(dd) == expected
    deployments = {
        c["metadata"]["name"]: c
        for c in render_children(dd, effective_replicas(dd))
        if c["kind"] == "Deployment"
    }
    assert deployments["llm-prefill"]["spec"]["replicas"] == expected["prefill"]
    assert deployments["llm-decode"]["spec"]["replicas"] == expected["decode"]


def test_the_policy_is_the_one_clamp_and_a_stale_decision_is_named() -> None:
    """A decision made within the spec's bounds is applied as decided; one decided before the bounds
    narrowed is held within them (never written beyond the user's bounds) and named, for the reconciler's
    StaleScalingDecision Event."""
    auto = {"enabled": True, "policyRef": {"name": "p"}, **BOUNDS}
    fresh = with_status(make(), auto, {"mode": "active", "desiredReplicas": {"prefill": 4, "decode": 2}})
    assert effective_replicas(fresh) == {"prefill": 4, "decode": 2}
    assert stale_decision(fresh) is None
    stale = with_status(make(), auto, {"mode": "active", "desiredReplicas": {"prefill": 6, "decode": 2}})
    assert effective_replicas(stale) == {"prefill": 4, "decode": 2}
    message = stale_decision(stale)
    assert message is not None
    assert "prefill 6 outside minReplicas 1..maxReplicas 4" in message and "decode 2" not in message
    advisory = with_status(make(), auto, {"mode": "advisory", "desiredReplicas": {"prefill": 6, "decode": 2}})
    assert stale_decision(advisory) is None


def test_render_settings_ports_are_the_ones_the_api_reserves() -> None:
    from disagg.api.deployment import ENGINE_POD_PORTS, ROUTER_POD_PORTS

    s = DEFAULT_SETTINGS
    assert {s.vllm_port, s.sglang_port} <= set(ENGINE_POD_PORTS)
    assert {s.router_metrics_port} <= set(ROUTER_POD_PORTS)
