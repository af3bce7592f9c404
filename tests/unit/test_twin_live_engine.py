"""The live engine's scheduling and the request/handshake parsing of the live twin (no network)."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from disagg.perf.latency import load_latency_model
from disagg.twin.live.engine import EngineSettings, EngineUnavailable, LiveEngine
from disagg.twin.live.exposition import VllmMetrics, render
from disagg.twin.live.follower import Defaults, Overrides, defaults_from_deployment, pod_spec_for
from disagg.twin.live.kv_exchange import (
    Bootstrap,
    Rendezvous,
    RequestError,
    parse_bootstrap,
    parse_kv_transfer_params,
)
from disagg.twin.live.latency import load_step_latency
from disagg.twin.live.load import trace_requests
from disagg.twin.live.proxy import check_local_endpoint, prefill_request
from disagg.twin.live.server import prompt_token_count, requested_max_tokens

MODEL = load_latency_model("llama-3.1-8b", "h100", 1)
FAST = EngineSettings(time_scale=0.02)


def _engine(settings: EngineSettings = FAST) -> LiveEngine:
    return LiveEngine(
        MODEL,
        VllmMetrics("m", settings.max_model_len),
        settings,
        engine_id="pod-0",
        side_channel=("127.0.0.1", 8000),
    )


async def _drain_all(engine: LiveEngine, *requests: Any) -> list[list[str]]:
    async def collect(request: Any) -> list[str]:
        return [event.text async for event in engine.stream(request) if event.finish_reason is None]

    return list(await asyncio.gather(*(collect(r) for r in requests)))


def test_requests_get_their_tokens_and_timings_follow_the_latency_model() -> None:
    async def scenario() -> LiveEngine:
        engine = _engine()
        engine.start()
        a = engine.submit(2048, 8)
        b = engine.submit(128, 4)
        texts = await _drain_all(engine, a, b)
        assert [len(t) for t in texts] == [8, 4]
        await engine.stop()
        return engine

    engine = asyncio.run(scenario())
    records = {r.prompt_tokens: r for r in engine.records}
    long = records[2048]
    assert long.finish_reason == "length" and long.generation_tokens == 8
    # Both prompts share the first step, so TTFT is at least the batched prefill's modelled time.
    assert long.ttft_s is not None and long.ttft_s >= MODEL.prefill_time_s([2048, 128])
    assert len(long.itls_s) == 7
    assert min(long.itls_s) >= MODEL.decode_step_time_s(1, 2049)
    assert engine.core.kv_used == 0 and engine.core.idle


def test_kv_capacity_queues_requests_until_blocks_free() -> None:
    async def scenario() -> LiveEngine:
        # KV for 128 tokens: two 100-token prompts do not fit together.
        engine = _engine(EngineSettings(time_scale=0.02, kv_capacity_tokens=128))
        engine.start()
        first = engine.submit(100, 4)
        second = engine.submit(100, 4)
        await _drain_all(engine, first, second)
        await engine.stop()
        return engine

    engine = asyncio.run(scenario())
    first, second = sorted(engine.records, key=lambda r: r.request_id)
    assert first.ttft_s is not None and second.ttft_s is not None
    # only 28 tokens of KV are left for the second prompt in the first step: its prefill ends later
    assert second.ttft_s > first.ttft_s
    assert engine.core.kv_used == 0


def _prefix_counters(engine: LiveEngine) -> tuple[float, float]:
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in render(engine.metrics).decode().splitlines()
        if line.startswith(("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"))
    }
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def test_prefix_cache_lookups_count_each_prompt_once_in_tokens() -> None:
    async def scenario() -> LiveEngine:
        engine = _engine()
        engine.start()
        # the load generator's prompts share no prefix: every lookup misses, as on a real engine
        await _drain_all(engine, engine.submit(2048, 8), engine.submit(128, 4))
        await engine.stop()
        return engine

    engine = asyncio.run(scenario())
    assert _prefix_counters(engine) == (2048 + 128, 0)


def test_prefix_cache_hits_are_the_tokens_the_core_served_from_its_cache() -> None:
    async def scenario() -> LiveEngine:
        engine = _engine()
        engine.core._caching = True  # prefix caching with block hashes, as the offline simulator runs it
        engine.start()
        for _ in range(2):  # the second prompt's leading blocks are cached by the first
            request = engine.submit(2048, 2)
            request.core.hashes = (11, 12, 13, 14)  # 512-token blocks (EngineSettings.prefix_block_tokens)
            await _drain_all(engine, request)
        await engine.stop()
        return engine

    engine = asyncio.run(scenario())
    queries, hits = _prefix_counters(engine)
    # whole blocks within prompt - 1 tokens: 3 of 4 (the last token is always computed, as in vLLM)
    assert (queries, hits) == (2 * 2048, 3 * 512)
    assert hits == engine.core.prefix_hit_tokens


# What vllm-router 0.1.17 sends a prefill engine (vllm-project/router src/routers/http/vllm_pd_router.rs,
# build_prefill_kv_transfer_params for NIXL).
ROUTER_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def test_prefill_with_remote_decode_answers_the_nixl_handshake() -> None:
    async def scenario() -> tuple[LiveEngine, dict[str, Any]]:
        engine = _engine()
        engine.start()
        request = engine.submit(100, 50, ROUTER_PREFILL_PARAMS, request_id="r-1")
        events = [e async for e in engine.stream(request)]
        await engine.stop()
        assert [e.finish_reason for e in events] == [None, "length"]  # max_tokens forced to 1
        assert events[-1].kv_transfer_params is not None
        return engine, dict(events[-1].kv_transfer_params)

    engine, params = asyncio.run(scenario())
    # vllm 0.33.0 NixlConnector request_finished's fields
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == "pod-0" and params["remote_request_id"] == "r-1"
    assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == 8000
    assert params["remote_block_ids"] == [list(range(7))]  # ceil(100 / 16) blocks, one KV cache group
    assert params["tp_size"] == 1 and params["remote_num_tokens"] == 100
    assert parse_kv_transfer_params(params).remote is not None  # a decode engine accepts them
    (record,) = engine.transfers
    assert record.outcome == "remote-decode" and record.received == ROUTER_PREFILL_PARAMS
    assert record.returned == params
    assert engine.held == {"r-1": (tuple(range(7)),)}  # kept for the decode engine to read
    assert engine.release_blocks("r-1", ((0, 1),)) is not None  # not the blocks it holds
    assert engine.release_blocks("r-1", (tuple(range(7)),)) is None and not engine.held


def test_decode_with_remote_prefill_pays_the_transfer_and_skips_prefill() -> None:
    params = {
        "do_remote_prefill": True,
        "remote_engine_id": "p-0",
        "remote_request_id": "r-1",
        "remote_block_ids": [[1, 2, 3]],
        "remote_host": "127.0.0.1",
        "remote_port": 9000,
    }

    async def scenario() -> LiveEngine:
        engine = _engine()
        engine.start()
        request = engine.submit(8000, 3, params)
        await _drain_all(engine, request)
        await engine.stop()
        return engine

    engine = asyncio.run(scenario())
    (transfer,) = engine.transfers
    assert transfer.outcome == "kv-loaded" and transfer.received == params
    record = engine.records[0]
    assert record.generation_tokens == 3
    assert record.ttft_s is not None
    assert record.ttft_s >= MODEL.kv_transfer_time_s(8000, "nic") + MODEL.decode_step_time_s(1, 8000)
    exposition = render(engine.metrics).decode().splitlines()
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 0.0' in exposition  # no local prefill
    assert 'vllm:generation_tokens_total{engine="0",model_name="m"} 3.0' in exposition


REMOTE = {
    "do_remote_prefill": True,
    "remote_engine_id": "e",
    "remote_request_id": "r",
    "remote_block_ids": [[1]],
    "remote_host": "127.0.0.1",
    "remote_port": 5600,
}


@pytest.mark.parametrize(
    "field", ["remote_engine_id", "remote_request_id", "remote_block_ids", "remote_host", "remote_port"]
)
def test_remote_prefill_params_missing_a_field_are_a_kv_load_failure_naming_it(field: str) -> None:
    params = {k: v for k, v in REMOTE.items() if k != field}
    parsed = parse_kv_transfer_params(params)
    assert parsed.remote is None and parsed.invalid is not None and field in parsed.invalid
    assert parse_kv_transfer_params(REMOTE).remote is not None
    flat = parse_kv_transfer_params({**REMOTE, "remote_block_ids": [1, 2]}).remote  # older vLLM: one group
    assert flat is not None and flat.block_ids == ((1, 2),)


def test_kv_transfer_params_must_be_an_object() -> None:
    with pytest.raises(RequestError) as err:
        parse_kv_transfer_params("yes")
    assert err.value.field == "kv_transfer_params"


@pytest.mark.parametrize("policy", ["fail", "recompute"])
def test_a_malformed_exchange_fails_or_recomputes_per_kv_load_failure_policy(policy: Any) -> None:
    """vLLM: invalid KVTransferParams never load; kv_load_failure_policy decides (fail is the default)."""
    params = {k: v for k, v in REMOTE.items() if k != "remote_engine_id"}

    async def scenario() -> tuple[LiveEngine, list[Any]]:
        engine = _engine(EngineSettings(time_scale=0.02, kv_load_failure_policy=policy))
        engine.start()
        request = engine.submit(500, 4, params)
        events = [e async for e in engine.stream(request)]
        await engine.stop()
        return engine, events

    engine, events = asyncio.run(scenario())
    (record,) = engine.transfers
    assert record.received == params and "remote_engine_id" in record.detail
    exposition = render(engine.metrics).decode().splitlines()
    if policy == "fail":
        assert [e.finish_reason for e in events] == ["error"]
        assert record.outcome == "kv-load-failed" and record.finish_reason == "error"
    else:
        assert [e.finish_reason for e in events][-1] == "length" and len(events) == 5
        assert record.outcome == "kv-load-failed-recomputed"
        assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 500.0' in exposition  # prefilled here


def test_engine_refuses_bad_requests_and_stopped_engines() -> None:
    async def scenario() -> None:
        engine = _engine()
        with pytest.raises(EngineUnavailable):
            engine.submit(10, 10)
        engine.start()
        with pytest.raises(RequestError, match="max_tokens"):
            engine.submit(10, 0)
        with pytest.raises(RequestError, match="max_model_len"):
            engine.submit(FAST.max_model_len, 10)
        await engine.drain(0.0)
        with pytest.raises(EngineUnavailable):
            engine.submit(10, 10)

    asyncio.run(scenario())


def test_prompt_counting_and_defaults() -> None:
    assert prompt_token_count("completions", {"prompt": list(range(777))}) == 777
    assert prompt_token_count("completions", {"prompt": "abcdefgh"}) == 2
    assert prompt_token_count("chat", {"messages": [{"role": "user", "content": "x" * 40}]}) == 10
    with pytest.raises(RequestError, match="messages"):
        prompt_token_count("chat", {"messages": []})
    with pytest.raises(RequestError, match="prompt"):
        prompt_token_count("completions", {"prompt": ["a", "b"]})
    assert requested_max_tokens("completions", {}, 256) == 16
    assert requested_max_tokens("chat", {"max_completion_tokens": 7}, 256) == 7
    with pytest.raises(RequestError, match="max_tokens"):
        requested_max_tokens("chat", {"max_tokens": -1}, 256)


def test_toy_proxy_prefill_body_and_local_endpoints_only() -> None:
    body = prefill_request({"prompt": "hi", "max_tokens": 50, "stream": True, "stream_options": {"x": 1}})
    assert body["max_tokens"] == 1 and body["stream"] is False and "stream_options" not in body
    assert body["kv_transfer_params"]["do_remote_decode"] is True
    assert check_local_endpoint("127.0.0.1:8000") == "127.0.0.1:8000"
    assert check_local_endpoint("127.64.0.3:8000") == "127.64.0.3:8000"  # a pod IP from the loopback CIDR
    with pytest.raises(ValueError, match=r"127\.0\.0\.0/8"):
        check_local_endpoint("10.0.0.1:8000")


def _pod(role: str, phase: str = "Running", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"dd-{role}-abc",
            "labels": {"disagg.dev/role": role, "disagg.dev/deployment": "dd"},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def test_pod_spec_from_pod_and_deployment() -> None:
    defaults = Defaults(model="meta-llama/Llama-3.1-70B-Instruct", tp={"prefill": 4, "decode": 8})
    pod = _pod(
        "prefill",
        nodeSelector={"disagg.dev/gpu-type": "l40s"},
        containers=[{"name": "engine", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
    )
    spec = pod_spec_for(pod, defaults, Overrides())
    assert spec is not None
    assert (spec.role, spec.choice.gpu, spec.choice.tp, spec.choice.model) == (
        "prefill",
        "l40s",
        2,
        "meta-llama/Llama-3.1-70B-Instruct",
    )
    decode = pod_spec_for(_pod("decode"), defaults, Overrides(gpu="h100"))
    assert decode is not None and decode.choice.tp == 8 and decode.choice.gpu == "h100"
    assert pod_spec_for(_pod("decode", phase="Pending"), defaults, Overrides()) is None
    assert pod_spec_for(_pod("router"), defaults, Overrides()) is None
    deleting = _pod("decode")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pod_spec_for(deleting, defaults, Overrides()) is None
    # no pod IP, or one off loopback: 127.0.0.1 and free ports
    assert decode.host == "127.0.0.1" and decode.http_port == 0 and decode.side_channel_port == 0


def test_a_pod_with_a_loopback_ip_is_served_on_it_at_its_engine_ports() -> None:
    container = {
        "name": "engine",
        "args": [
            "--kv-transfer-config",
            '{"kv_connector":"NixlConnector","kv_load_failure_policy":"recompute"}',
        ],
        "env": [{"name": "VLLM_NIXL_SIDE_CHANNEL_PORT", "value": "5600"}],
        "ports": [{"name": "http", "containerPort": 8000}, {"name": "nixl", "containerPort": 5600}],
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", "7"]}}},
    }
    pod = _pod("decode", containers=[container])
    pod["status"]["podIP"] = "127.64.0.9"
    spec = pod_spec_for(pod, Defaults(), Overrides())
    assert spec is not None
    assert (spec.host, spec.http_port, spec.side_channel_port) == ("127.64.0.9", 8000, 5600)
    assert spec.pre_stop_s == 7.0 and spec.kv_load_failure_policy == "recompute"
    pod["status"]["podIP"] = "10.244.0.9"  # never listened on: the twin stays on loopback
    off = pod_spec_for(pod, Defaults(), Overrides())
    assert off is not None and (off.host, off.http_port) == ("127.0.0.1", 0)


REPO = Path(__file__).resolve().parents[2]


def test_a_pod_of_the_example_deployment_gets_a_calibrated_model() -> None:
    example = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())
    defaults = defaults_from_deployment(example)
    assert (defaults.model, defaults.served_model, defaults.engine) == (
        "meta-llama/Llama-3.1-70B-Instruct",
        "llama-3.1-70b",
        "vllm",
    )
    spec = pod_spec_for(_pod("prefill"), defaults, Overrides())
    assert spec is not None
    assert (spec.choice.gpu, spec.choice.tp, spec.model_name) == ("NVIDIA-H100-80GB-HBM3", 4, "llama-3.1-70b")
    assert spec.max_model_len == 32768  # the example's maxModelLen: vLLM's token buckets stop at 20000
    model = load_step_latency(spec.choice)
    assert model.tp == 4 and model.kv_capacity_tokens > 0


def test_trace_requests_start_at_zero_and_keep_lengths() -> None:
    trace = REPO.parent / "shared" / "traces" / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    if not trace.is_file():
        pytest.skip(f"{trace} not present (../shared)")
    requests = trace_requests(trace, 50)
    assert len(requests) == 50
    assert requests[0].arrival_s == 0.0
    assert all(b.arrival_s >= a.arrival_s for a, b in itertools.pairwise(requests))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in requests)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"bootstrap_host": "127.0.0.1", "bootstrap_port": 9000}, "bootstrap_room"),
        ({"bootstrap_room": 5}, "bootstrap_host"),
        ({"bootstrap_host": "h", "bootstrap_port": 0, "bootstrap_room": 5}, "bootstrap_port"),
        ({"bootstrap_host": "h", "bootstrap_port": "x", "bootstrap_room": 5}, "bootstrap_port"),
    ],
)
def test_bad_bootstrap_fields_name_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_bootstrap(body)
    assert err.value.field == field


def test_sglang_bootstrap_pairs_a_prefill_and_a_decode_engine() -> None:
    """The decode waits for its room's prefill, then pays the KV transfer; the prefill ends at 1 token."""

    async def scenario() -> tuple[LiveEngine, LiveEngine]:
        shared = Rendezvous()
        prefill = LiveEngine(
            MODEL, VllmMetrics("m", 4096), FAST, engine_id="p", role="prefill", rendezvous=shared
        )
        decode = LiveEngine(
            MODEL, VllmMetrics("m", 4096), FAST, engine_id="d", role="decode", rendezvous=shared
        )
        prefill.start()
        decode.start()
        room = parse_bootstrap({"bootstrap_host": "127.0.0.1", "bootstrap_port": 9000, "bootstrap_room": 42})
        assert room == Bootstrap("127.0.0.1", 9000, 42)
        d = decode.submit(3000, 5, bootstrap=room)  # the router sends both at once; decode may come first
        p = prefill.submit(3000, 5, bootstrap=room)
        texts = await _drain_all(decode, d)
        await _drain_all(prefill, p)
        assert len(texts[0]) == 5
        await prefill.stop()
        await decode.stop()
        return prefill, decode

    prefill, decode = asyncio.run(scenario())
    (p_record,), (d_record,) = prefill.records, decode.records
    assert p_record.generation_tokens == 1 and d_record.generation_tokens == 5
    assert p_record.ttft_s is not None and d_record.ttft_s is not None
    assert d_record.ttft_s >= p_record.ttft_s + MODEL.kv_transfer_time_s(3000, "nic")
    assert 'vllm:prompt_tokens_total{engine="0",model_name="m"} 0.0' in render(decode.metrics).decode()


