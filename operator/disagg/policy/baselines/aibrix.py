"""AIBrix's APA (the pod autoscaler's APA strategy) with its released defaults as a baseline, per role
independently (see :mod:`disagg.policy.baselines`). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from disagg.policy.baselines.common import Targets
from disagg.policy.types import ROLES, Observation, Role, RoleObservation

# --- AIBrix APA, per role -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApaSettings:
    """AIBrix APA (annotation / spec field in comments; defaults are AIBrix's unless noted)."""

    # The metric and its target value per pod are the user's (no defaults in AIBrix). Prefill: running +
    # waiting requests per replica ("waiting": waiting only, like the prefill_queue_length of AIBrix's
    # StormService P/D sample, target 10); decode: KV-cache usage (kv_cache_usage_perc, target 0.5 in
    # AIBrix's APA sample). These two targets are this bench's choice.
    prefill_target_per_replica: float = 4.0
    prefill_metric: Literal["running+waiting", "waiting"] = "running+waiting"
    decode_kv_target: float = 0.6
    up_tolerance: float = 0.1  # autoscaling.aibrix.ai/scale-up-tolerance
    down_tolerance: float = 0.1  # autoscaling.aibrix.ai/scale-down-tolerance
    max_scale_up_rate: float = 2.0  # autoscaling.aibrix.ai/max-scale-up-rate: at most x2 per decision
    max_scale_down_rate: float = 2.0  # autoscaling.aibrix.ai/max-scale-down-rate: at most halve
    window_s: float = 180.0  # spec.observeWindowSeconds: the metric's moving-average window
    scale_up_cooldown_s: float = 0.0  # autoscaling.aibrix.ai/scale-up-cooldown-window
    scale_down_cooldown_s: float = 300.0  # autoscaling.aibrix.ai/scale-down-cooldown-window
    # What the scale-down cooldown window keeps: AIBrix's controller takes the lowest recommendation in
    # the window ("min"); "max" is Kubernetes HPA's stabilisation (the highest: scale down only once the
    # whole window agrees)
    scale_down_pick: Literal["min", "max"] = "min"
    # AIBrix's pending-replica guard (PR #2671, merged 2026-09; not in a release I could confirm)
    pending_guard: bool = False
    min_replicas: int = 1
    max_replicas: int = 64


@dataclass(frozen=True)
class ApaState:
    samples: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)  # role -> (t, value)
    recommendations: dict[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)  # role -> (t, n)


def apa_desired(current: int, value: float, target: float, s: ApaSettings) -> int:
    """AIBrix APA's ``computeTargetReplicas``: over ``1 + up_tolerance`` of the target, ceil(current x
    value/target) but at most ceil(current x max_scale_up_rate); under ``1 - down_tolerance``, ceil(current
    x value/target) but at least floor(current / max_scale_down_rate); else current. Then min/max."""
    if current <= 0:
        return s.min_replicas
    ratio = value / target
    desired = current
    if ratio > 1.0 + s.up_tolerance:
        desired = min(math.ceil(current * ratio), math.ceil(current * s.max_scale_up_rate))
    elif ratio < 1.0 - s.down_tolerance:
        desired = max(math.ceil(current * ratio), math.floor(current / s.max_scale_down_rate))
    return max(s.min_replicas, min(s.max_replicas, desired))


def _apa_value(ro: RoleObservation, role: Role, s: ApaSettings) -> tuple[float, float] | None:
    """(per-pod metric now, its target); pods reporting = the ready ones."""
    if role == "decode":
        if not ro.kv_usage.ok or ro.kv_usage.value is None:
            return None
        return ro.kv_usage.value, s.decode_kv_target
    if ro.ready <= 0 or not ro.queue_depth.ok or ro.queue_depth.value is None:
        return None
    load = ro.queue_depth.value
    if s.prefill_metric == "running+waiting":
        if not ro.running.ok or ro.running.value is None:
            return None
        load += ro.running.value
    return load / ro.ready, s.prefill_target_per_replica


