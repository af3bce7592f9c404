"""What every engine module shares: the container parts it returns, its protocol, and model helpers. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Protocol

from disagg.api.deployment import DisaggregatedDeployment, RoleName
from disagg.api.support import Engine
from disagg.render.lws import Member
from disagg.render.podparts import Obj, pod_ip_env, port
from disagg.render.settings import EngineProbes, RenderSettings

HF_CACHE_DIR = "/root/.cache/huggingface"  # huggingface_hub's default cache for the root user
# huggingface_hub reads HF_HUB_CACHE (default $HF_HOME/hub) as the directory of its cache layout
# (models--ORG--NAME/{blobs,refs,snapshots}) and HF_HUB_OFFLINE=1 to make no HTTP call, serving files
# from that cache only (huggingface_hub 1.31.0 constants.py HF_HUB_CACHE, HF_HUB_OFFLINE). vLLM 0.33.0
# (which requires huggingface_hub>=1.31.0) and SGLang 0.5.23 (through transformers 5.19.0, which requires
# huggingface-hub>=1.31.0) pass local_files_only=huggingface_hub.constants.HF_HUB_OFFLINE to their weight
# downloads (vllm/model_executor/model_loader/weight_utils.py, sglang/srt/model_loader/weight_utils.py).
HF_HUB_CACHE_DIR = f"{HF_CACHE_DIR}/hub"
HF_CACHE_VOLUME = "hf-cache"

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
    bootstrap_port: int | None = None  # the prefill pod's bootstrap port, annotated for the router
    serves_http: bool = True  # False on a LeaderWorkerSet worker: no API server, so no probes or scraping

    @property
    def http_port(self) -> int:
        return int(self.ports[0]["containerPort"])


class EngineModule(Protocol):
    """One inference engine: its image, port, probes, /dev/shm and command line per pool."""

    @property
    def engine(self) -> Engine: ...

    def image(self, settings: RenderSettings) -> str: ...

    def http_port(self, settings: RenderSettings) -> int: ...

    def probes(self, settings: RenderSettings) -> EngineProbes: ...

    def shm_size(self, settings: RenderSettings) -> str: ...

    def container(
        self, dd: DisaggregatedDeployment, role: RoleName, settings: RenderSettings, member: Member = "single"
    ) -> EngineContainer: ...


def model_location(dd: DisaggregatedDeployment, settings: RenderSettings) -> str:
    """What the engine loads: the Hugging Face id, or the model directory on the mounted PVC."""
    source = dd.spec.model.source
    if source.hugging_face is not None:
        return source.hugging_face.id
    assert source.pvc is not None  # the model guarantees exactly one source
    path = source.pvc.path.strip("/")
    return f"{settings.model_mount_path}/{path}" if path else settings.model_mount_path


def hf_token_env(dd: DisaggregatedDeployment) -> list[Obj]:
    """HF_TOKEN from the huggingFace source's tokenSecretRef (huggingface_hub utils/_auth.py reads it)."""
    source = dd.spec.model.source.hugging_face
    if source is None or source.token_secret_ref is None:
        return []
    ref = source.token_secret_ref
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def hf_hub_cache_env() -> Obj:
    return {"name": "HF_HUB_CACHE", "value": HF_HUB_CACHE_DIR}


def model_env(dd: DisaggregatedDeployment) -> list[Obj]:
    """The engine's Hugging Face environment: HF_TOKEN to download; with spec.model.cache, the cache on
    the volume and offline mode instead (no replica downloads, so no token on the engine pods)."""
    if dd.spec.model.cache is None:
        return hf_token_env(dd)
    return [hf_hub_cache_env(), {"name": "HF_HUB_OFFLINE", "value": "1"}]


def model_volumes(dd: DisaggregatedDeployment, settings: RenderSettings) -> tuple[list[Obj], list[Obj]]:
    """The PVC holding the weights; or spec.model.cache's claim, read-only at the Hugging Face cache;
    or a scratch volume for the Hugging Face download cache (so the download is accounted as ephemeral
    storage of a volume, not of the container's writable layer)."""
    pvc = dd.spec.model.source.pvc
    cache = dd.spec.model.cache
    if cache is not None:
        volume = {
            "name": HF_CACHE_VOLUME,
            "persistentVolumeClaim": {"claimName": cache.claim_name, "readOnly": True},
        }
        return [volume], [{"name": HF_CACHE_VOLUME, "mountPath": HF_HUB_CACHE_DIR, "readOnly": True}]
    if pvc is None:
        return [{"name": HF_CACHE_VOLUME, "emptyDir": {}}], [
            {"name": HF_CACHE_VOLUME, "mountPath": HF_CACHE_DIR}
        ]
    volume = {"name": "model", "persistentVolumeClaim": {"claimName": pvc.claim_name, "readOnly": True}}
    mount = {"name": "model", "mountPath": settings.model_mount_path, "readOnly": True}
    return [volume], [mount]


__all__ = [
    "HF_CACHE_DIR",
    "HF_CACHE_VOLUME",
    "HF_HUB_CACHE_DIR",
    "EngineContainer",
    "EngineModule",
    "Obj",
    "hf_hub_cache_env",
    "hf_token_env",
    "model_env",
    "model_location",
    "model_volumes",
    "pod_ip_env",
    "port",
    "quantity_bytes",
]
