"""The live twin against real peers: HTTP clients, a real Prometheus, and the local control plane.

1. One request through live prefill and decode endpoints with vLLM's NIXL handshake, streamed back.
2. A real Prometheus scrapes a live endpoint under load; its histogram_quantile(0.9) of the TTFT buckets
   lands within one bucket of the twin's own p90.
3. ``disagg twin serve`` (fixed layout) writes its endpoints file and serves through its proxy.
Following pods on the cluster is in test_twin_live_cluster.py.

Engines run with a time scale (0.25-0.5) so the tests take seconds; no assertion depends on speed.
"""

from __future__ import annotations

import asyncio
import bisect
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from disagg.cluster.wait import wait_for_async
from disagg.twin.live.engine import EngineSettings
from disagg.twin.live.exposition import VLLM_TTFT_BUCKETS
from disagg.twin.live.latency import LatencyChoice
from disagg.twin.live.load import LoadRequest, LoadSettings, run_load
from disagg.twin.live.pods import PodPool, PodSpec, PoolSettings
from disagg.twin.live.proxy import ToyPDProxy

CHOICE = LatencyChoice("llama-3.1-8b", "h100", 1)


async def _eventually(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str) -> Any:
    return await wait_for_async(check, timeout_s=timeout_s, what=what)


async def _fixed_pool(specs: dict[str, PodSpec], time_scale: float) -> PodPool:
    pool = PodPool(PoolSettings(engine=EngineSettings(time_scale=time_scale)))
    await pool.reconcile(specs)

    async def serving() -> bool:
        return all(p.state == "serving" for p in pool.pods.values())

    await _eventually(serving, 30, "the twin's pods to serve")
    return pool


def _sse_texts(raw: str) -> tuple[list[dict[str, Any]], bool]:
    chunks: list[dict[str, Any]] = []
    done = False
    for line in raw.splitlines():
        if line == "data: [DONE]":
            done = True
        elif line.startswith("data: "):
            chunks.append(json.loads(line[len("data: ") :]))
    return chunks, done


