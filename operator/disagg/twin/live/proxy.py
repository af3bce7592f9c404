"""The twin's built-in toy P/D proxy: vLLM's NIXL handshake or SGLang's bootstrap pairing.

No real router runs in tests or the demo, so this stands in for one. It does what vLLM's
tests/v1/kv_connector/nixl_integration/toy_proxy_server.py does (re-implemented, not copied): send the
request to a prefill endpoint with ``kv_transfer_params = {do_remote_decode: true, do_remote_prefill:
false, remote_*: null}``, ``stream: false`` and ``max_tokens: 1``; take the ``kv_transfer_params`` of
that answer; send the original request with them to a decode endpoint and stream its answer back.
With ``handshake="bootstrap"`` it pairs the pods the way SGLang's PD router does instead: the same
request, with ``bootstrap_host``/``bootstrap_port`` naming the prefill pod and a random
``bootstrap_room``, goes to a prefill and a decode pod at once, and the decode pod's answer is streamed
back. Endpoints are picked round robin from callables, so the pool can change while it runs. It listens
on 127.0.0.1 only and only forwards to loopback (127.0.0.0/8) endpoints.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from disagg.twin.live.server import ServerSettings, bound_port, error_response, is_loopback_host

EndpointSource = Callable[[], Sequence[str]]  # current endpoints as "127.0.0.1:PORT"
Handshake = Literal["nixl", "bootstrap"]
HANDSHAKES: tuple[Handshake, Handshake] = ("nixl", "bootstrap")


def check_local_endpoint(endpoint: str) -> str:
    """The endpoint as host:port, refusing anything outside 127.0.0.0/8 (and localhost)."""
    url = endpoint if "://" in endpoint else f"http://{endpoint}"
    parts = urlsplit(url)
    if parts.hostname is None or not is_loopback_host(parts.hostname) or parts.port is None:
        raise ValueError(f"endpoint must be a loopback HOST:PORT (127.0.0.0/8), got {endpoint!r}")
    return f"{parts.hostname}:{parts.port}"


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The body sent to the prefill engine (the toy proxy's send_request_to_service)."""
    out = dict(body)
    out["kv_transfer_params"] = {
        "do_remote_decode": True,
        "do_remote_prefill": False,
        "remote_engine_id": None,
        "remote_block_ids": None,
        "remote_host": None,
        "remote_port": None,
    }
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out.pop("min_completion_tokens", None)
    return out


class ToyPDProxy:
    """A minimal P/D proxy in front of twin endpoints (round robin on each side)."""

    def __init__(
        self,
        prefill: EndpointSource,
        decode: EndpointSource,
        settings: ServerSettings | None = None,
        attempts: int = 3,
        handshake: Handshake | Callable[[], Handshake] = "nixl",
        bootstrap_port: Callable[[str], int | None] | None = None,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        if not callable(handshake) and handshake not in HANDSHAKES:
            raise ValueError(f"handshake must be one of {HANDSHAKES}, got {handshake!r}")
        self.handshake = handshake  # or a callable deciding per request (e.g. from the pods' engine)
        self.prefill = prefill
        self.decode = decode
        self.settings = settings or ServerSettings()
        self.attempts = attempts  # prefill pods tried per request (one may vanish while scaling down)
        # a prefill endpoint's bootstrap server port (what SGLang's router reads from the pod annotation);
        # None, or an unknown endpoint: the endpoint's own port
        self.bootstrap_port = bootstrap_port
        self.port = 0
        self._counter = itertools.count()
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.port}"

    def _pick(self, source: EndpointSource) -> str | None:
        endpoints = sorted(source())
        if not endpoints:
            return None
        return check_local_endpoint(endpoints[next(self._counter) % len(endpoints)])

    async def start(self) -> int:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.host, self.settings.port)
        await site.start()
        self._runner = runner
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        self.port = bound_port(runner)
        return self.port

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def health(self, request: web.Request) -> web.Response:
        ok = bool(self.prefill()) and bool(self.decode())
        return web.json_response(
            {
                "status": "ok" if ok else "no endpoints",
                "prefill": len(self.prefill()),
                "decode": len(self.decode()),
            },
            status=200 if ok else 503,
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, "/v1/completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._forward(request, "/v1/chat/completions")

    async def _forward(self, request: web.Request, path: str) -> web.StreamResponse:
        assert self._session is not None
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error_response(400, "request body must be JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        headers = {"X-Request-Id": request.headers.get("X-Request-Id", f"proxy-{next(self._counter)}")}
        handshake = self.handshake() if callable(self.handshake) else self.handshake
        if handshake == "bootstrap":
            return await self._forward_bootstrap(request, path, body, headers)
        answer: Any = None
        for _ in range(self.attempts):  # a pod removed between pick and post: try the next one
            prefill = self._pick(self.prefill)
            if prefill is None:
                return error_response(503, "no ready prefill endpoint")
            try:
                async with self._session.post(
                    f"http://{prefill}{path}", json=prefill_request(body), headers=headers
                ) as r:
                    answer = await r.json(content_type=None)
                    if r.status != 200:
                        return web.json_response(answer, status=r.status)
                break
            except aiohttp.ClientConnectionError:
                answer = None
        if answer is None:
            return error_response(502, "no prefill endpoint answered")
        params = answer.get("kv_transfer_params") if isinstance(answer, dict) else None
        if params:
            body = {**body, "kv_transfer_params": params}
        decode = self._pick(self.decode)
        if decode is None:
            return error_response(503, "no ready decode endpoint")
        try:
            upstream = await self._session.post(f"http://{decode}{path}", json=body, headers=headers)
        except aiohttp.ClientConnectionError:
            return error_response(502, f"decode endpoint {decode} did not answer")
        async with upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    async def _forward_bootstrap(
        self, request: web.Request, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> web.StreamResponse:
        """SGLang's pairing: the same request to a prefill and a decode pod at once, decode streamed back."""
        assert self._session is not None
        prefill, decode = self._pick(self.prefill), self._pick(self.decode)
        if prefill is None or decode is None:
            return error_response(503, "no ready prefill or decode endpoint")
        host, _, port = prefill.rpartition(":")
        bootstrap = self.bootstrap_port(prefill) if self.bootstrap_port is not None else None
        paired = {**body, "bootstrap_host": host, "bootstrap_port": bootstrap or int(port)}
        paired["bootstrap_room"] = random.getrandbits(63)
        to_prefill = {**paired, "stream": False}
        to_prefill.pop("stream_options", None)

        async def run_prefill() -> None:
            assert self._session is not None
            async with self._session.post(f"http://{prefill}{path}", json=to_prefill, headers=headers) as r:
                await r.read()

        prefill_task = asyncio.ensure_future(run_prefill())
        try:
            upstream = await self._session.post(f"http://{decode}{path}", json=paired, headers=headers)
        except aiohttp.ClientConnectionError:
            prefill_task.cancel()
            return error_response(502, f"decode endpoint {decode} did not answer")
        async with upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
        # the decode side already answered; a failed prefill shows up in its metrics
        with contextlib.suppress(aiohttp.ClientError):
            await prefill_task
        return response
