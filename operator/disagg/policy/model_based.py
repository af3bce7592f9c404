"""The ``model-based`` algorithm (the default): replicas from a capacity model per role, corrected online,
planned over the start-up horizon. Pure.

The capacity model is the latency model of :mod:`disagg.perf` (:func:`disagg.perf.latency.load_latency_model`,
shared with the twin): the
time of a prefill step for the observed prompt lengths and of a decode step for a batch and context.
No separate profiling run; the model is corrected online where the comparison means something:

* prefill time, against the step a request shares *at the observed load* (:func:`prefill_latency_at_load`),
  learned only while requests run nearly alone; and, while the pool is saturated, its measured prompt-token
  throughput (:func:`saturated_prefill_correction`);
* the queueing model's wait, against the observed TTFT (:func:`queue_correction`);
* decode step time, against the observed ITL.

Prefill: a request costs its share of a batched step at the prompt tokens prefill computes (prefix-cache
hits removed, :func:`computed_prompts`); the pool is one M/G/n queue behind a load-balancing router
(:func:`pool_prefill_ttft_share`), sized so the prefill share of TTFT fits the TTFT target less KV transfer
and the first decode step, at a utilisation cap. Decode: the largest batch whose step time meets the ITL
target and whose KV fits, both at the 90th percentile of the batch's context; Little's law gives the
concurrency (arrival rate x output tokens x step time); never fewer replicas than the running sequences
need. The load is the forecast at the moment replicas asked for now will serve (:mod:`disagg.policy.forecast`:
grow for its expected value, keep what its band needs), or the window's peak when the trend is not
trusted; a queued backlog is drained over that horizon. Shrinks stop at a hysteresis band and, for decode,
where the observed ITL and the KV at the scale-down window's peak prove them safe. Breaches grow the pool
that shows a queue now. An error budget (:func:`budget_utilization`) lets replicas run busier while recent
evaluations breached far less often than the SLO percentile allows, and keeps a reserve below the target
utilisation while they breached more often. Bursts shorter than an evaluation that breach at prefill
again and again (:func:`recurring_burst`) keep the replicas that compute one within an evaluation
interval.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy.capacity import (
    PrefillService,
    RoleModels,
    decode_batch_at_slo,
    pool_prefill_ttft_share,
    prefill_latency_at_load,
    prefill_replicas_needed,
    prefill_service,
    prompt_quantiles,
    step_shape,
    sum_p90,
)
from disagg.policy.feedback import (
    Band,
    backlog_only,
    decode_holds_ttft,
    prefill_side_ttft,
    shrink_ceiling,
    smallest_safe_decode,
    smallest_safe_prefill,
    steady_arrivals,
)
from disagg.policy.forecast import Forecast, forecast_rate, planning_horizon_s
from disagg.policy.proposal import Proposal, RoleProposal
from disagg.policy.types import Bounds, Measured, Observation, PolicyState, Reason, Role

CORRECTION_RANGE = (0.25, 4.0)  # a correction outside this range means the profile is wrong, not slow
MAX_TREND_FACTOR = 2.0  # the lookahead never plans for more than twice the present load
# the error budget (budget_utilization): its spend averages breaches over about an hour; it is spent at
# half the share of misses the SLO percentile allows (the other half is for the bursts nobody foresaw);
# an unspent budget lets replicas run up to 0.1 busier than targetUtilization, never above 0.97
ERROR_BUDGET_HORIZON_S = 3600.0
BUDGET_SAFETY = 0.5
BUDGET_EXTRA_UTILIZATION = 0.1
MAX_UTILIZATION = 0.97
# an overspent budget takes headroom back: beyond the allowed spend, replicas plan for up to
# BUDGET_RESERVE_UTILIZATION less than targetUtilization, all of it once BUDGET_OVERSPEND times the allowed
# share of evaluations breached (the misses a sizing model does not see: bursts shorter than an evaluation,
# switches between traffic regimes, a cold start's backlog), never below MIN_UTILIZATION
BUDGET_RESERVE_UTILIZATION = 0.25
BUDGET_OVERSPEND = 3.0
MIN_UTILIZATION = 0.5
# the prefill correction learns only while fewer than this many other requests arrive, on average, during
# a request's own prefill step (see update_corrections)
LIGHT_LOAD_SHARING = 0.25
MAX_PREFIX_HIT = 0.95
# a prefill pool that arrivals outran within the last RECURRENCE_S keeps what the span's busier work
# needs (its RECURRENCE_QUANTILE quantile), and so does decode (the span's busier output work): traffic
# that switches between regimes (chat <-> code <-> documents) returns to levels it has visited, and a
# pool shrunk in between meets each return with a start-up and a backlog. A quantile, not the peak: the
# window's work is noisy with heavy-tailed prompts. Requiring two such episodes instead of one had no
# effect within one-hour traces (training families)
RECURRENCE_S = 3600.0
RECURRENCE_QUANTILE = 0.8
# bursts that recur: a prefill-side breach whose window brought at least PEAK_RATIO times the hour's
# median prefill work is a peak (PolicyState.prefill_peaks); once peaks came in PEAK_RECURRENCE separate
# episodes within RECURRENCE_S, the pool is sized for the level they reached (the median episode's),
# not shrunk between them. A burst shorter than an evaluation is over before replicas asked for at its
# breach can serve (120 s of start-up); a pool already holding the level drains the next one.
PEAK_RATIO = 1.25
PEAK_RECURRENCE = 3
# the pool keeps, beyond what the usual level needs, the replicas that compute a recurring burst's prompt
# tokens at full batches within this many evaluation intervals (never less than the TTFT target): the
# next evaluation then meets a pool that has caught up
BURST_DRAIN_INTERVALS = 1.0
# samples of the hour's work needed before one can stand out as a peak
PEAK_BASELINE_SAMPLES = 10
# queue samples older than this are not "the last evaluations" (an operator that paused, a restart)
QUEUE_MEMORY_S = 180.0
# a prefill pool falls behind when, over the metric window, it computed less than this share of the
# prompt tokens that arrived: only then is its throughput its capacity (saturated_prefill_correction)
FALLING_BEHIND = 0.9
# the queue correction may say the model's waits are up to 4x too long, or up to 1.5x too short (a
# pool breaching is handled by the breach rules, not by trusting the model less)
QUEUE_CORRECTION_RANGE = (0.25, 1.5)


def planned_rate(
    rate: float, now: float, history: Sequence[tuple[float, float]], lookahead_s: float
) -> float:
    """The request rate to plan for: the present, or the linear trend ``lookahead_s`` ahead if higher."""
    points = [*history, (now, rate)]
    if len(points) < 3 or lookahead_s <= 0:
        return rate
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mr = sum(r for _, r in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    if var <= 0:
        return rate
    slope = sum((t - mt) * (r - mr) for t, r in points) / var
    return min(max(rate, rate + slope * lookahead_s), rate * MAX_TREND_FACTOR if rate > 0 else mr)


def _ema(old: float | None, observed: float, weight: float) -> float:
    lo, hi = CORRECTION_RANGE
    observed = min(max(observed, lo), hi)
    return observed if old is None else (1.0 - weight) * old + weight * observed


def _v(m: Measured) -> float | None:
    return m.value if m.ok else None


def computed_share(obs: Observation) -> float:
    """The share of prompt tokens the prefill replicas compute: 1 less the prefix-cache hit rate (hits
    cost no prefill compute; at most MAX_PREFIX_HIT of a prompt counts as cached). 1 when unmeasured."""
    hit = _v(obs.prefill.prefix_hit_rate)
    if hit is None:
        return 1.0
    return 1.0 - min(max(hit, 0.0), MAX_PREFIX_HIT)


def computed_prompts(obs: Observation) -> tuple[float | None, float | None]:
    """Mean and 90th percentile of the prompt tokens prefill computes (the prompt less its cached
    prefix, :func:`computed_share`); the decode side holds the whole prompt's KV and uses the raw ones."""
    share = computed_share(obs)
    mean, p90 = _v(obs.prompt_tokens_mean), _v(obs.prompt_tokens_p90)
    return (mean * share if mean is not None else None), (p90 * share if p90 is not None else None)


