"""The autoscaling loop: evaluate each DisaggregatedDeployment's RatioPolicy and record the decision.

A kopf timer ticks at a small base interval and evaluates a deployment when its policy's
``evaluationInterval`` has passed since ``status.autoscaling.lastEvaluationTime`` (kopf timers have a
fixed interval; a policy's interval is data). Each evaluation:

1. reads the RatioPolicy named by ``spec.autoscaling.policyRef``;
2. builds an Observation: replica/ready/pending counts from the child Deployments and their pods,
   latencies and load from Prometheus through :mod:`disagg.metrics`;
3. calls the pure :func:`disagg.policy.decide`;
4. writes ``status.autoscaling`` (policy, mode, desiredReplicas, lastEvaluationTime, the last decisions)
   and the conditions MetricsAvailable, ScalingActive and ScalingLimited, and posts an Event for every
   change. The reconciler stays the only writer of child replica counts: it reads desiredReplicas.

Before a decode scale-down it sets ``controller.kubernetes.io/pod-deletion-cost`` on the decode pods from
their running requests, so the ReplicaSet removes the least-loaded pods first (they then drain gracefully).
Pods that stay Pending as Unschedulable past a grace period set a replica ceiling for their role
(``PolicyState.limited``) and the ScalingLimited condition, instead of piling up more Pending pods.

Per-object state (the PolicyState between evaluations) lives in kopf's per-object ``memo``; everything a
restart must not lose lives in status. The functions above the handler section are pure.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from disagg.policy.types import ROLES, Decision, Observation, PolicyState, Role

# Source: Kubernetes ReplicaSet pod-deletion-cost annotation (beta since v1.22), "Pods with lower
# deletion cost are preferred to be deleted before pods with higher deletion cost".
# https://kubernetes.io/docs/reference/labels-annotations-taints/#pod-deletion-cost
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

CONDITION_METRICS = "MetricsAvailable"
CONDITION_ACTIVE = "ScalingActive"
CONDITION_LIMITED = "ScalingLimited"


@dataclass(frozen=True)
class AutoscalingSettings:
    """Knobs of the loop itself (the policy's own knobs live in the RatioPolicy)."""

    tick_s: float = 2.0  # base timer interval; evaluations happen on the policy's interval
    pending_grace_s: float = 60.0  # how long an added pod may stay Unschedulable before the role is limited
    max_decisions: int = 10  # decisions kept in status, newest first
    prometheus_url: str | None = None

    @staticmethod
    def from_env(env: Mapping[str, str] | None = None) -> AutoscalingSettings:
        """Settings from ``DISAGG_AUTOSCALING_*`` and ``DISAGG_PROMETHEUS_URL`` (set by ``disagg run``)."""
        values = os.environ if env is None else env
        defaults = AutoscalingSettings()

        def number(key: str, default: float) -> float:
            raw = values.get(key)
            if raw is None or raw == "":
                return default
            try:
                parsed = float(raw)
            except ValueError as exc:
                raise ValueError(f"{key}: expected a number of seconds, got {raw!r}") from exc
            if parsed <= 0:
                raise ValueError(f"{key}: must be > 0, got {raw!r}")
            return parsed

        return AutoscalingSettings(
            tick_s=number("DISAGG_AUTOSCALING_TICK_S", defaults.tick_s),
            pending_grace_s=number("DISAGG_AUTOSCALING_PENDING_GRACE_S", defaults.pending_grace_s),
            max_decisions=int(number("DISAGG_AUTOSCALING_MAX_DECISIONS", defaults.max_decisions)),
            prometheus_url=values.get("DISAGG_PROMETHEUS_URL") or None,
        )


# ---------------------------------------------------------------------------------------------- time


def rfc3339(timestamp: float) -> str:
    """A Kubernetes-style timestamp (UTC, second precision, ``Z``)."""
    return datetime.fromtimestamp(timestamp, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: object) -> float | None:
    """Seconds since the epoch, or None when absent or unparseable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def is_due(last_evaluation: float | None, interval_s: float, now: float) -> bool:
    """Whether an evaluation is due: never evaluated, or the interval has passed (clock skew: due)."""
    if last_evaluation is None:
        return True
    return now - last_evaluation >= interval_s or now < last_evaluation


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodInfo:
    """What the loop needs to know about one engine pod."""

    name: str
    role: str
    ready: bool
    scheduled: bool
    unschedulable_since: float | None = None  # when PodScheduled turned False with reason Unschedulable
    terminating: bool = False


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """A PodInfo from a pod object as JSON (camelCase keys, as the API server serves it)."""
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    labels = metadata.get("labels") or {}
    ready = _condition(status, "Ready")
    scheduled = _condition(status, "PodScheduled")
    is_scheduled = bool((pod.get("spec") or {}).get("nodeName")) or (
        scheduled is not None and scheduled.get("status") == "True"
    )
    unschedulable_since = None
    if not is_scheduled and scheduled is not None and scheduled.get("reason") == "Unschedulable":
        unschedulable_since = parse_rfc3339(scheduled.get("lastTransitionTime"))
        if unschedulable_since is None:
            unschedulable_since = parse_rfc3339(metadata.get("creationTimestamp"))
    return PodInfo(
        name=str(metadata.get("name", "")),
        role=str(labels.get("disagg.dev/role", "")),
        ready=ready is not None and ready.get("status") == "True",
        scheduled=is_scheduled,
        unschedulable_since=unschedulable_since,
        terminating=metadata.get("deletionTimestamp") is not None,
    )


@dataclass(frozen=True)
class RoleCounts:
    replicas: int  # spec.replicas of the child Deployment
    ready: int
    pending: int  # not scheduled yet
    stuck: int  # Unschedulable for longer than the grace period


def role_counts(replicas: int, pods: Sequence[PodInfo], grace_s: float, now: float) -> RoleCounts:
    """Counts for one role; terminating pods are neither ready capacity nor pending demand."""
    live = [p for p in pods if not p.terminating]
    stuck = sum(
        1 for p in live if p.unschedulable_since is not None and now - p.unschedulable_since >= grace_s
    )
    return RoleCounts(
        replicas=replicas,
        ready=sum(1 for p in live if p.ready),
        pending=sum(1 for p in live if not p.scheduled),
        stuck=stuck,
    )


def update_limits(
    state: PolicyState, counts: Mapping[str, RoleCounts], now: float, backoff_s: float
) -> tuple[PolicyState, list[str]]:
    """The policy state with ceilings learned from stuck Pending pods; also the roles newly limited.

    A role whose added pods stay Unschedulable gets a ceiling of the replicas that did schedule (at
    least 1) in ``PolicyState.limited``. The ceiling is lifted after ``backoff_s`` (the policy's
    pendingBackoffSeconds) so the policy can probe for freed GPUs; if pods stay Pending again, it is
    learned again.
    """
    ceiling = dict(state.limited)
    since = dict(state.limited_since)
    newly: list[str] = []
    for role, c in counts.items():
        if c.stuck > 0:
            cap = max(1, c.replicas - c.stuck)
            if role not in ceiling or cap < ceiling[role]:
                if role not in ceiling:
                    newly.append(role)
                ceiling[role] = cap
                since[role] = now
        elif role in ceiling and now - since.get(role, now) >= backoff_s:
            del ceiling[role]
            since.pop(role, None)
    return replace(state, limited=ceiling, limited_since=since), newly


def apply_ceiling(decision: Decision, ceiling: Mapping[str, int]) -> tuple[Decision, list[str]]:
    """The decision clamped to the ceilings (in case the policy did not honour them); roles clamped."""
    clamped: list[str] = []
    values: dict[str, int] = {"prefill": decision.prefill, "decode": decision.decode}
    for role, cap in ceiling.items():
        if role in values and values[role] > cap:
            values[role] = cap
            clamped.append(role)
    if not clamped:
        return decision, []
    return replace(decision, prefill=values["prefill"], decode=values["decode"]), clamped


def deletion_costs(loads: Mapping[str, float | None]) -> dict[str, int]:
    """pod -> deletion cost: the least-loaded pod gets the lowest cost (is removed first).

    Pods whose load is unknown get the highest costs: the loop never chooses to remove what it can't
    see. Costs are ranks (0, 1, 2, ...); ties keep name order so the result is deterministic.
    """
    known = sorted(((v, k) for k, v in loads.items() if v is not None and math.isfinite(v)))
    unknown = sorted(k for k, v in loads.items() if v is None or not math.isfinite(v))
    ranked = [name for _, name in known] + unknown
    return {name: rank for rank, name in enumerate(ranked)}


# ---------------------------------------------------------------------------------------------- status


def decision_message(decision: Decision) -> str:
    if not decision.reasons:
        return "no change: SLOs met within the tolerance band"
    return "; ".join(r.message for r in decision.reasons)


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
    the target goes to recommendedReplicas only and desiredReplicas is removed (None in a merge patch),
    so the reconciler keeps spec replicas.
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
        "recommendedReplicas": dict(target),
        "lastEvaluationTime": rfc3339(now),
        "decisions": history,
    }


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: float,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """Conditions with ``kind`` set, Kubernetes style: lastTransitionTime moves only when status flips."""
    value = "True" if status else "False"
    result: list[dict[str, Any]] = []
    found = False
    for cond in conditions:
        if cond.get("type") != kind:
            result.append(dict(cond))
            continue
        found = True
        transition = cond.get("lastTransitionTime") if cond.get("status") == value else None
        result.append(_condition_entry(kind, value, reason, message, transition or rfc3339(now), generation))
    if not found:
        result.append(_condition_entry(kind, value, reason, message, rfc3339(now), generation))
    return result


def _condition_entry(
    kind: str, value: str, reason: str, message: str, transition: str, generation: int | None
) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
    }
    if generation is not None:
        entry["observedGeneration"] = generation
    return entry


def metrics_condition(observation: Observation) -> tuple[bool, str, str]:
    """MetricsAvailable from the user-facing latencies the policy steers by."""
    missing = [
        f"{name} is {signal.state.value}"
        for name, signal in (("TTFT", observation.ttft), ("ITL", observation.itl))
        if not signal.ok
    ]
    if not missing:
        return True, "MetricsOK", "TTFT and ITL are available from Prometheus"
    return False, "MetricsMissing", "; ".join(missing) + " (the policy holds replicas: fail-static)"


def limited_condition(
    decision: Decision, ceiling: Mapping[str, int], clamped_by_ceiling: Sequence[str]
) -> tuple[bool, str, str]:
    """ScalingLimited: a Pending-pod ceiling, the replica bounds or the GPU budget clipped the target."""
    if ceiling:
        roles = ", ".join(f"{r} <= {c}" for r, c in sorted(ceiling.items()))
        return True, "PendingPods", f"added pods stayed Unschedulable; not asking for more ({roles})"
    if clamped_by_ceiling:
        return True, "PendingPods", f"clamped by Pending pods: {', '.join(clamped_by_ceiling)}"
    for reason in decision.reasons:
        if reason.code in ("BudgetClamp", "GPUBudget", "MaxReplicas", "MinReplicas", "BoundsClamp"):
            return True, reason.code, reason.message
    return False, "DesiredWithinRange", "the desired replicas are within bounds, budget and capacity"


@dataclass(frozen=True)
class EventSpec:
    type: str  # Normal | Warning
    reason: str
    message: str


def change_events(
    decision: Decision,
    current: Mapping[str, int],
    mode: str,
    previous_conditions: Sequence[Mapping[str, Any]],
    conditions: Sequence[Mapping[str, Any]],
) -> list[EventSpec]:
    """An Event for every change: a new target (with its cause) and every condition that flipped."""
    events: list[EventSpec] = []
    target = {"prefill": decision.prefill, "decode": decision.decode}
    if any(target[r] != current.get(r) for r in ROLES):
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
        events.append(
            EventSpec("Warning" if bad else "Normal", str(cond.get("reason")), str(cond.get("message")))
        )
    return events


def current_replicas(counts: Mapping[str, RoleCounts]) -> dict[str, int]:
    return {role: c.replicas for role, c in counts.items()}


def decode_scale_down(decision: Decision, counts: Mapping[str, RoleCounts], mode: str) -> bool:
    return mode == "active" and "decode" in counts and decision.decode < counts["decode"].replicas


def role_of(name: str) -> Role:
    if name not in ROLES:
        raise ValueError(f"role: expected one of {ROLES}, got {name!r}")
    return "prefill" if name == "prefill" else "decode"
