"""The ``RatioPolicy`` custom resource (disagg.dev/v1alpha1, short name ``rp``).

A RatioPolicy says what latency users must feel (TTFT and ITL at a percentile), how the operator decides
one coordinated prefill:decode allocation to get there (the algorithm), and how fast it may move
(evaluation interval, stabilisation windows, per-step caps, tolerance band, GPU budget). A
DisaggregatedDeployment names it in ``spec.autoscaling.policyRef``. The pure policy engine
(:mod:`disagg.policy`) reads :class:`RatioPolicySpec` directly, so these models are the contract.

Pure: pydantic only. Durations are whole seconds (``...Seconds``), as in the HorizontalPodAutoscaler's
``behavior`` (autoscaling/v2).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from disagg.api.common import API_GROUP, API_VERSION, ApiModel, Condition
from disagg.api.crd import CrdSpec, PrinterColumn

GROUP = API_GROUP
VERSION = API_VERSION
KIND = "RatioPolicy"
PLURAL = "ratiopolicies"
SINGULAR = "ratiopolicy"
SHORT_NAMES = ("rp",)


def _open_range(minimum: float | None = None, maximum: float | None = None) -> dict[str, Any]:
    """Exclusive bounds the way a Kubernetes structural schema (OpenAPI v3.0) writes them: a number in
    ``minimum``/``maximum`` and a boolean ``exclusiveMinimum``/``exclusiveMaximum`` (pydantic would emit
    JSON Schema 2020-12's numeric form, which the API server rejects)."""
    extra: dict[str, Any] = {}
    if minimum is not None:
        extra |= {"minimum": minimum, "exclusiveMinimum": True}
    if maximum is not None:
        extra |= {"maximum": maximum, "exclusiveMaximum": True}
    return extra


def _cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """``x-kubernetes-validations`` (CEL) for the generated CRD schema of a model or field."""
    return {"x-kubernetes-validations": [{"rule": rule, "message": message} for rule, message in rules]}


class Algorithm(enum.StrEnum):
    """How the policy turns signals into target replicas."""

    SLO_FEEDBACK = "slo-feedback"
    MODEL_BASED = "model-based"
    FIXED_RATIO = "fixed-ratio"


class Mode(enum.StrEnum):
    """``active`` applies decisions; ``advisory`` decides and reports them but never acts."""

    ACTIVE = "active"
    ADVISORY = "advisory"


class LatencyTarget(ApiModel):
    """A latency objective: the ``percentile`` of the latency must stay at or below ``targetSeconds``."""

    percentile: float = Field(
        default=90.0,
        gt=0.0,
        lt=100.0,
        json_schema_extra=_open_range(0.0, 100.0),
        description="Percentile of the latency distribution the target applies to, in (0, 100), e.g. 90.",
    )
    target_seconds: float = Field(
        gt=0.0,
        json_schema_extra=_open_range(0.0),
        description="Upper bound on the latency at that percentile, in seconds.",
    )


class SLO(ApiModel):
    """The latencies users feel: time to first token and inter-token latency."""

    ttft: LatencyTarget = Field(
        default_factory=lambda: LatencyTarget(percentile=90.0, target_seconds=1.0),
        description="Time to first token as the user sees it (prefill queue + prefill + KV transfer + "
        "first decode step).",
    )
    itl: LatencyTarget = Field(
        default_factory=lambda: LatencyTarget(percentile=90.0, target_seconds=0.05),
        description="Inter-token latency (time between streamed tokens) on the decode pool.",
    )


class RoleSteps(ApiModel):
    """A number of replicas per role."""

    prefill: int = Field(default=1, ge=1, description="Replicas of the prefill pool.")
    decode: int = Field(default=1, ge=1, description="Replicas of the decode pool.")

    def of(self, role: str) -> int:
        return self.prefill if role == "prefill" else self.decode


class ScalingRules(ApiModel):
    """How fast one direction may move (like HPA ``behavior.scaleUp``/``scaleDown``)."""

    stabilization_window_seconds: int = Field(
        default=0,
        ge=0,
        le=3600,
        description="Window of past recommendations considered: scale-up uses the lowest recommendation "
        "in it, scale-down the highest, so short spikes or dips do not move the pools.",
    )
    max_step: RoleSteps = Field(
        default_factory=RoleSteps,
        description="Most replicas one decision may add (scaleUp) or remove (scaleDown) per role.",
    )


def _default_scale_up() -> ScalingRules:
    return ScalingRules(stabilization_window_seconds=0, max_step=RoleSteps(prefill=4, decode=4))


def _default_scale_down() -> ScalingRules:
    # 300 s: the HorizontalPodAutoscaler's default scale-down stabilisation window (Kubernetes docs,
    # "Horizontal Pod Autoscaling", --horizontal-pod-autoscaler-downscale-stabilization, default 5m)
    return ScalingRules(stabilization_window_seconds=300, max_step=RoleSteps(prefill=1, decode=1))


class GPUBudget(ApiModel):
    """The most GPUs both pools together may hold."""

    max_gpus: int = Field(
        alias="maxGPUs",
        ge=1,
        description="Upper bound on prefill and decode GPUs together. When it binds, GPUs go first to the "
        "pool whose SLO is breached.",
    )


class FixedRatio(ApiModel):
    """A fixed prefill:decode ratio, e.g. 1:3; total capacity is scaled in whole units of it."""

    prefill: int = Field(ge=1, le=64, description="Prefill part of the ratio.")
    decode: int = Field(ge=1, le=64, description="Decode part of the ratio.")


class RoleTensorParallel(ApiModel):
    """Tensor-parallel degree per role."""

    prefill: int = Field(default=1, ge=1, le=64, description="Tensor-parallel degree of a prefill replica.")
    decode: int = Field(default=1, ge=1, le=64, description="Tensor-parallel degree of a decode replica.")


class ModelBasedSettings(ApiModel):
    """Settings of the ``model-based`` algorithm (a capacity model per role, corrected online)."""

    model: str | None = Field(
        default=None,
        description="Model profile for the latency model (e.g. 'llama-3.1-8b'); defaults to the "
        "deployment's model.",
    )
    gpu: str | None = Field(
        default=None,
        description="GPU profile for the latency model (e.g. 'h100'); defaults to the deployment's GPU type.",
    )
    tensor_parallel: RoleTensorParallel | None = Field(
        default=None,
        description="Tensor-parallel degree per role; defaults to the deployment's.",
    )
    dtype: str = Field(default="bf16", min_length=1, description="Weight/activation dtype of the profile.")
    lookahead_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Plan for the load extrapolated this far ahead from the recent trend (never below now).",
    )
    target_utilization: float = Field(
        default=0.85,
        gt=0.0,
        json_schema_extra=_open_range(0.0),
        le=1.0,
        description="Fraction of a replica's modelled capacity the plan may use (headroom for bursts).",
    )
    prefill_token_budget: int = Field(
        default=8192,
        ge=256,
        le=1048576,
        description="Most prompt tokens a prefill replica batches into one step "
        "(vLLM --max-num-batched-tokens).",
    )
    correction_smoothing: float = Field(
        default=0.3,
        gt=0.0,
        json_schema_extra=_open_range(0.0),
        le=1.0,
        description="Weight of the newest observed/expected latency ratio in the online correction (EMA).",
    )


