"""NVIDIA Dynamo's planner as a baseline, in the three modes its ``optimization_target`` selects (see
:mod:`disagg.policy.baselines`): throughput-based scaling (:func:`dynamo_throughput_step`), the load-based
"easy mode" (:func:`dynamo_load_step`) and SLA load-based scaling (:func:`dynamo_sla_load_step`). Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Protocol

from disagg.policy.baselines.common import Targets
from disagg.policy.capacity import LatencyModelLike, RoleModels, decode_batch_at_slo
from disagg.policy.types import Observation, RoleObservation


def _value(ok: bool, v: float | None) -> float | None:
    return v if ok else None


def _in_progress(ro: RoleObservation) -> bool:
    """Dynamo's ``_scaling_in_progress``: the pool's target and its ready engines disagree."""
    return ro.replicas != ro.ready


def _apply_gpu_budget(
    num_p: int, num_d: int, budget: int | None, gp: int, gd: int, min_endpoint: int
) -> tuple[int, int]:
    """Dynamo's GPU budget: over it, both pools are scaled down proportionally (each >= min_endpoint)."""
    total = num_p * gp + num_d * gd
    if budget is None or total <= budget:
        return num_p, num_d
    scale = budget / total
    num_p = max(min_endpoint, math.floor(num_p * scale))
    num_d = max(min_endpoint, math.floor((budget - num_p * gp) / gd))
    return num_p, num_d


class _EngineLimits(Protocol):
    @property
    def min_endpoint(self) -> int: ...
    @property
    def max_gpu_budget(self) -> int | None: ...
    @property
    def prefill_gpus_per_engine(self) -> int: ...
    @property
    def decode_gpus_per_engine(self) -> int: ...


def _load_targets(
    obs: Observation,
    want_p: int | None,
    want_d: int | None,
    settings: _EngineLimits,
    floor: tuple[int, int] = (0, 0),
) -> Targets | None:
    """The load-based modes' common end: a pool with no wish keeps its ready engines; at least the
    floor and min_endpoint each; the GPU budget; only the pools that change."""
    num_p = want_p if want_p is not None else obs.prefill.ready
    num_d = want_d if want_d is not None else obs.decode.ready
    num_p, num_d = max(num_p, floor[0], settings.min_endpoint), max(num_d, floor[1], settings.min_endpoint)
    num_p, num_d = _apply_gpu_budget(
        num_p,
        num_d,
        settings.max_gpu_budget,
        settings.prefill_gpus_per_engine,
        settings.decode_gpus_per_engine,
        settings.min_endpoint,
    )
    return _changed(obs, num_p, num_d)


def _changed(obs: Observation, num_p: int, num_d: int) -> Targets | None:
    targets: Targets = {}
    if num_p != obs.prefill.replicas:
        targets["prefill"] = num_p
    if num_d != obs.decode.replicas:
        targets["decode"] = num_d
    return targets or None


# --- Dynamo planner, throughput-based scaling (optimization_target: sla) --------------------------------


@dataclass(frozen=True)
class DynamoSettings:
    ttft_target_s: float
    itl_target_s: float
    adjustment_interval_s: float = 180.0  # Dynamo's default (throughput_adjustment_interval_seconds)
    min_endpoint: int = 1
    # Dynamo's default max_gpu_budget is 8 GPUs; None here: the bench's own replica bounds apply instead
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
    """Dynamo's SLA planner, throughput-based scaling: ``optimization_target: sla`` with its defaults
    (``enable_throughput_scaling: true``, ``enable_load_scaling: false``).

    Source: NVIDIA Dynamo "Planner Design", throughput-based scaling, as documented v0.9.0 to v1.1
    (https://docs.nvidia.com/dynamo/v1.1.0/design-docs/component-design/planner-design and
    https://docs.nvidia.com/dynamo/v-0-9-0/design-docs/planner-design). Every ``adjustment_interval``
    (default 180 s) it reads the request count, ISL, OSL, TTFT and ITL over the interval; keeps
    correction factors ``prefill_correction = actual_ttft / expected_ttft`` and ``decode_correction =
    actual_itl / expected_itl``; predicts the next interval's load (here the constant predictor, next =
    last; Dynamo's default ``load_predictor`` is ``arima``, planner/config/defaults.py); prefill replicas
    = predicted prompt-token throughput x min(1, prefill correction) / interpolated prefill throughput per
    GPU at that ISL / GPUs per engine; decode replicas = predicted output-token throughput / the decode
    throughput per GPU interpolated at ITL target / decode correction and context ISL + OSL/2 / GPUs per
    engine; at least ``min_endpoint`` each; over the GPU budget both are scaled down proportionally. The
    "pre-deployment profile" the interpolators read is computed from the twin's latency model (the same
    model the simulator runs), i.e. a perfect profile. Newer releases (v1.2+) replace the correction
    factors by a performance model tuned online from ForwardPassMetrics and cap the change per
    observation (``max_throughput_scaling_replicas``); that is not modelled here.
    """
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
    num_p, num_d = _apply_gpu_budget(
        num_p,
        num_d,
        settings.max_gpu_budget,
        settings.prefill_gpus_per_engine,
        settings.decode_gpus_per_engine,
        settings.min_endpoint,
    )
    fresh = DynamoState(last_adjust=now, last_time=now, p_correction=p_corr, d_correction=d_corr)
    return {"prefill": num_p, "decode": num_d}, fresh


