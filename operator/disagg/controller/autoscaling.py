"""The autoscaling loop: evaluate each DisaggregatedDeployment's RatioPolicy and record the decision.

A kopf timer ticks at a small base interval and evaluates a deployment when its policy's
``evaluationInterval`` has passed since ``status.autoscaling.lastEvaluationTime`` (kopf timers have a
fixed interval; a policy's interval is data). Each evaluation:

1. reads the RatioPolicy named by ``spec.autoscaling.policyRef``;
2. builds an Observation: replica/ready/pending counts from the child Deployments and their pods,
   latencies and load from Prometheus through :mod:`disagg.metrics`;
3. calls the pure :func:`disagg.policy.decide` with the deployment's bounds: replica ranges, GPUs, its
   serving profile (model, GPU, TP, dtype, read as ``disagg simulate`` reads them) and each role's
   replica start-up, measured on the role's own pods (creation to Ready) or else estimated from the spec
   (:mod:`disagg.perf.startup`: weights cached or downloaded), which the ScalingActive condition reports;
4. writes ``status.autoscaling`` (policy, mode, desiredReplicas, lastEvaluationTime, lastEvaluation --
   the latest evaluation's target and cause even when it changed nothing --, the last decisions)
   and the conditions MetricsAvailable, ScalingActive and ScalingLimited, and posts an Event for every
   change. The reconciler stays the only writer of child replica counts: it reads desiredReplicas.

Before a decode scale-down it sets ``controller.kubernetes.io/pod-deletion-cost`` on the decode pods from
their running requests, so the ReplicaSet removes the least-loaded pods first (they then drain gracefully).
Pods that stay Pending as Unschedulable past a grace period set a replica ceiling for their role
(``PolicyState.limited``) and the ScalingLimited condition, instead of piling up more Pending pods.

Per-object state (the PolicyState between evaluations) lives in kopf's per-object ``memo``; everything a
restart must not lose lives in status. The part of the PolicyState worth keeping (rate history, learned
corrections, error-budget spend, recent moves) is written to ``status.autoscaling.policyMemory`` after
every evaluation and read back when the memo has none (:mod:`disagg.policy.memory`), so a restarted
operator does not start blind. The functions above the handler section are pure.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

import kopf
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from pydantic import ValidationError

from disagg.api.deployment import MAX_STATUS_DECISIONS
from disagg.api.ratiopolicy import RatioPolicy, RatioPolicySpec
from disagg.controller.metrics import ControllerMetrics
from disagg.k8s.client import DEPLOYMENT, DISAGG_DEPLOYMENT, MERGE_PATCH, POD, Kind, KubeApi, load_api_client
from disagg.k8s.events import post_event
from disagg.metrics.prometheus import PrometheusSignals
from disagg.metrics.queries import ENGINE_METRICS, TARGET_LABELS, Engine, gauge_sum_by, selector
from disagg.policy import decide
from disagg.policy.memory import from_memory, memory_patch, to_memory
from disagg.policy.types import (
    ROLES,
    Bounds,
    Decision,
    Observation,
    PolicyState,
    Role,
    RoleBounds,
    RoleObservation,
    ServingProfile,
)

# Source: Kubernetes ReplicaSet pod-deletion-cost annotation (beta since v1.22), "Pods with lower
# deletion cost are preferred to be deleted before pods with higher deletion cost".
# https://kubernetes.io/docs/reference/labels-annotations-taints/#pod-deletion-cost
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"

CONDITION_METRICS = "MetricsAvailable"
CONDITION_ACTIVE = "ScalingActive"
CONDITION_LIMITED = "ScalingLimited"


def decisions_kept(value: float) -> int:
    """DISAGG_AUTOSCALING_MAX_DECISIONS as a count within the CRD's maxItems (a larger one would make
    every status write fail validation)."""
    count = int(value)
    if count > MAX_STATUS_DECISIONS:
        raise ValueError(
            f"DISAGG_AUTOSCALING_MAX_DECISIONS: at most {MAX_STATUS_DECISIONS} "
            f"(status.autoscaling.decisions maxItems), got {count}"
        )
    return max(count, 1)


@dataclass(frozen=True)
class AutoscalingSettings:
    """Knobs of the loop itself (the policy's own knobs live in the RatioPolicy)."""

    tick_s: float = 2.0  # base timer interval; evaluations happen on the policy's interval
    pending_grace_s: float = 60.0  # how long an added pod may stay Unschedulable before the role is limited
    max_decisions: int = MAX_STATUS_DECISIONS  # decisions kept in status, newest first (the CRD's maxItems)
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
            max_decisions=decisions_kept(number("DISAGG_AUTOSCALING_MAX_DECISIONS", defaults.max_decisions)),
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
    created: float | None = None  # metadata.creationTimestamp
    ready_since: float | None = None  # lastTransitionTime of the Ready condition, while it is True


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
        created=parse_rfc3339(metadata.get("creationTimestamp")),
        ready_since=(
            parse_rfc3339(ready.get("lastTransitionTime"))
            if ready is not None and ready.get("status") == "True"
            else None
        ),
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


# ---------------------------------------------------------------------------------------------- start-up

STARTUP_SAMPLE_PODS = 3  # a role's start-up is the median over its most recently created Ready pods


def pod_startup_s(pod: PodInfo) -> float | None:
    """Seconds from the pod's creation to its turning Ready; None while it is not Ready (or has no
    timestamps). Both are second-precision API timestamps."""
    if pod.created is None or pod.ready_since is None or pod.ready_since < pod.created:
        return None
    return pod.ready_since - pod.created


def measured_startup_s(
    pods: Sequence[PodInfo], sample: int = STARTUP_SAMPLE_PODS
) -> tuple[float, int] | None:
    """The start-up measured on a role's own pods, and how many pods it is from: the median time from
    creation to Ready of the ``sample`` most recently created pods that are Ready. None: no pod is Ready.

    Creation to Ready is what the policy waits through after asking for a replica: scheduling (and node
    provisioning), image pull, the weights fetched or read, engine start. A pod whose Ready condition
    flipped back and forth since counts from its last flip; the median of the newest pods keeps one such
    pod from setting the value.
    """
    timed = sorted(
        ((p.created or 0.0, seconds) for p in pods if (seconds := pod_startup_s(p)) is not None),
        reverse=True,
    )
    recent = [seconds for _, seconds in timed[:sample]]
    if not recent:
        return None
    return float(statistics.median(recent)), len(recent)


@dataclass(frozen=True)
class SpecServing:
    """What the deployment's spec says about serving: the model-based algorithm's profile, and the
    twin's start-up estimate of one replica (None without a twin profile of the model)."""

    profile: ServingProfile
    startup_s: float | None
    cached: bool  # spec.model.cache (or a pvc source): replicas read the weights from a volume


def spec_serving(spec: Mapping[str, Any]) -> SpecServing | None:
    """Model, GPU, TP and dtype read from a DisaggregatedDeployment spec (dict as served) exactly as
    ``disagg simulate`` reads them (disagg.twin.sim.SimDeployment), and the start-up estimate of
    disagg.perf.startup; None when the spec does not validate or names no model."""
    from disagg.perf.startup import spec_startup_delay_s, weights_cached
    from disagg.twin.sim import SimDeployment  # pure; imported when first needed

    document = {
        "apiVersion": "disagg.dev/v1alpha1",
        "kind": "DisaggregatedDeployment",
        "metadata": {"name": "policy"},
        "spec": dict(spec),
    }
    try:
        dep = SimDeployment.from_dict(document)
    except ValueError:  # pydantic's ValidationError is a ValueError
        return None
    if dep.prefill is None or dep.decode is None:
        return None
    profile = ServingProfile(dep.model, dep.gpu, dep.prefill.tp, dep.decode.tp, dep.dtype)
    try:
        startup: float | None = spec_startup_delay_s(spec, dep.dtype)
    except (ValueError, KeyError):  # the twin has no profile of the model
        startup = None
    return SpecServing(profile, startup, weights_cached(spec))


@dataclass(frozen=True)
class StartupEstimate:
    """One role's replica start-up for the policy (RoleBounds.startup_seconds), and where it is from."""

    seconds: float
    source: Literal["measured", "spec"]
    detail: str  # for people

    def describe(self, role: str) -> str:
        return f"{role} {self.seconds:.0f} s ({self.detail})"


def role_startup(pods: Sequence[PodInfo], serving: SpecServing | None) -> StartupEstimate | None:
    """Measured on the role's own pods when one is Ready, else the spec's estimate, else None."""
    measured = measured_startup_s(pods)
    if measured is not None:
        seconds, count = measured
        what = "pod" if count == 1 else f"median of {count} pods"
        return StartupEstimate(seconds, "measured", f"measured: {what}, creation to Ready")
    if serving is not None and serving.startup_s is not None:
        how = "weights read from the model cache" if serving.cached else "every replica downloads the weights"
        return StartupEstimate(serving.startup_s, "spec", f"estimate: {how}")
    return None


def role_startups(
    serving: SpecServing | None, pods: Mapping[str, Sequence[PodInfo]]
) -> dict[Role, StartupEstimate | None]:
    return {role: role_startup(pods.get(role, ()), serving) for role in ROLES}


def startup_message(startups: Mapping[Role, StartupEstimate | None]) -> str:
    """The start-up the policy plans with, for the ScalingActive condition."""
    known = [e.describe(role) for role, e in startups.items() if e is not None]
    unknown = [role for role, e in startups.items() if e is None]
    parts = [*known, *(f"{role} unknown (no pod Ready yet, no estimate for the model)" for role in unknown)]
    return "replica start-up: " + ", ".join(parts)


# ---------------------------------------------------------------------------------------------- status


MAX_MESSAGE = 1000  # status and Event messages are for people; keep them readable (and under API limits)


def decision_message(decision: Decision) -> str:
    if not decision.reasons:
        return "no change: SLOs met within the tolerance band"
    text = "; ".join(r.message for r in decision.reasons)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


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
        if reason.code in ("ScalingLimited", "BudgetClamp", "StepCapped"):
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


def current_replicas(counts: Mapping[str, RoleCounts]) -> dict[str, int]:
    return {role: c.replicas for role, c in counts.items()}


def decode_scale_down(decision: Decision, counts: Mapping[str, RoleCounts], mode: str) -> bool:
    return mode == "active" and "decode" in counts and decision.decode < counts["decode"].replicas


# ---------------------------------------------------------------------------------------------- I/O
# Everything below talks to the API server (through disagg.k8s) or Prometheus (through disagg.metrics).

T = TypeVar("T")
log = logging.getLogger(__name__)
RATIO_POLICY = Kind("disagg.dev/v1alpha1", "RatioPolicy", "ratiopolicies")
DEFAULT_SETTINGS = AutoscalingSettings.from_env()


class SignalSource(Protocol):
    """What the loop needs from Prometheus (implemented over :mod:`disagg.metrics`)."""

    def observe(
        self,
        deployment: Mapping[str, Any],
        roles: Mapping[Role, RoleObservation],
        policy: RatioPolicySpec,
        now: float,
    ) -> Observation: ...

    def running_per_pod(
        self, deployment: Mapping[str, Any], role: Role, policy: RatioPolicySpec
    ) -> dict[str, float | None]: ...


def running_by_pod_query(engine: str, namespace: str, deployment: str, role: Role) -> str:
    """PromQL: requests running per pod of one pool (the load that orders decode pods for removal)."""
    metrics = ENGINE_METRICS[Engine(engine)]
    sel = selector(namespace, deployment, role, TARGET_LABELS)
    return gauge_sum_by(metrics.running, TARGET_LABELS.pod, sel)


def loads_from_result(result: object) -> dict[str, float | None]:
    """pod -> value from an instant-vector result; NaN or unparsable values are unknown (None)."""
    loads: dict[str, float | None] = {}
    for series in result if isinstance(result, list) else []:
        try:
            pod = str(series["metric"][TARGET_LABELS.pod])
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        loads[pod] = value if math.isfinite(value) else None
    return loads


@dataclass(frozen=True)
class PrometheusSignalSource:
    """The SignalSource over disagg.metrics' Prometheus adapter."""

    adapter: PrometheusSignals

    def observe(
        self,
        deployment: Mapping[str, Any],
        roles: Mapping[Role, RoleObservation],
        policy: RatioPolicySpec,
        now: float,
    ) -> Observation:
        metadata = deployment["metadata"]
        observation, signals = self.adapter.observe(
            engine_of(deployment),
            metadata["namespace"],
            metadata["name"],
            {str(role): pool for role, pool in roles.items()},
            policy.slo.ttft.percentile,
            policy.slo.itl.percentile,
            policy.metric_window_seconds,
            now,
        )
        if signals.errors:
            log.warning(
                "%s/%s: Prometheus queries failed: %s",
                metadata["namespace"],
                metadata["name"],
                signals.errors,
            )
        return observation

    def running_per_pod(
        self, deployment: Mapping[str, Any], role: Role, policy: RatioPolicySpec
    ) -> dict[str, float | None]:
        metadata = deployment["metadata"]
        query = running_by_pod_query(engine_of(deployment), metadata["namespace"], metadata["name"], role)
        try:
            return loads_from_result(self.adapter.client().custom_query(query))
        except Exception as error:  # Prometheus down: every pod's load is unknown (never zero)
            log.warning("per-pod load query failed: %s", error)
            return {}


def engine_of(deployment: Mapping[str, Any]) -> str:
    return str(((deployment.get("spec") or {}).get("engine") or {}).get("type") or "vllm")


def prometheus_signals(url: str) -> PrometheusSignalSource:
    return PrometheusSignalSource(PrometheusSignals(url))


@dataclass(frozen=True)
class Runtime:
    """What the handlers share for the operator's lifetime (kept in kopf's operator memo)."""

    kube: KubeApi
    settings: AutoscalingSettings
    signals: SignalSource | None
    metrics: AutoscalingMetrics


def autoscaling_enabled(spec: Mapping[str, Any], **_: Any) -> bool:
    """kopf ``when`` filter: only deployments with spec.autoscaling.enabled get the timer's work."""
    auto = spec.get("autoscaling") or {}
    return bool(auto.get("enabled"))


def role_bounds(spec: Mapping[str, Any], role: Role, startup_seconds: float | None = None) -> RoleBounds:
    auto = spec.get("autoscaling") or {}
    role_spec = spec.get(role) or {}
    limits = auto.get(role) or {}
    replicas = int(role_spec.get("replicas", 1))
    return RoleBounds(
        min_replicas=int(limits.get("minReplicas", replicas)),
        max_replicas=int(limits.get("maxReplicas", max(replicas, 1))),
        gpus_per_replica=int(role_spec.get("tensorParallelSize", 1)),
        startup_seconds=startup_seconds,
    )


def bounds_from(
    spec: Mapping[str, Any],
    serving: SpecServing | None,
    startups: Mapping[Role, StartupEstimate | None],
) -> Bounds:
    """The policy bounds from a DisaggregatedDeployment spec (dict as served), its serving profile and
    each role's start-up."""
    auto = spec.get("autoscaling") or {}
    max_gpus = auto.get("maxGPUs")

    def startup(role: Role) -> float | None:
        estimate = startups.get(role)
        return estimate.seconds if estimate is not None else None

    return Bounds(
        prefill=role_bounds(spec, "prefill", startup("prefill")),
        decode=role_bounds(spec, "decode", startup("decode")),
        max_gpus=int(max_gpus) if max_gpus is not None else None,
        profile=serving.profile if serving is not None else None,
    )


def bounds_of(spec: Mapping[str, Any], pods: Mapping[str, Sequence[PodInfo]] | None = None) -> Bounds:
    """The policy bounds from a DisaggregatedDeployment spec (dict as served): replica ranges, GPUs, the
    serving profile (model, GPU, TP, dtype) and each role's start-up, measured on ``pods`` (role ->
    the role's pods) when one is Ready, else the spec's estimate."""
    serving = spec_serving(spec)
    return bounds_from(spec, serving, role_startups(serving, pods or {}))


def read_role(
    kube: KubeApi, namespace: str, name: str, role: Role, grace_s: float, now: float
) -> tuple[RoleCounts, list[PodInfo]] | None:
    """Replicas from the child Deployment, ready/pending/stuck from its pods; None before it exists."""
    child = kube.get(DEPLOYMENT, namespace, f"{name}-{role}")
    if child is None:
        return None
    replicas = int((child.get("spec") or {}).get("replicas", 0))
    selector = f"disagg.dev/deployment={name},disagg.dev/role={role}"
    pods = [pod_info(p) for p in kube.list(POD, namespace, selector)]
    return role_counts(replicas, pods, grace_s, now), pods


def set_deletion_costs(kube: KubeApi, namespace: str, costs: Mapping[str, int]) -> None:
    """Annotate each pod with its deletion cost (a merge patch: other annotations are kept)."""
    for pod, cost in costs.items():
        body = {"metadata": {"annotations": {POD_DELETION_COST: str(cost)}}}
        try:
            kube.request("PATCH", POD.path(namespace, pod), body=body, content_type=MERGE_PATCH)
        except ApiException as error:
            if error.status != 404:  # a pod that is already gone needs no cost
                raise


@dataclass(frozen=True)
class ConditionUpdate:
    kind: str
    status: bool
    reason: str
    message: str
    now: float


def fresh_object(kube: KubeApi, body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object as the API server has it now (kopf's body may predate our own last status write)."""
    metadata = body["metadata"]
    return kube.get(DISAGG_DEPLOYMENT, metadata["namespace"], metadata["name"]) or body


def write_status(
    kube: KubeApi, body: Mapping[str, Any], autoscaling: Mapping[str, Any], updates: Sequence[ConditionUpdate]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Merge-patch status.autoscaling and our conditions over a fresh read (other conditions are kept).

    Returns the conditions before and after.
    """
    metadata = body["metadata"]
    fresh = fresh_object(kube, body)
    before = list((fresh.get("status") or {}).get("conditions") or [])
    generation = (fresh.get("metadata") or {}).get("generation")
    after = before
    for update in updates:
        after = set_condition(
            after, update.kind, update.status, update.reason, update.message, update.now, generation
        )
    kube.merge_patch_status(
        DISAGG_DEPLOYMENT,
        metadata["namespace"],
        metadata["name"],
        {"autoscaling": dict(autoscaling), "conditions": after},
    )
    return before, after


def report_inactive(rt: Runtime, body: Mapping[str, Any], reason: str, message: str, now: float) -> None:
    """ScalingActive=False (no policy, invalid policy): recorded once, with an Event when it flips."""
    status = body.get("status") or {}
    previous = {c.get("type"): c for c in status.get("conditions") or []}.get(CONDITION_ACTIVE) or {}
    if previous.get("status") == "False" and previous.get("reason") == reason:
        return
    auto = dict(status.get("autoscaling") or {})
    auto["lastEvaluationTime"] = rfc3339(now)
    update = ConditionUpdate(CONDITION_ACTIVE, False, reason, message, now)
    write_status(rt.kube, body, auto, [update])
    post_event(rt.kube, body, reason, message, "Warning")


def cached_serving(
    memo: MutableMapping[str, Any], generation: object, spec: Mapping[str, Any]
) -> SpecServing | None:
    """:func:`spec_serving` once per spec generation (it validates the whole spec), not per evaluation."""
    cached = memo.get("serving")
    if isinstance(cached, tuple) and generation is not None and cached[0] == generation:
        value: SpecServing | None = cached[1]
        return value
    serving = spec_serving(spec)
    memo["serving"] = (generation, serving)
    return serving


def policy_state(memo: Mapping[str, Any], status: Mapping[str, Any], now: float) -> PolicyState:
    """The PolicyState to evaluate from: the memo's, or after an operator restart (nothing in the memo)
    the one remembered in ``status.autoscaling.policyMemory`` (see :mod:`disagg.policy.memory`)."""
    state = memo.get("policy_state")
    if isinstance(state, PolicyState):
        return state
    return from_memory((status.get("autoscaling") or {}).get("policyMemory"), now)


def evaluate(
    rt: Runtime, body: Mapping[str, Any], memo: MutableMapping[str, Any], now: float
) -> Decision | None:
    """One evaluation of one deployment, if due. Returns the decision (None when not due or no policy)."""
    metadata, spec = body["metadata"], body.get("spec") or {}
    namespace, name = metadata["namespace"], metadata["name"]
    status = body.get("status") or {}
    policy_name = ((spec.get("autoscaling") or {}).get("policyRef") or {}).get("name")
    policy_obj = rt.kube.get(RATIO_POLICY, namespace, policy_name) if policy_name else None
    if policy_obj is None:
        report_inactive(
            rt, body, "PolicyNotFound", f"RatioPolicy {policy_name!r} not found in {namespace}", now
        )
        return None
    try:
        policy = RatioPolicy.model_validate(policy_obj).spec
    except ValidationError as error:
        report_inactive(rt, body, "InvalidPolicy", f"RatioPolicy {policy_name}: {error}", now)
        return None
    last = memo.get("last_evaluation")
    if last is None:
        last = parse_rfc3339((status.get("autoscaling") or {}).get("lastEvaluationTime"))
    if not is_due(last, float(policy.evaluation_interval_seconds), now):
        return None
    started = time.monotonic()
    counts: dict[str, RoleCounts] = {}
    pods: dict[str, list[PodInfo]] = {}
    for role in ROLES:
        found = read_role(rt.kube, namespace, name, role, rt.settings.pending_grace_s, now)
        if found is None:
            return None  # the reconciler has not created the pools yet: nothing to decide from
        counts[role], pods[role] = found
    memo["last_evaluation"] = now
    status = fresh_object(rt.kube, body).get("status") or {}
    role_obs: dict[Role, RoleObservation] = {}
    serving = cached_serving(memo, (body.get("metadata") or {}).get("generation"), spec)
    startups = role_startups(serving, pods)
    bounds = bounds_from(spec, serving, startups)
    for role in ROLES:
        c = counts[role]
        role_obs[role] = RoleObservation(
            replicas=c.replicas,
            ready=c.ready,
            pending=c.pending,
            gpus_per_replica=bounds.role(role).gpus_per_replica,
        )
    if rt.signals is not None:
        observation = rt.signals.observe(body, role_obs, policy, now)
    else:
        observation = Observation(time=now, prefill=role_obs["prefill"], decode=role_obs["decode"])

    state = policy_state(memo, status, now)
    state, newly_limited = update_limits(state, counts, now, float(policy.pending_backoff_seconds))
    decision, state = decide(observation, policy, state, now, bounds)
    decision, clamped = apply_ceiling(decision, state.limited)
    memo["policy_state"] = state
    mode = policy.mode.value
    current = current_replicas(counts)

    if decode_scale_down(decision, counts, mode) and rt.signals is not None:
        loads = rt.signals.running_per_pod(body, "decode", policy)
        live = {p.name: loads.get(p.name) for p in pods["decode"] if not p.terminating}
        set_deletion_costs(rt.kube, namespace, deletion_costs(live))

    new_auto = autoscaling_status(
        status.get("autoscaling"), str(policy_name), mode, decision, current, now, rt.settings.max_decisions
    )
    new_auto["policyMemory"] = memory_patch(
        (status.get("autoscaling") or {}).get("policyMemory"), to_memory(state, now)
    )
    metrics_ok, metrics_reason, metrics_message = metrics_condition(observation)
    limited, limited_reason, limited_message = limited_condition(decision, state.limited, clamped)
    if mode == "active":
        active = (
            True,
            "PolicyEvaluated",
            f"RatioPolicy {policy_name} ({policy.algorithm.value}) decides replicas; "
            + startup_message(startups),
        )
    else:
        active = (
            False,
            "AdvisoryMode",
            f"RatioPolicy {policy_name} is advisory: decisions are recorded, not applied; "
            + startup_message(startups),
        )
    updates = [
        ConditionUpdate(CONDITION_METRICS, metrics_ok, metrics_reason, metrics_message, now),
        ConditionUpdate(CONDITION_ACTIVE, active[0], active[1], active[2], now),
        ConditionUpdate(CONDITION_LIMITED, limited, limited_reason, limited_message, now),
    ]
    before, after = write_status(rt.kube, body, new_auto, updates)
    history = (status.get("autoscaling") or {}).get("decisions") or []
    previous_target = dict(history[0]) if history else None
    for event in change_events(decision, current, mode, before, after, previous_target):
        post_event(
            rt.kube, body, event.reason, event.message, "Warning" if event.type == "Warning" else "Normal"
        )
    if newly_limited:
        log.info("%s/%s: roles limited by Pending pods: %s", namespace, name, newly_limited)
    rt.metrics.record(name, decision, current, seconds=time.monotonic() - started)
    return decision


@dataclass(frozen=True)
class AutoscalingMetrics:
    """The loop's metrics, on the operator's registry (disagg.controller.metrics serves it)."""

    decisions: Counter  # labels: deployment, reason (the decision's primary cause; NoChange included)
    desired: Gauge  # labels: deployment, role
    current: Gauge  # labels: deployment, role
    loop_seconds: Histogram  # labels: deployment

    @staticmethod
    def create(registry: CollectorRegistry) -> AutoscalingMetrics:
        return AutoscalingMetrics(
            decisions=Counter(
                "disagg_decisions",
                "Ratio policy decisions, by deployment and primary reason.",
                ["deployment", "reason"],
                registry=registry,
            ),
            desired=Gauge(
                "disagg_desired_replicas",
                "Replicas the ratio policy wants per role.",
                ["deployment", "role"],
                registry=registry,
            ),
            current=Gauge(
                "disagg_current_replicas",
                "Replicas of the child Deployment per role when the policy was evaluated.",
                ["deployment", "role"],
                registry=registry,
            ),
            loop_seconds=Histogram(
                "disagg_policy_loop_duration_seconds",
                "Wall time of one policy evaluation (API reads, Prometheus queries, decide, status write).",
                ["deployment"],
                registry=registry,
                buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            ),
        )

    def record(self, deployment: str, decision: Decision, current: Mapping[str, int], seconds: float) -> None:
        self.decisions.labels(deployment=deployment, reason=decision.cause).inc()
        for role in ROLES:
            self.desired.labels(deployment=deployment, role=role).set(decision.replicas(role))
            if role in current:
                self.current.labels(deployment=deployment, role=role).set(current[role])
        self.loop_seconds.labels(deployment=deployment).observe(seconds)


# ---------------------------------------------------------------------------------------------- kopf


class RuntimeSlot:
    """Holds the Runtime, built once at the first tick (after every startup handler has filled the memo).

    Lives in the operator memo; kopf gives every object a shallow copy of it, so all objects share one
    slot and one Runtime (one set of metrics on the registry).
    """

    def __init__(self, settings: AutoscalingSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._runtime: Runtime | None = None

    def get(self, memo: Mapping[str, Any]) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = build_runtime(memo, self.settings)
            return self._runtime


def _find(memo: Mapping[str, Any], kind: type[T]) -> T | None:
    return next((v for v in memo.values() if isinstance(v, kind)), None)


def build_runtime(memo: Mapping[str, Any], settings: AutoscalingSettings) -> Runtime:
    """The Runtime from what the operator put in its memo (KubeApi, metrics registry, Prometheus URL)."""
    kube = _find(memo, KubeApi) or KubeApi(load_api_client())
    controller_metrics = _find(memo, ControllerMetrics)
    registry = controller_metrics.registry if controller_metrics else _find(memo, CollectorRegistry)
    url = memo.get("prometheus_url") or settings.prometheus_url
    return Runtime(
        kube=kube,
        settings=settings,
        signals=prometheus_signals(str(url)) if url else None,
        metrics=AutoscalingMetrics.create(registry if registry is not None else CollectorRegistry()),
    )


@kopf.on.startup()
def prepare_autoscaling(memo: kopf.Memo, **_: Any) -> None:
    memo["autoscaling_slot"] = RuntimeSlot(DEFAULT_SETTINGS)


@kopf.timer(
    "disagg.dev",
    "v1alpha1",
    "disaggregateddeployments",
    id="autoscaling",
    interval=DEFAULT_SETTINGS.tick_s,
    when=autoscaling_enabled,
)
def autoscale(
    body: kopf.Body, memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any
) -> None:
    """Evaluate the deployment's RatioPolicy when its evaluation interval has passed."""
    slot = memo.get("autoscaling_slot")
    if not isinstance(slot, RuntimeSlot):
        slot = RuntimeSlot(DEFAULT_SETTINGS)
        memo["autoscaling_slot"] = slot
    decision = evaluate(slot.get(memo), body, memo, time.time())
    if decision is not None and decision.reasons:
        logger.info(
            "autoscaling: prefill=%d decode=%d (%s)", decision.prefill, decision.decode, decision.cause
        )
