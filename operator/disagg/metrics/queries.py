"""PromQL for the ratio policy's signals, per deployment and role, for vLLM and SGLang. Pure.

Series are selected by the target labels that :func:`scrape_relabel_configs` makes Prometheus attach to
every engine pod it scrapes (kubernetes_sd ``role: pod``): ``namespace``, ``pod``, ``disagg_deployment``
and ``disagg_role``, copied from the pod's ``disagg.dev/deployment`` and ``disagg.dev/role`` labels.

What each engine measures in P/D, and so what the queries combine:

* The router sends a request to a prefill engine with ``max_tokens=1``; the prefill engine's TTFT
  histogram is the request's queue + prefill time there, and its request counter and prompt-length
  histogram count every user request. Its *output* histogram is all ones, so output lengths come from
  the decode pool.
* The decode engine receives the same request with the KV to pull; its TTFT histogram is the KV transfer
  plus the first decode step, its ITL histogram is what users feel between tokens.
* The user's TTFT is therefore prefill-side TTFT + decode-side TTFT (+ the router's own overhead, which
  engines cannot see). The policy gets the sum of the two sides' quantiles at its percentile. Quantiles
  are not additive, but both sides grow together under load (they are positively dependent), so the sum
  of their p-quantiles is a conservative (upper) estimate of the p-quantile of the sum, which is the
  safe side for an SLO.

Metric names (sources):
* vLLM: ``vllm:time_to_first_token_seconds``, ``vllm:inter_token_latency_seconds`` (V1; older
  ``vllm:time_per_output_token_seconds``), ``vllm:request_queue_time_seconds``,
  ``vllm:request_prefill_time_seconds``, ``vllm:request_prompt_tokens``, ``vllm:request_generation_tokens``,
  ``vllm:request_success_total``, ``vllm:prompt_tokens_total``, ``vllm:generation_tokens_total``,
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc`` (V1; V0
  ``vllm:gpu_cache_usage_perc``). Source: vllm-project/vllm docs/design/metrics.md (v0 and V1 lists).
  Prefix cache: ``vllm:prefix_cache_queries_total`` and ``vllm:prefix_cache_hits_total``, counters in
  tokens (declared as ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits``, prometheus_client adds
  ``_total``; vllm 0.33.0 wheel, vllm/v1/metrics/loggers.py ``PrometheusStatLogger``). A request counts
  once, when the scheduler admits it: queries += its prompt tokens, hits += the tokens found in the local
  prefix cache (vllm/v1/core/kv_cache_manager.py ``record_prefix_cache_stats``; lookups of preempted
  requests are left out, vllm/v1/metrics/stats.py ``PrefixCacheStats.record``). With prefix caching off
  nothing is counted, so the ratio is 0/0 (NaN). Earlier V1 releases also exported them as
  ``vllm:gpu_prefix_cache_queries_total`` / ``vllm:gpu_prefix_cache_hits_total``, tried second.
* SGLang: ``sglang:time_to_first_token_seconds``, ``sglang:inter_token_latency_seconds`` (older
  ``sglang:time_per_output_token_seconds``), ``sglang:queue_time_seconds``,
  ``sglang:prompt_tokens_histogram``, ``sglang:generation_tokens_histogram``,
  ``sglang:num_requests_total``, ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:num_queue_reqs``, ``sglang:num_running_reqs``,
  ``sglang:token_usage``. Source: sgl-project/sglang python/sglang/srt/metrics/collector.py and
  docs/references/production_metrics.md. SGLang has no prefill-time histogram; the prefill pool's
  mean compute time is its mean TTFT less its mean queue time.
  Prefix cache: the gauge ``sglang:cache_hit_rate`` (sglang 0.5.23 wheel,
  sglang/srt/observability/metrics_collector.py ``SchedulerMetricsCollector``), set on every prefill
  batch to hit / (hit + computed) prompt tokens of that batch, 0 for a batch of neither
  (sglang/srt/managers/scheduler_components/metrics_reporter.py ``report_prefill_stats``). Being the
  last batch's ratio, it is averaged over the window per pod, then over the pool's pods.

Routers (the end-to-end view, preferred when present):
* sglang-router 0.3.2 defines ``smg_router_ttft_seconds`` (time to first token as the client sees it,
  router included) and ``smg_router_tpot_seconds`` (strings in the released wheel's
  ``sglang_router/sglang_router_rs.abi3.so``). When its TTFT histogram has observations in the window,
  the user TTFT is read from it instead of the sum of the two engine sides. Run in the HTTP PD mode the
  operator deploys, 0.3.2 exports request durations but no TTFT (tests/e2e/test_released_router.py), so
  today the sum is what is used; the query costs nothing when the series is absent. ITL stays the
  decode engine's inter-token histogram: TPOT is a per-request mean, not the per-token gap the SLO is
  written on.
* vllm-router 0.1.17 exports request durations only (``vllm_router_request_duration_seconds``,
  ``vllm_router_pd_request_duration_seconds``; same source, ``vllm_router_rs.abi3.so``), no TTFT: the
  engine sum is used.

Where an engine version renamed a metric, the query tries the names in order with PromQL ``or``. Each
``engine:name`` is also tried as ``engine_name``: prometheus_client (which vLLM and SGLang use) writes
the colon as an underscore in its OpenMetrics exposition, the format Prometheus asks for first, so the
same metric can be stored either way (observed with prometheus_client 0.26 and Prometheus 2.42).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from disagg.policy.types import Role


@dataclass(frozen=True)
class TargetLabels:
    """Names of the target labels the relabel configuration attaches to engine series."""

    namespace: str = "namespace"
    pod: str = "pod"
    deployment: str = "disagg_deployment"
    role: str = "disagg_role"


TARGET_LABELS = TargetLabels()


class Engine(enum.StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


@dataclass(frozen=True)
class EngineMetrics:
    """Metric names of one engine; each a tuple of alternatives, preferred first."""

    ttft: tuple[str, ...]
    itl: tuple[str, ...]
    queue_time: tuple[str, ...]
    prefill_time: tuple[str, ...]  # empty: derive as TTFT - queue time on the prefill pool
    prompt_len: tuple[str, ...]  # histogram of prompt tokens per request
    output_len: tuple[str, ...]  # histogram of generated tokens per request
    requests_total: tuple[str, ...]
    prompt_tokens_total: tuple[str, ...]
    generation_tokens_total: tuple[str, ...]
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...]  # fraction 0..1
    # prefix cache: counters of prompt tokens looked up and found (vLLM), paired by position with
    # ``prefix_cache_hits``; or, where the engine exports only a ratio, a gauge 0..1 (SGLang)
    prefix_cache_queries: tuple[str, ...] = ()
    prefix_cache_hits: tuple[str, ...] = ()
    prefix_cache_hit_rate: tuple[str, ...] = ()


ENGINE_METRICS: dict[Engine, EngineMetrics] = {
    # source: vllm-project/vllm docs/design/metrics.md (v0 list and V1 renames)
    Engine.VLLM: EngineMetrics(
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        queue_time=("vllm:request_queue_time_seconds",),
        prefill_time=("vllm:request_prefill_time_seconds",),
        prompt_len=("vllm:request_prompt_tokens",),
        output_len=("vllm:request_generation_tokens",),
        requests_total=("vllm:request_success_total",),
        prompt_tokens_total=("vllm:prompt_tokens_total",),
        generation_tokens_total=("vllm:generation_tokens_total",),
        waiting=("vllm:num_requests_waiting",),
        running=("vllm:num_requests_running",),
        kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
        # vllm 0.33.0 wheel, vllm/v1/metrics/loggers.py (counter_prefix_cache_queries / _hits)
        prefix_cache_queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
        prefix_cache_hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    ),
    # source: sgl-project/sglang python/sglang/srt/metrics/collector.py
    Engine.SGLANG: EngineMetrics(
        ttft=("sglang:time_to_first_token_seconds",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        queue_time=("sglang:queue_time_seconds",),
        prefill_time=(),
        prompt_len=("sglang:prompt_tokens_histogram",),
        output_len=("sglang:generation_tokens_histogram",),
        requests_total=("sglang:num_requests_total",),
        prompt_tokens_total=("sglang:prompt_tokens_total",),
        generation_tokens_total=("sglang:generation_tokens_total",),
        waiting=("sglang:num_queue_reqs",),
        running=("sglang:num_running_reqs",),
        kv_usage=("sglang:token_usage",),
        # sglang 0.5.23 wheel, sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector)
        prefix_cache_hit_rate=("sglang:cache_hit_rate",),
    ),
}


@dataclass(frozen=True)
class RouterMetrics:
    """Metric names of the router deployed in front of one engine; empty when it exports none."""

    ttft: tuple[str, ...] = ()


ROUTER_METRICS: dict[Engine, RouterMetrics] = {
    # vllm-router 0.1.17 has no TTFT histogram (see the module docstring)
    Engine.VLLM: RouterMetrics(),
    # sglang-router 0.3.2: sglang_router_rs.abi3.so in the released wheel
    Engine.SGLANG: RouterMetrics(ttft=("smg_router_ttft_seconds",)),
}
ROUTER_ROLE = "router"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def selector(namespace: str, deployment: str, role: Role | str, labels: TargetLabels = TARGET_LABELS) -> str:
    """The label matchers of one pool of one deployment."""
    if not namespace or not deployment:
        raise ValueError("selector: namespace and deployment must be non-empty")
    return (
        f'{{{labels.namespace}="{_escape(namespace)}",{labels.deployment}="{_escape(deployment)}",'
        f'{labels.role}="{role}"}}'
    )


def _window(seconds: int) -> str:
    if seconds <= 0:
        raise ValueError(f"metric window must be > 0 seconds, got {seconds}")
    return f"{seconds}s"


def spellings(names: Sequence[str]) -> list[str]:
    """The names as given, then their OpenMetrics-escaped spellings (``:`` -> ``_``)."""
    escaped = [n.replace(":", "_") for n in names if ":" in n]
    return [*names, *(e for e in escaped if e not in names)]


def _alternatives(parts: Sequence[str]) -> str:
    if not parts:
        raise ValueError("no metric name to query")
    return parts[0] if len(parts) == 1 else " or ".join(f"({p})" for p in parts)


def histogram_quantile(names: Sequence[str], quantile: float, sel: str, window_s: int) -> str:
    """The ``quantile`` (0..1) of a histogram over the pool, from its buckets' rates."""
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must be in (0, 1), got {quantile}")
    w = _window(window_s)
    return _alternatives(
        [
            f"histogram_quantile({quantile:g}, sum by (le) (rate({n}_bucket{sel}[{w}])))"
            for n in spellings(names)
        ]
    )


