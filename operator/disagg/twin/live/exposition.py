"""Prometheus exposition of an emulated engine, in vLLM's or SGLang's exact names, labels and buckets.

One ``CollectorRegistry`` per simulated pod (never the global registry), so many pods live in one
process and each ``/metrics`` shows only its own engine.

Sources (checked with the code search, names/labels/buckets transcribed, no code copied):
- vLLM: vllm-project/vllm ``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``, v0.10/0.11):
  labels ``model_name`` and ``engine``; counters are declared without ``_total`` and prometheus_client
  appends it (``vllm:prompt_tokens`` -> ``vllm:prompt_tokens_total``); ``vllm:request_success`` has the
  extra label ``finished_reason`` (stop|length|abort); token histograms use ``build_1_2_5_buckets(
  max_model_len)``; TTFT, inter-token and request-latency buckets as listed below. Prefix cache: the
  counters ``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (exposed with ``_total``), in
  tokens: a request adds its prompt tokens to queries and its locally cached tokens to hits once, when
  the scheduler admits it (vllm 0.33.0 wheel, vllm/v1/metrics/loggers.py and
  vllm/v1/core/kv_cache_manager.py ``record_prefix_cache_stats``). ``vllm:prompt_tokens`` counts every
  prompt token, cached ones included (``IterationStats.num_prompt_tokens`` is
  ``prompt_token_stats.total``), and ``vllm:prompt_tokens_by_source`` splits it by the label ``source``:
  ``local_compute``, ``local_cache_hit``, ``external_kv_transfer`` (vllm 0.33.0 wheel,
  vllm/v1/metrics/stats.py ``PromptTokenStats``, vllm/v1/metrics/loggers.py).
- SGLang: sgl-project/sglang ``python/sglang/srt/metrics/collector.py`` (``TokenizerMetricsCollector``
  and ``SchedulerMetricsCollector``) and ``docs/references/production_metrics.md``: label
  ``model_name``; ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``, ``sglang:token_usage``,
  ``sglang:num_used_tokens``, ``sglang:gen_throughput``, ``sglang:prompt_tokens_total``,
  ``sglang:generation_tokens_total``, ``sglang:num_requests_total``, and the TTFT, inter-token and e2e
  histograms with the default buckets below. Prefix cache: the gauge ``sglang:cache_hit_rate``, set on
  each prefill batch to hit / (hit + computed) prompt tokens of the batch (sglang 0.5.23 wheel,
  sglang/srt/observability/metrics_collector.py and
  sglang/srt/managers/scheduler_components/metrics_reporter.py ``report_prefill_stats``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

EngineKind = Literal["vllm", "sglang"]
ENGINE_KINDS: tuple[EngineKind, EngineKind] = ("vllm", "sglang")

# The text format both engines serve (prometheus_client's 0.0.4 text exposition).
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

# vllm/v1/metrics/loggers.py: histogram_time_to_first_token
VLLM_TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vllm/v1/metrics/loggers.py: histogram_inter_token_latency (same list as the deprecated
# vllm:time_per_output_token_seconds)
VLLM_ITL_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vllm/v1/metrics/loggers.py: request_latency_buckets (e2e, queue, inference, prefill, decode)
VLLM_REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# vllm/v1/metrics/loggers.py: histogram_iteration_tokens (v0.10 fixed list)
VLLM_ITERATION_TOKEN_BUCKETS: tuple[float, ...] = (
    1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
)  # fmt: skip
# vllm.v1.engine.FinishReason string values
VLLM_FINISH_REASONS: tuple[str, ...] = ("stop", "length", "abort")

# sglang/srt/metrics/collector.py: TokenizerMetricsCollector defaults
SGLANG_TTFT_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
)  # fmt: skip
SGLANG_ITL_BUCKETS: tuple[float, ...] = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040,
    0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
SGLANG_E2E_BUCKETS: tuple[float, ...] = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400,
    600, 1200, 1800, 2400,
)  # fmt: skip


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (the bucket rule of vLLM's token histograms)."""
    if max_value < 1:
        raise ValueError(f"max_model_len must be >= 1, got {max_value}")
    buckets: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * scale
            if value > max_value:
                return buckets
            buckets.append(value)
        scale *= 10