# --- Dynamo planner, load-based "easy mode" (optimization_target: throughput, the default) -------------

# Static thresholds of the easy mode (core/load_scaling.py, the _PREFILL_*/_DECODE_* constants, the same
# in every version of the file read). Prefill: queued prefill tokens / context length; decode: (scheduled +
# queued) KV tokens / the engine's KV capacity. (scale up, scale down).
_EASY_PREFILL: dict[str, tuple[float, float]] = {"throughput": (1.0, 0.1), "latency": (0.1, 0.0)}
_EASY_DECODE: dict[str, tuple[float, float]] = {"throughput": (1.0, 0.6), "latency": (0.4, 0.1)}


@dataclass(frozen=True)
class DynamoLoadSettings:
    """Dynamo's load-based planner (PlannerConfig fields in comments)."""

    target: Literal["throughput", "latency", "load"] = "throughput"  # optimization_target
    # the prefill engine's context length (its max_model_len); 131072 = Llama-3.1's max_position_embeddings
    # (config.json), vLLM's default max_model_len for the bench's model
    context_length_tokens: int = 131_072
    # the decode engine's KV capacity in tokens (max_kv_tokens); None: models.decode.kv_capacity_tokens,
    # and without models the queued requests' KV is not counted (KV usage alone)
    kv_capacity_tokens: int | None = None
    # optimization_target "load" only (required there, no defaults in Dynamo)
    prefill_scale_up_queue_tokens: int | None = None
    prefill_scale_down_queue_tokens: int | None = None
    decode_scale_up_kv_rate: float | None = None  # percent, 0-100
    decode_scale_down_kv_rate: float | None = None
    adjustment_interval_s: float = 5.0  # load_adjustment_interval_seconds
    min_endpoint: int = 1
    max_gpu_budget: int | None = None  # Dynamo's default is 8; None: the bench's bounds apply
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1


@dataclass(frozen=True)
class DynamoLoadState:
    last_adjust: float | None = None


def _queued_prefill_tokens(obs: Observation, ro: RoleObservation) -> float | None:
    """Per engine: requests waiting x the mean prompt (FPM ``queued_requests.sum_prefill_tokens``)."""
    if not ro.queue_depth.ok or ro.queue_depth.value is None or ro.ready <= 0:
        return None
    waiting = ro.queue_depth.value / ro.ready
    if waiting <= 0:
        return 0.0
    isl = _value(obs.prompt_tokens_mean.ok, obs.prompt_tokens_mean.value)
    return None if isl is None else waiting * isl


def _decode_kv(obs: Observation, ro: RoleObservation, capacity: int | None) -> tuple[float, float] | None:
    """Per engine (scheduled, queued) decode KV as fractions of the KV capacity."""
    if not ro.kv_usage.ok or ro.kv_usage.value is None or ro.ready <= 0:
        return None
    queued = 0.0
    if capacity and ro.queue_depth.ok and ro.queue_depth.value:
        isl = _value(obs.prompt_tokens_mean.ok, obs.prompt_tokens_mean.value) or 0.0
        queued = ro.queue_depth.value / ro.ready * isl / capacity
    return ro.kv_usage.value, queued


