"""The support registry: engine and connector modules, routers, probes, RDMA and podTemplate merging."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.podtemplate import deep_merge
from disagg.api.support import CONNECTORS, ENGINES, SUPPORT_MATRIX, combination, with_support_matrix
from disagg.render import build_prefill_deployment, build_router_deployment, render_children
from disagg.render.connectors import CONNECTORS as CONNECTOR_MODULES
from disagg.render.engines import ENGINES as ENGINE_MODULES
from disagg.render.routers import ROUTERS
from disagg.render.settings import DEFAULT_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
ACCEPTED = tuple((c.engine, c.connector) for c in SUPPORT_MATRIX if c.accepted)
REFUSED = tuple((c.engine, c.connector) for c in SUPPORT_MATRIX if not c.accepted)


def doc(engine: str = "sglang", connector: str = "mooncake", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "metadata": {"name": "llm", "namespace": "serving"},
        "spec": {
            "model": {"name": "m", "source": {"huggingFace": {"id": "org/m"}}},
            "engine": {"type": engine},
            "kvTransfer": {"connector": connector},
        },
    }
    for key, value in spec.items():
        base["spec"][key] = {**base["spec"].get(key, {}), **value}
    return base


def make(engine: str = "sglang", connector: str = "mooncake", **spec: Any) -> DisaggregatedDeployment:
    return DisaggregatedDeployment.model_validate(doc(engine, connector, **spec))


def pod(dd: DisaggregatedDeployment) -> dict[str, Any]:
    template: dict[str, Any] = build_prefill_deployment(dd)["spec"]["template"]
    return template


# ------------------------------------------------------------------------------------------- registry


def test_every_enum_value_has_a_module_and_every_cell_a_row() -> None:
    assert set(ENGINE_MODULES) == set(ENGINES)
    assert set(CONNECTOR_MODULES) == set(CONNECTORS)
    assert all(ENGINE_MODULES[e].engine == e for e in ENGINES)
    assert all(CONNECTOR_MODULES[c].connector == c for c in CONNECTORS)
    cells = [(c.engine, c.connector) for c in SUPPORT_MATRIX]
    assert sorted(cells) == sorted((e, c) for e in ENGINES for c in CONNECTORS)
    assert all(c.reason and c.source for c in SUPPORT_MATRIX)


def test_the_accepted_combinations_and_their_routers() -> None:
    assert {(e, c): combination(e, c).router for e, c in ACCEPTED} == {
        ("vllm", "nixl"): "vllm-router",
        ("sglang", "mooncake"): "sglang-router",
        ("sglang", "nixl"): "sglang-router",
    }


@pytest.mark.parametrize(("engine", "connector"), ACCEPTED)
def test_every_accepted_combination_renders_with_its_router(engine: str, connector: str) -> None:
    dd = make(engine, connector)
    router = ROUTERS[combination(engine, connector).router or ""]
    container = build_router_deployment(dd)["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == router.image(DEFAULT_SETTINGS)
    assert container["command"][: len(router.command_head)] == list(router.command_head)
    assert render_children(dd)


@pytest.mark.parametrize(("engine", "connector"), REFUSED)
def test_a_refused_combination_is_refused_by_the_api_and_by_the_renderer(engine: str, connector: str) -> None:
    refusal = combination(engine, connector).refusal
    assert refusal.startswith(f"spec.kvTransfer.connector: {connector} with {engine}: ")
    with pytest.raises(ValueError, match=re.escape(refusal)):
        make(engine, connector)
    # Skipping validation must not render something that would not disaggregate.
    valid = make()
    spec = valid.spec.model_copy(
        update={
            "engine": valid.spec.engine.model_copy(update={"type": engine}),
            "kv_transfer": valid.spec.kv_transfer.model_copy(update={"connector": connector}),
        }
    )
    forged = valid.model_copy(update={"spec": spec})
    with pytest.raises(ValueError) as raised:
        render_children(forged)
    assert str(raised.value) == refusal


def test_docs_support_matrix_is_generated_from_the_registry() -> None:
    text = (ROOT / "docs" / "deployment.md").read_text()
    assert with_support_matrix(text) == text, (
        "docs/deployment.md support matrix is stale; run .venv/bin/disagg crds"
    )
    for cell in SUPPORT_MATRIX:
        assert cell.reason in text


# --------------------------------------------------------------------------------------------- probes


def test_sglang_probes_outlast_its_generating_health_check() -> None:
    container = pod(make("sglang", "nixl"))["spec"]["containers"][0]
    # /health runs a one-token generation for up to SGLANG_HEALTH_CHECK_TIMEOUT = 20 s (sglang 0.5.23).
    for probe in ("startupProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
        assert container[probe]["timeoutSeconds"] > 20
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["readinessProbe"]["timeoutSeconds"] >= 1


def test_vllm_probes_use_health_with_explicit_timeouts() -> None:
    container = pod(make("vllm", "nixl"))["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
        assert (
            container[probe]["timeoutSeconds"]
            == getattr(DEFAULT_SETTINGS.vllm_probes, probe.removesuffix("Probe")).timeout_seconds
        )


@pytest.mark.parametrize(("engine", "connector"), ACCEPTED)
def test_router_liveness_does_not_depend_on_engines(engine: str, connector: str) -> None:
    container = build_router_deployment(make(engine, connector))["spec"]["template"]["spec"]["containers"][0]
    assert container["livenessProbe"]["httpGet"]["path"] == "/liveness"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert container["livenessProbe"]["timeoutSeconds"] >= 1


# ------------------------------------------------------------------------------------- bootstrap ports


def test_bootstrap_annotation_is_the_one_the_deployed_router_reads() -> None:
    assert ROUTERS["vllm-router"].bootstrap_annotation == "vllm.ai/bootstrap-port"
    assert ROUTERS["sglang-router"].bootstrap_annotation == "sglang.ai/bootstrap-port"
    dd = make("sglang", "mooncake", kvTransfer={"bootstrapPort": 9100})
    annotations = pod(dd)["metadata"]["annotations"]
    assert annotations["sglang.ai/bootstrap-port"] == "9100"
    assert "vllm.ai/bootstrap-port" not in annotations


# ----------------------------------------------------------------------------------------------- RDMA


def test_rdma_gives_the_engine_the_device_ipc_lock_and_the_network() -> None:
    rdma = {"resourceName": "rdma/hca_shared_devices_a", "count": 2, "networks": "net/ib-sriov"}
    template = pod(make("sglang", "mooncake", kvTransfer={"rdma": rdma, "rdmaDevice": "mlx5_0"}))
    container = template["spec"]["containers"][0]
    assert container["resources"]["requests"]["rdma/hca_shared_devices_a"] == "2"
    assert container["resources"]["limits"]["rdma/hca_shared_devices_a"] == "2"
    assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "net/ib-sriov"
    assert "--disaggregation-ib-device" in container["args"]


def test_rdma_defaults_and_absence() -> None:
    container = pod(make("vllm", "nixl", kvTransfer={"rdma": {}}))["spec"]["containers"][0]
    assert container["resources"]["limits"]["rdma/ib"] == "1"
    plain = pod(make("vllm", "nixl"))
    assert "securityContext" not in plain["spec"]["containers"][0]
    assert "k8s.v1.cni.cncf.io/networks" not in plain["metadata"]["annotations"]
    assert not any(k.startswith("rdma/") for k in plain["spec"]["containers"][0]["resources"]["limits"])


def test_rdma_resource_name_is_validated() -> None:
    with pytest.raises(ValueError, match="resourceName"):
        make(kvTransfer={"rdma": {"resourceName": "not a resource"}})


@pytest.mark.parametrize(("engine", "size"), [("vllm", "16Gi"), ("sglang", "32Gi")])
def test_shared_memory_is_sized_per_engine(engine: str, size: str) -> None:
    connector = "nixl"
    volumes = {v["name"]: v for v in pod(make(engine, connector))["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": size}


# ------------------------------------------------------------------------------------ podTemplate merge


def test_a_pvc_volume_in_pod_template_replaces_the_download_cache() -> None:
    override = {"spec": {"volumes": [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf"}}]}}
    template = pod(make("vllm", "nixl", prefill={"podTemplate": override}))
    volumes = [v for v in template["spec"]["volumes"] if v["name"] == "hf-cache"]
    assert volumes == [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf"}}]
    mounts = template["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"} in mounts
    assert any(v["name"] == "dshm" for v in template["spec"]["volumes"])  # the others stay


def test_pod_template_merges_env_mounts_and_ports_by_their_keys() -> None:
    override = {
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "env": [
                        {"name": "UCX_NET_DEVICES", "value": "mlx5_1:1"},
                        {"name": "NEW", "value": "1"},
                    ],
                    "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm", "readOnly": False}],
                    "ports": [{"containerPort": 8000, "name": "http", "hostPort": 8000}],
                }
            ]
        }
    }
    kv = {"connector": "nixl", "rdmaDevice": "mlx5_0"}
    template = pod(make("vllm", "nixl", kvTransfer=kv, prefill={"podTemplate": override}))
    container = template["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    assert env["UCX_NET_DEVICES"] == {"name": "UCX_NET_DEVICES", "value": "mlx5_1:1"}
    assert env["NEW"]["value"] == "1" and "VLLM_NIXL_SIDE_CHANNEL_PORT" in env
    shm = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert shm == [{"name": "dshm", "mountPath": "/dev/shm", "readOnly": False}]
    http = [p for p in container["ports"] if p["containerPort"] == 8000]
    assert http == [{"name": "http", "containerPort": 8000, "protocol": "TCP", "hostPort": 8000}]


def test_deep_merge_replaces_lists_it_does_not_know() -> None:
    merged = deep_merge({"tolerations": [{"key": "a"}], "args": ["x"]}, {"tolerations": [{"key": "b"}]})
    assert merged == {"tolerations": [{"key": "b"}], "args": ["x"]}
