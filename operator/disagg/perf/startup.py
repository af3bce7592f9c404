"""How long a new engine replica takes to serve: weights fetched, loaded, engine initialised. Pure.

    startup = engine_init_s
            + weight_bytes / hub_download_bytes_per_s    (only when the replica downloads from the Hub)
            + weight_bytes / load_bytes_per_s            (from the model cache claim, or the local disk)

A replica without ``spec.model.cache`` downloads the whole model from the Hugging Face Hub into its
emptyDir before the engine can load it (every scale-up of a 70B pool pulls ~140 GB); with the cache (or a
``pvc`` source) it reads the weights from the shared volume and downloads nothing. The ratio policy has
to wait through exactly this delay after each scale-up, so the twin takes it from the spec.

The bandwidths and the initialisation time below are assumptions, not measurements: named, commented,
and overridable (:class:`StartupAssumptions`), and meant to be replaced by figures measured on the target
cluster. :func:`startup_delay_s` depends only on a weight size in bytes (so a policy or bench can use it
with any size); :func:`spec_startup_delay_s` reads the size from the model profiles
(:mod:`disagg.perf.latency`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg.perf.latency import load_model_config

GB = 1e9


@dataclass(frozen=True)
class StartupAssumptions:
    """What a replica's start-up is made of. Every figure is an assumption; override it for a cluster."""

    # Sustained download rate of one pod from the Hugging Face Hub (CDN / Xet storage) with hf's default
    # 8 parallel workers (huggingface_hub 1.31.0 cli/download.py, --max-workers default 8). Assumed
    # 0.5 GB/s (4 Gbit/s): a cloud node's egress share for one pod, not the NIC's line rate.
    hub_download_gbytes_per_s: float = 0.5
    # Read rate of one pod from a ReadWriteMany/ReadOnlyMany network file system (NFS, CephFS, a cloud
    # file store) holding the cache. Assumed 1.5 GB/s per client.
    cache_read_gbytes_per_s: float = 1.5
    # Read rate of the just-downloaded files from the pod's emptyDir (node-local NVMe, partly still in
    # the page cache). Assumed 3 GB/s.
    local_read_gbytes_per_s: float = 3.0
    # Engine initialisation after the weights are in GPU memory: KV cache profiling and allocation,
    # CUDA graph capture, compilation, and the API server coming up. Assumed 60 s.
    engine_init_s: float = 60.0

    def __post_init__(self) -> None:
        for name in ("hub_download_gbytes_per_s", "cache_read_gbytes_per_s", "local_read_gbytes_per_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.engine_init_s < 0:
            raise ValueError(f"engine_init_s: must be >= 0, got {self.engine_init_s}")


DEFAULT_ASSUMPTIONS = StartupAssumptions()


def startup_delay_s(
    weight_bytes: float, cached: bool, assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS
) -> float:
    """Seconds from a replica's creation until it serves, for ``weight_bytes`` of weights that are on a
    shared volume (``cached``) or downloaded from the Hub first."""
    if weight_bytes < 0:
        raise ValueError(f"weight_bytes: must be >= 0, got {weight_bytes}")
    a = assumptions
    if cached:
        fetch = 0.0
        load = weight_bytes / (a.cache_read_gbytes_per_s * GB)
    else:
        fetch = weight_bytes / (a.hub_download_gbytes_per_s * GB)
        load = weight_bytes / (a.local_read_gbytes_per_s * GB)
    return a.engine_init_s + fetch + load


def weights_cached(spec: Mapping[str, Any]) -> bool:
    """Whether the replicas of a DisaggregatedDeployment spec (a dict) read their weights from a volume:
    ``model.cache`` set, or a ``pvc`` source; a Hugging Face source without a cache downloads."""
    model = spec.get("model") if isinstance(spec.get("model"), Mapping) else {}
    assert isinstance(model, Mapping)
    source = model.get("source") if isinstance(model.get("source"), Mapping) else {}
    assert isinstance(source, Mapping)
    return bool(model.get("cache")) or bool(source.get("pvc"))


def spec_startup_delay_s(
    spec: Mapping[str, Any], dtype: str, assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS
) -> float:
    """The start-up delay of a replica of a DisaggregatedDeployment spec (a dict): the model's weight
    bytes from the profiles (profiles/models.yaml params_b x bytes of ``dtype``), cached or not.

    Raises ValueError when the twin has no profile of the model."""
    model = spec.get("model") if isinstance(spec.get("model"), Mapping) else {}
    assert isinstance(model, Mapping)
    name = model.get("name")
    if not isinstance(name, str):
        raise ValueError("spec.model.name: a DisaggregatedDeployment needs a model name for the twin")
    return startup_delay_s(checkpoint_bytes(name, dtype), weights_cached(spec), assumptions)


def checkpoint_bytes(model: str, dtype: str) -> float:
    """The bytes of a model's weights a pod fetches and reads: params x bytes of ``dtype`` (a checkpoint
    published quantized, DeepSeek's FP8 or gpt-oss's MXFP4, at its own format when ``dtype`` is bf16).
    Every pod of a multi-node replica fetches the whole checkpoint into its own node's storage, as vLLM
    and SGLang load from a local path on each node. ValueError when the twin has no profile of it."""
    from disagg.perf.moe import Parallelism, load_moe_archs, resolve_moe_model

    arch_name = resolve_moe_model(model)
    if arch_name is None:
        return load_model_config(model).weight_bytes(dtype)
    arch = load_moe_archs()[arch_name]
    kind = arch.native_dtype if dtype == "bf16" else dtype
    return arch.weight_bytes_per_gpu(kind, Parallelism())  # one GPU holding everything: the whole


__all__ = [
    "DEFAULT_ASSUMPTIONS",
    "StartupAssumptions",
    "checkpoint_bytes",
    "spec_startup_delay_s",
    "startup_delay_s",
    "weights_cached",
]
