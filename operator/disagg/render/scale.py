"""Pure: the total an external autoscaler asks for through /scale, split into prefill and decode replicas.

HPA and KEDA write one number, ``spec.replicas`` of the DisaggregatedDeployment (its /scale subresource).
The pools are sized to sum to it at a ratio that comes from elsewhere: the RatioPolicy's decision when one
is active, else the spec's own prefill:decode replicas. So one coordinated P:D decision stays with the
operator (the ratio), total capacity may come from the user's autoscaler, and the reconciler remains the
only writer of the children's replicas. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from disagg.api.deployment import ROLE_NAMES, DisaggregatedDeployment, ReplicaBounds, RoleName


@dataclass(frozen=True)
class ScaleSplit:
    """The pools' replicas for a requested total, and why the total applied differs when it does."""

    replicas: dict[str, int]
    requested: int
    applied: int
    limit: str | None  # None when the requested total applied as asked


def _bounds(dd: DisaggregatedDeployment, role: RoleName) -> ReplicaBounds:
    """A pool's range under /scale: spec.autoscaling.<role> when set, else at least 1 and at most the
    schema's 1000 (spec.<role>.replicas is then the ratio, not a bound)."""
    auto = dd.spec.autoscaling
    bounds = auto.bounds(role) if auto is not None else None
    return bounds if bounds is not None else ReplicaBounds(min_replicas=1, max_replicas=1000)


def split_total(
    total: int,
    ratio: Mapping[str, int],
    bounds: Mapping[str, ReplicaBounds],
    gpus_per_replica: Mapping[str, int] | None = None,
    max_gpus: int | None = None,
) -> ScaleSplit:
    """Prefill and decode replicas summing to ``total`` (when the bounds and budget allow) at ``ratio``.

    The prefill share is ``ratio[prefill] / (ratio[prefill] + ratio[decode])`` (half when both are 0),
    rounded to the nearest replica; each pool is then held in its bounds and the total within the GPU
    budget. 0 scales both pools to zero whatever the bounds (KEDA's idle state is the user's explicit
    choice).
    """
    if total <= 0:
        return ScaleSplit({role: 0 for role in ROLE_NAMES}, total, 0, None)
    low = sum(bounds[role].min_replicas for role in ROLE_NAMES)
    high = sum(bounds[role].max_replicas for role in ROLE_NAMES)
    limit = None
    applied = total
    if applied < low:
        applied, limit = low, f"raised to the pools' minReplicas ({low})"
    elif applied > high:
        applied, limit = high, f"lowered to the pools' maxReplicas ({high})"
    weight = ratio["prefill"] + ratio["decode"]
    share = ratio["prefill"] / weight if weight > 0 else 0.5

    def split(n: int) -> dict[str, int]:
        prefill = round(n * share)
        pb, db = bounds["prefill"], bounds["decode"]
        prefill = min(prefill, pb.max_replicas, n - db.min_replicas)
        prefill = max(pb.min_replicas, n - db.max_replicas, prefill)
        return {"prefill": prefill, "decode": n - prefill}

    replicas = split(applied)
    if max_gpus is not None and gpus_per_replica is not None:
        per_replica = gpus_per_replica

        def gpus(counts: Mapping[str, int]) -> int:
            return sum(counts[role] * per_replica[role] for role in ROLE_NAMES)

        over = gpus(replicas) > max_gpus
        while gpus(replicas) > max_gpus and applied > low:
            applied -= 1
            replicas = split(applied)
        if over:
            limit = f"lowered to {applied} to fit spec.autoscaling.maxGPUs ({max_gpus})"
    return ScaleSplit(replicas, total, applied, limit)


def scale_split(dd: DisaggregatedDeployment, ratio: Mapping[str, int]) -> ScaleSplit | None:
    """The split of ``spec.replicas`` at ``ratio`` (the replicas that would apply without /scale), or
    None when spec.replicas is unset."""
    total = dd.spec.replicas
    if total is None:
        return None
    auto = dd.spec.autoscaling
    return split_total(
        total,
        ratio,
        {role: _bounds(dd, role) for role in ROLE_NAMES},
        {role: dd.spec.role(role).gpus_per_replica for role in ROLE_NAMES},
        auto.max_gpus if auto is not None else None,
    )
