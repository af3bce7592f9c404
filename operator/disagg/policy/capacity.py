"""The capacity model under the model-based algorithm: what one replica of a pool can do, from the
deployment's latency model (:mod:`disagg.perf.latency`). Pure.

Prefill: a request costs its share of a batched step at its prompt length (:func:`prefill_service`); the
pool is one M/G/n queue behind a load-balancing router (:func:`pool_prefill_ttft_share`), and
:func:`prefill_replicas_needed` is the fewest replicas whose prefill share of TTFT fits a budget at a
percentile. Decode: the largest batch whose step meets the ITL target and whose KV fits
(:func:`decode_batch_at_slo`). What to ask of this model (the load, the corrections, the shrink proofs)
is :mod:`disagg.policy.model_based`'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
from typing import Protocol

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy.feedback import StepTime
from disagg.policy.types import Bounds, ServingProfile

Z90 = NormalDist().inv_cdf(0.9)
MAX_PROMPT = 1_048_576.0
MAX_DECODE_BATCH = 1024


class LatencyModelLike(Protocol):
    """What the model-based algorithm needs from :class:`disagg.perf.latency.LatencyModel`."""

    kv_capacity_tokens: int

    def prefill_time_s(self, prompt_lens: Sequence[int]) -> float: ...

    def decode_step_time_s(self, batch_size: int, total_context_tokens: int) -> float: ...

    def kv_transfer_time_s(self, tokens: int) -> float: ...


@dataclass(frozen=True)
class RoleModels:
    prefill: LatencyModelLike
    decode: LatencyModelLike


def resolve_profile(policy: RatioPolicySpec, bounds: Bounds) -> ServingProfile | None:
    """The deployment's serving profile with the policy's overrides applied; None if unknown."""
    mb = policy.model_based
    base = bounds.profile
    model = mb.model or (base.model if base else None)
    gpu = mb.gpu or (base.gpu if base else None)
    if model is None or gpu is None:
        return None
    tp_p = mb.tensor_parallel.prefill if mb.tensor_parallel else (base.tp_prefill if base else 1)
    tp_d = mb.tensor_parallel.decode if mb.tensor_parallel else (base.tp_decode if base else 1)
    dtype = mb.dtype if mb.dtype != "bf16" or base is None else base.dtype
    if mb.tensor_parallel or base is None:  # the policy's own tensor parallelism replaces the layout
        return ServingProfile(model=model, gpu=gpu, tp_prefill=tp_p, tp_decode=tp_d, dtype=dtype)
    return replace(base, model=model, gpu=gpu, dtype=dtype)


def load_models(profile: ServingProfile) -> RoleModels:
    """The latency models of both roles (disagg.perf, cached there)."""
    from disagg.perf.latency import load_latency_model
    from disagg.perf.moe import Parallelism, Speculation

    def model(role: str, tp: int) -> LatencyModelLike:
        layout = profile.layout(role)
        par = None if layout is None else Parallelism(**asdict(layout))
        spec = Speculation(profile.mtp_decode) if role == "decode" and profile.mtp_decode else None
        return load_latency_model(
            profile.model, profile.gpu, tp, profile.dtype, parallelism=par, speculation=spec
        )

    return RoleModels(prefill=model("prefill", profile.tp_prefill), decode=model("decode", profile.tp_decode))


@dataclass(frozen=True)
class PrefillService:
    """Per-request prefill service of one replica for the observed prompt-length distribution."""

    mean_s: float  # mean GPU time a request takes from the replica (its share of a batched step)
    second_moment: float  # E[S^2] of that time
    latency_tail_s: float  # p90 of the step a request waits in once started (its own prefill latency)
    mean_latency_s: float  # mean of that step time (what engines report as prefill time)


def lognormal_sigma(mean: float, p90: float | None) -> float:
    """The shape of the log-normal with this mean and 90th percentile (0 when p90 <= mean: no spread
    measured). ln p90 - ln mean = z90 x sigma - sigma^2 / 2; the smaller root, capped at z90 where the
    p90 is too far above the mean for any log-normal."""
    if p90 is None or p90 <= mean or mean <= 0:
        return 0.0
    gap = math.log(p90) - math.log(mean)
    disc = Z90 * Z90 - 2.0 * gap
    return Z90 - math.sqrt(disc) if disc >= 0 else Z90


def sum_p90(count: float, mean: float, p90: float | None) -> float:
    """The 90th percentile of the sum of ``count`` independent lengths with this mean and p90, by the
    normal approximation of the sum with the standard deviation of the log-normal fitted to them.

    Not ``count x mean + sqrt(count) x (p90 - mean)``: for heavy-tailed lengths the standard deviation is
    far above p90 - mean (a log-normal of sigma 1.5 has sd 2.9 x its mean, p90 - mean 1.2 x), and a sum
    judged by p90 - mean let a heavy-tailed pool shrink to a decode replica whose cache then filled (seen
    on the heavy-tail training family: 2 -> 1 decode replica, TTFT attainment of that window 83%)."""
    if count <= 0:
        return 0.0
    sigma = lognormal_sigma(mean, p90)
    sd = mean * math.sqrt(math.expm1(sigma * sigma))
    return count * mean + Z90 * math.sqrt(count) * sd


def prompt_quantiles(mean: float, p90: float | None, points: int = 16) -> list[float]:
    """Prompt lengths at evenly spaced quantiles of a log-normal with this mean and p90."""
    if p90 is None or p90 <= mean or mean <= 0:
        return [max(mean, 1.0)]
    sigma = lognormal_sigma(mean, p90)
    mu = math.log(mean) - sigma * sigma / 2.0
    unit = NormalDist()
    return [min(math.exp(mu + sigma * unit.inv_cdf((i + 0.5) / points)), MAX_PROMPT) for i in range(points)]


def prefill_service(
    lm: LatencyModelLike, lengths: Sequence[float], token_budget: int, correction: float
) -> PrefillService:
    shares, steps = [], []
    for value in lengths:
        length = max(round(value), 1)
        batch = max(token_budget // length, 1)
        step = lm.prefill_time_s([length] * batch) * correction
        shares.append(step / batch)
        steps.append(step)
    n = len(shares)
    ordered = sorted(steps)
    return PrefillService(
        mean_s=sum(shares) / n,
        second_moment=sum(x * x for x in shares) / n,
        latency_tail_s=ordered[min(int(0.9 * n), n - 1)],
        mean_latency_s=sum(steps) / n,
    )


def prefill_ttft_share(service: PrefillService, rate_per_replica: float, percentile: float) -> float:
    """Prefill share of TTFT at ``percentile`` with M/G/1 queueing (Pollaczek-Khinchine mean wait, an
    exponential tail above it); inf when the replica is saturated."""
    rho = rate_per_replica * service.mean_s
    if rho >= 1.0:
        return math.inf
    if rho <= 0.0:
        return service.latency_tail_s
    mean_wait = rate_per_replica * service.second_moment / (2.0 * (1.0 - rho))
    miss = 1.0 - percentile / 100.0
    wait = (mean_wait / rho) * math.log(rho / miss) if rho > miss else 0.0
    return service.latency_tail_s + wait


def erlang_c(servers: int, offered: float) -> float:
    """Probability that an arrival waits in an M/M/n queue with ``offered`` = arrival rate / service
    rate (Erlang C); 1 when the servers are saturated."""
    if servers <= 0 or offered >= servers:
        return 1.0
    if offered <= 0:
        return 0.0
    term, total = 1.0, 1.0  # a^k / k!, summed over k < n
    for k in range(1, servers):
        term *= offered / k
        total += term
    last = term * offered / servers * servers / (servers - offered)  # a^n / n! * n / (n - a)
    return last / (total + last)


def pool_prefill_ttft_share(
    service: PrefillService, rate: float, replicas: int, percentile: float, wait_scale: float = 1.0
) -> float:
    """Prefill share of TTFT at ``percentile`` for a pool whose router sends each request to the least
    loaded replica (vLLM/llm-d/Dynamo routers balance by load), i.e. one M/G/n queue rather than n
    separate M/G/1 queues: the Erlang C probability of waiting, an exponential tail at rate
    n*mu - lambda, scaled by (1 + cs^2) / 2 for general service times (the Allen-Cunneen approximation;
    Allen, "Probability, Statistics and Queueing Theory", 1990). inf when the pool is saturated.
    ``wait_scale``: the online correction of the waiting part (observed over predicted; see
    :func:`queue_correction`)."""
    if rate <= 0:
        return service.latency_tail_s
    mu = 1.0 / service.mean_s
    if rate >= replicas * mu:
        return math.inf
    wait_p = erlang_c(replicas, rate / mu)
    miss = 1.0 - percentile / 100.0
    if wait_p <= miss:
        return service.latency_tail_s
    cs2 = max(service.second_moment / (service.mean_s * service.mean_s) - 1.0, 0.0)
    wait = (1.0 + cs2) / 2.0 * math.log(wait_p / miss) / (replicas * mu - rate)
    return service.latency_tail_s + wait * wait_scale


def prefill_replicas_needed(
    service: PrefillService,
    rate: float,
    budget_s: float,
    percentile: float,
    utilization: float,
    most: int,
    latency_at: Callable[[float], float] | None = None,
    wait_scale: float = 1.0,
) -> int:
    """Fewest replicas whose prefill share of TTFT fits the budget (``most`` if none does).

    ``latency_at``: the prefill step a long (90th percentile) request runs in when a replica receives
    this many requests/s (:func:`prefill_latency_at_load`); without it the full-batch step, which
    overstates the latency of a pool that is not saturated."""
    if rate <= 0:
        return 1
    wait_budget = max(budget_s, service.latency_tail_s + 0.25 * budget_s)
    for n in range(1, most + 1):
        per = rate / n
        if per * service.mean_s > utilization:
            continue
        at_load = service if latency_at is None else replace(service, latency_tail_s=latency_at(per))
        if pool_prefill_ttft_share(at_load, rate, n, percentile, wait_scale) <= wait_budget:
            return n
    return most


def decode_batch_at_slo(
    lm: LatencyModelLike,
    context: float,
    itl_target: float,
    correction: float,
    context_p90: float | None = None,
) -> int:
    """Largest batch whose decode step meets the ITL target and whose KV fits (0 if even 1 misses).

    ``context_p90``: the 90th percentile of one sequence's context. The KV of ``b`` sequences is then
    judged at the 90th percentile of their sum (:func:`sum_p90`),
    not at b x mean: with long, heavy-tailed prompts a few long ones fill a small batch's cache (seen:
    a long-context pool shrunk to one decode replica at 13% KV, which then filled to 97%)."""

    def kv_tokens(b: int) -> float:
        return sum_p90(b, context, context_p90)

    def ok(b: int) -> bool:
        # the step time grows with the context the batch holds: judged at the same 90th percentile as
        # the KV, since the ITL target is a percentile too (a batch of long contexts steps slower)
        tokens = kv_tokens(b)
        return (
            tokens <= lm.kv_capacity_tokens
            and lm.decode_step_time_s(b, int(tokens)) * correction <= itl_target
        )

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while hi <= MAX_DECODE_BATCH and ok(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, MAX_DECODE_BATCH + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def prefill_latency_at_load(
    lm: LatencyModelLike, length: float, token_budget: int, token_rate: float
) -> float:
    """The prefill time a request of ``length`` tokens sees on a replica receiving ``token_rate`` prompt
    tokens/s: the step it runs in also carries the prompts that arrived during the previous step, up to
    the token budget (the fixed point of tokens per step = token rate x step time). At low load a
    request runs nearly alone; near saturation its step is full. What an engine reports as prefill time
    is this, not the full-batch step, so the online correction must compare against it."""
    length_i = max(round(length), 1)
    if length_i >= token_budget:
        # chunked over whole-budget steps the prompt fills alone, but its last chunk shares its step
        # with the prompts that arrived meanwhile, like a short prompt does (seen: 10k-token prompts at
        # 75% busy read 1.28x the alone time and the correction learned from it sized prefill for the
        # stretched latency as if it were compute: 7-8 replicas where 4 met the SLO)
        rest = length_i % token_budget
        if rest == 0:
            return lm.prefill_time_s([length_i])
        shared = prefill_latency_at_load(lm, rest, token_budget, token_rate)
        return lm.prefill_time_s([length_i]) + shared - lm.prefill_time_s([rest])
    tokens = float(length_i)
    step = lm.prefill_time_s([length_i])
    for _ in range(32):
        batch = max(1, min(token_budget // length_i, round(tokens / length_i)))
        step = lm.prefill_time_s([length_i] * batch)
        # the step holds this request and, on average, the tokens that arrived during the step before
        # (seen from inside a step, Poisson batches are size-biased: 1 + lambda x T requests)
        nxt = min(float(token_budget), length_i + token_rate * step)
        if abs(nxt - tokens) < 0.5 * length_i:
            break
        tokens = nxt
    return step


def step_shape(lm: LatencyModelLike, context: float) -> StepTime:
    """The decode step time against batch size at ``context`` tokens per sequence."""

    def step(batch: float) -> float:
        size = max(1, round(batch))
        return lm.decode_step_time_s(size, int(size * context))

    return step
