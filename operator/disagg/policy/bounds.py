"""The policy's bounds of a DisaggregatedDeployment, read once from the validated model. Pure.

The operator's autoscaler, ``disagg simulate`` (:meth:`disagg.twin.sim.SimDeployment.from_model`) and the
benchmarks all call :func:`bounds_for`, so the same objects give the same replica ranges, GPUs, GPU
budget, serving profile (what the model-based algorithm loads its latency model from) and replica
start-up everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping

from disagg.api.deployment import DisaggregatedDeployment, DisaggregatedDeploymentSpec
from disagg.perf.startup import DEFAULT_ASSUMPTIONS, StartupAssumptions, spec_startup_delay_s, weights_cached
from disagg.policy.types import ROLES, Bounds, Role, RoleBounds, ServingProfile

# Node labels that name the GPU a pool runs on, in the order they are looked for (decode pool first).
GPU_LABELS = ("disagg.dev/gpu-type", "nvidia.com/gpu.product")
DEFAULT_GPU = "h100"


def gpu_of(spec: DisaggregatedDeploymentSpec) -> str:
    """The GPU type named by the pools' node selectors (the decode pool's first), else the default."""
    for role in ("decode", "prefill"):
        selector = spec.role(role).node_selector or {}
        for label in GPU_LABELS:
            if selector.get(label):
                return selector[label]
    return DEFAULT_GPU


def weight_dtype(spec: DisaggregatedDeploymentSpec) -> str:
    """The weights' data type as the latency model knows it: fp8 when the spec asks for fp8, else bf16."""
    named = spec.model.dtype or spec.model.quantization or "bf16"
    return "fp8" if named.lower() == "fp8" else "bf16"


def serving_profile(spec: DisaggregatedDeploymentSpec) -> ServingProfile:
    """Model, GPU, tensor parallelism per pool and weight dtype: the model-based algorithm's profile."""
    return ServingProfile(
        model=spec.model.name,
        gpu=gpu_of(spec),
        tp_prefill=spec.prefill.tensor_parallel_size,
        tp_decode=spec.decode.tensor_parallel_size,
        dtype=weight_dtype(spec),
    )


def spec_startup_s(
    spec: DisaggregatedDeploymentSpec, assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS
) -> float | None:
    """The start-up of one replica the spec implies (weights cached on a volume or downloaded, see
    :mod:`disagg.perf.startup`); None when there is no profile of the model."""
    try:
        return spec_startup_delay_s(spec.to_api(), weight_dtype(spec), assumptions)
    except (ValueError, KeyError):
        return None


def spec_weights_cached(spec: DisaggregatedDeploymentSpec) -> bool:
    """Whether replicas read the weights from a volume (spec.model.cache, or a pvc source)."""
    return weights_cached(spec.to_api())


def bounds_for(
    dd: DisaggregatedDeployment,
    startups: Mapping[Role, float | None] | None = None,
    assumptions: StartupAssumptions = DEFAULT_ASSUMPTIONS,
) -> Bounds:
    """The policy bounds of ``dd``: each pool's replica range (spec.autoscaling.<role>, or the spec's
    replicas when unset), GPUs per replica, maxGPUs, the serving profile, and each pool's replica
    start-up: ``startups`` (e.g. measured on the pods) where given, else the spec's estimate."""
    spec = dd.spec
    estimate = spec_startup_s(spec, assumptions) if startups is None else None
    auto = spec.autoscaling

    def role_bounds(role: Role) -> RoleBounds:
        replicas = spec.replica_bounds(role)
        return RoleBounds(
            min_replicas=replicas.min_replicas,
            max_replicas=replicas.max_replicas,
            gpus_per_replica=spec.role(role).gpus_per_replica,
            startup_seconds=estimate if startups is None else startups.get(role),
        )

    prefill, decode = (role_bounds(role) for role in ROLES)
    return Bounds(
        prefill=prefill,
        decode=decode,
        max_gpus=auto.max_gpus if auto is not None else None,
        profile=serving_profile(spec),
    )
