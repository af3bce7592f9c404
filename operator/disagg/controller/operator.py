"""The operator process: one kopf registry with the reconciler's and the autoscaler's handlers, each
registered explicitly with what it needs (``register(registry, context)``), from settings built by the CLI.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import kopf
from kubernetes.config.config_exception import ConfigException

from disagg.controller import autoscaler, handlers
from disagg.controller.gate import ReconcileGate
from disagg.controller.handlers import ReconcileContext
from disagg.controller.metrics import AutoscalingMetrics, create_metrics, serve_metrics
from disagg.controller.reconcile import Reconciler
from disagg.controller.settings import ControllerSettings
from disagg.k8s.apply import DEPLOYMENT_LABEL
from disagg.k8s.client import KubeApi, load_api_client

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunOptions:
    """How to run: what to watch, peering, probes, metrics."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    standalone: bool = True
    peering_name: str | None = None
    peering_priority: int | None = None
    peering_lifetime_s: int | None = None
    liveness_endpoint: str | None = None
    metrics_port: int | None = None
    metrics_host: str = "0.0.0.0"
    settings: ControllerSettings = field(default_factory=ControllerSettings)


def kopf_settings(options: RunOptions) -> kopf.OperatorSettings:
    """kopf's settings from ours: annotation-only persistence (status stays ours), timeouts, peering."""
    settings = kopf.OperatorSettings()
    ours = options.settings
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ours.annotations_prefix)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ours.annotations_prefix, key="last-handled-configuration"
    )
    settings.persistence.finalizer = ours.finalizer
    settings.posting.level = logging.getLevelName(ours.kopf_event_level)
    settings.watching.server_timeout = ours.watch_server_timeout_s
    settings.watching.client_timeout = ours.watch_client_timeout_s
    settings.execution.max_workers = ours.max_workers
    settings.queueing.idle_timeout = ours.watch_worker_idle_s
    # Children are watched only for drift: ask the API server for those carrying the deployment label (every
    # rendered child has it; the pruner finds children by it too), not every Deployment, Service and
    # ConfigMap in the cluster. A child whose label is removed leaves the selection, which the watch
    # reports as DELETED, and the reconcile that follows puts the label back.
    for resource in handlers.CHILD_RESOURCES:
        settings.watching.label_selectors[resource] = DEPLOYMENT_LABEL
    if options.peering_lifetime_s is not None:
        settings.peering.lifetime = options.peering_lifetime_s
    return settings


def run_operator(options: RunOptions) -> int:
    """Run until interrupted; the exit code."""
    try:
        api_client = load_api_client(connections=options.settings.api_connections)
    except ConfigException as error:
        raise SystemExit(
            "disagg run: no Kubernetes credentials: set KUBECONFIG (or ~/.kube/config), "
            f"or run in a pod with a service account ({error})"
        ) from error
    api = KubeApi(api_client, request_timeout_s=options.settings.request_timeout_s)
    metrics = create_metrics()
    reconciler = Reconciler(api, options.settings, metrics)
    registry = kopf.OperatorRegistry()
    # a fresh registry has no login handler (kopf's default one adds them): log in as the client we use
    kopf.on.login(registry=registry)(kopf.login_via_client)
    settings = kopf_settings(options)
    context = ReconcileContext(reconciler, ReconcileGate(), options.settings, settings.execution.executor)
    handlers.register(registry, context)
    autoscaling = AutoscalingMetrics.create(metrics.registry)
    autoscaler.register(
        registry, autoscaler.Autoscaler.create(api, options.settings.autoscaling, autoscaling)
    )
    if options.metrics_port is not None:
        serve_metrics(metrics.registry, options.metrics_port, options.metrics_host)
        log.info("metrics on http://%s:%d/metrics", options.metrics_host, options.metrics_port)
    kopf.run(
        registry=registry,
        settings=settings,
        standalone=options.standalone,
        peering_name=options.peering_name,
        priority=options.peering_priority,
        liveness_endpoint=options.liveness_endpoint,
        clusterwide=options.all_namespaces,
        namespaces=list(options.namespaces),
    )
    return 0
