"""The ``DisaggregatedDeployment`` status: what the operator writes (the pools, the router, conditions, and
the autoscaler's decisions), as opposed to the spec users write (:mod:`disagg.api.deployment`). Part of the
same CRD, generated from these models by :mod:`disagg.api.crd`. Pure: pydantic only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from disagg.api.common import (
    MAX_CONDITIONS,
    MAX_NAME_LENGTH,
    ApiModel,
    Condition,
    FreeFormObject,
)


class RoleStatus(ApiModel):
    """Observed state of one pool."""

    # Written by other loops too: a key one of them adds must not make the object unreadable.
    model_config = ConfigDict(extra="ignore")

    replicas: int = Field(default=0, ge=0, description="Pods of the pool that exist.")
    ready: int = Field(default=0, ge=0, description="Pods of the pool that are Ready.")
    desired: int = Field(default=0, ge=0, description="Replicas the operator applied to the pool.")
    display: str = Field(
        default="0/0", max_length=32, description="ready/desired, for kubectl get (e.g. 2/3)."
    )

    @classmethod
    def of(cls, desired: int, replicas: int, ready: int) -> RoleStatus:
        return cls(desired=desired, replicas=replicas, ready=ready, display=f"{ready}/{desired}")


def format_ratio(prefill: int, decode: int) -> str:
    """The P:D ratio as shown in status.ratio, e.g. ``2:3``."""
    return f"{prefill}:{decode}"


class RouterStatus(ApiModel):
    """Observed state of the router."""

    # Written by other loops too: a key one of them adds must not make the object unreadable.
    model_config = ConfigDict(extra="ignore")

    endpoint: str | None = Field(
        default=None,
        max_length=1024,
        description="In-cluster URL of the OpenAI-compatible endpoint, e.g. http://NAME-router.NS.svc:8000.",
    )
    replicas: int = Field(default=0, ge=0, description="Router pods that exist.")
    ready: int = Field(default=0, ge=0, description="Router pods that are Ready.")


class DesiredReplicas(ApiModel):
    """Replicas per pool the autoscaler wants the reconciler to apply."""

    # Written by other loops too: a key one of them adds must not make the object unreadable.
    model_config = ConfigDict(extra="ignore")

    prefill: int = Field(ge=0, description="Desired prefill replicas.")
    decode: int = Field(ge=0, description="Desired decode replicas.")


# the longest message a decision in status.autoscaling keeps (the CRD's maxLength; longer ones are cut)
MAX_DECISION_MESSAGE = 4096


class ScalingDecision(ApiModel):
    """One decision of the autoscaler."""

    # Written by other loops too: a key one of them adds must not make the object unreadable.
    model_config = ConfigDict(extra="ignore")

    time: str = Field(description="When it was decided (RFC 3339).")
    prefill: int = Field(ge=0, description="Prefill replicas decided.")
    decode: int = Field(ge=0, description="Decode replicas decided.")
    cause: str = Field(max_length=128, description="Primary reason code, e.g. TTFTBreachPrefillQueue.")
    message: str = Field(default="", max_length=MAX_DECISION_MESSAGE, description="Why, for people.")


# the most decisions status.autoscaling keeps (the CRD's maxItems; the operator's setting may not exceed it)
MAX_STATUS_DECISIONS = 10


class AutoscalingStatus(ApiModel):
    """What the autoscaling loop decided (written by it, read by the reconciler)."""

    # Written by other loops too: a key one of them adds must not make the object unreadable.
    model_config = ConfigDict(extra="ignore")

    policy: str | None = Field(default=None, max_length=MAX_NAME_LENGTH, description="The RatioPolicy used.")
    mode: Literal["active", "advisory"] | None = Field(
        default=None, description="active: decisions are applied; advisory: only reported."
    )
    desired_replicas: DesiredReplicas | None = Field(
        default=None, description="Replicas per pool the autoscaler wants (applied in active mode)."
    )
    last_evaluation_time: str | None = Field(default=None, description="Last evaluation (RFC 3339).")
    last_evaluation: ScalingDecision | None = Field(
        default=None,
        description="The latest evaluation, also when it changed nothing (cause NoChange, MetricsMissing, "
        "...): what the autoscaler thinks now; decisions keeps only the moves.",
    )
    decisions: list[ScalingDecision] = Field(
        default_factory=list,
        max_length=MAX_STATUS_DECISIONS,
        description=f"Recent decisions, newest first (at most {MAX_STATUS_DECISIONS}).",
    )
    policy_memory: FreeFormObject | None = Field(
        default=None,
        description="What the ratio policy remembers across an operator restart, rewritten after every "
        "evaluation: recent request rates (loadHistory), learned corrections, error-budget spend "
        "(sloSpend), recent scale-ups, scale-downs and flaps, times in epoch seconds, at most an hour "
        "old. Internal to the autoscaler; a restarted operator reads it back, and anything it cannot "
        "read is ignored (the policy then starts without history).",
    )


class DisaggregatedDeploymentStatus(ApiModel):
    """Observed state, written by the operator."""

    # Other writers (kopf's progress storage) may add fields: keep them instead of failing.
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"x-kubernetes-preserve-unknown-fields": True}
    )

    observed_generation: int | None = Field(
        default=None, ge=0, description="The metadata.generation this status describes."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=MAX_CONDITIONS,
        description="Ready, Progressing and Degraded (plus ModelCached under spec.model.cache, and "
        "MetricsAvailable, ScalingActive and ScalingLimited under autoscaling).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    prefill: RoleStatus | None = Field(default=None, description="The prefill pool.")
    decode: RoleStatus | None = Field(default=None, description="The decode pool.")
    ratio: str | None = Field(default=None, max_length=32, description="Desired prefill:decode, e.g. 2:3.")
    router: RouterStatus | None = Field(default=None, description="The router and its endpoint.")
    autoscaling: AutoscalingStatus | None = Field(default=None, description="The autoscaler's state.")
    replicas: int | None = Field(
        default=None,
        ge=0,
        description="Replicas of both pools that exist (prefill + decode; a multi-node replica counts "
        "once): the /scale subresource's status.replicas, which HPA and KEDA read.",
    )
    selector: str | None = Field(
        default=None,
        max_length=1024,
        description="Label selector of both pools' pods, in the string form /scale reports "
        "(status.selector), which HPA needs for pod and resource metrics.",
    )

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)
