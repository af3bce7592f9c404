"""The chaos suite's fault-injecting Prometheus proxy (disagg.chaos.promproxy) in front of a canned
Prometheus, read through the operator's own adapter (disagg.metrics.prometheus)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from disagg.chaos.promproxy import STALE_AGE_S, Fault, PrometheusProxy, rewrite
from disagg.metrics import build_queries
from disagg.metrics.prometheus import PrometheusSignals
from disagg.policy.types import SignalState


class _Canned(BaseHTTPRequestHandler):
    """Every instant query answered with one sample: 3 for a sample-age probe, else 0.5."""

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        query = (parse_qs(urlsplit(self.path).query).get("query") or [""])[0]
        value = "3" if "timestamp(" in query else "0.5"
        answer = {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": {}, "value": [time.time(), value]}]},
        }
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def proxy() -> Iterator[PrometheusProxy]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    thread = Thread(target=upstream.serve_forever, daemon=True)
    thread.start()
    proxy = PrometheusProxy(f"http://127.0.0.1:{upstream.server_port}", slow_s=3.0)
    try:
        yield proxy
    finally:
        proxy.close()
        upstream.shutdown()
        upstream.server_close()


def _value(proxy: PrometheusProxy, query: str) -> list[Any]:
    url = f"{proxy.url}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=5) as response:
        result: list[Any] = json.loads(response.read())["data"]["result"]
    return [s["value"][1] for s in result]


def test_each_fault_rewrites_the_values_or_the_staleness_probe(proxy: PrometheusProxy) -> None:
    assert _value(proxy, "up") == ["0.5"]
    for fault, value in (
        (Fault.NAN, "NaN"),
        (Fault.INF, "+Inf"),
        (Fault.NEGATIVE, "-1"),
        (Fault.HUGE, "1e30"),
    ):
        proxy.set(fault)
        assert _value(proxy, "up") == [value]
        assert _value(proxy, "time() - max(timestamp(up))") == ["3"]  # the staleness probe left alone
    proxy.set(Fault.STALE)
    assert _value(proxy, "up") == ["0.5"]
    assert _value(proxy, "time() - max(timestamp(up))") == [repr(3.0 + STALE_AGE_S)]
    proxy.set(Fault.EMPTY)
    assert _value(proxy, "up") == [] and _value(proxy, "time() - max(timestamp(up))") == []
    proxy.set(Fault.HTTP_500)
    with pytest.raises(urllib.error.HTTPError) as error:
        _value(proxy, "up")
    assert error.value.code == 500
    proxy.set(Fault.PASS)
    assert _value(proxy, "up") == ["0.5"]


def test_rewrite_leaves_non_vector_answers_alone() -> None:
    scalar = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}}
    assert rewrite(Fault.NAN, "1+1", json.loads(json.dumps(scalar))) == scalar


def test_the_operators_adapter_sees_each_fault_as_a_state(proxy: PrometheusProxy) -> None:
    queries = build_queries("vllm", "ns", "dd", 90, 90, 30)
    adapter = PrometheusSignals(proxy.url, timeout_s=0.5, retries=0)
    assert adapter.run(queries).get("itl").state is SignalState.OK
    for fault, state in (
        (Fault.NAN, SignalState.NAN),
        (Fault.INF, SignalState.INVALID),
        (Fault.NEGATIVE, SignalState.INVALID),
        (Fault.EMPTY, SignalState.MISSING),
        (Fault.HTTP_500, SignalState.MISSING),
    ):
        proxy.set(fault)
        signals = adapter.run(queries)
        assert signals.get("itl").state is state, fault
        # only a failed query is a failure; garbage is a state of the signal
        assert (signals.failure() is not None) == (fault is Fault.HTTP_500), fault
    assert "HTTP Status Code 500" in str(signals.failure())
    proxy.set(Fault.HUGE)
    assert adapter.run(queries).get("itl").value == 1e30
    proxy.set(Fault.SLOW)  # past the adapter's timeout: unreachable, the rest failed at once
    started = time.monotonic()
    signals = adapter.run(queries)
    assert time.monotonic() - started < 2.5
    assert signals.get("itl").state is SignalState.MISSING
    assert signals.failure() == f"Prometheus at {proxy.url} did not answer within 0.5 s"
