"""What the autoscaling loop records: ``status.autoscaling`` (the target, the latest evaluation, the last
moves, the policy's memory), the conditions MetricsAvailable, ScalingActive and ScalingLimited, and an
Event for every change. The builders are pure; :func:`write_status` and :func:`report_inactive` write
through :mod:`disagg.k8s`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from disagg.api.common import rfc3339, set_api_condition, shorten
from disagg.api.deployment import MAX_DECISION_MESSAGE
from disagg.k8s.client import DISAGG_DEPLOYMENT, KubeApi
from disagg.k8s.events import post_event
from disagg.policy.types import ROLES, Decision, Observation

CONDITION_METRICS = "MetricsAvailable"
CONDITION_ACTIVE = "ScalingActive"
CONDITION_LIMITED = "ScalingLimited"


def decision_message(decision: Decision) -> str:
    if not decision.reasons:
        return "no change: SLOs met within the tolerance band"
    return shorten("; ".join(r.message for r in decision.reasons), MAX_DECISION_MESSAGE)


def decision_record(decision: Decision, now: float) -> dict[str, Any]:
    """One entry of status.autoscaling.decisions."""
    return {
        "time": rfc3339(now),
        "prefill": decision.prefill,
        "decode": decision.decode,
        "cause": decision.cause,
        "message": decision_message(decision),
    }


def push_decision(
    history: Sequence[Mapping[str, Any]], record: Mapping[str, Any], keep: int
) -> list[dict[str, Any]]:
    """The decisions list with ``record`` first, at most ``keep`` entries, newest first."""
    return [dict(record), *(dict(r) for r in history)][:keep]


def autoscaling_status(
    previous: Mapping[str, Any] | None,
    policy_name: str,
    mode: str,
    decision: Decision,
    current: Mapping[str, int],
    now: float,
    keep: int,
) -> dict[str, Any]:
    """The new status.autoscaling.

    A decision enters the history when it changes the target (or is the first one), so the history
    shows moves, not every evaluation. In active mode desiredReplicas is the target; in advisory mode
    the target is recorded in the decisions only and desiredReplicas is removed (None in a merge
    patch), so the reconciler keeps the spec's replicas.
    """
    prev = dict(previous or {})
    history = list(prev.get("decisions") or [])
    target = {"prefill": decision.prefill, "decode": decision.decode}
    last_target = None
    if history:
        last_target = {"prefill": history[0].get("prefill"), "decode": history[0].get("decode")}
    moved = target != {r: current.get(r) for r in ROLES} or decision.changed
    if not history or (moved and target != last_target):
        history = push_decision(history, decision_record(decision, now), keep)
    return {
        "policy": policy_name,
        "mode": mode,
        "desiredReplicas": dict(target) if mode == "active" else None,
        "lastEvaluationTime": rfc3339(now),
        "lastEvaluation": decision_record(decision, now),
        "decisions": history,
    }


@dataclass(frozen=True)
class ConditionUpdate:
    """One of the loop's conditions to set."""

    kind: str
    status: bool
    reason: str
    message: str


# room left in MetricsAvailable's message for Prometheus's error
MAX_FAILURE_MESSAGE = 240


def metrics_condition(observation: Observation, failure: str | None = None) -> ConditionUpdate:
    """MetricsAvailable from the user-facing latencies the policy steers by. ``failure``: why Prometheus
    gave none when its queries failed (reason PrometheusQueryFailed, the error in the message); otherwise
    the reason is MetricsMissing and the message names each signal's state (missing, nan, stale,
    invalid)."""
    missing = [
        f"{name} is {signal.state.value}"
        for name, signal in (("TTFT", observation.ttft), ("ITL", observation.itl))
        if not signal.ok
    ]
    if not missing:
        return ConditionUpdate(
            CONDITION_METRICS, True, "MetricsOK", "TTFT and ITL are available from Prometheus"
        )
    message = "; ".join(missing)
    reason = "MetricsMissing"
    if failure:
        message += f": {shorten(failure, MAX_FAILURE_MESSAGE)}"
        reason = "PrometheusQueryFailed"
    return ConditionUpdate(
        CONDITION_METRICS, False, reason, message + " (the policy holds replicas: fail-static)"
    )


def limited_condition(decision: Decision, ceiling: Mapping[str, int]) -> ConditionUpdate:
    """ScalingLimited: a Pending-pod ceiling, the replica bounds or the GPU budget clipped the target."""
    if ceiling:
        roles = ", ".join(f"{r} <= {c}" for r, c in sorted(ceiling.items()))
        message = f"added pods stayed Unschedulable; not asking for more ({roles})"
        return ConditionUpdate(CONDITION_LIMITED, True, "PendingPods", message)
    for reason in decision.reasons:
        if reason.code in ("ScalingLimited", "BudgetClamp", "StepCapped"):
            return ConditionUpdate(CONDITION_LIMITED, True, reason.code, reason.message)
    message = "the desired replicas are within bounds, budget and capacity"
    return ConditionUpdate(CONDITION_LIMITED, False, "DesiredWithinRange", message)


