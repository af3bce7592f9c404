"""The live twin's emulated vLLM engine against the released vLLM wheel: the prefill answer it gives a
router carries exactly the ``kv_transfer_params`` fields vLLM's NixlConnector returns, and the fields the
twin's decode side requires are among them. Read from the wheel's source (zipfile + ast, no install), so
a field renamed upstream fails here, not only in a user's cluster."""

from __future__ import annotations

import ast
import asyncio
import zipfile
from typing import Any

import pytest

from disagg.cluster.released import ensure_wheel, pinned_releases
from disagg.perf.latency import load_latency_model
from disagg.twin.live.engine import EngineSettings, LiveEngine
from disagg.twin.live.exposition import VllmMetrics
from disagg.twin.live.kv_exchange import NIXL_REMOTE_FIELDS

pytestmark = pytest.mark.conformance

# vllm 0.33.0: NixlConnector's scheduler side, whose request_finished builds the answer
PULL_SCHEDULER = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py"
# what vllm-router 0.1.17 sends a prefill engine (vllm-project/router vllm_pd_router.rs,
# build_prefill_kv_transfer_params for NIXL)
ROUTER_PREFILL_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def released_answer_fields() -> set[str]:
    """The keyword names of the ``dict(...)`` that the released ``request_finished`` returns."""
    release = pinned_releases()["vllm"]
    with zipfile.ZipFile(ensure_wheel(release.package, release.version)) as wheel:
        tree = ast.parse(wheel.read(PULL_SCHEDULER))
    functions = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "request_finished"
    ]
    assert functions, f"{PULL_SCHEDULER}: no request_finished in vllm {release.version}"
    fields: set[str] = set()
    for node in ast.walk(functions[0]):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            fields |= {kw.arg for kw in node.keywords if kw.arg is not None}
    assert fields, f"{PULL_SCHEDULER}: request_finished builds no dict(...) in vllm {release.version}"
    return fields


def twin_answer() -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        settings = EngineSettings(time_scale=0.02)
        engine = LiveEngine(
            load_latency_model("llama-3.1-8b", "h100", 1),
            VllmMetrics("m", settings.max_model_len),
            settings,
            engine_id="pod-0",
            side_channel=("127.0.0.1", 5600),
        )
        engine.start()
        request = engine.submit(100, 50, ROUTER_PREFILL_PARAMS, request_id="r-1")
        events = [e async for e in engine.stream(request)]
        await engine.stop()
        assert events[-1].kv_transfer_params is not None
        return dict(events[-1].kv_transfer_params)

    return asyncio.run(scenario())


def test_the_twins_prefill_answer_has_exactly_the_released_fields() -> None:
    released = released_answer_fields()
    assert set(twin_answer()) == released
    # what the twin's decode side insists on is something the released prefill sends
    assert set(NIXL_REMOTE_FIELDS) <= released