def update_corrections(
    obs: Observation,
    models: RoleModels,
    state: PolicyState,
    weight: float,
    token_budget: int,
) -> dict[str, float]:
    """Observed / expected latency per role, smoothed. Unchanged where a signal is missing.

    The expected prefill time is the latency model's at the observed load (:func:`prefill_latency_at_load`),
    not at a full batch: comparing a lightly loaded engine's short steps with full-batch steps made the
    correction read 0.25 (the clamp) and the pool look four times faster than it is."""
    corr = dict(state.correction)
    prompt, computed_p90 = computed_prompts(obs)
    observed_prefill = _v(obs.prefill.compute_time)
    rate = _v(obs.request_rate)
    if prompt is not None and observed_prefill is not None and prompt > 0 and rate is not None:
        lengths = prompt_quantiles(prompt, computed_p90)
        per_replica = rate / max(obs.prefill.ready, 1)
        token_rate = per_replica * prompt
        # only where the expectation is unambiguous: a request mostly runs alone (fewer than half a
        # request arrives during its own step), or fills whole steps by itself (longer than the budget).
        # In between the step a request shares depends on the arrival pattern within the window, which
        # the window's mean rate does not tell; a correction learned there tracks the load, not the engine
        alone = per_replica * models.prefill.prefill_time_s([max(round(prompt), 1)]) <= LIGHT_LOAD_SHARING
        # and no backlog: a queue drained by full steps says nothing about a lone request's time
        wait = _v(obs.prefill.queue_time)
        drained = wait is not None and wait <= observed_prefill
        if drained and (alone or prompt >= token_budget):
            expected = sum(
                prefill_latency_at_load(models.prefill, x, token_budget, token_rate) for x in lengths
            ) / len(lengths)
            if expected > 0:
                corr["prefill"] = _ema(corr.get("prefill"), observed_prefill / expected, weight)
    itl = _v(obs.itl)
    running = _v(obs.decode.running)
    prompt, out = _v(obs.prompt_tokens_mean), _v(obs.output_tokens_mean)
    if itl is not None and running is not None and prompt is not None and out is not None:
        batch = max(round(running / max(obs.decode.replicas, 1)), 1)
        # the observed ITL is a percentile: compare it with the step at the same percentile of the
        # batch's context (as decode_batch_at_slo sizes), not at the mean. Against the mean, long
        # heavy-tailed documents read as a slow engine (x1.43) and decode was sized for the tail twice
        context = prompt + out / 2
        p90_prompt = _v(obs.prompt_tokens_p90)
        tokens = sum_p90(batch, context, (p90_prompt + out / 2) if p90_prompt is not None else None)
        expected = models.decode.decode_step_time_s(batch, int(tokens))
        if expected > 0:
            corr["decode"] = _ema(corr.get("decode"), itl / expected, weight)
    return corr


