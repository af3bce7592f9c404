"""The autoscaling loop: evaluate each DisaggregatedDeployment's RatioPolicy and record the decision.

A kopf timer ticks at a small base interval and evaluates a deployment when its policy's
``evaluationInterval`` has passed since ``status.autoscaling.lastEvaluationTime`` (kopf timers have a
fixed interval; a policy's interval is data). Each evaluation:

1. reads the RatioPolicy named by ``spec.autoscaling.policyRef``;
2. observes (:mod:`disagg.controller.observe`): the pools' replicas, Ready and Unschedulable pods and
   replica start-up from the API server, latencies and load from Prometheus, and the bounds of the
   deployment read as the API model (:func:`disagg.policy.bounds.bounds_for`, as ``disagg simulate``
   reads them);
3. calls the pure :func:`disagg.policy.decide` (which also learns the ceiling of a pool whose added pods
   stay Unschedulable past the grace period);
4. records (:mod:`disagg.controller.scaling_status`): ``status.autoscaling``, the conditions
   MetricsAvailable, ScalingActive and ScalingLimited, an Event for every change, and the metrics.
   The reconciler stays the only writer of child replica counts: it reads desiredReplicas.

Before a decode scale-down it sets ``controller.kubernetes.io/pod-deletion-cost`` on the decode pods from
their running requests, so the ReplicaSet removes the least-loaded pods first (they then drain gracefully).
A multi-node decode pool is a LeaderWorkerSet, whose groups go highest index first whatever their load (its
leaders are a StatefulSet's pods, which no deletion cost orders): there the leader's preStop and
termination grace drain the group, whose workers outlive the leader (they are deleted with it, by the
garbage collector, once it is gone).

Per-object state (the PolicyState between evaluations) lives in kopf's per-object ``memo``; what a
restart must not lose lives in status (``status.autoscaling.policyMemory``, :mod:`disagg.policy.memory`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import kopf
from pydantic import ValidationError

from disagg.api.common import parse_rfc3339
from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicy, RatioPolicySpec
from disagg.controller.metrics import AutoscalingMetrics
from disagg.controller.observe import (
    DeploymentReading,
    PrometheusSignalSource,
    SignalSource,
    cached_reading,
    observe,
    read_pools,
    startup_message,
)
from disagg.controller.pods import deletion_costs, set_deletion_costs
from disagg.controller.reconcile import format_validation_error
from disagg.controller.scaling_status import (
    active_condition,
    autoscaling_status,
    change_events,
    fresh_object,
    limited_condition,
    metrics_condition,
    post_events,
    report_inactive,
    write_status,
)
from disagg.controller.settings import AutoscalingSettings
from disagg.k8s.client import DISAGG_DEPLOYMENT, RATIO_POLICY, KubeApi
from disagg.metrics.prometheus import PrometheusSignals
from disagg.policy import decide
from disagg.policy.memory import from_memory, memory_patch, to_memory
from disagg.policy.types import ROLES, Decision, PolicyState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Autoscaler:
    """What the loop's handlers share for the operator's lifetime."""

    kube: KubeApi
    settings: AutoscalingSettings
    signals: SignalSource | None
    metrics: AutoscalingMetrics

    @staticmethod
    def create(kube: KubeApi, settings: AutoscalingSettings, metrics: AutoscalingMetrics) -> Autoscaler:
        """The loop over ``kube``, reading Prometheus at ``settings.prometheus_url`` (none: no signals)."""
        url = settings.prometheus_url
        access = settings.prometheus_access()
        signals = PrometheusSignalSource(PrometheusSignals(url, access=access)) if url else None
        return Autoscaler(kube, settings, signals, metrics)


def is_due(last_evaluation: float | None, interval_s: float, now: float) -> bool:
    """Whether an evaluation is due: never evaluated, or the interval has passed (clock skew: due)."""
    if last_evaluation is None:
        return True
    return now - last_evaluation >= interval_s or now < last_evaluation


def policy_state(memo: Mapping[str, Any], status: Mapping[str, Any], now: float) -> PolicyState:
    """The PolicyState to evaluate from: the memo's, or after an operator restart (nothing in the memo)
    the one remembered in ``status.autoscaling.policyMemory`` (see :mod:`disagg.policy.memory`)."""
    state = memo.get("policy_state")
    if isinstance(state, PolicyState):
        return state
    return from_memory((status.get("autoscaling") or {}).get("policyMemory"), now)


def with_deployment_mode(policy: RatioPolicySpec, dd: DisaggregatedDeployment) -> RatioPolicySpec:
    """The policy as this deployment runs it: spec.autoscaling.mode, when set, overrides the policy's mode
    for this deployment only (the decision's ``advisory`` flag, status, Events and whether replicas move
    all follow it)."""
    mode = dd.spec.autoscaling.mode if dd.spec.autoscaling is not None else None
    return policy if mode is None or mode == policy.mode else policy.model_copy(update={"mode": mode})


def evaluate(
    auto: Autoscaler, body: Mapping[str, Any], memo: MutableMapping[str, Any], now: float
) -> Decision | None:
    """One evaluation of one deployment, if due. Returns the decision (None when not due or no policy)."""
    metadata, spec = body["metadata"], body.get("spec") or {}
    namespace, name = metadata["namespace"], metadata["name"]
    status = body.get("status") or {}
    policy_name = ((spec.get("autoscaling") or {}).get("policyRef") or {}).get("name")
    policy_obj = auto.kube.get(RATIO_POLICY, namespace, policy_name) if policy_name else None
    if policy_obj is None:
        message = f"RatioPolicy {policy_name!r} not found in {namespace}"
        report_inactive(auto.kube, body, "PolicyNotFound", message, now)
        return None
    try:
        policy = RatioPolicy.model_validate(policy_obj).spec
    except ValidationError as error:
        report_inactive(auto.kube, body, "InvalidPolicy", f"RatioPolicy {policy_name}: {error}", now)
        return None
    reading = cached_reading(memo, body)
    if not isinstance(reading, DeploymentReading):
        report_inactive(auto.kube, body, "InvalidSpec", format_validation_error(reading), now)
        return None
    policy = with_deployment_mode(policy, reading.dd)
    last = memo.get("last_evaluation")
    if last is None:
        last = parse_rfc3339((status.get("autoscaling") or {}).get("lastEvaluationTime"))
    if not is_due(last, float(policy.evaluation_interval_seconds), now):
        return None
    started = time.monotonic()
    pools = read_pools(auto.kube, reading.dd)
    if pools is None:
        return None  # the reconciler has not created the pools yet: nothing to decide from
    memo["last_evaluation"] = now
    status = fresh_object(auto.kube, body).get("status") or {}
    observation, bounds, startups, failure = observe(auto.signals, reading, pools, policy, now)
    state = policy_state(memo, status, now)
    decision, state = decide(
        observation, policy, state, now, bounds, pending_grace_s=auto.settings.pending_grace_s
    )
    memo["policy_state"] = state
    mode = policy.mode.value
    current: dict[str, int] = {role: pools[role].replicas for role in ROLES}

    # pod-deletion-cost orders a ReplicaSet's pods only: a LeaderWorkerSet removes its highest groups
    scale_down = decision.decode < current["decode"] and not pools["decode"].multi_node
    if mode == "active" and scale_down and auto.signals is not None:
        loads = auto.signals.running_per_pod(reading.dd, "decode")
        live = {p.name: loads.get(p.name) for p in pools["decode"].pods if not p.terminating}
        set_deletion_costs(auto.kube, namespace, deletion_costs(live))

    previous = status.get("autoscaling") or {}
    new_auto = autoscaling_status(
        previous, str(policy_name), mode, decision, current, now, auto.settings.max_decisions
    )
    new_auto["policyMemory"] = memory_patch(previous.get("policyMemory"), to_memory(state, now))
    updates = [
        metrics_condition(observation, failure),
        active_condition(str(policy_name), policy.algorithm.value, mode, startup_message(startups)),
        limited_condition(decision, state.limited),
    ]
    before, after = write_status(auto.kube, body, new_auto, updates, now)
    history = previous.get("decisions") or []
    previous_target = dict(history[0]) if history else None
    post_events(auto.kube, body, change_events(decision, current, mode, before, after, previous_target))
    auto.metrics.record(
        name,
        decision,
        current,
        seconds=time.monotonic() - started,
        latencies={"ttft": observation.ttft.value, "itl": observation.itl.value},
        targets={"ttft": policy.slo.ttft.target_seconds, "itl": policy.slo.itl.target_seconds},
        conditions={update.kind: update.status for update in updates},
    )
    return decision


def autoscaling_enabled(spec: Mapping[str, Any], **_: Any) -> bool:
    """kopf ``when`` filter: only deployments with spec.autoscaling.enabled get the timer's work."""
    return bool((spec.get("autoscaling") or {}).get("enabled"))