class FeedbackSettings(ApiModel):
    """Settings of the ``slo-feedback`` algorithm (and the load side of ``fixed-ratio``)."""

    kv_usage_high: float = Field(
        default=0.9,
        gt=0.0,
        json_schema_extra=_open_range(0.0),
        le=1.0,
        description="Decode KV-cache usage at or above which the decode pool counts as saturated.",
    )
    target_utilization: float = Field(
        default=0.8,
        gt=0.0,
        json_schema_extra=_open_range(0.0),
        le=1.0,
        description="Highest estimated busy fraction a pool may reach after shrinking; with steady "
        "arrivals, slo-feedback adds prefill replicas once the prefill pool's busy fraction passes it.",
    )


# the highest maxReversalsPerHour: one reversal per evaluation at the default 30 s interval, no limit in
# practice
MAX_REVERSALS_PER_HOUR = 120


class RatioPolicySpec(ApiModel):
    """Desired behaviour of the ratio control loop."""

    model_config = ConfigDict(
        json_schema_extra=_cel(
            (
                "self.algorithm != 'fixed-ratio' || has(self.fixedRatio)",
                "fixedRatio is required when algorithm is fixed-ratio",
            ),
            (
                "!has(self.scaleUp) || !has(self.scaleDown) || "
                "self.scaleDown.stabilizationWindowSeconds >= self.scaleUp.stabilizationWindowSeconds",
                "scaleDown.stabilizationWindowSeconds must be >= scaleUp.stabilizationWindowSeconds "
                "(fast up, slow down)",
            ),
            (
                "self.metricWindowSeconds >= self.evaluationIntervalSeconds",
                "metricWindowSeconds must be >= evaluationIntervalSeconds",
            ),
        )
    )

    slo: SLO = Field(default_factory=SLO, description="Latency objectives the policy keeps.")
    algorithm: Algorithm = Field(
        default=Algorithm.MODEL_BASED,
        description="model-based (default): replicas from the deployment's latency model corrected online, "
        "planned over the start-up horizon, falling back to slo-feedback when the model or GPU has no "
        "profile; slo-feedback: scale the bottleneck the latencies point at; fixed-ratio: total capacity "
        "at a fixed prefill:decode ratio.",
    )
    fixed_ratio: FixedRatio | None = Field(
        default=None, description="The prefill:decode ratio for algorithm fixed-ratio."
    )
    mode: Mode = Field(
        default=Mode.ACTIVE,
        description="active: decisions are applied; advisory: decided and reported, never applied.",
    )
    evaluation_interval_seconds: int = Field(
        default=30, ge=5, le=3600, description="How often the policy is evaluated, in seconds."
    )
    metric_window_seconds: int = Field(
        default=120,
        ge=10,
        le=3600,
        description="Window of the rate() and quantile queries, in seconds; older samples count as stale.",
    )
    scale_up: ScalingRules = Field(
        default_factory=_default_scale_up, description="Scale-up stabilisation window and per-step cap."
    )
    scale_down: ScalingRules = Field(
        default_factory=_default_scale_down,
        description="Scale-down stabilisation window and per-step cap (slow down).",
    )
    max_reversals_per_hour: int = Field(
        default=2,
        ge=2,
        le=MAX_REVERSALS_PER_HOUR,
        description="Most direction changes (a shrink after a growth, a growth after a shrink) a pool may "
        "make within an hour: a shrink that reverses a growth waits while it and the growth that may follow "
        "it would exceed this; growth never waits. "
        "120 (one per evaluation at the default interval) lifts the limit.",
    )
    tolerance: float = Field(
        default=0.1,
        ge=0.0,
        lt=1.0,
        json_schema_extra=_open_range(None, 1.0),
        description="Tolerance band: no change while the latency/target ratio is within 1 +/- tolerance.",
    )
    gpu_budget: GPUBudget | None = Field(default=None, description="GPU budget over both pools.")
    pending_backoff_seconds: int = Field(
        default=300,
        ge=0,
        le=86400,
        description="After pods stayed Pending (no GPU of that type), how long the learned replica ceiling "
        "holds before the policy probes for capacity again.",
    )
    model_based: ModelBasedSettings = Field(
        default_factory=ModelBasedSettings, description="Settings of the model-based algorithm."
    )
    feedback: FeedbackSettings = Field(
        default_factory=FeedbackSettings, description="Settings of the slo-feedback algorithm."
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> RatioPolicySpec:
        """The CEL rules above, checked in Python too (for the twin, the CLI and the unit tests)."""
        if self.algorithm is Algorithm.FIXED_RATIO and self.fixed_ratio is None:
            raise ValueError("fixedRatio: required when algorithm is fixed-ratio")
        up, down = self.scale_up.stabilization_window_seconds, self.scale_down.stabilization_window_seconds
        if down < up:
            raise ValueError(
                f"scaleDown.stabilizationWindowSeconds ({down}) must be >= "
                f"scaleUp.stabilizationWindowSeconds ({up})"
            )
        if self.metric_window_seconds < self.evaluation_interval_seconds:
            raise ValueError(
                f"metricWindowSeconds ({self.metric_window_seconds}) must be >= evaluationIntervalSeconds "
                f"({self.evaluation_interval_seconds})"
            )
        return self


class RatioPolicyStatus(ApiModel):
    """Observed state of a RatioPolicy."""

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the operator last processed."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Conditions, e.g. Accepted.")
    deployments: list[str] = Field(
        default_factory=list,
        description="DisaggregatedDeployments (names) whose autoscaling uses this policy.",
    )


