"""PromQL built per engine and role, result mapping to signal states, and the scrape relabelling."""

from __future__ import annotations

from typing import Any

import pytest

from disagg.metrics import build_queries, engine_scrape_config, scrape_relabel_configs
from disagg.metrics.prometheus import (
    PrometheusSignals,
    Signals,
    combine_ttft,
    in_range,
    measured_from_result,
    observation_from_signals,
    values_by_pod,
)
from disagg.metrics.queries import counter_ratio, histogram_quantile, selector
from disagg.policy.types import Measured, RoleObservation, SignalState

SEL_P = '{namespace="prod",disagg_deployment="llama",disagg_role="prefill"}'
INVALID = Measured(None, SignalState.INVALID)
SEL_D = '{namespace="prod",disagg_deployment="llama",disagg_role="decode"}'


def test_vllm_queries_select_the_right_pool_and_metric() -> None:
    q = build_queries("vllm", "prod", "llama", ttft_percentile=90, itl_percentile=95, window_s=120)
    assert q["ttft_prefill_side"] == (
        "(histogram_quantile(0.9, sum by (le) "
        f"(rate(vllm:time_to_first_token_seconds_bucket{SEL_P}[120s])))) or "
        "(histogram_quantile(0.9, sum by (le) "
        f"(rate(vllm_time_to_first_token_seconds_bucket{SEL_P}[120s]))))"
    )
    assert f"vllm:time_to_first_token_seconds_bucket{SEL_D}" in q["ttft_decode_side"]
    # ITL: the V1 name first, the older name as a fallback, on the decode pool only
    assert q["itl"].startswith(
        "(histogram_quantile(0.95, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket"
    )
    assert (
        "or (histogram_quantile(0.95, sum by (le) (rate(vllm:time_per_output_token_seconds_bucket" in q["itl"]
    )
    assert SEL_P not in q["itl"]
    assert q["request_rate"].startswith(f"(sum(rate(vllm:request_success_total{SEL_P}[120s]))) or ")
    # prompt lengths from the prefill pool, output lengths from the decode pool (prefill outputs 1 token)
    assert q["prompt_tokens_mean"].startswith(
        f"(sum(rate(vllm:request_prompt_tokens_sum{SEL_P}[120s])) / "
        f"sum(rate(vllm:request_prompt_tokens_count{SEL_P}[120s])))"
    )
    assert f"vllm:request_generation_tokens_sum{SEL_D}" in q["output_tokens_mean"]
    assert (
        "histogram_quantile(0.9, sum by (le) (rate(vllm:request_prompt_tokens_bucket"
        in q["prompt_tokens_p90"]
    )
    assert q["prefill.queue_depth"] == (
        f"(sum(vllm:num_requests_waiting{SEL_P})) or (sum(vllm_num_requests_waiting{SEL_P}))"
    )
    assert q["decode.running"].startswith(f"(sum(vllm:num_requests_running{SEL_D}))")
    # V1 name, V0 name, then both as an OpenMetrics exposition escapes them
    assert q["decode.kv_usage"] == (
        f"(avg(vllm:kv_cache_usage_perc{SEL_D})) or (avg(vllm:gpu_cache_usage_perc{SEL_D})) or "
        f"(avg(vllm_kv_cache_usage_perc{SEL_D})) or (avg(vllm_gpu_cache_usage_perc{SEL_D}))"
    )
    assert "vllm:request_queue_time_seconds_bucket" in q["prefill.queue_time"]
    assert f"sum(rate(vllm:request_prefill_time_seconds_sum{SEL_P}[120s]))" in q["prefill.compute_time"]
    assert q["decode.token_throughput"].startswith(f"(sum(rate(vllm:generation_tokens_total{SEL_D}[120s])))")


def test_sglang_queries_use_sglang_names() -> None:
    q = build_queries("sglang", "prod", "llama", 90, 90, 60)
    assert "sglang:time_to_first_token_seconds_bucket" in q["ttft_prefill_side"]
    assert "sglang:inter_token_latency_seconds_bucket" in q["itl"]
    assert (
        q["prefill.queue_depth"]
        == f"(sum(sglang:num_queue_reqs{SEL_P})) or (sum(sglang_num_queue_reqs{SEL_P}))"
    )
    assert q["decode.kv_usage"].startswith(f"(avg(sglang:token_usage{SEL_D}))")
    assert q["request_rate"].startswith(f"(sum(rate(sglang:num_requests_total{SEL_P}[60s])))")
    assert "sglang:queue_time_seconds_bucket" in q["prefill.queue_time"]
    # no prefill-time histogram in SGLang: mean TTFT - mean queue time on the prefill pool
    assert q["prefill.compute_time"].startswith("((sum(rate(sglang:time_to_first_token_seconds_sum")
    assert ") - ((sum(rate(sglang:queue_time_seconds_sum" in q["prefill.compute_time"]
    assert not any("vllm" in v for v in q.queries.values())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine": "tgi"}, "engine"),
        ({"window_s": 0}, "window"),
        ({"ttft_percentile": 100}, "quantile"),
        ({"deployment": ""}, "deployment"),
    ],
)
def test_bad_input_is_named(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "engine": "vllm",
        "namespace": "prod",
        "deployment": "llama",
        "ttft_percentile": 90,
        "itl_percentile": 90,
        "window_s": 60,
    }
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        build_queries(**args)  # type: ignore[arg-type]