def test_one_request_through_prefill_and_decode_with_the_nixl_handshake() -> None:
    async def scenario() -> None:
        pool = await _fixed_pool(
            {"p-0": PodSpec("p-0", "prefill", CHOICE), "d-0": PodSpec("d-0", "decode", CHOICE)}, 0.5
        )
        (prefill,), (decode,) = pool.endpoints("prefill"), pool.endpoints("decode")
        try:
            async with aiohttp.ClientSession() as http:
                ask = {"model": "llama-3.1-8b", "prompt": list(range(3000)), "max_tokens": 12}
                to_prefill = {
                    **ask,
                    "max_tokens": 1,
                    "stream": False,
                    "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False},
                }
                async with http.post(f"http://{prefill}/v1/completions", json=to_prefill) as r:
                    assert r.status == 200
                    first = await r.json()
                params = first["kv_transfer_params"]
                assert params["do_remote_prefill"] is True
                assert params["remote_engine_id"] == "p-0"
                prefill_server = pool.pods["p-0"].server
                assert prefill_server is not None
                # the prefill's side channel (its own port, as VLLM_NIXL_SIDE_CHANNEL_PORT)
                assert params["remote_host"] == prefill.rpartition(":")[0]
                assert params["remote_port"] == prefill_server.side_channel_port
                assert [len(g) for g in params["remote_block_ids"]] == [-(-3000 // 16)]  # one group
                assert first["usage"] == {"prompt_tokens": 3000, "completion_tokens": 1, "total_tokens": 3001}

                to_decode = {**ask, "stream": True, "kv_transfer_params": params}
                async with http.post(f"http://{decode}/v1/completions", json=to_decode) as r:
                    assert r.status == 200
                    assert r.headers["Content-Type"].startswith("text/event-stream")
                    chunks, done = _sse_texts(await r.text())
                texts = [c["choices"][0]["text"] for c in chunks if c["choices"][0]["text"]]
                assert done and len(texts) == 12
                assert chunks[-1]["choices"][0]["finish_reason"] == "length"
                decode_server = pool.pods["d-0"].server
                assert decode_server is not None
                (seen,) = decode_server.engine.transfers
                assert seen.outcome == "kv-loaded" and seen.received == params
                assert not prefill_server.engine.held  # the decode engine read (and freed) the blocks

                async with http.get(f"http://{decode}/metrics") as r:
                    decode_metrics = await r.text()
                async with http.get(f"http://{prefill}/metrics") as r:
                    prefill_metrics = await r.text()
            labels = '{engine="0",model_name="llama-3.1-8b"}'
            assert f"vllm:prompt_tokens_total{labels} 3000.0" in prefill_metrics
            assert f"vllm:prompt_tokens_total{labels} 0.0" in decode_metrics  # the decode skipped prefill
            assert f"vllm:generation_tokens_total{labels} 12.0" in decode_metrics
            # the same handshake through the built-in toy proxy, on the chat API
            proxy = ToyPDProxy(lambda: pool.endpoints("prefill"), lambda: pool.endpoints("decode"))
            await proxy.start()
            try:
                async with aiohttp.ClientSession() as http:
                    body = {
                        "messages": [{"role": "user", "content": "x" * 400}],
                        "max_tokens": 5,
                        "stream": True,
                    }
                    async with http.post(f"{proxy.url}/v1/chat/completions", json=body) as r:
                        chunks, done = _sse_texts(await r.text())
                deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
                assert done and len([d for d in deltas if d]) == 5
            finally:
                await proxy.stop()
        finally:
            await pool.close()

    asyncio.run(scenario())


def test_sglang_pods_pair_through_the_bootstrap_room() -> None:
    """SGLang-flavoured pods behind the proxy's bootstrap pairing: streamed chat, SGLang metric names."""

    async def scenario() -> None:
        specs = {
            "p-0": PodSpec("p-0", "prefill", CHOICE, engine="sglang"),
            "d-0": PodSpec("d-0", "decode", CHOICE, engine="sglang"),
        }
        pool = await _fixed_pool(specs, 0.5)
        proxy = ToyPDProxy(
            lambda: pool.endpoints("prefill"),
            lambda: pool.endpoints("decode"),
            handshake="bootstrap",
            bootstrap_port=pool.side_channel_port,
        )
        await proxy.start()
        try:
            async with aiohttp.ClientSession() as http:
                body = {
                    "messages": [{"role": "user", "content": "y" * 4000}],
                    "max_tokens": 7,
                    "stream": True,
                }
                async with http.post(f"{proxy.url}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    chunks, done = _sse_texts(await r.text())
                (decode,) = pool.endpoints("decode")
                async with http.get(f"http://{decode}/metrics") as r:
                    metrics = await r.text()
            deltas = [c["choices"][0]["delta"].get("content") for c in chunks if c["choices"]]
            assert done and len([d for d in deltas if d]) == 7
            assert 'sglang:generation_tokens_total{model_name="llama-3.1-8b"} 7.0' in metrics
            assert "vllm:" not in metrics
            (prefill_server,) = [s for s in pool.servers() if s.identity.role == "prefill"]
            (record,) = prefill_server.engine.records
            assert record.generation_tokens == 1  # the prefill pod stopped at its prompt
        finally:
            await proxy.stop()
            await pool.close()

    asyncio.run(scenario())


def _bucket_index(value: float) -> int:
    return bisect.bisect_left(list(VLLM_TTFT_BUCKETS), value)


def test_prometheus_ttft_p90_agrees_with_the_twin_within_one_bucket(
    prometheus_factory: Callable[[dict[str, Any]], Any],
) -> None:
    time_scale = 0.5
    rng = np.random.default_rng(7)
    requests = [
        LoadRequest(float(t), int(p), 4)
        for t, p in zip(
            np.cumsum(rng.exponential(1 / 10, size=120)), rng.integers(64, 4000, size=120), strict=True
        )
    ]

    async def scenario() -> tuple[list[float], float]:
        pool = await _fixed_pool({"c-0": PodSpec("c-0", "colocated", CHOICE)}, time_scale)
        (endpoint,) = pool.endpoints("colocated")
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "twin", "static_configs": [{"targets": [endpoint]}]}],
        }
        prom = await asyncio.to_thread(prometheus_factory, config)
        try:

            async def scraped() -> bool:
                result = await asyncio.to_thread(prom.query, 'up{job="twin"} == 1')
                return bool(result)

            await _eventually(scraped, 30, "Prometheus to scrape the twin")
            report = await run_load(
                requests, LoadSettings(f"http://{endpoint}", len(requests), 60, time_scale)
            )
            assert report.failed == 0
            engine = pool.servers()[0].engine
            own = [r.ttft_s for r in engine.records if r.ttft_s is not None]
            count = len(own)
            query_count = "sum(vllm:time_to_first_token_seconds_count)"

            async def all_scraped() -> bool:
                result = await asyncio.to_thread(prom.query, query_count)
                return bool(result) and float(result[0]["value"][1]) == count

            await _eventually(all_scraped, 30, "Prometheus to see every request")
            query = "histogram_quantile(0.9, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket[2m])))"
            result = await asyncio.to_thread(prom.query, query)
            return own, float(result[0]["value"][1])
        finally:
            await pool.close()

    own, from_prometheus = asyncio.run(scenario())
    assert len(own) == len(requests)
    twin_p90 = float(np.quantile(own, 0.9))
    print(f"TTFT p90: twin {twin_p90 * 1000:.1f} ms, Prometheus {from_prometheus * 1000:.1f} ms")
    assert abs(_bucket_index(twin_p90) - _bucket_index(from_prometheus)) <= 1


def test_twin_serve_cli_writes_its_endpoints(tmp_path: Path) -> None:
    """``disagg twin serve`` with a fixed layout and the proxy: the endpoints file names a working proxy."""
    import subprocess
    import sys

    endpoints = tmp_path / "endpoints.json"
    command = [sys.executable, "-m", "disagg", "twin", "serve", "--prefill", "1", "--decode", "1"]
    command += ["--proxy-port", "0", "--endpoints-file", str(endpoints), "--time-scale", "0.5"]
    process = subprocess.Popen(
        [*command, "--duration", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def scenario() -> None:
        async def document() -> dict[str, Any] | None:
            if not endpoints.exists():
                return None
            doc: dict[str, Any] = json.loads(endpoints.read_text())
            ready = doc["proxy"] and all(p["state"] == "serving" for p in doc["pods"].values())
            return doc if ready and len(doc["pods"]) == 2 else None

        doc = await _eventually(document, 30, "the endpoints file")
        report = await run_load([LoadRequest(0.0, 500, 3)], LoadSettings(doc["proxy"], 1, 30, 0.5))
        assert report.ok == 1 and report.results[0].tokens == 3

    try:
        asyncio.run(scenario())
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0