class RatioPolicy(ApiModel):
    """A whole RatioPolicy object as stored by the API server."""

    api_version: Literal["disagg.dev/v1alpha1"] = Field(
        default="disagg.dev/v1alpha1", alias="apiVersion", description="disagg.dev/v1alpha1."
    )
    kind: Literal["RatioPolicy"] = Field(default="RatioPolicy", description="RatioPolicy.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Standard object metadata.")
    spec: RatioPolicySpec = Field(default_factory=RatioPolicySpec, description="Desired behaviour.")
    status: RatioPolicyStatus | None = Field(default=None, description="Observed state.")


CRD_SPEC = CrdSpec(
    model=RatioPolicy,
    kind=KIND,
    plural=PLURAL,
    singular=SINGULAR,
    short_names=SHORT_NAMES,
    printer_columns=(
        PrinterColumn("Algorithm", ".spec.algorithm", description="How the policy decides"),
        PrinterColumn("Mode", ".spec.mode", description="active or advisory"),
        PrinterColumn("TTFT", ".spec.slo.ttft.targetSeconds", "number", "TTFT target (s)"),
        PrinterColumn("ITL", ".spec.slo.itl.targetSeconds", "number", "ITL target (s)"),
        PrinterColumn("Deployments", ".status.deployments", description="Deployments using it", priority=1),
    ),
)