def _kv_capacity(configured: int | None, models: RoleModels | None) -> int | None:
    if configured is not None:
        return configured
    return models.decode.kv_capacity_tokens if models is not None else None


def _easy_prefill(obs: Observation, s: DynamoLoadSettings) -> int | None:
    """``_prefill_easy_decision``: +1 at or over the scale-up threshold, -1 under the scale-down one."""
    ro, n = obs.prefill, obs.prefill.ready
    queued = _queued_prefill_tokens(obs, ro)
    if queued is None or n <= 0:
        return None
    if s.target == "load":
        if s.prefill_scale_up_queue_tokens is None or s.prefill_scale_down_queue_tokens is None:
            return None
        up, down, value = (
            float(s.prefill_scale_up_queue_tokens),
            float(s.prefill_scale_down_queue_tokens),
            queued,
        )
    else:
        up, down = _EASY_PREFILL[s.target]
        value = queued / s.context_length_tokens
    if value >= up:
        return n + 1
    # throughput: strictly below; latency ("all queues empty") and load: at or below
    below = value < down if s.target == "throughput" else value <= down
    if n > 1 and below:
        return max(n - 1, s.min_endpoint)
    return None


def _easy_decode(obs: Observation, s: DynamoLoadSettings, capacity: int | None) -> int | None:
    """``_decode_easy_decision``: KV utilisation (scheduled + queued) against the thresholds."""
    ro, n = obs.decode, obs.decode.ready
    kv = _decode_kv(obs, ro, capacity)
    if kv is None or n <= 0:
        return None
    util = kv[0] + kv[1]
    if s.target == "load":
        if s.decode_scale_up_kv_rate is None or s.decode_scale_down_kv_rate is None:
            return None
        up, down = s.decode_scale_up_kv_rate / 100.0, s.decode_scale_down_kv_rate / 100.0
        over, under = util >= up, util <= down
    else:
        up, down = _EASY_DECODE[s.target]
        over, under = util > up, util < down
    if over:
        return n + 1
    if n > 1 and under:
        return max(n - 1, s.min_endpoint)
    return None


def dynamo_load_step(
    obs: Observation,
    state: DynamoLoadState,
    now: float,
    settings: DynamoLoadSettings,
    models: RoleModels | None = None,
) -> tuple[Targets | None, DynamoLoadState]:
    """Dynamo's load-based planner, ``optimization_target: throughput`` (the default), ``latency`` or
    ``load``, disaggregated mode.

    Sources (ai-dynamo/dynamo): ``components/src/dynamo/planner/core/load_scaling.py``
    (``_advance_load_disagg``, ``_prefill_easy_decision``, ``_decode_easy_decision``), defaults in
    ``components/src/dynamo/planner/config/defaults.py`` and ``planner_config.py`` (the validator forces
    ``enable_load_scaling`` on and ``enable_throughput_scaling`` off for every target but ``sla``);
    Planner Guide v1.7.0 (throughput is the default; "static thresholds on queue depth and KV cache
    utilization"). Every ``load_adjustment_interval`` (default 5 s; the bench observes every 30 s, so
    at most one step per 30 s here), unless either pool is still scaling (target != ready engines: the
    planner only observes then):

    * prefill, per engine: queued prefill tokens / context length; scale up by one engine if it is >= 1.0
      (``latency``: >= 0.1), down by one if < 0.1 (``latency``: == 0) and more than one engine;
    * decode, per engine: (scheduled + queued) KV tokens / KV capacity; up by one if > 1.0 (``latency``:
      > 0.4), down by one if < 0.6 (``latency``: < 0.1);
    * ``load``: the same with the user's absolute ``prefill_scale_{up,down}_queue_tokens`` and
      ``decode_scale_{up,down}_kv_rate`` (%), compared with >= / <=;

    then at least ``min_endpoint`` each and the GPU budget. New counts are relative to the ready engines.
    """
    if state.last_adjust is not None and now - state.last_adjust < settings.adjustment_interval_s:
        return None, state
    fresh = DynamoLoadState(last_adjust=now)
    if _in_progress(obs.prefill) or _in_progress(obs.decode):
        return None, fresh
    capacity = _kv_capacity(settings.kv_capacity_tokens, models)
    want_p = _easy_prefill(obs, settings)
    want_d = _easy_decode(obs, settings, capacity)
    return _load_targets(obs, want_p, want_d, settings), fresh