def histogram_mean(names: Sequence[str], sel: str, window_s: int) -> str:
    """The mean observation of a histogram over the pool (NaN when nothing was observed)."""
    w = _window(window_s)
    return _alternatives(
        [f"sum(rate({n}_sum{sel}[{w}])) / sum(rate({n}_count{sel}[{w}]))" for n in spellings(names)]
    )


def counter_rate(names: Sequence[str], sel: str, window_s: int) -> str:
    """Per-second rate of a counter summed over the pool."""
    w = _window(window_s)
    return _alternatives([f"sum(rate({n}{sel}[{w}]))" for n in spellings(names)])


def counter_ratio(numerators: Sequence[str], denominators: Sequence[str], sel: str, window_s: int) -> str:
    """Rate of one counter over the rate of another, each summed over the pool; the names are paired by
    position (one engine version's spelling of both). NaN when the denominator did not move."""
    if len(numerators) != len(denominators):
        raise ValueError(f"counter_ratio: {list(numerators)} and {list(denominators)} do not pair up")
    w = _window(window_s)
    return _alternatives(
        [
            f"sum(rate({n}{sel}[{w}])) / sum(rate({d}{sel}[{w}]))"
            for n, d in zip(spellings(numerators), spellings(denominators), strict=True)
        ]
    )