@dataclass(frozen=True)
class FinishedRequest:
    """The per-request timings an engine reports when a request ends (seconds, engine clock)."""

    prompt_tokens: int
    generation_tokens: int
    max_tokens: int
    finish_reason: str
    e2e_s: float  # arrival -> last token
    queue_s: float  # arrival -> first scheduled
    prefill_s: float  # first scheduled -> first token
    decode_s: float  # first token -> last token
    inference_s: float  # first scheduled -> last token


@dataclass(frozen=True)
class EngineGauges:
    """The scheduler state after a step."""

    running: int
    waiting: int
    kv_usage: float  # 0..1
    kv_used_tokens: int = 0
    generation_throughput: float = 0.0  # tokens/s over the last step


class EngineMetrics(Protocol):
    """What the emulated engine reports; implemented per engine kind with that engine's names."""

    registry: CollectorRegistry

    def record_gauges(self, gauges: EngineGauges) -> None: ...
    def record_step_tokens(self, prompt_tokens: int, generation_tokens: int) -> None: ...
    def record_preemptions(self, count: int) -> None: ...
    def record_prefix_cache(self, queried_tokens: int, hit_tokens: int, computed_tokens: int) -> None:
        """One step's prefix-cache accounting: ``queried_tokens``/``hit_tokens`` are the prompt tokens of
        the requests the step admits for the first time and those found cached, ``computed_tokens`` the
        prompt tokens the step computes for requests never preempted."""
        ...

    def record_first_token(self, ttft_s: float) -> None: ...
    def record_inter_token(self, itl_s: float) -> None: ...
    def record_finished(self, request: FinishedRequest) -> None: ...