def test_label_values_are_escaped() -> None:
    assert selector('a"b', "x", "decode") == '{namespace="a\\"b",disagg_deployment="x",disagg_role="decode"}'
    assert (
        histogram_quantile(["m"], 0.5, "{}", 30)
        == "histogram_quantile(0.5, sum by (le) (rate(m_bucket{}[30s])))"
    )


def test_results_map_to_states_never_to_zero() -> None:
    assert measured_from_result([]) == Measured(None, SignalState.MISSING)
    assert measured_from_result([{"metric": {}, "value": [1.0, "NaN"]}]) == Measured(None, SignalState.NAN)
    assert measured_from_result([{"metric": {}, "value": [1.0, "0.25"]}]) == Measured(0.25, SignalState.OK)
    assert measured_from_result([{"metric": {}, "value": [1.0, "0"]}]) == Measured(0.0, SignalState.OK)
    assert measured_from_result(None).state is SignalState.MISSING
    # no signal is infinite (histogram_quantile answers a finite bucket bound): garbage, not a value
    for raw in ("+Inf", "-Inf"):
        assert measured_from_result([{"metric": {}, "value": [1.0, raw]}]) == INVALID


def test_values_a_signal_cannot_take_are_invalid_never_used() -> None:
    # latencies, rates, counts, token lengths: >= 0
    assert in_range("ttft_prefill_side", Measured.of(-0.5)) == INVALID
    assert in_range("request_rate", Measured.of(-1e30)) == INVALID
    assert in_range("decode.queue_depth", Measured.of(-1.0)) == INVALID
    assert in_range("itl", Measured(float("inf"))) == INVALID
    assert in_range("itl", Measured.of(0.0)) == Measured(0.0)
    # wildly high but possible: a real reading (the policy scales up within its bounds)
    assert in_range("ttft_prefill_side", Measured.of(1e30)) == Measured(1e30)
    # fractions: [0, 1]
    assert in_range("decode.kv_usage", Measured.of(1.0)) == Measured(1.0)
    assert in_range("decode.kv_usage", Measured.of(1.5)) == INVALID
    assert in_range("prefill.prefix_hit_rate", Measured.of(-0.1)) == INVALID
    assert in_range("prefill.prefix_hit_rate", Measured.of(1.0 + 1e-9)).ok  # rounding of a ratio of rates
    # the staleness probe may be negative (a target stamping its samples ahead of Prometheus's clock)
    assert in_range("decode.sample_age", Measured.of(-2.0)) == Measured(-2.0)
    assert in_range("decode.sample_age", Measured(float("inf"))) == INVALID
    # states pass through
    assert in_range("itl", Measured.missing(SignalState.NAN)).state is SignalState.NAN
    # per-pod load: unknown, never a negative load
    result = [{"metric": {"pod": p}, "value": [1.0, v]} for p, v in (("a", "-3"), ("b", "+Inf"), ("c", "2"))]
    assert values_by_pod(result) == {"a": None, "b": None, "c": 2.0}


def test_user_ttft_is_both_sides_and_missing_if_either_is() -> None:
    both = combine_ttft(Measured.of(0.3), Measured.of(0.05))
    assert both.state is SignalState.OK and both.value == pytest.approx(0.35)
    assert combine_ttft(Measured.of(0.3), Measured.missing(SignalState.NAN)).state is SignalState.NAN
    assert combine_ttft(Measured.missing(), Measured.of(0.05)).state is SignalState.MISSING


POOLS = {"prefill": RoleObservation(replicas=2, ready=2), "decode": RoleObservation(replicas=3, ready=3)}