def startup_horizon_s(policy: RatioPolicySpec, bounds: Bounds) -> float:
    """How far ahead to plan: the slower pool's start-up (from the deployment) when known, else the
    policy's lookaheadSeconds, plus one evaluation and half the metric window (see
    :func:`disagg.policy.forecast.planning_horizon_s`)."""
    known = [s for s in (bounds.prefill.startup_seconds, bounds.decode.startup_seconds) if s is not None]
    startup = max(known) if known else float(policy.model_based.lookahead_seconds)
    return planning_horizon_s(startup, policy.evaluation_interval_seconds, policy.metric_window_seconds)


def forecast_window_s(policy: RatioPolicySpec, bounds: Bounds) -> float:
    """The span of rate history the trend is fitted on: twice the horizon, at least the scale-down
    window (a shorter fit mistakes a burst for a trend)."""
    return max(2.0 * startup_horizon_s(policy, bounds), float(policy.scale_down.stabilization_window_seconds))


def work_sample(obs: Observation) -> tuple[float, float] | None:
    """The work arriving for each pool now: prompt tokens/s prefill computes (prefix-cache hits removed)
    and output tokens/s decode generates; None when the rate or a length is unmeasured."""
    rate, out = _v(obs.request_rate), _v(obs.output_tokens_mean)
    computed, _ = computed_prompts(obs)
    if rate is None or out is None or computed is None:
        return None
    return rate * computed, rate * out


@dataclass(frozen=True)
class WorkPlan:
    """One pool's load to plan for, in requests/s at today's lengths."""

    plan: float  # grow for this
    keep: float  # shrink no lower than what this needs
    shrink_peak: float  # the scale-down window's busiest moment
    forecast: Forecast  # of the pool's work (tokens/s)


def work_plan(
    state: PolicyState,
    role: Role,
    now: float,
    rate: float,
    per_request: float,
    policy: RatioPolicySpec,
    bounds: Bounds,
    shrink_window: float,
) -> WorkPlan:
    """The load one pool plans for, from the history of its own work (:func:`work_sample`), divided by
    the tokens a request brings now (``per_request``). A trusted trend: grow for its expected value at
    the moment replicas asked for now will serve, and keep what its upper band needs; bursty or too
    little history: the short trend ahead, or the metric window's peak if higher. Without a work history
    (memory restored from an older operator) the request rates stand in at today's lengths.

    In work, not requests: when chat turns into long documents the request rate falls while each
    request's prefill grows five-fold; the window's peak *rate* at the new length planned for a load
    that never came (seen: a mix shift grew prefill 8 -> 12 and decode 3 -> 7 on a falling rate)."""
    column = work_column(role)
    series = [(w[0], w[column]) for w in state.work_history]
    if not series:
        series = [(t, r * per_request) for t, r in state.load_history]
    present = rate * per_request
    mb = policy.model_based
    fc = forecast_rate(
        series,
        now,
        present,
        startup_horizon_s(policy, bounds),
        forecast_window_s(policy, bounds),
        policy.slo.ttft.percentile,
    )
    if fc.trusted:
        plan, keep = max(present, fc.mean), max(present, fc.upper)
    else:
        recent = [w for t, w in series if now - t <= policy.metric_window_seconds]
        trend = [(t, w) for t, w in series if now - t <= mb.lookahead_seconds]
        plan = keep = max([planned_rate(present, now, trend, mb.lookahead_seconds), *recent])
    peak = max([present, *(w for t, w in series if now - t <= shrink_window)])
    return WorkPlan(plan / per_request, keep / per_request, peak / per_request, fc)


def queue_correction(
    obs: Observation,
    service: PrefillService,
    latency_at: Callable[[float], float],
    policy: RatioPolicySpec,
    state: PolicyState,
    decode_first_s: float,
) -> float:
    """How the waiting the queueing model predicts compares with what users see: observed prefill share
    of TTFT (TTFT at the percentile less KV transfer and the first decode step) less the step a request
    runs in, over the modelled wait at the present load and ready replicas; smoothed, within
    QUEUE_CORRECTION_RANGE, 1 until learned. Learned only where the model expects real waiting (at least
    a fifth of the step), since a tiny predicted wait makes the ratio noise. The M/G/n approximation
    treats prefill as first-come single service; batched prefill drains a queue faster than that, and
    on the training families the model's waits ran two to three times what was observed."""
    old = state.correction.get("prefill-wait", 1.0)
    rate, ttft = _v(obs.request_rate), _v(obs.ttft)
    ready = obs.prefill.ready
    if rate is None or ttft is None or rate <= 0 or ready <= 0 or ready < obs.prefill.replicas:
        return old
    tail = latency_at(rate / ready)
    at_load = replace(service, latency_tail_s=tail)
    predicted = pool_prefill_ttft_share(at_load, rate, ready, policy.slo.ttft.percentile) - tail
    if not math.isfinite(predicted) or predicted < 0.2 * tail or predicted <= 0:
        return old
    observed = max(ttft - decode_first_s - tail, 0.0)
    lo, hi = QUEUE_CORRECTION_RANGE
    ratio = min(max(observed / predicted, lo), hi)
    weight = policy.model_based.correction_smoothing
    return (1.0 - weight) * old + weight * ratio


