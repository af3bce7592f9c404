"""Engine command lines, environment and ports per engine (vLLM, SGLang) and KV connector. Pure.

vLLM (``vllm serve``; docs.vllm.ai "Disaggregated prefilling", vllm/config/kv_transfer.py):
``--kv-transfer-config`` is a KVTransferConfig JSON with ``kv_connector`` (NixlConnector,
MooncakeConnector, LMCacheConnectorV1, P2pNcclConnector), ``kv_role`` (kv_producer on prefill,
kv_consumer on decode), ``kv_load_failure_policy`` (Literal["recompute", "fail"], set explicitly) and
``kv_connector_extra_config``.

- NIXL: each pod advertises its side channel through ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (the pod IP, from
  the downward API) and ``VLLM_NIXL_SIDE_CHANNEL_PORT`` (default 5600), exposed as a container port
  (vllm/envs.py; NixlConnector docs).
- Mooncake: the prefill pod serves a bootstrap HTTP server on ``VLLM_MOONCAKE_BOOTSTRAP_PORT`` (8998)
  that decode queries (vllm/envs.py; mooncake_connector.py ``get_mooncake_side_channel_port``).
- LMCache: the engine reads ``LMCACHE_CONFIG_FILE``, a YAML with ``enable_pd``, ``pd_role``
  (sender/receiver), ``pd_proxy_host``/``pd_proxy_port`` (sender), ``pd_peer_host``,
  ``pd_peer_init_port``/``pd_peer_alloc_port`` (receiver, one port per TP rank), ``pd_buffer_size``
  and ``pd_buffer_device``; every key can be overridden by ``LMCACHE_<KEY>`` (LMCache configuration
  docs), which is how the decode pod sets its own IP as ``pd_peer_host``.
- P2pNcclConnector: ``kv_port``, ``kv_buffer_size`` and ``kv_connector_extra_config`` with
  ``proxy_ip``/``proxy_port`` (ZMQ registration with the proxy) and ``http_port`` (the serving port)
  (vLLM examples/online_serving/disaggregated_serving_p2p_nccl_xpyd).
- Graceful stop: ``--shutdown-timeout S`` makes vLLM (>= 0.18) drain in-flight requests on SIGTERM.

SGLang (python/sglang/srt/server_args.py; docs.sglang.ai "PD Disaggregation"):
``python3 -m sglang.launch_server --model-path M --host 0.0.0.0 --port 30000 --tp-size N
--disaggregation-mode prefill|decode --disaggregation-transfer-backend mooncake|nixl
--disaggregation-bootstrap-port 8998 [--disaggregation-ib-device DEV] --enable-metrics``; prefill pods
carry the annotation ``sglang.ai/bootstrap-port`` that the SGLang router's Kubernetes service
discovery reads (sgl-router service_discovery.rs ``bootstrap_port_annotation``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.render.names import child_name, connector_configmap_name
from disagg.render.settings import RenderSettings

Obj = dict[str, Any]

VLLM_CONNECTORS = {
    "nixl": "NixlConnector",
    "mooncake": "MooncakeConnector",
    "lmcache": "LMCacheConnectorV1",
    "p2p-nccl": "P2pNcclConnector",
}
KV_ROLES: dict[RoleName, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
LMCACHE_PD_ROLES: dict[RoleName, str] = {"prefill": "sender", "decode": "receiver"}
SGLANG_BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"
LMCACHE_CONFIG_DIR = "/etc/lmcache"
LMCACHE_CONFIG_FILE = "lmcache.yaml"
HF_CACHE_DIR = "/root/.cache/huggingface"  # huggingface_hub's default cache for the root user

_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|K|M|G|T)?$")
_UNITS = {
    None: 1,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def quantity_bytes(value: str) -> int:
    """``"8Gi"`` -> 8589934592 (the subset of Kubernetes quantities spec.kvTransfer.bufferSize allows)."""
    match = _QUANTITY.match(value)
    if match is None:
        raise ValueError(f"spec.kvTransfer.bufferSize: {value!r} is not a quantity like 8Gi")
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class EngineContainer:
    """The engine-specific parts of one pool's pod."""

    command: list[str]
    args: list[str]
    env: list[Obj] = field(default_factory=list)
    ports: list[Obj] = field(default_factory=list)  # container ports, "http" first
    annotations: dict[str, str] = field(default_factory=dict)
    volumes: list[Obj] = field(default_factory=list)
    volume_mounts: list[Obj] = field(default_factory=list)

    @property
    def http_port(self) -> int:
        return int(self.ports[0]["containerPort"])


def _port(name: str, number: int) -> Obj:
    return {"name": name, "containerPort": number, "protocol": "TCP"}


def _pod_ip_env(name: str) -> Obj:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def model_location(dd: DisaggregatedDeployment, settings: RenderSettings) -> str:
    """What the engine loads: the Hugging Face id, or the model directory on the mounted PVC."""
    source = dd.spec.model.source
    if source.hugging_face is not None:
        return source.hugging_face.id
    assert source.pvc is not None  # the model guarantees exactly one source
    path = source.pvc.path.strip("/")
    return f"{settings.model_mount_path}/{path}" if path else settings.model_mount_path