def test_observation_assembly_and_staleness() -> None:
    signals = Signals(
        {
            "ttft_prefill_side": Measured.of(0.4),
            "ttft_decode_side": Measured.of(0.1),
            "itl": Measured.of(0.03),
            "request_rate": Measured.of(5.0),
            "prefill.queue_time": Measured.of(0.1),
            "prefill.running": Measured.of(3.0),
            "prefill.sample_age": Measured.of(2.0),
            "decode.running": Measured.of(40.0),
            "decode.sample_age": Measured.of(900.0),  # decode pool stopped reporting long ago
            "decode.kv_usage": Measured.of(0.4),
        }
    )
    o = observation_from_signals(signals, POOLS, window_s=120, now=10.0)
    assert o.ttft.state is SignalState.STALE and o.itl.state is SignalState.STALE
    assert o.decode.running.state is SignalState.STALE and o.decode.kv_usage.state is SignalState.STALE
    assert o.prefill.running == Measured(3.0)
    assert o.prefill.compute_time.state is SignalState.MISSING
    assert o.request_rate == Measured(5.0)
    assert o.prompt_tokens_mean.state is SignalState.MISSING
    assert (o.prefill.replicas, o.decode.replicas) == (2, 3)


def test_relabelling_maps_pod_labels_to_target_labels() -> None:
    rules = scrape_relabel_configs()
    targets = {r.get("target_label"): r["source_labels"] for r in rules if "target_label" in r}
    assert targets["disagg_deployment"] == ["__meta_kubernetes_pod_label_disagg_dev_deployment"]
    assert targets["disagg_role"] == ["__meta_kubernetes_pod_label_disagg_dev_role"]
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]
    addresses = [r["source_labels"] for r in rules if r.get("target_label") == "__address__"]
    # the pod IP and the annotated port, as on any cluster (no twin-specific address rule)
    assert addresses == [["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"]]
    keep = [r for r in rules if r.get("action") == "keep"]
    assert keep[0]["source_labels"] == ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"]
    # engines and routers (the router's own TTFT histogram is preferred where it exports one)
    assert keep[1] == {
        "source_labels": ["__meta_kubernetes_pod_label_disagg_dev_role"],
        "action": "keep",
        "regex": "prefill|decode|router",
    }
    job = engine_scrape_config(kubeconfig_file="/tmp/kc", namespaces=["a"])
    assert job["kubernetes_sd_configs"] == [
        {"role": "pod", "kubeconfig_file": "/tmp/kc", "namespaces": {"names": ["a"]}}
    ]
    with pytest.raises(ValueError, match="not both"):
        engine_scrape_config(api_server="https://127.0.0.1:6443", kubeconfig_file="/tmp/kc")


def test_router_ttft_is_queried_only_where_the_router_exports_one() -> None:
    sglang = build_queries("sglang", "prod", "llama", 90, 90, 60)
    router_sel = '{namespace="prod",disagg_deployment="llama",disagg_role="router"}'
    assert sglang["ttft_router"] == (
        f"histogram_quantile(0.9, sum by (le) (rate(smg_router_ttft_seconds_bucket{router_sel}[60s])))"
    )
    assert "ttft_router" not in build_queries("vllm", "prod", "llama", 90, 90, 60).queries


def _pools() -> dict[str, RoleObservation]:
    return {"prefill": RoleObservation(replicas=1, ready=1), "decode": RoleObservation(replicas=1, ready=1)}


def test_user_ttft_prefers_the_router_and_falls_back_to_the_engine_sum() -> None:
    sides = {
        "ttft_prefill_side": Measured(0.4, SignalState.OK),
        "ttft_decode_side": Measured(0.1, SignalState.OK),
    }
    with_router = Signals({**sides, "ttft_router": Measured(0.62, SignalState.OK)})
    assert observation_from_signals(with_router, _pools(), 60, 0.0).ttft == Measured(0.62, SignalState.OK)
    # the router histogram without observations (NaN) or absent: the sum of the two engine sides
    for router in (Measured.missing(SignalState.NAN), None):
        values = dict(sides) if router is None else {**sides, "ttft_router": router}
        ttft = observation_from_signals(Signals(values), _pools(), 60, 0.0).ttft
        assert ttft.ok and ttft.value == pytest.approx(0.5)


def test_prefix_hit_rate_is_hits_over_queries_on_the_prefill_pool_for_vllm() -> None:
    q = build_queries("vllm", "prod", "llama", 90, 90, 120)
    # vllm 0.33.0 wheel, vllm/v1/metrics/loggers.py: counters in tokens, names paired per spelling
    assert q["prefill.prefix_hit_rate"] == " or ".join(
        f"(sum(rate({hits}{SEL_P}[120s])) / sum(rate({queries}{SEL_P}[120s])))"
        for hits, queries in (
            ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
            ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
            ("vllm_prefix_cache_hits_total", "vllm_prefix_cache_queries_total"),
            ("vllm_gpu_prefix_cache_hits_total", "vllm_gpu_prefix_cache_queries_total"),
        )
    )
    assert "decode.prefix_hit_rate" not in q.queries


