"""Tunables of the reconciler, in one place (the handlers read them, never hard-code them)."""

from __future__ import annotations

from dataclasses import dataclass

from disagg.k8s.apply import FIELD_MANAGER


@dataclass(frozen=True)
class ControllerSettings:
    field_manager: str = FIELD_MANAGER
    # Safety net: every DisaggregatedDeployment is re-reconciled this often even if no watch event came.
    resync_interval_s: float = 60.0
    # Delay before kopf retries a reconcile that failed for a transient reason (API server hiccup).
    retry_delay_s: float = 5.0
    # Children applied concurrently within one apply wave.
    apply_concurrency: int = 4
    # Timeout of each API request the reconciler makes.
    request_timeout_s: float = 30.0
    # kopf's watch requests: how long the server keeps one open, and the client-side cap.
    watch_server_timeout_s: int = 300
    watch_client_timeout_s: int = 330
    # Prefix of the annotations where kopf keeps its handler progress and last-handled spec.
    annotations_prefix: str = "disagg.dev"
    # kopf puts this finalizer on objects with timers (resync, autoscaling) so it can stop them before the
    # object goes; delete DisaggregatedDeployments before uninstalling the operator.
    finalizer: str = "disagg.dev/finalizer"
    # kopf's own Events (handler succeeded/failed) below this level are not posted; ours always are.
    kopf_event_level: str = "WARNING"
    # Threads for the synchronous handlers (they do blocking Kubernetes I/O).
    max_workers: int = 8
