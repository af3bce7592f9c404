"""What the status of a DisaggregatedDeployment says, computed from its children. Pure: dicts in, dict out.

Conditions follow the Kubernetes conventions (metav1.Condition): ``lastTransitionTime`` moves only when a
condition's status flips; ``observedGeneration`` says which spec the condition describes.
Source: https://github.com/kubernetes/community/blob/master/contributors/devel/sig-architecture/api-conventions.md#typical-status-properties
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from disagg.api.common import Moment, set_api_condition
from disagg.api.deployment import RoleStatus, RouterStatus, format_ratio

ROLES = ("prefill", "decode", "router")
MODEL_CACHED = "ModelCached"  # the condition of spec.model.cache (disagg.controller.modelcache)
SCALED_ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class RoleState:
    """One role's Deployment as the API server reports it."""

    desired: int  # spec.replicas
    replicas: int  # status.replicas (pods that exist, any version)
    ready: int  # status.readyReplicas
    updated: int  # status.updatedReplicas
    rolled_out: bool  # the controller saw the latest spec and every replica runs it and is ready
    failure: str | None = None  # why the rollout is stuck (ReplicaFailure / ProgressDeadlineExceeded)


@dataclass(frozen=True)
class Problem:
    """Why the operator could not do its job for this object (an invalid spec, a failed apply)."""

    reason: str  # CamelCase, e.g. InvalidSpec, RenderFailed, ApplyFailed
    message: str
    transient: bool = False


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def role_state(deployment: Mapping[str, Any] | None) -> RoleState | None:
    """A RoleState from a live Deployment (apps/v1); None when the Deployment does not exist."""
    if deployment is None:
        return None
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = _int((deployment.get("metadata") or {}).get("generation"))
    desired = _int(spec.get("replicas", 1))
    replicas, ready = _int(status.get("replicas")), _int(status.get("readyReplicas"))
    updated = _int(status.get("updatedReplicas"))
    failure = None
    for condition in status.get("conditions") or []:
        kind, state, reason = condition.get("type"), condition.get("status"), condition.get("reason")
        if (kind == "ReplicaFailure" and state == "True") or (
            kind == "Progressing" and reason == "ProgressDeadlineExceeded"
        ):
            failure = f"{condition.get('reason')}: {condition.get('message', '')}".strip()
    rolled_out = (
        _int(status.get("observedGeneration")) >= generation
        and updated >= desired
        and ready >= desired
        and replicas == updated
    )
    return RoleState(desired, replicas, ready, updated, rolled_out, failure)


def _role_summary(name: str, state: RoleState | None) -> str:
    if state is None:
        return f"{name} missing"
    return f"{name} {state.ready}/{state.desired} ready"


def build_status(
    current: Mapping[str, Any],
    generation: int,
    roles: Mapping[str, RoleState | None],
    router_endpoint: str | None,
    problem: Problem | None,
    now: Moment,
    model_cached: tuple[bool, str, str] | None = None,
    selector: str | None = None,
) -> dict[str, Any]:
    """The new status: everything the reconciler owns, merged over ``current`` (other writers' keys kept).

    ``roles`` maps prefill/decode/router to their Deployment's state (None: not there). ``problem`` is
    set when the spec could not be rendered or the children could not be applied. ``model_cached`` is
    the ModelCached condition (status, reason, message) under spec.model.cache; None removes it. While it
    is False the pools are held at 0 replicas, so the object is not Ready whatever the pools say.
    ``selector`` is both pools' pod selector; with it go ``replicas`` (both pools' replicas that exist),
    the /scale subresource's status that HPA and KEDA read.
    """
    status: dict[str, Any] = {k: v for k, v in current.items()}
    status["observedGeneration"] = generation
    for role in SCALED_ROLES:
        state = roles.get(role)
        role_status = RoleStatus.of(desired=0, replicas=0, ready=0)
        if state is not None:
            role_status = RoleStatus.of(desired=state.desired, replicas=state.replicas, ready=state.ready)
        status[role] = role_status.to_api()
    prefill, decode = roles.get("prefill"), roles.get("decode")
    if selector is not None:
        status["selector"] = selector
        status["replicas"] = sum(state.replicas for state in (prefill, decode) if state is not None)
    if prefill is not None and decode is not None:
        status["ratio"] = format_ratio(prefill.desired, decode.desired)
    router = roles.get("router")
    status["router"] = RouterStatus(
        endpoint=router_endpoint,
        replicas=router.replicas if router else 0,
        ready=router.ready if router else 0,
    ).to_api()

    all_there = all(roles.get(role) is not None for role in ROLES)
    rolled_out = all_there and all(s is not None and s.rolled_out for s in roles.values())
    failures = [f"{role}: {s.failure}" for role, s in roles.items() if s is not None and s.failure]
    summary = ", ".join(_role_summary(role, roles.get(role)) for role in ROLES)

    conditions: list[dict[str, Any]] = list(current.get("conditions") or [])
    if problem is not None:
        conditions = set_api_condition(
            conditions, "Degraded", True, problem.reason, problem.message, generation, now
        )
    elif failures:
        message = "; ".join(failures)
        conditions = set_api_condition(conditions, "Degraded", True, "ChildFailing", message, generation, now)
    else:
        message = "children match the spec"
        conditions = set_api_condition(conditions, "Degraded", False, "Reconciled", message, generation, now)

    if model_cached is None:
        conditions = [c for c in conditions if c.get("type") != MODEL_CACHED]
    else:
        cached, cache_reason, cache_message = model_cached
        conditions = set_api_condition(
            conditions, MODEL_CACHED, cached, cache_reason, cache_message, generation, now
        )
    waiting = model_cached is not None and not model_cached[0]
    if waiting and model_cached is not None:
        rolled_out = False
        ready_reason, ready_message = "ModelNotCached", model_cached[2]
    elif rolled_out:
        ready_reason, ready_message = "AllReplicasReady", summary
    elif problem is not None and not all_there:
        ready_reason, ready_message = problem.reason, problem.message
    else:
        ready_reason, ready_message = "ReplicasNotReady", summary
    conditions = set_api_condition(
        conditions, "Ready", rolled_out, ready_reason, ready_message, generation, now
    )

    if problem is not None and not problem.transient:
        progressing, reason, message = False, "Blocked", f"cannot progress: {problem.message}"
    elif waiting and model_cached is not None:
        progressing, reason, message = True, model_cached[1], model_cached[2]
    elif rolled_out:
        progressing, reason, message = False, "RolloutComplete", summary
    else:
        progressing, reason, message = True, "RollingOut", summary
    conditions = set_api_condition(conditions, "Progressing", progressing, reason, message, generation, now)
    status["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    return status


def status_differs(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """Whether writing ``new`` would change anything (a status patch is skipped when it would not)."""
    return any(old.get(key) != value for key, value in new.items())
