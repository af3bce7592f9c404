"""A fault-injecting HTTP proxy in front of a real Prometheus, for the chaos cases.

The operator is pointed at the proxy (``--prometheus-url``); the proxy forwards every request to the real
Prometheus and, as its :class:`Fault` says (switched at run time with :meth:`PrometheusProxy.set`), fails
or rewrites the answer:

* ``pass``: the real answer, untouched;
* ``http-500``: every request answered 500 with Prometheus's error body, Prometheus never asked;
* ``slow``: the real answer after ``slow_s`` (longer than the operator's query timeout);
* ``nan``, ``inf``, ``negative``, ``huge``: every sample of an instant-vector answer rewritten to NaN,
  +Inf, -1 or 1e30, except the staleness probe's (a query of ``timestamp(...)``, the sample age): the
  value path and the staleness path are broken one at a time;
* ``empty``: every instant vector answered empty (the series gone: what Prometheus answers for a
  target it no longer scrapes, past its staleness marker or the 5 m lookback);
* ``stale``: only the staleness probe rewritten, its samples ``STALE_AGE_S`` older. An instant query's
  ``value[0]`` is the evaluation time, not the sample's, so a sample's age is visible only through
  ``timestamp()``; with staleness markers a series Prometheus stopped scraping vanishes at once
  (``empty``), so a stale but present sample is what a federated or remote-written series that stopped
  updating looks like within the lookback.

Stdlib only (http.server, urllib), threads: one per request, so a slow answer holds up no other.
"""

from __future__ import annotations

import enum
import json
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


class Fault(enum.StrEnum):
    PASS = "pass"
    HTTP_500 = "http-500"
    SLOW = "slow"
    NAN = "nan"
    INF = "inf"
    EMPTY = "empty"
    STALE = "stale"
    NEGATIVE = "negative"
    HUGE = "huge"


# the value every sample is rewritten to (the staleness probe's excepted)
VALUE_FAULTS: dict[Fault, str] = {
    Fault.NAN: "NaN",
    Fault.INF: "+Inf",
    Fault.NEGATIVE: "-1",
    Fault.HUGE: "1e30",
}
STALE_AGE_S = 600.0  # how much older the stale fault makes the newest sample (the metric window is less)
AGE_PROBE = "timestamp("  # disagg.metrics.queries.sample_age
QUERY_PATHS = ("/api/v1/query",)  # instant queries: what the operator runs


def _query_of(method: str, path: str, body: bytes, content_type: str) -> str:
    params = parse_qs(urlsplit(path).query)
    if method == "POST" and content_type.startswith("application/x-www-form-urlencoded"):
        params.update(parse_qs(body.decode("utf-8", "replace")))
    return (params.get("query") or [""])[0]


def rewrite(fault: Fault, query: str, answer: dict[str, Any]) -> dict[str, Any]:
    """The answer to one instant query as ``fault`` makes it (in place; returned)."""
    data = answer.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "vector":
        return answer
    samples = data.get("result")
    if not isinstance(samples, list):
        return answer
    probe = AGE_PROBE in query
    if fault is Fault.EMPTY:
        data["result"] = []
    elif fault in VALUE_FAULTS and not probe:
        for sample in samples:
            sample["value"] = [sample["value"][0], VALUE_FAULTS[fault]]
    elif fault is Fault.STALE and probe:
        for sample in samples:
            ts, value = sample["value"]
            sample["value"] = [ts, repr(float(value) + STALE_AGE_S)]
    return answer


class PrometheusProxy:
    """The proxy, started on a free loopback port, in ``pass`` until :meth:`set`."""

    def __init__(self, upstream: str, slow_s: float = 8.0, host: str = "127.0.0.1") -> None:
        self.upstream = upstream.rstrip("/")
        self.slow_s = slow_s
        self._fault = Fault.PASS
        self._changed = threading.Event()  # set on every switch: a slow answer in flight is let go
        self._lock = threading.Lock()
        self.counts: dict[Fault, int] = {}  # requests answered under each fault
        self.server = ThreadingHTTPServer((host, 0), self._handler())
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="prom-proxy", daemon=True)
        self._thread.start()

    @property
    def fault(self) -> Fault:
        return self._fault

    def set(self, fault: Fault) -> None:
        with self._lock:
            self._fault = fault
            changed, self._changed = self._changed, threading.Event()
        changed.set()

    def close(self) -> None:
        self.set(Fault.PASS)
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def _count(self, fault: Fault) -> None:
        with self._lock:
            self.counts[fault] = self.counts.get(fault, 0) + 1

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as requests' pooled session expects
            disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms delayed-ACK stall

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (its timeout): fine
                    self.close_connection = True

            def _serve(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy._lock:
                    fault, changed = proxy._fault, proxy._changed
                proxy._count(fault)
                if fault is Fault.HTTP_500:
                    error = {
                        "status": "error",
                        "errorType": "internal",
                        "error": "injected by the chaos proxy",
                    }
                    self._reply(500, json.dumps(error).encode())
                    return
                if fault is Fault.SLOW:
                    changed.wait(proxy.slow_s)  # cut short when the fault is switched off
                content_type = self.headers.get("Content-Type") or ""
                request = urllib.request.Request(proxy.upstream + self.path, data=body or None, method=method)
                if content_type:
                    request.add_header("Content-Type", content_type)
                try:
                    with urllib.request.urlopen(request, timeout=30) as response:
                        status, raw = response.status, response.read()
                        answer_type = response.headers.get("Content-Type") or "application/json"
                except urllib.error.HTTPError as error:
                    status, raw = error.code, error.read()
                    answer_type = error.headers.get("Content-Type") or "application/json"
                except OSError as error:  # the real Prometheus unreachable: as a gateway says it
                    self._reply(502, str(error).encode(), "text/plain")
                    return
                if fault in (Fault.PASS, Fault.SLOW, Fault.HTTP_500) or status != 200:
                    self._reply(status, raw, answer_type)
                    return
                if urlsplit(self.path).path not in QUERY_PATHS:
                    self._reply(status, raw, answer_type)
                    return
                query = _query_of(method, self.path, body, content_type)
                answer = rewrite(fault, query, json.loads(raw))
                self._reply(status, json.dumps(answer).encode(), answer_type)

        return Handler
