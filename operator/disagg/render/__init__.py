"""Pure rendering: a DisaggregatedDeployment spec to the child manifests, per engine and KV connector.

``render_children(dd, replicas)`` returns every child as a dict (no ownerReferences: the k8s layer adds
them); ``effective_replicas(dd)`` says which replica counts the reconciler applies, ``stale_decision(dd)``
why the autoscaler's decision is not applied as decided. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg.api.deployment import ROLE_NAMES, DisaggregatedDeployment
from disagg.api.podtemplate import deep_merge
from disagg.render.builders import (
    build_decode_deployment,
    build_engine_pod_template,
    build_model_cache_pvc,
    build_model_download_job,
    build_pdb,
    build_prefill_deployment,
    build_role_service,
    build_router_deployment,
    build_router_rbac,
    build_router_service,
)
from disagg.render.gateway import build_epp_deployment, gateway_children
from disagg.render.scale import scale_split
from disagg.render.settings import DEFAULT_SETTINGS, RenderSettings


def _decided(dd: DisaggregatedDeployment) -> dict[str, int] | None:
    """The autoscaler's decision the reconciler applies: status.autoscaling.desiredReplicas when autoscaling
    is enabled, its mode is active and that field exists; None otherwise."""
    auto = dd.spec.autoscaling
    status = dd.status.autoscaling if dd.status else None
    if auto is None or not auto.enabled or status is None or status.mode != "active":
        return None
    desired = status.desired_replicas
    if desired is None:
        return None
    return {"prefill": desired.prefill, "decode": desired.decode}


def stale_decision(dd: DisaggregatedDeployment) -> str | None:
    """Why the autoscaler's decision is not applied as decided, or None when it is (or there is none).

    The policy decides within the bounds of this very spec (:func:`disagg.policy.bounds.bounds_for` reads
    :meth:`DisaggregatedDeploymentSpec.replica_bounds`, and :func:`disagg.policy.decide` clamps to them),
    so a decided count outside them was decided under bounds the user has since changed (or written to
    status by someone else): the reconciler records it.
    """
    decided = _decided(dd)
    if decided is None:
        return None
    outside = []
    for role in ROLE_NAMES:
        bounds = dd.spec.replica_bounds(role)
        if not bounds.min_replicas <= decided[role] <= bounds.max_replicas:
            outside.append(
                f"{role} {decided[role]} outside minReplicas {bounds.min_replicas}..maxReplicas "
                f"{bounds.max_replicas}"
            )
    if not outside:
        return None
    return (
        f"desiredReplicas was decided under other bounds ({'; '.join(outside)}): the pools are held "
        "within the spec's bounds until the autoscaler decides again"
    )


def effective_replicas(dd: DisaggregatedDeployment) -> dict[str, int]:
    """Replicas per role the reconciler applies.

    The autoscaler's decision (status.autoscaling.desiredReplicas, when autoscaling is enabled, its mode is
    active and that field exists), else spec.<role>.replicas. When spec.replicas is set (the /scale
    subresource HPA and KEDA write), those counts give only the ratio: the pools are sized to sum to
    spec.replicas at it (:func:`disagg.render.scale.split_total`; :func:`scale_limit` says when bounds or
    the GPU budget hold the total elsewhere).

    One clamp: the policy's. :func:`disagg.policy.decide` is where a decision is bounded, within
    :func:`disagg.policy.bounds.bounds_for` of this spec, and a decision made under this spec passes
    through here unchanged. The check below is not a second clamp of that decision: it is the render
    layer's validation of its input. The object it renders pairs the spec as the user has it now with a
    status value decided under an earlier generation of it (the user may narrow spec.autoscaling.<role>
    at any time, and any status writer may write the field), and the only writer of replica counts never
    writes one outside the bounds the user has set, the rule the API enforces on spec.<role>.replicas.
    It binds only on such a stale value (:func:`stale_decision`, which the reconciler records), and only
    until the autoscaler's next evaluation decides within the new bounds.
    """
    ratio = _pool_replicas(dd)
    split = scale_split(dd, ratio)  # spec.replicas (/scale): that total, split at this ratio
    return ratio if split is None else split.replicas


def _pool_replicas(dd: DisaggregatedDeployment) -> dict[str, int]:
    """The replicas without /scale: the decision within the user's bounds, else spec.<role>.replicas."""
    spec = dd.spec
    result: dict[str, int] = {role: spec.role(role).replicas for role in ROLE_NAMES}
    decided = _decided(dd)
    if decided is not None:
        for role in ROLE_NAMES:
            result[role] = spec.replica_bounds(role).clamp(decided[role])  # the user's bounds, see above
    return result


def scale_limit(dd: DisaggregatedDeployment) -> str | None:
    """Why the pools do not sum to spec.replicas (the /scale total), or None when they do or it is unset."""
    split = scale_split(dd, _pool_replicas(dd))
    if split is None or split.limit is None:
        return None
    return (
        f"spec.replicas {split.requested} {split.limit}: prefill {split.replicas['prefill']}, "
        f"decode {split.replicas['decode']}"
    )


def render_children(
    dd: DisaggregatedDeployment,
    replicas: Mapping[str, int] | None = None,
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> list[dict[str, Any]]:
    """Every child of ``dd``, in apply order (RBAC, model cache claim, Services, download Job,
    Deployments, PDBs). With spec.router.type gateway-api the built-in router's RBAC, Service and
    Deployment are replaced by the endpoint picker's, its ConfigMap, the InferencePool and the optional
    HTTPRoute (:mod:`disagg.render.gateway`).

    ``replicas`` overrides the pools' replica counts (e.g. :func:`effective_replicas`, or 0 while the
    model cache is being filled); a missing role keeps spec.<role>.replicas.
    """
    counts = dict(replicas or {})
    gateway_api = dd.spec.router.gateway
    children: list[dict[str, Any]] = gateway_children(dd, settings) if gateway_api else build_router_rbac(dd)
    pvc = build_model_cache_pvc(dd)
    if pvc is not None:
        children.append(pvc)
    for role in ROLE_NAMES:
        children.append(build_role_service(dd, role, headless=False, settings=settings))
        children.append(build_role_service(dd, role, headless=True, settings=settings))
    if not gateway_api:
        children.append(build_router_service(dd, settings))
    job = build_model_download_job(dd, settings)
    if job is not None:
        children.append(job)
    children.append(build_prefill_deployment(dd, counts.get("prefill"), settings))
    children.append(build_decode_deployment(dd, counts.get("decode"), settings))
    if gateway_api:
        children.append(build_epp_deployment(dd, settings))
    else:
        children.append(build_router_deployment(dd, None, settings))
    children += [build_pdb(dd, role) for role in ROLE_NAMES]
    return children


__all__ = [
    "DEFAULT_SETTINGS",
    "RenderSettings",
    "build_decode_deployment",
    "build_engine_pod_template",
    "build_model_cache_pvc",
    "build_model_download_job",
    "build_pdb",
    "build_prefill_deployment",
    "build_role_service",
    "build_router_deployment",
    "build_router_rbac",
    "build_router_service",
    "deep_merge",
    "effective_replicas",
    "render_children",
    "scale_limit",
]