def register(registry: kopf.OperatorRegistry, auto: Autoscaler) -> None:
    """Register the autoscaling timer on ``registry``."""

    def autoscale(
        body: kopf.Body, memo: Any, logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any
    ) -> None:
        """Evaluate the deployment's RatioPolicy when its evaluation interval has passed."""
        try:
            decision = evaluate(auto, body, memo, time.time())
        except OSError as error:  # the API server unreachable (k8s.client.ApiUnreachable): one line, retried
            raise kopf.TemporaryError(f"autoscaling: {error}", delay=auto.settings.tick_s) from error
        if decision is not None and decision.reasons:
            logger.info(
                "autoscaling: prefill=%d decode=%d (%s)", decision.prefill, decision.decode, decision.cause
            )

    group, version, plural = DISAGG_DEPLOYMENT.resource
    kopf.timer(
        group,
        version,
        plural,
        registry=registry,
        id="autoscaling",
        interval=auto.settings.tick_s,
        when=autoscaling_enabled,
    )(autoscale)

    def forget_deleted(event: Mapping[str, Any], body: Mapping[str, Any], **_: Any) -> None:
        if event.get("type") == "DELETED":
            auto.metrics.forget(str((body.get("metadata") or {}).get("name", "")))

    kopf.on.event(group, version, plural, registry=registry, id="autoscaling-metrics")(forget_deleted)