def test_drain_finishes_in_flight_requests_and_refuses_new_ones() -> None:
    async def scenario() -> tuple[int, str | None]:
        engine = _engine()
        engine.start()
        request = engine.submit(500, 20)
        draining = asyncio.ensure_future(engine.drain(timeout_s=60.0))
        await asyncio.sleep(0)
        with pytest.raises(EngineUnavailable):
            engine.submit(10, 10)
        aborted = await draining
        return aborted, request.finish_reason

    assert asyncio.run(scenario()) == (0, "length")


def test_a_followed_pod_loads_its_model_for_the_spec_start_up_unless_the_cli_fixes_it() -> None:
    import argparse
    import copy

    from disagg.perf.startup import spec_startup_delay_s
    from disagg.twin.live.cli import _pool_settings, configure
    from disagg.twin.live.follower import spec_startup_delay
    from disagg.twin.live.pods import PodPool, PoolSettings

    example = yaml.safe_load((REPO / "examples" / "vllm-nixl.yaml").read_text())  # 70B, weights cached
    uncached = copy.deepcopy(example)
    del uncached["spec"]["model"]["cache"]
    cached = defaults_from_deployment(example, startup_scale=0.5)
    downloading = defaults_from_deployment(uncached, startup_scale=0.5)
    assert cached.startup_delay_s == pytest.approx(spec_startup_delay_s(example["spec"], "bf16") * 0.5)
    assert downloading.startup_delay_s == pytest.approx(spec_startup_delay_s(uncached["spec"], "bf16") * 0.5)
    assert cached.startup_delay_s is not None and downloading.startup_delay_s is not None
    assert 60 < cached.startup_delay_s < downloading.startup_delay_s  # ~77 s vs ~195 s at half scale
    spec = pod_spec_for(_pod("prefill"), cached, Overrides())
    assert spec is not None and spec.startup_delay_s == cached.startup_delay_s
    fixed = pod_spec_for(_pod("prefill"), cached, Overrides(startup_delay_s=2.0))
    assert fixed is not None and fixed.startup_delay_s == 2.0  # --startup-delay wins
    # a model the twin has no profile of: the fallback's delay (None: the pool's setting)
    unknown = copy.deepcopy(uncached)
    unknown["spec"]["model"]["name"] = "Qwen/Qwen3-0.6B"
    assert defaults_from_deployment(unknown).startup_delay_s is None
    assert spec_startup_delay(unknown["spec"], "bf16") is None
    with pytest.raises(ValueError, match="scale"):
        spec_startup_delay(example["spec"], "bf16", scale=-1.0)
    # the pool sleeps the pod's own delay (else its own setting), in wall seconds
    pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=0.5), startup_delay_s=3.0))
    assert pool.startup_delay_s(spec) == pytest.approx(cached.startup_delay_s * 0.5)
    assert pool.startup_delay_s(replace(spec, startup_delay_s=None)) == 1.5
    # the CLI: no --startup-delay means the spec's estimate (times --startup-scale) for followed pods
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["serve", "--deployment", "dd", "--startup-scale", "0.07"])
    assert args.startup_delay is None and args.startup_scale == 0.07
    assert _pool_settings(args).startup_delay_s == 0.0
    args = parser.parse_args(["serve", "--startup-delay", "4"])
    assert _pool_settings(args).startup_delay_s == 4.0