# --- Dynamo planner, SLA load-based scaling (optimization_target: sla, enable_load_scaling) -------------


@dataclass(frozen=True)
class DynamoSlaLoadSettings:
    ttft_target_s: float  # ttft_ms (default 500 ms)
    itl_target_s: float  # itl_ms (default 50 ms)
    # the prefill engine's chunked-prefill budget (max_num_batched_tokens, from the worker); the twin's
    # engine default
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int | None = None  # max_kv_tokens; None: models.decode.kv_capacity_tokens
    scale_down_sensitivity: float = 0.8  # load_scaling_down_sensitivity (default 80) / 100
    adjustment_interval_s: float = 5.0  # load_adjustment_interval_seconds
    min_endpoint: int = 1
    max_gpu_budget: int | None = None  # Dynamo's default is 8; None: the bench's bounds apply
    prefill_gpus_per_engine: int = 1
    decode_gpus_per_engine: int = 1
    # enable_throughput_scaling as well: throughput-based scaling then only sets a floor under the
    # load-based decisions (every throughput_adjustment_interval). None: load-based scaling alone.
    throughput: DynamoSettings | None = None


@dataclass(frozen=True)
class DynamoSlaLoadState:
    last_adjust: float | None = None
    throughput: DynamoState = DynamoState()
    floor: tuple[int, int] = (0, 0)  # throughput-based lower bounds (prefill, decode)


def _prefill_iteration_s(lm: LatencyModelLike, tokens: float, isl: float) -> float:
    """Wall time of one prefill iteration scheduling ``tokens`` prompt tokens (prompts of ``isl``)."""
    if tokens <= 0:
        return 0.0
    prompts = max(1, math.ceil(tokens / max(isl, 1.0)))
    each = max(1, round(tokens / prompts))
    return lm.prefill_time_s([each] * prompts)


def estimate_next_ttft(lm: LatencyModelLike, queued_tokens: float, isl: float, max_batched: int) -> float:
    """Dynamo's ``estimate_next_ttft``: the queue plus one mean prompt, chunked into iterations of at
    most ``max_num_batched_tokens``, summed (the twin's latency model standing in for the regression)."""
    total = queued_tokens + isl
    time, remaining = 0.0, total
    while remaining > 0:
        chunk = min(remaining, float(max_batched))
        time += _prefill_iteration_s(lm, chunk, isl)
        remaining -= chunk
    return time


def _sla_prefill(obs: Observation, s: DynamoSlaLoadSettings, lm: LatencyModelLike) -> int | None:
    """``_prefill_load_decision``: +1 if the estimated TTFT misses the SLA; -1 if, with this engine's
    queue shared by one engine fewer (x N/(N-1)), the queue-induced TTFT stays under
    ``(SLA - own prefill time) x sensitivity``."""
    ro, n = obs.prefill, obs.prefill.ready
    queued = _queued_prefill_tokens(obs, ro)
    isl = _value(obs.prompt_tokens_mean.ok, obs.prompt_tokens_mean.value)
    if queued is None or isl is None or n <= 0:
        return None
    ttft = estimate_next_ttft(lm, queued, isl, s.max_num_batched_tokens)
    if ttft > s.ttft_target_s:
        return n + 1
    if n > 1:
        own = estimate_next_ttft(lm, 0.0, isl, s.max_num_batched_tokens)
        budget = (s.ttft_target_s - own) * s.scale_down_sensitivity
        post = estimate_next_ttft(lm, queued * n / (n - 1), isl, s.max_num_batched_tokens)
        if budget > 0 and post - own < budget:
            return max(n - 1, s.min_endpoint)
    return None


