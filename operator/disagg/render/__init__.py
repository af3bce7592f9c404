"""Pure rendering: a DisaggregatedDeployment spec to the child manifests, per engine and KV connector.

``render_children(dd, replicas)`` returns every child as a dict (no ownerReferences: the k8s layer adds
them); ``effective_replicas(dd)`` says which replica counts the reconciler applies. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from disagg.api.deployment import ROLE_NAMES, DisaggregatedDeployment
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
    deep_merge,
)
from disagg.render.settings import DEFAULT_SETTINGS, RenderSettings


def effective_replicas(dd: DisaggregatedDeployment) -> dict[str, int]:
    """Replicas per role the reconciler applies.

    status.autoscaling.desiredReplicas clamped to the role's replica bounds (spec.autoscaling.<role>, or
    the spec's replicas when unset: :meth:`DisaggregatedDeploymentSpec.replica_bounds`, the same bounds
    the policy decides within, so a target decided under bounds since narrowed is not applied beyond
    them) when autoscaling is enabled, its mode is active and that field exists; spec.<role>.replicas
    otherwise.
    """
    spec = dd.spec
    result: dict[str, int] = {role: spec.role(role).replicas for role in ROLE_NAMES}
    auto = spec.autoscaling
    status = dd.status.autoscaling if dd.status else None
    if auto is None or not auto.enabled or status is None or status.mode != "active":
        return result
    desired = status.desired_replicas
    if desired is None:
        return result
    for role in ROLE_NAMES:
        value = desired.prefill if role == "prefill" else desired.decode
        result[role] = spec.replica_bounds(role).clamp(value)  # the bounds the policy decided within
    return result


def render_children(
    dd: DisaggregatedDeployment,
    replicas: Mapping[str, int] | None = None,
    settings: RenderSettings = DEFAULT_SETTINGS,
) -> list[dict[str, Any]]:
    """Every child of ``dd``, in apply order (RBAC, model cache claim, Services, download Job,
    Deployments, PDBs).

    ``replicas`` overrides the pools' replica counts (e.g. :func:`effective_replicas`, or 0 while the
    model cache is being filled); a missing role keeps spec.<role>.replicas.
    """
    counts = dict(replicas or {})
    children: list[dict[str, Any]] = list(build_router_rbac(dd))
    pvc = build_model_cache_pvc(dd)
    if pvc is not None:
        children.append(pvc)
    for role in ROLE_NAMES:
        children.append(build_role_service(dd, role, headless=False, settings=settings))
        children.append(build_role_service(dd, role, headless=True, settings=settings))
    children.append(build_router_service(dd, settings))
    job = build_model_download_job(dd, settings)
    if job is not None:
        children.append(job)
    children.append(build_prefill_deployment(dd, counts.get("prefill"), settings))
    children.append(build_decode_deployment(dd, counts.get("decode"), settings))
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
]