def test_prefix_hit_rate_is_the_window_mean_of_the_gauge_for_sglang() -> None:
    q = build_queries("sglang", "prod", "llama", 90, 90, 60)
    # sglang 0.5.23 wheel, sglang/srt/observability/metrics_collector.py: a gauge per prefill batch
    assert q["prefill.prefix_hit_rate"] == (
        f"(avg(avg_over_time(sglang:cache_hit_rate{SEL_P}[60s]))) or "
        f"(avg(avg_over_time(sglang_cache_hit_rate{SEL_P}[60s])))"
    )
    assert "decode.prefix_hit_rate" not in q.queries


def test_counter_ratio_pairs_spellings_and_refuses_unpaired_names() -> None:
    assert counter_ratio(["a:h"], ["a:q"], "{}", 30) == (
        "(sum(rate(a:h{}[30s])) / sum(rate(a:q{}[30s]))) or (sum(rate(a_h{}[30s])) / sum(rate(a_q{}[30s])))"
    )
    with pytest.raises(ValueError, match="pair"):
        counter_ratio(["a:h", "b:h"], ["a:q"], "{}", 30)


class _FakeProm:
    """Answers each PromQL with a canned instant-vector result (an empty vector when not listed)."""

    def __init__(self, answers: dict[str, list[dict[str, Any]]]) -> None:
        self.answers = answers

    def custom_query(self, promql: str) -> list[dict[str, Any]]:
        return self.answers.get(promql, [])


def _hit_rate_observed(value: str | None, sample_age: str = "5") -> RoleObservation:
    queries = build_queries("vllm", "prod", "llama", 90, 90, 120)
    answers: dict[str, list[dict[str, Any]]] = {
        queries["prefill.sample_age"]: [{"metric": {}, "value": [1.0, sample_age]}]
    }
    if value is not None:
        answers[queries["prefill.prefix_hit_rate"]] = [{"metric": {}, "value": [1.0, value]}]
    client: Any = _FakeProm(answers)
    signals = PrometheusSignals("http://prometheus.invalid").run(queries, client=client)
    observation = observation_from_signals(signals, _pools(), 120, 0.0)
    assert observation.decode.prefix_hit_rate.state is SignalState.MISSING  # queried on the prefill pool only
    return observation.prefill


def test_the_adapter_reads_the_prefix_hit_rate_and_never_makes_a_zero() -> None:
    assert _hit_rate_observed("0.375").prefix_hit_rate == Measured(0.375, SignalState.OK)
    assert _hit_rate_observed("0").prefix_hit_rate == Measured(0.0, SignalState.OK)  # looked up, all missed
    # no series (an engine without the counters, not scraped yet): MISSING, not 0
    assert _hit_rate_observed(None).prefix_hit_rate == Measured(None, SignalState.MISSING)
    # series but no lookups in the window: rate(hits) / rate(queries) = 0/0 = NaN
    assert _hit_rate_observed("NaN").prefix_hit_rate == Measured(None, SignalState.NAN)
    # the pool stopped reporting: STALE like its other signals
    assert _hit_rate_observed("0.5", sample_age="900").prefix_hit_rate.state is SignalState.STALE


@pytest.mark.parametrize("raw", ["-1", "+Inf", "-Inf"])
def test_garbage_from_prometheus_leaves_ttft_and_itl_unavailable(raw: str) -> None:
    """Every query answered with a value no signal can take (the staleness probe left alone): no signal
    reaches the policy as OK, so it holds (a negative TTFT read as real shrank an idle-looking pool, an
    infinite one raised OverflowError in the replica arithmetic)."""
    queries = build_queries("vllm", "prod", "llama", 90, 90, 120)
    answers = {
        promql: [{"metric": {}, "value": [1.0, "3" if name.endswith("sample_age") else raw]}]
        for name, promql in queries.queries.items()
    }
    client: Any = _FakeProm(answers)
    signals = PrometheusSignals("http://prometheus.invalid").run(queries, client=client)
    assert not signals.errors
    o = observation_from_signals(signals, _pools(), 120, 0.0)
    assert o.ttft == INVALID and o.itl == INVALID
    for role in (o.prefill, o.decode):
        assert not any(getattr(role, f).ok for f in ("queue_depth", "running", "kv_usage", "queue_time"))
    assert not o.request_rate.ok and not o.prompt_tokens_mean.ok