def gauge_sum(names: Sequence[str], sel: str) -> str:
    return _alternatives([f"sum({n}{sel})" for n in spellings(names)])


def gauge_sum_by(names: Sequence[str], by: str, sel: str) -> str:
    """A gauge summed per value of one label (e.g. running requests per pod)."""
    return _alternatives([f"sum by ({by}) ({n}{sel})" for n in spellings(names)])


def gauge_avg(names: Sequence[str], sel: str) -> str:
    return _alternatives([f"avg({n}{sel})" for n in spellings(names)])


def gauge_window_avg(names: Sequence[str], sel: str, window_s: int) -> str:
    """A gauge averaged over the window per series, then over the pool."""
    w = _window(window_s)
    return _alternatives([f"avg(avg_over_time({n}{sel}[{w}]))" for n in spellings(names)])


def prefix_hit_rate(m: EngineMetrics, sel: str, window_s: int) -> str | None:
    """Fraction of prompt tokens served from the prefix cache over the window (None: not exported)."""
    if m.prefix_cache_queries:
        return counter_ratio(m.prefix_cache_hits, m.prefix_cache_queries, sel, window_s)
    if m.prefix_cache_hit_rate:
        return gauge_window_avg(m.prefix_cache_hit_rate, sel, window_s)
    return None