def queue_growth_rate(samples: Sequence[tuple[float, float]], now: float, queued: float, ready: int) -> float:
    """Requests/s by which arrivals outrun the prefill pool: the queue's growth over the last
    evaluation, when it grew at each of the last two and by more than one request per ready replica in
    all; 0 otherwise. Two growths, not one: a burst shorter than an evaluation fills the queue once and
    is gone (the flash-bursts family), a shift in traffic keeps filling it."""
    points = [*samples[-2:], (now, queued)]
    if len(points) < 3:
        return 0.0
    steps = list(pairwise(points))
    if any(b[1] <= a[1] or b[0] <= a[0] for a, b in steps) or queued - points[0][1] <= max(ready, 1):
        return 0.0
    (t0, q0), (t1, q1) = steps[-1]
    return (q1 - q0) / (t1 - t0)


def work_column(role: Role) -> int:
    """Where a PolicyState.work_history sample holds the pool's work: prompt tokens/s prefill computes,
    output tokens/s decode generates."""
    return 1 if role == "prefill" else 2


def recurring_level(state: PolicyState, now: float, per_request: float, role: Role) -> float:
    """The pool's work the last hour spent its busier part at (RECURRENCE_QUANTILE of the work
    samples), in requests/s at today's computed prompt length (prefill) or output length (decode)."""
    column = work_column(role)
    hour = sorted(w[column] for w in state.work_history if now - w[0] <= RECURRENCE_S)
    if not hour:
        return 0.0
    return hour[min(int(RECURRENCE_QUANTILE * len(hour)), len(hour) - 1)] / per_request