def model_env(dd: DisaggregatedDeployment) -> list[Obj]:
    source = dd.spec.model.source.hugging_face
    if source is None or source.token_secret_ref is None:
        return []
    ref = source.token_secret_ref
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def model_volumes(dd: DisaggregatedDeployment, settings: RenderSettings) -> tuple[list[Obj], list[Obj]]:
    """The PVC holding the weights, or a scratch volume for the Hugging Face download cache (so the
    download is accounted as ephemeral storage of a volume, not of the container's writable layer)."""
    pvc = dd.spec.model.source.pvc
    if pvc is None:
        return [{"name": "hf-cache", "emptyDir": {}}], [{"name": "hf-cache", "mountPath": HF_CACHE_DIR}]
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}}
    mount = {"name": "model", "mountPath": settings.model_mount_path, "readOnly": True}
    return [volume], [mount]


# ------------------------------------------------------------------------------------------------- vLLM


def lmcache_config(dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings) -> Obj:
    """The LMCache PD configuration file of one pool (LMCACHE_CONFIG_FILE)."""
    kv = dd.spec.kv_transfer
    buffer = quantity_bytes(kv.buffer_size) if kv.buffer_size else settings.lmcache_buffer_bytes
    config: Obj = {
        "local_cpu": False,
        "enable_pd": True,
        "transfer_channel": "nixl",
        "pd_role": LMCACHE_PD_ROLES[role],
        "pd_buffer_size": buffer,
        "pd_buffer_device": "cuda",
        "nixl_backends": ["UCX"],
    }
    if role == "prefill":
        config["pd_proxy_host"] = child_name(dd.name, "router")
        config["pd_proxy_port"] = settings.lmcache_proxy_port
    else:
        tp = dd.spec.decode.tensor_parallel_size
        # Overridden per pod by LMCACHE_PD_PEER_HOST (the pod IP); 0.0.0.0 binds every interface.
        config["pd_peer_host"] = "0.0.0.0"
        config["pd_peer_init_port"] = [settings.lmcache_peer_init_port + rank for rank in range(tp)]
        config["pd_peer_alloc_port"] = [settings.lmcache_peer_alloc_port + rank for rank in range(tp)]
    return config


def vllm_kv_transfer_config(dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings) -> Obj:
    """The KVTransferConfig JSON of one pool."""
    kv = dd.spec.kv_transfer
    config: Obj = {
        "kv_connector": VLLM_CONNECTORS[kv.connector],
        "kv_role": KV_ROLES[role],
        "kv_load_failure_policy": kv.load_failure_policy,
    }
    extra: Obj = {}
    if kv.connector == "mooncake" and kv.rdma_device:
        extra["mooncake_protocol"] = "rdma"
    if kv.connector == "lmcache":
        # One LMCache RPC endpoint per engine (vLLM examples/others/lmcache/disagg_prefill_lmcache_v1).
        extra["discard_partial_chunks"] = False
        extra["lmcache_rpc_port"] = "producer1" if role == "prefill" else "consumer1"
    if kv.connector == "p2p-nccl":
        default_buffer = settings.p2p_buffer_bytes if role == "decode" else 10**9
        config["kv_buffer_size"] = float(quantity_bytes(kv.buffer_size) if kv.buffer_size else default_buffer)
        config["kv_port"] = str(settings.p2p_kv_port)
        extra.update(
            {
                "proxy_ip": child_name(dd.name, "router"),
                "proxy_port": str(settings.p2p_proxy_port),
                # The address the instance registers with the proxy; the kubelet expands $(POD_IP).
                "http_ip": "$(POD_IP)",
                "http_port": str(settings.vllm_port),
                "send_type": "PUT_ASYNC",
            }
        )
    extra.update(kv.extra_config or {})
    if extra:
        config["kv_connector_extra_config"] = extra
    return config


