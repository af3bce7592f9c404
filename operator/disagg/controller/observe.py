"""What one evaluation observes: the deployment read as the API model, each pool's pods and replica
start-up, the policy's bounds (:func:`disagg.policy.bounds.bounds_for`, the reading ``disagg simulate``
uses too) and the latencies and load from Prometheus (through :mod:`disagg.metrics`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import ValidationError

from disagg.api.deployment import DisaggregatedDeployment
from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.controller.pods import PodInfo, Pool, measured_startup_s, pool_observation, read_pool
from disagg.k8s.client import KubeApi
from disagg.metrics.prometheus import PrometheusSignals
from disagg.policy.bounds import bounds_for, spec_startup_s, spec_weights_cached
from disagg.policy.types import ROLES, Bounds, Observation, Role, RoleObservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeploymentReading:
    """A DisaggregatedDeployment validated once per spec generation, with what its spec says about a
    replica's start-up (the estimate is None without a profile of the model)."""

    dd: DisaggregatedDeployment
    startup_s: float | None
    cached: bool  # spec.model.cache (or a pvc source): replicas read the weights from a volume


def read_deployment(body: Mapping[str, Any]) -> DeploymentReading | ValidationError:
    """The deployment as the API model, or why it does not validate."""
    try:
        dd = DisaggregatedDeployment.model_validate(dict(body))
    except ValidationError as error:
        return error
    return DeploymentReading(dd, spec_startup_s(dd.spec), spec_weights_cached(dd.spec))


def cached_reading(
    memo: MutableMapping[str, Any], body: Mapping[str, Any]
) -> DeploymentReading | ValidationError:
    """:func:`read_deployment` once per spec generation (it validates the whole object)."""
    generation = (body.get("metadata") or {}).get("generation")
    cached = memo.get("deployment_reading")
    if isinstance(cached, tuple) and generation is not None and cached[0] == generation:
        value: DeploymentReading | ValidationError = cached[1]
        return value
    reading = read_deployment(body)
    memo["deployment_reading"] = (generation, reading)
    return reading


@dataclass(frozen=True)
class StartupEstimate:
    """One role's replica start-up for the policy (RoleBounds.startup_seconds), and where it is from."""

    seconds: float
    source: Literal["measured", "spec"]
    detail: str  # for people

    def describe(self, role: str) -> str:
        return f"{role} {self.seconds:.0f} s ({self.detail})"


def role_startup(pods: Sequence[PodInfo], reading: DeploymentReading | None) -> StartupEstimate | None:
    """Measured on the role's own pods when one is Ready, else the spec's estimate, else None."""
    measured = measured_startup_s(pods)
    if measured is not None:
        seconds, count = measured
        what = "pod" if count == 1 else f"median of {count} pods"
        return StartupEstimate(seconds, "measured", f"measured: {what}, creation to Ready")
    if reading is not None and reading.startup_s is not None:
        how = "weights read from the model cache" if reading.cached else "every replica downloads the weights"
        return StartupEstimate(reading.startup_s, "spec", f"estimate: {how}")
    return None


def role_startups(
    reading: DeploymentReading | None, pods: Mapping[str, Sequence[PodInfo]]
) -> dict[Role, StartupEstimate | None]:
    return {role: role_startup(pods.get(role, ()), reading) for role in ROLES}


def startup_message(startups: Mapping[Role, StartupEstimate | None]) -> str:
    """The start-up the policy plans with, for the ScalingActive condition."""
    known = [e.describe(role) for role, e in startups.items() if e is not None]
    unknown = [role for role, e in startups.items() if e is None]
    parts = [*known, *(f"{role} unknown (no pod Ready yet, no estimate for the model)" for role in unknown)]
    return "replica start-up: " + ", ".join(parts)


def deployment_bounds(reading: DeploymentReading, startups: Mapping[Role, StartupEstimate | None]) -> Bounds:
    """The policy's bounds of the deployment with each role's start-up as the loop knows it."""
    return bounds_for(reading.dd, {role: e.seconds if e else None for role, e in startups.items()})


class SignalSource(Protocol):
    """What the loop needs from Prometheus."""

    def observe(
        self,
        dd: DisaggregatedDeployment,
        roles: Mapping[Role, RoleObservation],
        policy: RatioPolicySpec,
        now: float,
    ) -> tuple[Observation, str | None]:
        """The Observation, and why Prometheus gave no TTFT or ITL when its queries failed (else None)."""
        ...

    def running_per_pod(self, dd: DisaggregatedDeployment, role: Role) -> dict[str, float | None]: ...


@dataclass(frozen=True)
class PrometheusSignalSource:
    """The SignalSource over disagg.metrics' Prometheus adapter."""

    adapter: PrometheusSignals

    def observe(
        self,
        dd: DisaggregatedDeployment,
        roles: Mapping[Role, RoleObservation],
        policy: RatioPolicySpec,
        now: float,
    ) -> tuple[Observation, str | None]:
        observation, signals = self.adapter.observe(
            dd.spec.engine.type,
            dd.namespace,
            dd.name,
            {str(role): pool for role, pool in roles.items()},
            policy.slo.ttft.percentile,
            policy.slo.itl.percentile,
            policy.metric_window_seconds,
            now,
        )
        if signals.errors:
            log.warning("%s/%s: Prometheus queries failed: %s", dd.namespace, dd.name, signals.errors)
        return observation, signals.failure()

    def running_per_pod(self, dd: DisaggregatedDeployment, role: Role) -> dict[str, float | None]:
        try:
            return self.adapter.running_per_pod(dd.spec.engine.type, dd.namespace, dd.name, role)
        except Exception as error:  # Prometheus down: every pod's load is unknown (never zero)
            log.warning("per-pod load query failed: %s", error)
            return {}


def read_pools(kube: KubeApi, dd: DisaggregatedDeployment) -> dict[Role, Pool] | None:
    """Both pools as the API server has them; None until the reconciler has created both."""
    pools: dict[Role, Pool] = {}
    for role in ROLES:
        pool = read_pool(kube, dd.namespace, dd.name, role, dd.spec.role(role).multi_node)
        if pool is None:
            return None
        pools[role] = pool
    return pools


def observe(
    signals: SignalSource | None,
    reading: DeploymentReading,
    pools: Mapping[Role, Pool],
    policy: RatioPolicySpec,
    now: float,
) -> tuple[Observation, Bounds, dict[Role, StartupEstimate | None], str | None]:
    """The Observation of one evaluation, the bounds to decide within, each role's start-up and why
    Prometheus gave no TTFT or ITL when its queries failed."""
    startups = role_startups(reading, {role: pool.pods for role, pool in pools.items()})
    bounds = deployment_bounds(reading, startups)
    roles = {
        role: pool_observation(pool.replicas, pool.pods, now, bounds.role(role).gpus_per_replica)
        for role, pool in pools.items()
    }
    if signals is None:
        return Observation(time=now, prefill=roles["prefill"], decode=roles["decode"]), bounds, startups, None
    observation, failure = signals.observe(reading.dd, roles, policy, now)
    return observation, bounds, startups, failure