def sample_age(names: Sequence[str], sel: str) -> str:
    """Seconds since the newest sample of a gauge in the pool (for staleness)."""
    return _alternatives([f"time() - max(timestamp({n}{sel}))" for n in spellings(names)])


@dataclass(frozen=True)
class QuerySet:
    """Every query one evaluation runs for one deployment, by signal name."""

    queries: dict[str, str]

    def __getitem__(self, key: str) -> str:
        return self.queries[key]


def build_queries(
    engine: Engine | str,
    namespace: str,
    deployment: str,
    ttft_percentile: float,
    itl_percentile: float,
    window_s: int,
    labels: TargetLabels = TARGET_LABELS,
) -> QuerySet:
    """All the PromQL the adapter runs for one deployment. Percentiles are 0..100, as in the policy."""
    try:
        m = ENGINE_METRICS[Engine(engine)]
    except ValueError:
        raise ValueError(f"engine: {engine!r} is not one of {[e.value for e in Engine]}") from None
    p, d = (selector(namespace, deployment, r, labels) for r in ("prefill", "decode"))
    qt, qi = ttft_percentile / 100.0, itl_percentile / 100.0
    q: dict[str, str] = {
        # prefill side of TTFT (queue + prefill) and decode side (KV transfer + first step)
        "ttft_prefill_side": histogram_quantile(m.ttft, qt, p, window_s),
        "ttft_decode_side": histogram_quantile(m.ttft, qt, d, window_s),
        "itl": histogram_quantile(m.itl, qi, d, window_s),
        "request_rate": counter_rate(m.requests_total, p, window_s),
        "prompt_tokens_mean": histogram_mean(m.prompt_len, p, window_s),
        "prompt_tokens_p90": histogram_quantile(m.prompt_len, 0.9, p, window_s),
        "output_tokens_mean": histogram_mean(m.output_len, d, window_s),
        "output_tokens_p90": histogram_quantile(m.output_len, 0.9, d, window_s),
        "prefill.queue_time": histogram_quantile(m.queue_time, qt, p, window_s),
        "decode.queue_time": histogram_quantile(m.queue_time, qt, d, window_s),
        # compute times are means over the window (as the twin reports them): the capacity models need
        # mean service times; the tails are in ttft/itl
        "decode.compute_time": histogram_mean(m.itl, d, window_s),
        "prefill.token_throughput": counter_rate(m.prompt_tokens_total, p, window_s),
        "decode.token_throughput": counter_rate(m.generation_tokens_total, d, window_s),
    }
    # prefix-cache hits of the prefill pool's lookups: the tokens whose prefill costs no compute
    hit_rate = prefix_hit_rate(m, p, window_s)
    if hit_rate is not None:
        q["prefill.prefix_hit_rate"] = hit_rate
    router = ROUTER_METRICS[Engine(engine)]
    if router.ttft:
        r = selector(namespace, deployment, ROUTER_ROLE, labels)
        q["ttft_router"] = histogram_quantile(router.ttft, qt, r, window_s)
    if m.prefill_time:
        q["prefill.compute_time"] = histogram_mean(m.prefill_time, p, window_s)
    else:  # SGLang: mean prefill time = mean TTFT - mean queue time on the prefill pool
        q["prefill.compute_time"] = (
            f"({histogram_mean(m.ttft, p, window_s)}) - ({histogram_mean(m.queue_time, p, window_s)})"
        )
    for role, sel in (("prefill", p), ("decode", d)):
        q[f"{role}.queue_depth"] = gauge_sum(m.waiting, sel)
        q[f"{role}.running"] = gauge_sum(m.running, sel)
        q[f"{role}.kv_usage"] = gauge_avg(m.kv_usage, sel)
        q[f"{role}.sample_age"] = sample_age(m.running, sel)
    return QuerySet(q)


def running_by_pod_query(
    engine: Engine | str,
    namespace: str,
    deployment: str,
    role: Role | str,
    labels: TargetLabels = TARGET_LABELS,
) -> str:
    """PromQL: requests running per pod of one pool (the load that orders decode pods for removal)."""
    metrics = ENGINE_METRICS[Engine(engine)]
    return gauge_sum_by(metrics.running, labels.pod, selector(namespace, deployment, role, labels))
