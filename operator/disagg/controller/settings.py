"""The operator's settings, typed and validated (pydantic-settings): built once by ``disagg run`` from
the environment and its flags, then passed to the handlers, which never read the environment.

Environment variables (the chart and ``disagg demo`` set them): ``DISAGG_<FIELD>`` for the reconciler's
fields, ``DISAGG_AUTOSCALING_<FIELD>`` for the autoscaling loop's, and ``DISAGG_PROMETHEUS_URL`` with
how to reach it: ``DISAGG_PROMETHEUS_CA_FILE``, ``DISAGG_PROMETHEUS_BEARER_TOKEN_FILE``,
``DISAGG_PROMETHEUS_HEADERS`` (a JSON object) and ``DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from disagg.api.deployment import MAX_STATUS_DECISIONS
from disagg.k8s.apply import FIELD_MANAGER
from disagg.metrics.prometheus import PrometheusAccess
from disagg.policy.engine import PENDING_GRACE_S


class AutoscalingSettings(BaseSettings):
    """Knobs of the autoscaling loop itself (the policy's own knobs live in the RatioPolicy)."""

    model_config = SettingsConfigDict(
        env_prefix="DISAGG_AUTOSCALING_", frozen=True, extra="ignore", populate_by_name=True
    )

    # base timer interval; evaluations happen on each policy's evaluationIntervalSeconds
    tick_s: float = Field(default=2.0, gt=0)
    # how long an added pod may stay Unschedulable before its pool is limited
    pending_grace_s: float = Field(default=PENDING_GRACE_S, gt=0)
    # decisions kept in status, newest first; at most the CRD's maxItems (a longer list fails every write)
    max_decisions: int = Field(default=MAX_STATUS_DECISIONS, ge=1, le=MAX_STATUS_DECISIONS)
    # Prometheus the loop reads its signals from; None: no signals (the policy holds, fail-static)
    prometheus_url: str | None = Field(default=None, validation_alias="DISAGG_PROMETHEUS_URL")
    # TLS: verified against the system CAs, or this CA bundle (PEM); turning verification off is explicit
    prometheus_ca_file: str | None = Field(default=None, validation_alias="DISAGG_PROMETHEUS_CA_FILE")
    prometheus_insecure_skip_verify: bool = Field(
        default=False, validation_alias="DISAGG_PROMETHEUS_INSECURE_SKIP_VERIFY"
    )
    # a file holding the bearer token (the chart mounts it from a Secret), re-read for every evaluation
    prometheus_bearer_token_file: str | None = Field(
        default=None, validation_alias="DISAGG_PROMETHEUS_BEARER_TOKEN_FILE"
    )
    # extra headers on every request (e.g. X-Scope-OrgID for a multi-tenant Prometheus); kept out of repr
    prometheus_headers: dict[str, str] = Field(
        default_factory=dict, validation_alias="DISAGG_PROMETHEUS_HEADERS", repr=False
    )

    def prometheus_access(self) -> PrometheusAccess:
        return PrometheusAccess(
            ca_file=self.prometheus_ca_file,
            insecure_skip_verify=self.prometheus_insecure_skip_verify,
            bearer_token_file=self.prometheus_bearer_token_file,
            headers=tuple(sorted(self.prometheus_headers.items())),
        )


class ControllerSettings(BaseSettings):
    """Tunables of the reconciler and the autoscaling loop (handlers read them, never hard-code them)."""

    model_config = SettingsConfigDict(env_prefix="DISAGG_", frozen=True, extra="ignore")

    field_manager: str = FIELD_MANAGER
    # Safety net: every DisaggregatedDeployment is re-reconciled this often even if no watch event came.
    resync_interval_s: float = Field(default=60.0, gt=0)
    # Delay before kopf retries a reconcile that failed for a transient reason (API server hiccup).
    retry_delay_s: float = Field(default=5.0, gt=0)
    # Children applied concurrently within one apply wave.
    apply_concurrency: int = Field(default=4, ge=1)
    # Timeout of each API request the reconciler makes.
    request_timeout_s: float = Field(default=30.0, gt=0)
    # kopf's watch requests: how long the server keeps one open, and the client-side cap.
    watch_server_timeout_s: int = Field(default=300, gt=0)
    watch_client_timeout_s: int = Field(default=330, gt=0)
    # Prefix of the annotations where kopf keeps its handler progress and last-handled spec.
    annotations_prefix: str = "disagg.dev"
    # kopf puts this finalizer on objects with timers (resync, autoscaling) so it can stop them before the
    # object goes; delete DisaggregatedDeployments before uninstalling the operator.
    finalizer: str = "disagg.dev/finalizer"
    # kopf's own Events (handler succeeded/failed) below this level are not posted; ours always are.
    kopf_event_level: str = "WARNING"
    # Threads for the synchronous handlers (they do blocking Kubernetes I/O).
    max_workers: int = Field(default=8, ge=1)
    # kopf keeps a worker (and the last event body it got) per watched object until no event came for this
    # long; its default is 5 s. Our watch handlers only queue a reconcile, so a worker is cheap to restart;
    # 1 s frees a rollout's thousands of child bodies sooner. 500-deployment load probe, peak RSS: 187 and
    # 161 MiB at 1 s, 200 and 168 MiB at 5 s (two runs each; run-to-run spread is larger than the gap).
    watch_worker_idle_s: float = Field(default=1.0, gt=0)
    autoscaling: AutoscalingSettings = Field(default_factory=AutoscalingSettings)

    @property
    def api_connections(self) -> int:
        """Connections the API client keeps: every handler thread may run one apply wave at once."""
        return self.max_workers * self.apply_concurrency