def _pending_guard(current: int, ready: int, desired: int, value: float, target: float) -> int:
    """AIBrix ``applyPendingReplicaGuard`` (APA): pods not ready yet count as missing metrics (scale up)
    or as at the target (scale down)."""
    ready = max(0, min(ready, current))
    pending = current - ready
    if pending <= 0 or desired == current:
        return desired
    if desired > current:
        adjusted = value * ready / current
        return min(max(math.ceil(current * adjusted / target), current), desired)
    adjusted = (value * ready + target * pending) / current
    return max(min(math.ceil(current * adjusted / target), current), desired)


def _stabilise(
    history: tuple[tuple[float, int], ...], now: float, recommendation: int, current: int, s: ApaSettings
) -> tuple[int, tuple[tuple[float, int], ...]]:
    """AIBrix ``stabilizeRecommendation``: keep each recommendation; scale up to the highest within the
    scale-up window, down to the lowest (or, "max", the highest) within the scale-down window; a window
    of 0 s takes the recommendation as it is."""
    keep = max(s.scale_up_cooldown_s, s.scale_down_cooldown_s)
    history = tuple((t, r) for t, r in (*history, (now, recommendation)) if t > now - keep)
    if recommendation == current:
        return current, history
    up = recommendation > current
    window = s.scale_up_cooldown_s if up else s.scale_down_cooldown_s
    within = [r for t, r in history if t > now - window]
    if not within:
        return recommendation, history
    pick_max = up or s.scale_down_pick == "max"
    return (max(within) if pick_max else min(within)), history


def apa_step(
    obs: Observation, state: ApaState, now: float, settings: ApaSettings
) -> tuple[Targets | None, ApaState]:
    """AIBrix's APA with its released defaults, one PodAutoscaler per role (StormService role-level
    autoscaling, ``subTargetSelector.roleName``).

    Sources (vllm-project/aibrix, main): ``pkg/controller/podautoscaler/context/context.go``
    (``NewBaseScalingContext``: max scale-up rate 2, max scale-down rate 2, up/down fluctuation tolerance
    0.1, scale-up cooldown window 0 s, scale-down cooldown window 300 s), ``algorithm/apa.go``
    (``computeTargetReplicas``), ``metrics/`` (``DefaultStableWindowDuration`` 180 s: each evaluation
    records the mean over pods, APA uses the mean over the window), ``podautoscaler_controller.go``
    (``DefaultResyncInterval`` 10 s; ``stabilizeRecommendation``: scale-up takes the highest
    recommendation within the scale-up window, scale-down the lowest within the scale-down window;
    then min/max replicas), ``autoscaler.go`` (``applyPendingReplicaGuard``, off by default here);
    docs ``docs/source/features/autoscaling/metric-based-autoscaling.rst`` (the annotation table) and
    ``samples/autoscaling/stormservice-pool.yaml`` (one APA per role of a P/D StormService).

    The 10 s evaluation runs here at the bench's 30 s observation interval, so the 180 s window
    averages six samples instead of eighteen; the metrics are the pools' instantaneous values per ready
    replica. Note the scale-down window as AIBrix implements it does not delay a scale-down: the lowest
    recommendation of the last 300 s wins (``scale_down_pick="max"`` gives HPA's stabilisation).
    """
    samples = dict(state.samples)
    recs = dict(state.recommendations)
    targets: Targets = {}
    for role in ROLES:
        ro = obs.role(role)
        measured = _apa_value(ro, role, settings)
        if measured is None:
            continue
        value_now, target = measured
        window = tuple(
            (t, v) for t, v in (*samples.get(role, ()), (now, value_now)) if t > now - settings.window_s
        )
        samples[role] = window
        current = ro.replicas
        if current <= 0:  # AIBrix: "scaling disabled: current replicas is 0"
            continue
        value = sum(v for _, v in window) / len(window)
        want = apa_desired(current, value, target, settings)
        if settings.pending_guard:
            want = _pending_guard(current, ro.ready, want, value, target)
        want, recs[role] = _stabilise(recs.get(role, ()), now, want, current, settings)
        want = max(settings.min_replicas, min(settings.max_replicas, want))
        if want != current:
            targets[role] = want
    return (targets or None), ApaState(samples, recs)
