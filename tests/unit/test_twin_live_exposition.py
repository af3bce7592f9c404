"""The live twin's /metrics speak vLLM's and SGLang's exposition: names, label names, bucket boundaries.

Expected values are transcribed from the engines' sources (vllm/v1/metrics/loggers.py,
sglang/srt/metrics/collector.py), independently of the module's constants, so a typo on either side
shows up here.
"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from disagg.twin.live.exposition import (
    EngineGauges,
    FinishedRequest,
    SglangMetrics,
    VllmMetrics,
    build_1_2_5_buckets,
    make_metrics,
    render,
)

VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0]
VLLM_TTFT += [20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0]
VLLM_ITL += [40.0, 80.0]
VLLM_REQUEST = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0]
VLLM_REQUEST += [240.0, 480.0, 960.0, 1920.0, 7680.0]
SGLANG_TTFT = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]


def _finished() -> FinishedRequest:
    return FinishedRequest(
        prompt_tokens=1000,
        generation_tokens=50,
        max_tokens=50,
        finish_reason="length",
        e2e_s=1.2,
        queue_s=0.1,
        prefill_s=0.2,
        decode_s=0.9,
        inference_s=1.1,
    )


def _exercise(metrics: VllmMetrics | SglangMetrics) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    metrics.record_gauges(EngineGauges(running=3, waiting=2, kv_usage=0.25, kv_used_tokens=4096))
    metrics.record_step_tokens(1000, 3)
    metrics.record_first_token(0.3)
    metrics.record_inter_token(0.012)
    metrics.record_finished(_finished())
    text = render(metrics).decode()
    samples: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        samples[family.name] = [(s.name, dict(s.labels), s.value) for s in family.samples]
    return samples


def _buckets(samples: list[tuple[str, dict[str, str], float]]) -> list[float]:
    return [
        float(labels["le"])
        for name, labels, _ in samples
        if name.endswith("_bucket") and labels["le"] != "+Inf"
    ]


def test_vllm_names_labels_and_buckets() -> None:
    samples = _exercise(VllmMetrics("meta-llama/Llama-3.1-8B-Instruct", max_model_len=8192))
    required = [
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
        "vllm:request_prefill_time_seconds",
        "vllm:request_decode_time_seconds",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:request_success",
        "vllm:request_prompt_tokens",
        "vllm:request_generation_tokens",
    ]
    missing = [name for name in required if name not in samples]
    assert not missing
    for name in required:
        for _, labels, _ in samples[name]:
            assert labels["model_name"] == "meta-llama/Llama-3.1-8B-Instruct"
            assert labels["engine"] == "0"
    assert _buckets(samples["vllm:time_to_first_token_seconds"]) == VLLM_TTFT
    assert _buckets(samples["vllm:inter_token_latency_seconds"]) == VLLM_ITL
    for name in ("e2e_request_latency", "request_queue_time", "request_prefill_time", "request_decode_time"):
        assert _buckets(samples[f"vllm:{name}_seconds"]) == VLLM_REQUEST
    assert _buckets(samples["vllm:request_prompt_tokens"]) == [
        1,
        2,
        5,
        10,
        20,
        50,
        100,
        200,
        500,
        1000,
        2000,
        5000,
    ]


def test_vllm_counter_and_gauge_values() -> None:
    samples = _exercise(VllmMetrics("m", max_model_len=4096))
    values = {
        name: value for family in samples.values() for name, labels, value in family if "le" not in labels
    }
    assert values["vllm:prompt_tokens_total"] == 1000
    assert values["vllm:generation_tokens_total"] == 3
    assert values["vllm:num_requests_running"] == 3
    assert values["vllm:num_requests_waiting"] == 2
    assert values["vllm:kv_cache_usage_perc"] == 0.25
    success = {labels["finished_reason"]: value for _, labels, value in samples["vllm:request_success"]}
    assert success == {"stop": 0.0, "length": 1.0, "abort": 0.0}
    ttft = {n: v for n, labels, v in samples["vllm:time_to_first_token_seconds"] if labels.get("le") == "0.5"}
    assert ttft == {"vllm:time_to_first_token_seconds_bucket": 1.0}  # 0.3 s lands in le=0.5, not le=0.25


def test_sglang_names_and_buckets() -> None:
    samples = _exercise(SglangMetrics("meta-llama/Llama-3.1-8B-Instruct"))
    for name in (
        "sglang:time_to_first_token_seconds",
        "sglang:inter_token_latency_seconds",
        "sglang:e2e_request_latency_seconds",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens",
        "sglang:generation_tokens",
    ):
        assert name in samples, name
        assert all(
            labels["model_name"] == "meta-llama/Llama-3.1-8B-Instruct" for _, labels, _ in samples[name]
        )
    assert _buckets(samples["sglang:time_to_first_token_seconds"]) == SGLANG_TTFT
    assert not any(name.startswith("vllm:") for name in samples)
    values = {n: v for family in samples.values() for n, labels, v in family if "le" not in labels}
    assert values["sglang:num_queue_reqs"] == 2
    assert values["sglang:prompt_tokens_total"] == 1000


def _values(metrics: VllmMetrics | SglangMetrics) -> dict[str, float]:
    text = render(metrics).decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "le" not in s.labels
    }


def test_vllm_prefix_cache_counters_count_lookups_in_tokens() -> None:
    # vllm 0.33.0 wheel, vllm/v1/metrics/loggers.py: Counter(name="vllm:prefix_cache_queries") and
    # "vllm:prefix_cache_hits", exposed with _total, labels model_name and engine
    metrics = VllmMetrics("m", max_model_len=4096)
    before = _values(metrics)
    assert before["vllm:prefix_cache_queries_total"] == 0 and before["vllm:prefix_cache_hits_total"] == 0
    metrics.record_prefix_cache(queried_tokens=2048, hit_tokens=512, computed_tokens=1536)
    metrics.record_prefix_cache(queried_tokens=1000, hit_tokens=0, computed_tokens=3000)
    metrics.record_prefix_cache(queried_tokens=0, hit_tokens=0, computed_tokens=0)  # a decode-only step
    values = _values(metrics)
    assert values["vllm:prefix_cache_queries_total"] == 3048
    assert values["vllm:prefix_cache_hits_total"] == 512
    families = {f.name: f for f in text_string_to_metric_families(render(metrics).decode())}
    assert families["vllm:prefix_cache_hits"].type == "counter"
    assert {tuple(sorted(s.labels)) for s in families["vllm:prefix_cache_queries"].samples} == {
        ("engine", "model_name")
    }


def test_sglang_cache_hit_rate_is_the_last_prefill_batch_ratio() -> None:
    # sglang 0.5.23 wheel: Gauge(name="sglang:cache_hit_rate") set per prefill batch to
    # hit / (hit + computed) tokens (scheduler_components/metrics_reporter.py report_prefill_stats)
    metrics = SglangMetrics("m")
    assert _values(metrics)["sglang:cache_hit_rate"] == 0.0
    metrics.record_prefix_cache(queried_tokens=2048, hit_tokens=512, computed_tokens=1536)
    assert _values(metrics)["sglang:cache_hit_rate"] == 0.25
    metrics.record_prefix_cache(queried_tokens=0, hit_tokens=0, computed_tokens=0)  # decode: left as is
    assert _values(metrics)["sglang:cache_hit_rate"] == 0.25
    metrics.record_prefix_cache(queried_tokens=0, hit_tokens=0, computed_tokens=100)  # a chunk, no new hits
    assert _values(metrics)["sglang:cache_hit_rate"] == 0.0
    assert not any(name.startswith("vllm:") for name in _values(metrics))


def test_each_pod_has_its_own_registry() -> None:
    a = make_metrics("vllm", "m", 4096)
    b = make_metrics("vllm", "m", 4096)
    a.record_first_token(0.2)
    assert b"vllm:time_to_first_token_seconds_count" in render(b)
    count_b = [
        line
        for line in render(b).decode().splitlines()
        if line.startswith("vllm:time_to_first_token_seconds_count")
    ]
    assert count_b == ['vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 0.0']


def test_one_two_five_buckets() -> None:
    assert build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]
    assert build_1_2_5_buckets(1) == [1]


def test_unknown_engine_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="engine"):
        make_metrics("trtllm", "m", 10)  # type: ignore[arg-type]


def test_vllm_prompt_tokens_count_cached_tokens_and_split_them_by_source() -> None:
    # vllm 0.33.0 wheel, vllm/v1/metrics/stats.py: vllm:prompt_tokens is PromptTokenStats.total (computed +
    # local cache hits + external KV), vllm:prompt_tokens_by_source splits it by the label source
    metrics = VllmMetrics("m", max_model_len=4096)
    metrics.record_prefix_cache(queried_tokens=2048, hit_tokens=512, computed_tokens=1536)
    metrics.record_step_tokens(prompt_tokens=1536, generation_tokens=0)
    metrics.record_step_tokens(prompt_tokens=0, generation_tokens=7)
    families = {f.name: f for f in text_string_to_metric_families(render(metrics).decode())}
    total = [s.value for s in families["vllm:prompt_tokens"].samples if s.name.endswith("_total")]
    assert total == [2048]
    by_source = {
        s.labels["source"]: s.value
        for s in families["vllm:prompt_tokens_by_source"].samples
        if s.name.endswith("_total")
    }
    assert by_source == {"local_compute": 1536, "local_cache_hit": 512, "external_kv_transfer": 0}