def vllm_container(dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings) -> EngineContainer:
    spec = dd.spec
    role_spec = spec.role(role)
    kv = spec.kv_transfer
    args = [
        "serve",
        model_location(dd, settings),
        "--host",
        "0.0.0.0",
        "--port",
        str(settings.vllm_port),
        "--served-model-name",
        spec.model.served,
        "--tensor-parallel-size",
        str(role_spec.tensor_parallel_size),
        "--kv-transfer-config",
        json.dumps(vllm_kv_transfer_config(dd, role, settings), separators=(",", ":"), sort_keys=True),
        "--shutdown-timeout",
        str(role_spec.shutdown_timeout_seconds),
    ]
    args += _vllm_model_args(dd)
    container = EngineContainer(command=["vllm"], args=args, ports=[_port("http", settings.vllm_port)])
    if kv.connector == "nixl":
        container.env += [
            _pod_ip_env("VLLM_NIXL_SIDE_CHANNEL_HOST"),
            {"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": str(kv.side_channel_port)},
        ]
        container.ports.append(_port("nixl", kv.side_channel_port))
        if kv.rdma_device:
            container.env.append({"name": "UCX_NET_DEVICES", "value": kv.rdma_device})
    elif kv.connector == "mooncake":
        if role == "prefill":
            container.env.append({"name": "VLLM_MOONCAKE_BOOTSTRAP_PORT", "value": str(kv.bootstrap_port)})
            container.ports.append(_port("bootstrap", kv.bootstrap_port))
            # vllm-router's Kubernetes discovery is the SGLang router's, which reads the prefill
            # bootstrap port from this annotation.
            container.annotations[SGLANG_BOOTSTRAP_ANNOTATION] = str(kv.bootstrap_port)
    elif kv.connector == "lmcache":
        _add_lmcache(container, dd, role, settings)
    elif kv.connector == "p2p-nccl":
        container.env.append(_pod_ip_env("POD_IP"))
        container.ports.append(_port("p2p-kv", settings.p2p_kv_port))
    return container


def _vllm_model_args(dd: DisaggregatedDeployment) -> list[str]:
    model = dd.spec.model
    args: list[str] = []
    hf = model.source.hugging_face
    if hf is not None and hf.revision:
        args += ["--revision", hf.revision]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    if model.dtype is not None:
        args += ["--dtype", model.dtype]
    if model.quantization is not None:
        args += ["--quantization", model.quantization]
    return args


def _add_lmcache(
    container: EngineContainer, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
) -> None:
    container.env.append(
        {"name": "LMCACHE_CONFIG_FILE", "value": f"{LMCACHE_CONFIG_DIR}/{LMCACHE_CONFIG_FILE}"}
    )
    container.volumes.append(
        {"name": "lmcache-config", "configMap": {"name": connector_configmap_name(dd.name, role, "lmcache")}}
    )
    container.volume_mounts.append(
        {"name": "lmcache-config", "mountPath": LMCACHE_CONFIG_DIR, "readOnly": True}
    )
    if role == "decode":
        container.env.append(_pod_ip_env("LMCACHE_PD_PEER_HOST"))
        for rank in range(dd.spec.decode.tensor_parallel_size):
            container.ports.append(_port(f"lmc-init-{rank}", settings.lmcache_peer_init_port + rank))
            container.ports.append(_port(f"lmc-alloc-{rank}", settings.lmcache_peer_alloc_port + rank))


# ----------------------------------------------------------------------------------------------- SGLang


def sglang_container(
    dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
) -> EngineContainer:
    spec = dd.spec
    role_spec = spec.role(role)
    kv = spec.kv_transfer
    model = spec.model
    args = [
        "-m",
        "sglang.launch_server",
        "--model-path",
        model_location(dd, settings),
        "--served-model-name",
        model.served,
        "--host",
        "0.0.0.0",
        "--port",
        str(settings.sglang_port),
        "--tp-size",
        str(role_spec.tensor_parallel_size),
        "--disaggregation-mode",
        role,
        "--disaggregation-transfer-backend",
        kv.connector,
        "--disaggregation-bootstrap-port",
        str(kv.bootstrap_port),
    ]
    if kv.rdma_device:
        args += ["--disaggregation-ib-device", kv.rdma_device]
    args.append("--enable-metrics")
    hf = model.source.hugging_face
    if hf is not None and hf.revision:
        args += ["--revision", hf.revision]
    if model.max_model_len is not None:
        args += ["--context-length", str(model.max_model_len)]
    if model.dtype is not None:
        args += ["--dtype", model.dtype]
    if model.quantization is not None:
        args += ["--quantization", model.quantization]
    container = EngineContainer(command=["python3"], args=args, ports=[_port("http", settings.sglang_port)])
    if role == "prefill":
        container.ports.append(_port("bootstrap", kv.bootstrap_port))
        container.annotations[SGLANG_BOOTSTRAP_ANNOTATION] = str(kv.bootstrap_port)
    return container


def engine_container(
    dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings
) -> EngineContainer:
    """The engine-specific parts of one pool, user args and env appended last (so they win)."""
    if dd.spec.engine.type == "vllm":
        container = vllm_container(dd, role, settings)
    else:
        container = sglang_container(dd, role, settings)
    container.env = model_env(dd) + container.env
    container.args += list(dd.spec.engine.args) + list(dd.spec.role(role).args)
    volumes, mounts = model_volumes(dd, settings)
    container.volumes += volumes
    container.volume_mounts += mounts
    return container


def engine_image(dd: DisaggregatedDeployment, settings: RenderSettings) -> str:
    if dd.spec.engine.image:
        return dd.spec.engine.image
    return settings.vllm_image if dd.spec.engine.type == "vllm" else settings.sglang_image


def engine_port(dd: DisaggregatedDeployment, settings: RenderSettings) -> int:
    return settings.vllm_port if dd.spec.engine.type == "vllm" else settings.sglang_port