def hour_median_work(state: PolicyState, now: float) -> float | None:
    """The median prefill work (tokens/s) of the last hour's samples; None with fewer than
    PEAK_BASELINE_SAMPLES of them."""
    hour = sorted(w[1] for w in state.work_history if now - w[0] <= RECURRENCE_S)
    if len(hour) < PEAK_BASELINE_SAMPLES:
        return None
    return hour[len(hour) // 2]


def is_prefill_peak(state: PolicyState, now: float, work: float) -> bool:
    """Whether prefill work of ``work`` tokens/s stands out from the last hour's as a peak: at least
    PEAK_RATIO times the hour's median (:func:`hour_median_work`)."""
    median = hour_median_work(state, now)
    return median is not None and work >= PEAK_RATIO * median


def recurring_burst(state: PolicyState, now: float, window_s: float, merge_s: float) -> float:
    """The prompt tokens a recurring burst brings beyond the usual level: the median, over the peak
    episodes of the last hour (peaks less than ``merge_s`` apart are one episode), of the episode's
    highest work above the hour's median, times the metric window ``window_s`` the work is averaged
    over (a burst shorter than the window shows in its average diluted by the window's length). 0 before
    PEAK_RECURRENCE episodes, or without a median."""
    median = hour_median_work(state, now)
    if median is None:
        return 0.0
    episodes: list[float] = []
    last: float | None = None
    for t, work in sorted(p for p in state.prefill_peaks if now - p[0] <= RECURRENCE_S):
        if last is not None and t - last <= merge_s:
            episodes[-1] = max(episodes[-1], work)
        else:
            episodes.append(work)
        last = t
    if len(episodes) < PEAK_RECURRENCE:
        return 0.0
    excess = sorted(max(w - median, 0.0) for w in episodes)[len(episodes) // 2]
    return excess * window_s


def settled_for(state: PolicyState, role: Role, now: float, policy: RatioPolicySpec, bounds: Bounds) -> bool:
    """Whether the pool has served at its present size for a whole metric window: no scale-up for its
    start-up plus the window, no scale-down for the window (a window's throughput then belongs to the
    replicas serving now)."""
    down = state.last_scale_down.get(role)
    return grown_and_settled(state, role, now, policy, bounds) and (
        down is None or now - down >= policy.metric_window_seconds
    )


def grown_and_settled(
    state: PolicyState, role: Role, now: float, policy: RatioPolicySpec, bounds: Bounds
) -> bool:
    """Whether the pool's last scale-up (if any) is older than its start-up plus one metric window:
    the window's latencies then describe the pool at its present size."""
    up = state.last_scale_up.get(role)
    startup = bounds.role(role).startup_seconds or 0.0
    return up is None or now - up >= startup + float(policy.metric_window_seconds)


def kv_footprint(obs: Observation) -> float | None:
    """The KV a request holds over its decode, in token-steps: output x (prompt + output / 2); None when a
    length is unmeasured. With a steady request rate and ITL, the decode pool's KV use is proportional
    to it (Little's law)."""
    prompt, out = _v(obs.prompt_tokens_mean), _v(obs.output_tokens_mean)
    if prompt is None or out is None:
        return None
    return out * (prompt + out / 2.0)


def footprint_growth(state: PolicyState, obs: Observation, now: float, window_s: float) -> float:
    """How far the KV footprint of a request (:func:`kv_footprint`) rose over the last ``window_s``: now
    over the window's lowest, at least 1. A rising footprint is a traffic mix moving toward longer
    prompts or answers, and the KV the pool holds lags behind it by the answers still to start; a
    decode shrink must fit the KV grown by as much again (seen: code -> documents shrank decode 2 -> 1
    at 33% KV while outputs grew from 60 to 75 tokens; 30 s later the one cache was full, 400 requests
    queued behind it, TTFT 48 s)."""
    now_fp = kv_footprint(obs)
    past = [fp for t, _, _, fp in state.decode_load if now - t <= window_s and fp > 0]
    if now_fp is None or not past:
        return 1.0
    return max(1.0, now_fp / min(past))


def decode_load_peak(state: PolicyState, now: float, window_s: float) -> tuple[float | None, float | None]:
    """The decode pool's peak KV in use (in replica caches) and peak running sequences over the last
    ``window_s`` (None when nothing was recorded)."""
    recent = [(kv, run) for t, kv, run, _ in state.decode_load if now - t <= window_s]
    if not recent:
        return None, None
    return max(kv for kv, _ in recent), max(run for _, run in recent)


def saturated_prefill_correction(obs: Observation, service: PrefillService, computed: float) -> float | None:
    """While the pool falls behind (requests queue at every ready prefill replica, more than two each,
    and over the window it computed fewer prompt tokens than arrived), the prompt tokens it computes per
    second are its capacity: the model's capacity per replica over the measured one is a correction for
    the model. None when the pool is not saturated or a signal is unmeasured.

    A queue seen at one instant is not saturation: Poisson arrivals queue for a moment at 70% busy, and
    a pool that keeps up computes exactly what arrives, which says nothing about its capacity (seen: a
    diurnal ramp read as saturation at 0.7 busy, the correction jumped 1.00 -> 1.18 and stayed there,
    holding one prefill replica too many for the rest of the day)."""
    waiting, throughput = _v(obs.prefill.queue_depth), _v(obs.prefill.token_throughput)
    rate = _v(obs.request_rate)
    ready = obs.prefill.ready
    if waiting is None or throughput is None or rate is None or ready <= 0 or throughput <= 0:
        return None
    # the engines count every prompt token, prefix-cache hits included (vllm 0.33.0
    # vllm/v1/metrics/stats.py: vllm:prompt_tokens is PromptTokenStats.total; sglang 0.5.23
    # metrics_collector.py: the request's prompt_tokens): the computed ones are that share of it
    throughput *= computed_share(obs)
    if waiting <= 2 * ready or throughput >= FALLING_BEHIND * rate * computed:
        return None
    modelled = computed / service.mean_s  # prompt tokens/s one replica computes at full batches
    measured = throughput / ready
    return modelled / measured


def prefill_queued(obs: Observation, ttft_target_s: float) -> bool:
    """Requests wait at the prefill pool now (more than one per ready replica), or their queue time
    over the window is a real share of the TTFT target: evidence that prefill replicas would help."""
    waiting, wait_s = _v(obs.prefill.queue_depth), _v(obs.prefill.queue_time)
    queued = waiting is not None and waiting > max(obs.prefill.ready, 1)
    return queued or (wait_s is not None and wait_s >= 0.25 * ttft_target_s)


def with_hysteresis(current: int, grow_to: int, shrink_to: int) -> int:
    """``grow_to`` when it is above ``current``; a shrink only as far as ``shrink_to`` (sized with more
    headroom), never above ``current``."""
    if grow_to >= current:
        return grow_to
    return min(current, max(grow_to, shrink_to))


def slo_breached(obs: Observation, policy: RatioPolicySpec) -> bool | None:
    """Whether this evaluation's latencies breach the SLO (None when neither latency is measured)."""
    ttft, itl = _v(obs.ttft), _v(obs.itl)
    if ttft is None and itl is None:
        return None
    return (ttft is not None and ttft > policy.slo.ttft.target_seconds) or (
        itl is not None and itl > policy.slo.itl.target_seconds
    )


def updated_spend(spend: float | None, breached: bool | None, policy: RatioPolicySpec) -> float | None:
    """The error budget's spend: an exponential average of breached evaluations over about an hour."""
    if breached is None:
        return spend
    weight = min(1.0, policy.evaluation_interval_seconds / ERROR_BUDGET_HORIZON_S)
    value = 1.0 if breached else 0.0
    # a fresh start has earned nothing yet: it begins with the budget all but spent, and earns headroom
    # back at the pace the average forgets (about an hour), never from one good evaluation
    start = allowed_spend(policy) if spend is None else spend
    return (1.0 - weight) * start + weight * value


def allowed_spend(policy: RatioPolicySpec) -> float:
    """The share of breached evaluations the error budget allows."""
    return max((100.0 - policy.slo.ttft.percentile) / 100.0, 1e-6) * BUDGET_SAFETY


def budget_utilization(policy: RatioPolicySpec, spend: float | None) -> float:
    """The utilisation the sizing may plan for. The SLO allows ``100 - percentile`` percent of requests
    to miss; while recent evaluations breached far less often than that (an unspent error budget),
    replicas may run up to ``BUDGET_EXTRA_UTILIZATION`` busier than ``targetUtilization``; as breaches
    approach the budget the headroom comes back, and at the budget the configured target holds. Past
    the budget the sizing keeps a reserve: up to ``BUDGET_RESERVE_UTILIZATION`` below the target, reached
    at ``BUDGET_OVERSPEND`` times the budget, until the breaches age out of the average (about an hour).
    No history (a fresh start, a restart): the configured target."""
    base = policy.model_based.target_utilization
    if spend is None:
        return base
    spent = spend / allowed_spend(policy)
    if spent > 1.0:
        over = min(1.0, (spent - 1.0) / (BUDGET_OVERSPEND - 1.0))
        return max(base - BUDGET_RESERVE_UTILIZATION * over, min(MIN_UTILIZATION, base))
    return min(base + BUDGET_EXTRA_UTILIZATION * (1.0 - spent), MAX_UTILIZATION)


def model_based_proposal(
    obs: Observation,
    policy: RatioPolicySpec,
    state: PolicyState,
    now: float,
    bounds: Bounds,
    models: RoleModels,
    shrink_window: float = 0.0,
) -> Proposal:
    rate, prompt, out = _v(obs.request_rate), _v(obs.prompt_tokens_mean), _v(obs.output_tokens_mean)
    mb = policy.model_based
    corr = update_corrections(obs, models, state, mb.correction_smoothing, mb.prefill_token_budget)
    spend = updated_spend(state.slo_spend, slo_breached(obs, policy), policy)
    util = budget_utilization(policy, spend)
    if rate is not None and rate <= 0.0:  # measured idle: lengths are missing because nothing arrived
        idle = "no requests arriving"
        return Proposal(
            RoleProposal(bounds.prefill.min_replicas, (Reason("IdleShrink", idle, "prefill"),)),
            RoleProposal(bounds.decode.min_replicas, (Reason("IdleShrink", idle, "decode"),)),
            corr,
            spend,
        )
    if rate is None or prompt is None or out is None:
        missing = [
            name
            for name, m in (
                ("request rate", obs.request_rate),
                ("prompt length", obs.prompt_tokens_mean),
                ("output length", obs.output_tokens_mean),
            )
            if not m.ok
        ]
        msg = f"{', '.join(missing)} missing; holding"
        return Proposal(
            RoleProposal(None, (Reason("MetricsMissing", msg, "prefill"),)),
            RoleProposal(None, (Reason("MetricsMissing", msg, "decode"),)),
            corr,
            spend,
        )
    computed, computed_p90 = computed_prompts(obs)
    computed = max(computed or prompt, 1.0)
    # each pool plans for its own work (prompt tokens it computes, tokens it generates), forecast and
    # remembered in those units and turned back into requests/s at today's lengths
    pp = work_plan(state, "prefill", now, rate, computed, policy, bounds, shrink_window)
    dp = work_plan(state, "decode", now, rate, max(out, 1.0), policy, bounds, shrink_window)
    fc = pp.forecast
    ttft_t, itl_t = policy.slo.ttft.target_seconds, policy.slo.itl.target_seconds
    c_p, c_d = corr.get("prefill", 1.0), corr.get("decode", 1.0)
    context = prompt + out / 2.0
    decode_first = (
        models.decode.kv_transfer_time_s(int(prompt)) + models.decode.decode_step_time_s(1, int(prompt)) * c_d
    )
    budget = max(ttft_t - decode_first, 0.2 * ttft_t)
    lengths = prompt_quantiles(computed, computed_p90)
    service = prefill_service(models.prefill, lengths, mb.prefill_token_budget, c_p)
    relative = saturated_prefill_correction(obs, service, computed)
    if relative is not None:
        # the pool falls behind: what it computes is at most its capacity, so the model (corrected by
        # c_p already) over the measurement bounds the correction from above. Lowering toward it is
        # always safe; raising is trusted only once the pool has served at its present size for a whole
        # window (throughput over a window in which replicas joined, divided by today's ready replicas,
        # reads slow: seen during a chat -> code shift, the correction climbed 1.00 -> 1.33 while new
        # replicas started, and held every later allocation a third too large)
        saturated = c_p * relative
        if saturated < c_p or settled_for(state, "prefill", now, policy, bounds):
            c_p = _ema(c_p, saturated, mb.correction_smoothing)
            corr["prefill"] = c_p
            service = prefill_service(models.prefill, lengths, mb.prefill_token_budget, c_p)
    long_prompt = max(computed_p90 or computed, computed)

    def latency_at(per_replica_rate: float) -> float:
        token_rate = per_replica_rate * computed
        return prefill_latency_at_load(models.prefill, long_prompt, mb.prefill_token_budget, token_rate) * c_p

    # a backlog queued before capacity arrived (a cold start, a burst) is work too: drained over the
    # planning horizon it adds queued / horizon requests/s to the plan (new replicas take the new
    # arrivals while the old ones work off what they hold)
    # arrivals that outrun the pool show first as a queue that grows at every evaluation, a minute or
    # two before the window's average rate catches up: plan for at least what the ready replicas
    # compute plus that growth, and count the backlog the queue will hold when new replicas are ready
    queued = _v(obs.prefill.queue_depth) or 0.0
    outrun = queue_growth_rate(state.prefill_queue, now, queued, obs.prefill.ready)
    # only a queue that already costs users a real share of the TTFT target counts (and only then are
    # the ready replicas surely busy): bursty arrivals and heavy-tailed prompts grow a short queue at
    # two evaluations by chance (seen: prefill planned for 14.7 req/s at 6.2 arriving, and reversed
    # five times an hour)
    if queued * service.mean_s / max(obs.prefill.ready, 1) < 0.5 * ttft_t:
        outrun = 0.0
    fell_behind = outrun > 0
    if fell_behind or any(now - t <= RECURRENCE_S for t in state.prefill_fell_behind):
        pp = replace(pp, keep=max(pp.keep, recurring_level(state, now, computed, "prefill")))
        # decode too: a regime that returns brings its answers back with its prompts (seen on the
        # validation set: decode shrank to one replica while code traffic's short answers ran, and the
        # chat that returned at 2,700 s lost 57% of its 5-minute window)
        dp = replace(dp, keep=max(dp.keep, recurring_level(state, now, max(out, 1.0), "decode")))
    if outrun > 0:
        # a queue this long keeps the ready replicas computing at their capacity: arrivals are that
        # plus the growth (the window's average rate lags a shift by half its span)
        arriving = obs.prefill.ready / service.mean_s + outrun
        pp = replace(pp, plan=max(pp.plan, arriving), keep=max(pp.keep, arriving))
    window_s = float(policy.metric_window_seconds)
    burst = recurring_burst(state, now, window_s, window_s + policy.evaluation_interval_seconds)
    drain_s = max(BURST_DRAIN_INTERVALS * policy.evaluation_interval_seconds, ttft_t)
    horizon = startup_horizon_s(policy, bounds)
    startup = bounds.prefill.startup_seconds
    # with no queue history yet (a cold start), the model says how fast the queue grows: arrivals beyond
    # what the ready replicas compute at full batches, until replicas asked for now are ready
    deficit = max(rate - obs.prefill.ready / service.mean_s, 0.0)
    growth = max(outrun, deficit)
    backlog = queued + growth * (float(mb.lookahead_seconds) if startup is None else startup)
    backlog_rate = backlog / horizon if queued > max(obs.prefill.ready, 1) else 0.0

    wait_scale = queue_correction(obs, service, latency_at, policy, state, decode_first)
    corr["prefill-wait"] = wait_scale

    def prefill_needed(utilization: float, load: float) -> int:
        if load <= 0:
            return bounds.prefill.min_replicas
        return prefill_replicas_needed(
            service,
            load + backlog_rate,
            budget,
            policy.slo.ttft.percentile,
            utilization,
            bounds.prefill.max_replicas,
            latency_at,
            wait_scale,
        )

    burst_extra = 0
    if burst > 0:
        # recurring bursts: the pool the usual level needs, plus the replicas that compute a burst's
        # prompt tokens within the drain time at full batches (a transient: they are idle otherwise)
        burst_extra = math.ceil(burst / (drain_s * computed / service.mean_s))
        usual = (hour_median_work(state, now) or rate * computed) / computed
        floor_up = min(prefill_needed(util, usual) + burst_extra, bounds.prefill.max_replicas)
        floor_keep = min(prefill_needed(util * (1 - policy.tolerance), usual) + burst_extra, floor_up)
    p90_prompt = _v(obs.prompt_tokens_p90)
    context_p90 = (p90_prompt + out / 2.0) if p90_prompt is not None else None
    batch = decode_batch_at_slo(models.decode, context, itl_t, c_d, context_p90)

    def decode_needed(utilization: float, load: float) -> int:
        if load <= 0:
            return bounds.decode.min_replicas
        if batch == 0:
            return bounds.decode.max_replicas
        step = models.decode.decode_step_time_s(batch, int(batch * context)) * c_d
        return math.ceil(load * out * step / (batch * utilization))

    tol = policy.tolerance
    # hysteresis: a pool grows when the plan needs more replicas at the utilisation, and shrinks only
    # to what the plan needs at a utilisation lower by the tolerance band, so a plan hovering at a
    # replica boundary does not move the pool up and down
    n_p = with_hysteresis(
        obs.prefill.replicas, prefill_needed(util, pp.plan), prefill_needed(util * (1 - tol), pp.keep)
    )
    if burst_extra:
        n_p = max(n_p, with_hysteresis(obs.prefill.replicas, floor_up, floor_keep))
    n_d = with_hysteresis(
        obs.decode.replicas, decode_needed(util, dp.plan), decode_needed(util * (1 - tol), dp.keep)
    )
    # what the decode pool holds now is demand too, measured rather than planned; and a full KV cache
    # with requests queued behind it hides how much more is coming, so it doubles the pool (once the
    # replicas asked for earlier are ready). Seen: code traffic's short answers shrank decode to one
    # replica; long documents then filled its cache and queued 288 requests there
    running, waiting, kv = _v(obs.decode.running), _v(obs.decode.queue_depth), _v(obs.decode.kv_usage)
    if batch > 0 and running:
        n_d = max(n_d, math.ceil(running / (batch * util)))
    kv_full = kv is not None and kv >= policy.feedback.kv_usage_high and (waiting or 0.0) > 0
    if kv_full and obs.decode.ready >= obs.decode.replicas:
        n_d = max(n_d, 2 * obs.decode.replicas)
    down_window = float(policy.scale_down.stabilization_window_seconds)
    if n_d < obs.decode.replicas:
        # the model may shrink decode only as far as the observed ITL and KV prove safe: the ITL now,
        # grown by the latency model's step shape at the batch the survivors would carry, and the KV
        # at the peak load of the scale-down window (seen: a steady pool flipping 2 -> 1 -> 2 because
        # ITL p90 on one replica breached what the mean-context model expected)
        safe = smallest_safe_decode(
            obs,
            obs.decode.replicas,
            Band(itl_t, tol),
            util,
            bounds.decode,
            step_shape(models.decode, context),
            dp.shrink_peak / rate if rate > 0 else 1.0,
            batch or None,
            *decode_load_peak(state, now, down_window),
            kv_growth=footprint_growth(state, obs, now, down_window),
        )
        n_d = max(n_d, safe[0] if safe is not None else obs.decode.replicas)
    ttft, itl = _v(obs.ttft), _v(obs.itl)
    n_now = obs.prefill.replicas
    if n_p < n_now and not fc.trusted and ttft is not None and prefill_side_ttft(obs) is not None:
        # with bursty arrivals (no trusted trend) the model may not shrink below what the observed
        # latencies prove safe (bursts queue more than the Poisson model expects; the proof judges
        # against the scale-down window's peak); a trusted trend is smooth enough for the model and its
        # band; without the prefill pool's own latencies there is no proof to ask and the model decides
        band = Band(ttft_t, tol)
        window = [(t, r) for t, r in state.load_history if now - t <= shrink_window]
        steady = steady_arrivals(obs, window, shrink_window)
        work = service.mean_s if steady else None
        safe = smallest_safe_prefill(
            obs,
            n_now,
            band,
            util,
            bounds.prefill,
            pp.shrink_peak,
            work,
            shrink_ceiling(band, steady),
        )
        n_p = max(n_p, safe[0] if safe is not None else n_now)
    ttft_breach = ttft is not None and ttft > ttft_t * (1 + tol)
    d_breach = itl is not None and itl > itl_t * (1 + tol)
    # the model never overrules a breach it did not foresee: at least one more replica (once the
    # replicas asked for earlier are ready), in the pool that shows the breach now. TTFT that waits at
    # decode (queued there now) grows decode; TTFT with requests queued at prefill grows prefill; a
    # TTFT tail with neither (long prompts' own prefill time) is not cured by replicas and grows nothing
    side = prefill_side_ttft(obs)
    at_decode = ttft_breach and ttft is not None and decode_holds_ttft(obs, ttft, side, ttft_t)
    p_breach = ttft_breach and not at_decode and prefill_queued(obs, ttft_t)
    arriving_work = work_sample(obs)
    at_peak = p_breach and arriving_work is not None and is_prefill_peak(state, now, arriving_work[0])
    if p_breach and not backlog_only(obs, obs.prefill.replicas, mb.target_utilization):
        ready = obs.prefill.ready >= obs.prefill.replicas
        n_p = max(n_p, obs.prefill.replicas + (1 if ready else 0))
    # a decode breach grows the pool only once its last growth has served a whole metric window: ITL
    # and queue times are window statistics, and a window that began before the new replicas were ready
    # describes the smaller pool (seen: +1 decode the minute a replica added for a full cache became
    # ready, while the backlog it was added for drained: 3 decode replicas where 2 sufficed). A full
    # cache is handled above, whatever the timing
    if (d_breach or at_decode) and grown_and_settled(state, "decode", now, policy, bounds):
        ready = obs.decode.ready >= obs.decode.replicas
        n_d = max(n_d, obs.decode.replicas + (1 if ready else 0))
    d_breach = d_breach or at_decode
    load = (
        f"{pp.plan:.2f} req/s planned for prefill, {dp.plan:.2f} for decode (now {rate:.2f}; prefill work "
        f"{fc.describe('tokens/s')}), prompt {prompt:.0f}, "
        f"output {out:.0f} tokens, utilisation {util:.2f}"
        + (f" ({spend:.0%} of recent evaluations breached)" if spend is not None else "")
    )
    grown = f" ({backlog:.0f} once replicas asked for now serve)" if backlog > queued + 0.5 else ""
    drain = f"; backlog of {queued:.0f}{grown} drains at {backlog_rate:.2f} req/s" if backlog_rate else ""
    if burst_extra:
        drain += (
            f"; recurring bursts of {burst:.3g} prompt tokens keep {burst_extra} replica(s) to compute "
            f"them within {drain_s:.0f}s"
        )
    return Proposal(
        RoleProposal(
            n_p,
            (
                Reason(
                    "ModelCapacity",
                    f"{load}; prefill {service.mean_s * 1000:.0f}ms per request (x{c_p:.2f}){drain}",
                    "prefill",
                ),
            ),
            breached=p_breach,
        ),
        RoleProposal(
            n_d,
            (
                Reason(
                    "ModelCapacity",
                    f"{load}; batch {batch} per decode replica at ITL target (x{c_d:.2f})",
                    "decode",
                ),
            ),
            breached=d_breach,
        ),
        corr,
        spend,
        prefill_fell_behind=fell_behind,
        prefill_peak=at_peak,
    )