def _sla_decode(
    obs: Observation, s: DynamoSlaLoadSettings, lm: LatencyModelLike, capacity: int
) -> int | None:
    """``_decode_load_decision``: ITL of the next step (batch + 1, scheduled + queued KV + one mean
    context); +1 if over the SLA; -1 if with the KV (and batch) x N/(N-1) the cache still fits and the
    ITL stays under SLA x sensitivity."""
    ro, n = obs.decode, obs.decode.ready
    kv = _decode_kv(obs, ro, capacity)
    if kv is None or n <= 0 or not ro.running.ok or ro.running.value is None:
        return None
    sched, queued = kv[0] * capacity, kv[1] * capacity
    batch = ro.running.value / n
    isl = _value(obs.prompt_tokens_mean.ok, obs.prompt_tokens_mean.value) or 0.0
    osl = _value(obs.output_tokens_mean.ok, obs.output_tokens_mean.value) or 0.0
    avg_len = sched / batch if batch >= 1 else isl + osl / 2
    itl = lm.decode_step_time_s(round(batch) + 1, int(sched + queued + avg_len))
    if itl > s.itl_target_s:
        return n + 1
    if n > 1:
        k = n / (n - 1)
        post_kv = (sched + queued) * k
        if post_kv < capacity:
            post = lm.decode_step_time_s(round(batch * k) + 1, int(post_kv + avg_len))
            if post < s.itl_target_s * s.scale_down_sensitivity:
                return max(n - 1, s.min_endpoint)
    return None


def dynamo_sla_load_step(
    obs: Observation,
    state: DynamoSlaLoadState,
    now: float,
    settings: DynamoSlaLoadSettings,
    models: RoleModels,
) -> tuple[Targets | None, DynamoSlaLoadState]:
    """Dynamo's SLA load-based planner: ``optimization_target: sla`` with ``enable_load_scaling: true``
    (and ``enable_throughput_scaling`` when ``settings.throughput`` is set), disaggregated mode.

    Sources (ai-dynamo/dynamo): ``components/src/dynamo/planner/core/load_scaling.py``
    (``_prefill_load_decision``, ``_decode_load_decision``, ``_scale_decision``),
    ``core/perf_model/prefill.py`` (``estimate_next_ttft``: queued prefill tokens + the mean ISL chunked
    by ``max_num_batched_tokens``, the predicted iteration times summed) and ``core/perf_model/decode.py``
    (``estimate_next_itl``: features (decode requests, decode KV tokens), next step = mean batch + 1 and
    scheduled + queued KV + one mean context), ``core/throughput_scaling.py`` (with load scaling on, the
    throughput result is only a lower bound); defaults in ``config/defaults.py``
    (``load_adjustment_interval`` 5 s, ``load_scaling_down_sensitivity`` 80); Planner Guide and "Tune the
    Planner" v1.7.0. Every ``load_adjustment_interval`` (the bench observes every 30 s), unless either
    pool is still scaling: prefill +1 when the estimated TTFT of the next request exceeds the TTFT SLA,
    -1 when the queue-induced TTFT after consolidation (queue x N/(N-1)) stays under ``(SLA - own
    prefill time) x sensitivity``; decode +1 when the estimated ITL exceeds the ITL SLA, -1 when after
    consolidation the KV fits the cache and the ITL stays under ``SLA x sensitivity``; then the
    throughput floor, ``min_endpoint`` and the GPU budget. Dynamo fits its performance model online from
    ForwardPassMetrics (regression, or AIConfigurator estimates tuned online) and waits for
    ``load_min_observations`` (5) first; here the twin's latency model stands in, a perfect model.
    """
    throughput_state, floor = state.throughput, state.floor
    if settings.throughput is not None:
        bounds, throughput_state = dynamo_throughput_step(
            obs, state.throughput, now, settings.throughput, models
        )
        if bounds is not None:
            floor = (bounds["prefill"], bounds["decode"])
    st = replace(state, throughput=throughput_state, floor=floor)
    if state.last_adjust is not None and now - state.last_adjust < settings.adjustment_interval_s:
        return None, st
    st = replace(st, last_adjust=now)
    if _in_progress(obs.prefill) or _in_progress(obs.decode):
        return None, st
    capacity = _kv_capacity(settings.kv_capacity_tokens, models) or models.decode.kv_capacity_tokens
    want_p = _sla_prefill(obs, settings, models.prefill)
    want_d = _sla_decode(obs, settings, models.decode, capacity)
    return _load_targets(obs, want_p, want_d, settings, floor), st
