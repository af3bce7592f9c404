"""The operator's own Prometheus metrics, on one registry that other loops (autoscaling) add to.

Everything is built by :func:`create_metrics` on a registry the caller owns; nothing is registered at
import time, so tests and several operators in one process never collide.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

NAMESPACE = "disagg_operator"


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


def serve_metrics(registry: CollectorRegistry, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``registry`` on http://host:port/metrics from a background thread."""
    start_http_server(port, addr=host, registry=registry)
