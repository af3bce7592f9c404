"""The operator's own Prometheus metrics (the reconciler's and the autoscaling loop's), on one registry.

Everything is built by :func:`create_metrics` on a registry the caller owns; nothing is registered at
import time, so tests and several operators in one process never collide.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from disagg.controller.scaling_status import CONDITION_ACTIVE, CONDITION_LIMITED, CONDITION_METRICS
from disagg.policy.types import ROLES, Decision

NAMESPACE = "disagg_operator"
SLOS = ("ttft", "itl")
CONDITIONS = (CONDITION_METRICS, CONDITION_ACTIVE, CONDITION_LIMITED)


@dataclass(frozen=True)
class ControllerMetrics:
    registry: CollectorRegistry
    reconciles: Counter  # labels: result = ok | degraded | error
    reconcile_seconds: Histogram
    child_changes: Counter  # labels: action = created | updated | pruned
    status_writes: Counter


def create_metrics(registry: CollectorRegistry | None = None) -> ControllerMetrics:
    """Metric objects on ``registry`` (a fresh one when None)."""
    registry = registry if registry is not None else CollectorRegistry()
    return ControllerMetrics(
        registry=registry,
        reconciles=Counter(
            "reconciles",
            "Reconciles of DisaggregatedDeployments, by result.",
            ["result"],
            namespace=NAMESPACE,
            registry=registry,
        ),
        reconcile_seconds=Histogram(
            "reconcile_duration_seconds",
            "Wall time of one reconcile (validate, render, apply, status).",
            namespace=NAMESPACE,
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        ),
        child_changes=Counter(
            "child_changes",
            "Children created, updated or pruned by the reconciler.",
            ["action"],
            namespace=NAMESPACE,
            registry=registry,
        ),
        status_writes=Counter(
            "status_writes",
            "Status patches of DisaggregatedDeployments (only written when the status changed).",
            namespace=NAMESPACE,
            registry=registry,
        ),
    )


@dataclass(frozen=True)
class AutoscalingMetrics:
    """The autoscaling loop's metrics, on the operator's registry."""

    decisions: Counter  # labels: deployment, reason (the decision's primary cause; NoChange included)
    desired: Gauge  # labels: deployment, role
    current: Gauge  # labels: deployment, role
    loop_seconds: Histogram  # labels: deployment
    # What the chart's PrometheusRule alerts on (charts/disagg-operator/templates/prometheusrule.yaml):
    slo_latency: Gauge  # labels: deployment, slo (ttft | itl); absent while the policy cannot read it
    slo_target: Gauge  # labels: deployment, slo
    condition: Gauge  # labels: deployment, condition (MetricsAvailable | ScalingActive | ScalingLimited)

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
            slo_latency=Gauge(
                "disagg_slo_latency_seconds",
                "TTFT and ITL users feel at the policy's SLO percentile, as the policy last read them "
                "(absent while Prometheus has no reading).",
                ["deployment", "slo"],
                registry=registry,
            ),
            slo_target=Gauge(
                "disagg_slo_target_seconds",
                "The RatioPolicy's TTFT and ITL targets (spec.slo.*.targetSeconds).",
                ["deployment", "slo"],
                registry=registry,
            ),
            condition=Gauge(
                "disagg_condition",
                "The autoscaling conditions of a deployment's status: 1 True, 0 False.",
                ["deployment", "condition"],
                registry=registry,
            ),
        )

    def record(
        self,
        deployment: str,
        decision: Decision,
        current: Mapping[str, int],
        seconds: float,
        *,
        latencies: Mapping[str, float | None] | None = None,
        targets: Mapping[str, float] | None = None,
        conditions: Mapping[str, bool] | None = None,
    ) -> None:
        """One evaluation. ``latencies`` and ``targets`` by SLO (ttft, itl; a None latency removes the
        series, so a missing reading is absent rather than stale), ``conditions`` by condition type."""
        self.decisions.labels(deployment=deployment, reason=decision.cause).inc()
        for role in ROLES:
            self.desired.labels(deployment=deployment, role=role).set(decision.replicas(role))
            if role in current:
                self.current.labels(deployment=deployment, role=role).set(current[role])
        self.loop_seconds.labels(deployment=deployment).observe(seconds)
        for slo, value in (latencies or {}).items():
            if value is None:
                with contextlib.suppress(KeyError):
                    self.slo_latency.remove(deployment, slo)
            else:
                self.slo_latency.labels(deployment=deployment, slo=slo).set(value)
        for slo, target in (targets or {}).items():
            self.slo_target.labels(deployment=deployment, slo=slo).set(target)
        for kind, status in (conditions or {}).items():
            self.condition.labels(deployment=deployment, condition=kind).set(1.0 if status else 0.0)

    def forget(self, deployment: str) -> None:
        """Remove a deleted deployment's SLO and condition series (else its last alert state would stay)."""
        series = [(g, slo) for g in (self.slo_latency, self.slo_target) for slo in SLOS]
        series += [(self.condition, kind) for kind in CONDITIONS]
        for gauge, label in series:
            with contextlib.suppress(KeyError):
                gauge.remove(deployment, label)


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``registry`` on http://host:port/metrics from a background thread."""
    start_http_server(port, addr=host, registry=registry)