class VllmMetrics:
    """vLLM v1's ``PrometheusStatLogger`` metrics for one engine (``engine`` label = engine index)."""

    def __init__(self, model_name: str, max_model_len: int, engine_index: int = 0) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labelnames = ["model_name", "engine"]
        values = {"model_name": model_name, "engine": str(engine_index)}
        reg = self.registry
        token_buckets = build_1_2_5_buckets(max_model_len)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labelnames, registry=reg).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labelnames, registry=reg).labels(**values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...] | list[int]) -> Histogram:
            return Histogram(name, doc, labelnames, buckets=list(buckets), registry=reg).labels(**values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        by_source = Counter(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            [*labelnames, "source"],
            registry=reg,
        )
        self.prompt_tokens_by_source = {
            source: by_source.labels(**values, source=source)
            for source in ("local_compute", "local_cache_hit", "external_kv_transfer")
        }
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labelnames, "finished_reason"],
            registry=reg,
        )
        self.success: Mapping[str, Counter] = {
            reason: success.labels(finished_reason=reason, **values) for reason in VLLM_FINISH_REASONS
        }
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", token_buckets
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", token_buckets
        )
        self.request_max_tokens = histogram(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", token_buckets
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            VLLM_ITERATION_TOKEN_BUCKETS,
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            VLLM_TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            VLLM_ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.prefill = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )
        self.decode = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            VLLM_REQUEST_LATENCY_BUCKETS,
        )

    def record_gauges(self, gauges: EngineGauges) -> None:
        self.running.set(gauges.running)
        self.waiting.set(gauges.waiting)
        self.kv_usage.set(gauges.kv_usage)

    def record_step_tokens(self, prompt_tokens: int, generation_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.prompt_tokens_by_source["local_compute"].inc(prompt_tokens)
        self.generation_tokens.inc(generation_tokens)
        if prompt_tokens + generation_tokens > 0:
            self.iteration_tokens.observe(prompt_tokens + generation_tokens)

    def record_preemptions(self, count: int) -> None:
        self.preemptions.inc(count)

    def record_prefix_cache(self, queried_tokens: int, hit_tokens: int, computed_tokens: int) -> None:
        del computed_tokens  # vLLM counts lookups, not the batch's computed tokens
        self.prefix_cache_queries.inc(queried_tokens)
        self.prefix_cache_hits.inc(hit_tokens)
        # cached prompt tokens count in vllm:prompt_tokens too (its total), under source local_cache_hit
        self.prompt_tokens.inc(hit_tokens)
        self.prompt_tokens_by_source["local_cache_hit"].inc(hit_tokens)

    def record_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def record_inter_token(self, itl_s: float) -> None:
        self.itl.observe(itl_s)

    def record_finished(self, request: FinishedRequest) -> None:
        reason = request.finish_reason if request.finish_reason in self.success else "abort"
        self.success[reason].inc()
        self.e2e.observe(request.e2e_s)
        self.queue.observe(request.queue_s)
        self.prefill.observe(request.prefill_s)
        self.decode.observe(request.decode_s)
        self.inference.observe(request.inference_s)
        self.request_prompt_tokens.observe(request.prompt_tokens)
        self.request_generation_tokens.observe(request.generation_tokens)
        self.request_max_tokens.observe(request.max_tokens)


class SglangMetrics:
    """SGLang's tokenizer and scheduler metrics for one server (label ``model_name``)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labelnames = ["model_name"]
        values = {"model_name": model_name}
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labelnames, registry=reg).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labelnames, registry=reg).labels(**values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, labelnames, buckets=list(buckets), registry=reg).labels(**values)

        self.running = gauge("sglang:num_running_reqs", "The number of running requests.")
        self.queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("sglang:token_usage", "The token usage.")
        self.used_tokens = gauge("sglang:num_used_tokens", "The number of used tokens.")
        self.gen_throughput = gauge("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = gauge("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.prompt_tokens = counter("sglang:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("sglang:generation_tokens", "Number of generation tokens processed.")
        self.requests = counter("sglang:num_requests", "Number of requests processed.")
        self.ttft = histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            SGLANG_TTFT_BUCKETS,
        )
        self.itl = histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            SGLANG_ITL_BUCKETS,
        )
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            SGLANG_E2E_BUCKETS,
        )

    def record_gauges(self, gauges: EngineGauges) -> None:
        self.running.set(gauges.running)
        self.queue.set(gauges.waiting)
        self.token_usage.set(gauges.kv_usage)
        self.used_tokens.set(gauges.kv_used_tokens)
        self.gen_throughput.set(gauges.generation_throughput)

    def record_step_tokens(self, prompt_tokens: int, generation_tokens: int) -> None:
        # SGLang counts tokens per finished request (observe_one_finished_request), not per step.
        del prompt_tokens, generation_tokens

    def record_preemptions(self, count: int) -> None:
        del count  # SGLang calls these retractions and exposes them as a histogram; not emulated

    def record_prefix_cache(self, queried_tokens: int, hit_tokens: int, computed_tokens: int) -> None:
        # per prefill batch, the ratio of that batch; batches without prompt tokens (decode) leave it
        del queried_tokens
        if hit_tokens + computed_tokens > 0:
            self.cache_hit_rate.set(hit_tokens / (hit_tokens + computed_tokens))

    def record_first_token(self, ttft_s: float) -> None:
        self.ttft.observe(ttft_s)

    def record_inter_token(self, itl_s: float) -> None:
        self.itl.observe(itl_s)

    def record_finished(self, request: FinishedRequest) -> None:
        self.prompt_tokens.inc(request.prompt_tokens)
        self.generation_tokens.inc(request.generation_tokens)
        self.requests.inc()
        self.e2e.observe(request.e2e_s)


def make_metrics(
    engine: EngineKind, model_name: str, max_model_len: int, engine_index: int = 0
) -> EngineMetrics:
    """The metrics of ``engine`` ("vllm" or "sglang") for one simulated pod."""
    if engine == "vllm":
        return VllmMetrics(model_name, max_model_len, engine_index)
    if engine == "sglang":
        return SglangMetrics(model_name)
    raise ValueError(f"engine must be one of {ENGINE_KINDS}, got {engine!r}")


def render(metrics: EngineMetrics) -> bytes:
    """The text exposition of one pod's registry."""
    return generate_latest(metrics.registry)
