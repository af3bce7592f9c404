"""Baseline autoscalers to compare the ratio policy against, implemented from their public descriptions.

Each is a pure step function ``(observation, state, now) -> (targets | None, state)`` over the same
:class:`~disagg.policy.types.Observation` the ratio policy gets, so the twin replays them identically.

* :func:`dynamo_throughput_step`: Dynamo's SLA planner, throughput-based scaling. Source: NVIDIA Dynamo
  docs, "Planner Design" (https://docs.nvidia.com/dynamo/latest/design-docs/component-design/planner-design):
  every ``adjustment_interval`` (default 180 s) it reads the request count, ISL, OSL, TTFT and ITL over
  the interval; keeps correction factors ``prefill_correction = actual_ttft / expected_ttft`` and
  ``decode_correction = actual_itl / expected_itl``; predicts the next interval's load (here the constant
  predictor: next = last); prefill replicas = predicted prompt-token throughput x min(1, prefill
  correction) / interpolated prefill throughput per GPU at that ISL / GPUs per engine; decode replicas =
  predicted output-token throughput / the decode throughput per GPU interpolated at ITL target / decode
  correction and context ISL + OSL/2 / GPUs per engine; at least ``min_endpoint`` each; if the GPU budget
  is exceeded both are scaled down proportionally. The "pre-deployment profile" the interpolators read
  is computed from the twin's latency model (the same model the simulator runs), i.e. a perfect profile.
* :func:`apa_step`: an AIBrix-APA-style autoscaler per role, independently. Source: AIBrix docs,
  "Metric-based Autoscaling" (APA: like HPA, desired = ceil(current x current_value / target_value), with
  up/down fluctuation tolerances before it acts, default 10%) and the HPA algorithm it follows; a
  cooldown after each change. Metrics here: prefill running + waiting requests per replica, decode
  KV-cache usage.
* :func:`best_static_split` (in bench/policy_goodput.py, since it needs the simulator): the fixed
  P:D split chosen in hindsight per trace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from disagg.policy.model_based import LatencyModelLike, RoleModels, decode_batch_at_slo
from disagg.policy.types import Observation, Role

Targets = dict[str, int]


# --- Dynamo SLA planner, throughput mode ----------------------------------------------------------------


@dataclass(frozen=True)
class DynamoSettings:
    ttft_target_s: float
    itl_target_s: float
    adjustment_interval_s: float = 180.0  # Dynamo's default adjustment_interval
    min_endpoint: int = 1
    max_gpu_budget: int | None = None
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1


@dataclass(frozen=True)
class DynamoState:
    last_adjust: float | None = None
    requests: float = 0.0  # requests seen since the last adjustment
    prompt_tokens: float = 0.0
    output_tokens: float = 0.0
    elapsed: float = 0.0
    last_time: float | None = None
    p_correction: float = 1.0
    d_correction: float = 1.0


def prefill_throughput_per_gpu(lm: LatencyModelLike, isl: float, gpus: int) -> float:
    """Prompt tokens/s per GPU of one engine prefilling requests of ``isl`` tokens (the profile)."""
    length = max(int(isl), 1)
    return length / lm.prefill_time_s([length]) / gpus


def decode_throughput_per_gpu(lm: LatencyModelLike, itl_s: float, context: float, gpus: int) -> float:
    """Output tokens/s per GPU of one engine at the largest batch whose ITL meets ``itl_s``."""
    batch = decode_batch_at_slo(lm, context, itl_s, 1.0)
    if batch == 0:
        return 0.0
    return batch / lm.decode_step_time_s(batch, int(batch * context)) / gpus


def dynamo_throughput_step(
    obs: Observation, state: DynamoState, now: float, settings: DynamoSettings, models: RoleModels
) -> tuple[Targets | None, DynamoState]:
    dt = 0.0 if state.last_time is None else now - state.last_time
    rate = obs.request_rate.value if obs.request_rate.ok and obs.request_rate.value is not None else 0.0
    isl = obs.prompt_tokens_mean.value if obs.prompt_tokens_mean.ok else None
    osl = obs.output_tokens_mean.value if obs.output_tokens_mean.ok else None
    n = rate * dt
    st = replace(
        state,
        requests=state.requests + n,
        prompt_tokens=state.prompt_tokens + n * (isl or 0.0),
        output_tokens=state.output_tokens + n * (osl or 0.0),
        elapsed=state.elapsed + dt,
        last_time=now,
    )
    # step 2: correction factors from the latest latencies against the profile's expectations
    p_corr, d_corr = st.p_correction, st.d_correction
    if obs.ttft.ok and obs.ttft.value and isl:
        expected = models.prefill.prefill_time_s([max(int(isl), 1)])
        p_corr = obs.ttft.value / expected if expected > 0 else p_corr
    if obs.itl.ok and obs.itl.value and isl and osl and obs.decode.running.ok:
        running = obs.decode.running.value or 0.0
        batch = max(round(running / max(obs.decode.replicas, 1)), 1)
        expected = models.decode.decode_step_time_s(batch, int(batch * (isl + osl / 2)))
        d_corr = obs.itl.value / expected if expected > 0 else d_corr
    st = replace(st, p_correction=p_corr, d_correction=d_corr)
    if state.last_adjust is not None and now - state.last_adjust < settings.adjustment_interval_s:
        return None, st
    if st.elapsed <= 0 or st.requests <= 0:
        return None, replace(st, last_adjust=now)
    # step 3: the constant predictor (next interval = the one just observed)
    req_rate = st.requests / st.elapsed
    next_isl = st.prompt_tokens / st.requests
    next_osl = st.output_tokens / st.requests
    # step 4: replicas from the interpolated per-GPU throughput
    pred_prefill = req_rate * next_isl * min(1.0, p_corr)
    p_thpt = prefill_throughput_per_gpu(models.prefill, next_isl, settings.prefill_gpus_per_engine)
    num_p = math.ceil(pred_prefill / p_thpt / settings.prefill_gpus_per_engine) if p_thpt > 0 else 1
    corrected_itl = settings.itl_target_s / d_corr if d_corr > 0 else settings.itl_target_s
    d_thpt = decode_throughput_per_gpu(
        models.decode, corrected_itl, next_isl + next_osl / 2, settings.decode_gpus_per_engine
    )
    pred_decode = req_rate * next_osl
    num_d = math.ceil(pred_decode / d_thpt / settings.decode_gpus_per_engine) if d_thpt > 0 else num_p
    num_p, num_d = max(num_p, settings.min_endpoint), max(num_d, settings.min_endpoint)
    # step 5: GPU budget, scaled down proportionally
    budget = settings.max_gpu_budget
    gp, gd = settings.prefill_gpus_per_engine, settings.decode_gpus_per_engine
    total = num_p * gp + num_d * gd
    if budget is not None and total > budget:
        scale = budget / total
        num_p = max(settings.min_endpoint, math.floor(num_p * scale))
        num_d = max(settings.min_endpoint, math.floor((budget - num_p * gp) / gd))
    fresh = DynamoState(last_adjust=now, last_time=now, p_correction=p_corr, d_correction=d_corr)
    return {"prefill": num_p, "decode": num_d}, fresh


# --- AIBrix-APA-style, per role ------------------------------------------------------------------------


@dataclass(frozen=True)
class ApaSettings:
    prefill_target_per_replica: float = 4.0  # running + waiting requests per prefill replica
    decode_kv_target: float = 0.6  # KV-cache usage per decode replica
    up_tolerance: float = 0.1  # APA's up-fluctuation tolerance
    down_tolerance: float = 0.1  # APA's down-fluctuation tolerance
    cooldown_s: float = 60.0
    min_replicas: int = 1
    max_replicas: int = 64
    max_scale_up_rate: float = 2.0  # at most double per decision (HPA-style rate limit)


@dataclass(frozen=True)
class ApaState:
    last_change: dict[str, float] = field(default_factory=dict)


def apa_desired(current: int, value: float, target: float, s: ApaSettings) -> int:
    """APA: ceil(current x value/target) when the ratio leaves the tolerance band, else current."""
    if current <= 0:
        return s.min_replicas
    ratio = value / target
    if 1.0 - s.down_tolerance <= ratio <= 1.0 + s.up_tolerance:
        return current
    desired = math.ceil(current * ratio)
    desired = min(desired, math.ceil(current * s.max_scale_up_rate))
    return max(s.min_replicas, min(s.max_replicas, desired))


def apa_step(
    obs: Observation, state: ApaState, now: float, settings: ApaSettings
) -> tuple[Targets | None, ApaState]:
    targets: Targets = {}
    last = dict(state.last_change)
    roles: tuple[Role, Role] = ("prefill", "decode")
    for role in roles:
        ro = obs.role(role)
        if role in last and now - last[role] < settings.cooldown_s:
            continue
        if role == "prefill":
            if not (ro.running.ok and ro.queue_depth.ok):
                continue
            load = ((ro.running.value or 0.0) + (ro.queue_depth.value or 0.0)) / max(ro.replicas, 1)
            want = apa_desired(ro.replicas, load, settings.prefill_target_per_replica, settings)
        else:
            if not ro.kv_usage.ok or ro.kv_usage.value is None:
                continue
            want = apa_desired(ro.replicas, ro.kv_usage.value, settings.decode_kv_target, settings)
        if want != ro.replicas:
            targets[role] = want
            last[role] = now
    return (targets or None), ApaState(last)