def active_condition(policy_name: str, algorithm: str, mode: str, startups: str) -> ConditionUpdate:
    """ScalingActive: the policy decides replicas (active) or only recommends them (advisory)."""
    if mode == "active":
        message = f"RatioPolicy {policy_name} ({algorithm}) decides replicas; {startups}"
        return ConditionUpdate(CONDITION_ACTIVE, True, "PolicyEvaluated", message)
    message = f"RatioPolicy {policy_name} is advisory: decisions are recorded, not applied; {startups}"
    return ConditionUpdate(CONDITION_ACTIVE, False, "AdvisoryMode", message)


@dataclass(frozen=True)
class EventSpec:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def change_events(
    decision: Decision,
    current: Mapping[str, int],
    mode: str,
    previous_conditions: Sequence[Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]],
    previous_target: Mapping[str, Any] | None = None,
) -> list[EventSpec]:
    """An Event for every change: a new target (with its cause) and every condition that flipped.

    A target is announced once: not again while the reconciler has yet to apply it (``previous_target``
    is the last recorded decision), and in advisory mode not on every evaluation.
    """
    events: list[EventSpec] = []
    target = {"prefill": decision.prefill, "decode": decision.decode}
    repeated = previous_target is not None and all(previous_target.get(r) == target[r] for r in ROLES)
    if not repeated and any(target[r] != current.get(r) for r in ROLES):
        verb = "recommends" if mode == "advisory" else "scales"
        moves = ", ".join(
            f"{r} {current.get(r)} -> {target[r]}" for r in ROLES if target[r] != current.get(r)
        )
        events.append(EventSpec("Normal", decision.cause, f"{verb} {moves}: {decision_message(decision)}"))
    before = {c.get("type"): c.get("status") for c in previous_conditions}
    for cond in conditions:
        kind = cond.get("type")
        if kind not in (CONDITION_METRICS, CONDITION_ACTIVE, CONDITION_LIMITED):
            continue
        if before.get(kind) == cond.get("status"):
            continue
        bad = (kind == CONDITION_LIMITED) == (cond.get("status") == "True")
        if kind not in before and not bad:
            continue  # a condition first set in its good state is no news
        events.append(
            EventSpec("Warning" if bad else "Normal", str(cond.get("reason")), str(cond.get("message")))
        )
    return events


def fresh_object(kube: KubeApi, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object as the API server has it now (kopf's body may predate our own last status write)."""
    metadata = body["metadata"]
    return kube.get(DISAGG_DEPLOYMENT, metadata["namespace"], metadata["name"]) or body


def write_status(
    kube: KubeApi,
    body: Mapping[str, Any],
    autoscaling: Mapping[str, Any],
    updates: Sequence[ConditionUpdate],
    now: float,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Merge-patch status.autoscaling and our conditions over a fresh read (other conditions are kept).

    Returns the conditions before and after.
    """
    metadata = body["metadata"]
    fresh = fresh_object(kube, body)
    before = list((fresh.get("status") or {}).get("conditions") or [])
    generation = (fresh.get("metadata") or {}).get("generation")
    after = before
    for u in updates:
        after = set_api_condition(after, u.kind, u.status, u.reason, u.message, generation, now)
    kube.merge_patch_status(
        DISAGG_DEPLOYMENT,
        metadata["namespace"],
        metadata["name"],
        {"autoscaling": dict(autoscaling), "conditions": after},
    )
    return before, after


def report_inactive(kube: KubeApi, body: Mapping[str, Any], reason: str, message: str, now: float) -> None:
    """ScalingActive=False (no policy, an invalid policy or spec): recorded once, with an Event."""
    status = body.get("status") or {}
    previous = {c.get("type"): c for c in status.get("conditions") or []}.get(CONDITION_ACTIVE) or {}
    if previous.get("status") == "False" and previous.get("reason") == reason:
        return
    auto = dict(status.get("autoscaling") or {})
    auto["lastEvaluationTime"] = rfc3339(now)
    write_status(kube, body, auto, [ConditionUpdate(CONDITION_ACTIVE, False, reason, message)], now)
    post_event(kube, body, reason, message, "Warning")


def post_events(kube: KubeApi, body: Mapping[str, Any], events: Sequence[EventSpec]) -> None:
    for event in events:
        post_event(kube, body, event.reason, event.message, event.type)
