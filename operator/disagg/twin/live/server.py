"""The HTTP face of one simulated pod: what vLLM's (or SGLang's) OpenAI server answers, on a loopback
address (127.0.0.1, or the pod's own IP when the cluster hands pod IPs out of 127.0.0.0/8).

Routes: ``GET /health``, ``GET /metrics`` (the engine's Prometheus exposition), ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions`` (non-streaming JSON, or SSE with
``stream: true``: ``data: {chunk}`` events and a final ``data: [DONE]``). Response shapes follow the
OpenAI API as vLLM serves it (vllm/entrypoints/openai/protocol.py: ``CompletionResponse``,
``CompletionStreamResponse``, ``ChatCompletionResponse``, ``ChatCompletionStreamResponse``), including
the top-level ``kv_transfer_params`` vLLM adds for P/D serving.

Beside it, on the side-channel port (vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT), each pod serves the twin's
stand-in for NIXL's handshake: ``GET /metadata`` (engine id, TP size, block size) and ``POST /read`` (a
decode engine reads, and so frees, the blocks a prefilled request holds). That wire format is the twin's
own (vLLM's side channel is ZMQ + msgpack and the KV moves over RDMA); what it keeps from vLLM is who
connects where: the decode engine dials the ``remote_host:remote_port`` the prefill advertised and fails the
KV load when that is not the engine, or the request, the params name.

Prompts are counted, not tokenized: a list of token ids counts exactly (vLLM accepts ``prompt`` as
token ids), text counts one token per four characters (OpenAI's rule of thumb for English).
"""

from __future__ import annotations

import ipaddress
import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web

from disagg.twin.live.engine import EngineUnavailable, LiveEngine, LiveRequest, Role, TokenEvent
from disagg.twin.live.exposition import CONTENT_TYPE, EngineKind, render
from disagg.twin.live.kv_exchange import Bootstrap, RemotePrefill, RequestError, parse_bootstrap

Api = Literal["completions", "chat"]

# OpenAI API reference: max_tokens defaults to 16 for /v1/completions.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHARS_PER_TOKEN = 4  # OpenAI's rule of thumb: one token is about four characters of English text


def is_loopback_host(host: str) -> bool:
    """``localhost`` or an IPv4 address in 127.0.0.0/8 (Linux routes all of it to the loopback device)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.version == 4 and address.is_loopback


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 0  # 0: any free port
    side_channel_port: int = 0  # the NIXL side channel's port (0: any free port)
    # vLLM's chat default is "the rest of the context"; the twin caps an unspecified chat length here.
    chat_default_max_tokens: int = 256
    side_channel_timeout_s: float = 10.0  # wall seconds a KV read from a prefill's side channel may take

    def __post_init__(self) -> None:
        if not is_loopback_host(self.host):
            raise ValueError(
                f"host must be a loopback address in 127.0.0.0/8 (the twin never listens elsewhere), "
                f"got {self.host!r}"
            )
        for name in ("port", "side_channel_port"):
            if not 0 <= getattr(self, name) < 65536:
                raise ValueError(f"{name} must be 0..65535, got {getattr(self, name)}")


@dataclass(frozen=True)
class PodIdentity:
    """Which pod this endpoint plays."""

    name: str
    role: Role
    engine: EngineKind
    served_model: str


def count_text_tokens(text: str) -> int:
    return max(1, math.ceil(len(text) / CHARS_PER_TOKEN))


def prompt_token_count(api: Api, body: Mapping[str, Any]) -> int:
    """How many prompt tokens a request carries; RequestError names the bad field."""
    if api == "completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return count_text_tokens(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        if isinstance(prompt, list) and len(prompt) == 1:
            only = prompt[0]
            if isinstance(only, str):
                return count_text_tokens(only)
            if isinstance(only, list) and only and all(isinstance(t, int) for t in only):
                return len(only)
        raise RequestError(
            "prompt", "must be a string, a list of token ids, or a one-element batch of either"
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages", "must be a non-empty list")
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{i}]", "must be an object")
        content = message.get("content", "")
        if isinstance(content, str):
            total += count_text_tokens(content) if content else 0
        elif isinstance(content, list):
            text = "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
            total += count_text_tokens(text) if text else 0
        elif content is not None:
            raise RequestError(f"messages[{i}].content", "must be a string or a list of parts")
    return max(total, 1)


def requested_max_tokens(api: Api, body: Mapping[str, Any], chat_default: int) -> int:
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise RequestError(name, f"must be a positive integer, got {value!r}")
        return value
    return COMPLETIONS_DEFAULT_MAX_TOKENS if api == "completions" else chat_default


def error_response(status: int, message: str, param: str | None = None) -> web.Response:
    """vLLM's ErrorResponse shape (object, message, type, param, code)."""
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        500: "InternalServerError",
        503: "ServiceUnavailableError",
    }.get(status, "Error")
    body = {"object": "error", "message": message, "type": kind, "param": param, "code": status}
    return web.json_response(body, status=status)


class EngineServer:
    """An aiohttp server for one simulated pod, bound to 127.0.0.1."""

    def __init__(
        self, engine: LiveEngine, identity: PodIdentity, settings: ServerSettings | None = None
    ) -> None:
        self.engine = engine
        self.identity = identity
        self.settings = settings or ServerSettings()
        self.port = 0
        self.side_channel_port = 0
        self._runner: web.AppRunner | None = None
        self._side_runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._created = int(time.time())

    @property
    def endpoint(self) -> str:
        """host:port, as the pod annotation carries it."""
        return f"{self.settings.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.endpoint}"

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        return app

    def build_side_channel_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metadata", self.side_metadata)
        app.router.add_post("/read", self.side_read)
        return app

    async def start(self) -> int:
        """Bind the API and the side channel, start the engine, and return the API port."""
        try:
            self._side_runner = await _serve(
                self.build_side_channel_app(), self.settings.host, self.settings.side_channel_port
            )
            self.side_channel_port = bound_port(self._side_runner)
            self._runner = await _serve(self.build_app(), self.settings.host, self.settings.port)
            self.port = bound_port(self._runner)
        except BaseException:
            await self._shutdown()
            raise
        timeout = aiohttp.ClientTimeout(total=self.settings.side_channel_timeout_s)
        self._session = aiohttp.ClientSession(timeout=timeout)
        self.engine.side_channel = (self.settings.host, self.side_channel_port)
        self.engine.kv_puller = self.pull_kv
        self.engine.bootstrap_probe = self.probe_bootstrap
        self.engine.start()
        return self.port

    async def drain(self, timeout_s: float | None = None) -> int:
        aborted = await self.engine.drain(timeout_s)
        await self._shutdown()
        return aborted

    async def stop(self) -> None:
        await self.engine.stop()
        await self._shutdown()

    async def _shutdown(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._side_runner is not None:
            await self._side_runner.cleanup()
            self._side_runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # the side channel ------------------------------------------------------------------------------
    async def side_metadata(self, request: web.Request) -> web.Response:
        engine = self.engine
        return web.json_response(
            {
                "engine_id": engine.engine_id,
                "role": engine.role,
                "tp_size": engine.tp_size,
                "block_size": engine.settings.block_size,
            }
        )

    async def side_read(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            request_id = str(body["request_id"])
            blocks = tuple(tuple(int(b) for b in group) for group in body["block_ids"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            return error_response(400, "read: needs request_id and block_ids")
        problem = self.engine.release_blocks(request_id, blocks)
        if problem is not None:
            return error_response(404, problem)
        return web.json_response({"request_id": request_id, "blocks": sum(len(g) for g in blocks)})

    async def probe_bootstrap(self, bootstrap: Bootstrap) -> str | None:
        """SGLang decode: a prefill engine's bootstrap server answers at bootstrap_host:bootstrap_port."""
        if not is_loopback_host(bootstrap.host):
            return f"bootstrap_host {bootstrap.host!r} is not in 127.0.0.0/8 (the twin reaches only loopback)"
        if self._session is None:
            return "the engine is stopped"
        base = f"http://{bootstrap.host}:{bootstrap.port}"
        try:
            async with self._session.get(f"{base}/metadata") as response:
                meta = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as err:
            return f"bootstrap server {base} unreachable: {err!r}"
        if not isinstance(meta, Mapping) or meta.get("role") != "prefill":
            return f"{base} is not a prefill engine's bootstrap server: {meta!r}"
        return None

    async def pull_kv(self, remote: RemotePrefill) -> str | None:
        """Read a remote prefill's blocks through its side channel; None on success, else why not."""
        if not is_loopback_host(remote.host):
            return (
                f"remote_host {remote.host!r} is not a loopback address (the twin reaches only 127.0.0.0/8)"
            )
        if self._session is None:
            return "the engine is stopped"
        base = f"http://{remote.host}:{remote.port}"
        try:
            async with self._session.get(f"{base}/metadata") as response:
                meta = await response.json(content_type=None)
            if not isinstance(meta, Mapping) or meta.get("engine_id") != remote.engine_id:
                found = meta.get("engine_id") if isinstance(meta, Mapping) else None
                return f"side channel {base} is engine {found!r}, not remote_engine_id {remote.engine_id!r}"
            body = {"request_id": remote.request_id, "block_ids": [list(g) for g in remote.block_ids]}
            async with self._session.post(f"{base}/read", json=body) as response:
                if response.status != 200:
                    answer = await response.json(content_type=None)
                    message = answer.get("message") if isinstance(answer, Mapping) else answer
                    return f"side channel {base} refused the read: {message}"
        except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as err:
            return f"side channel {base} unreachable: {err!r}"
        return None

    # handlers --------------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.engine.accepting else 503)

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=render(self.engine.metrics), headers={"Content-Type": CONTENT_TYPE})

    async def models(self, request: web.Request) -> web.Response:
        model = self.identity.served_model
        card = {
            "id": model,
            "object": "model",
            "created": self._created,
            "owned_by": self.identity.engine,
            "root": model,
            "parent": None,
            "max_model_len": self.engine.settings.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def _serve(self, request: web.Request, api: Api) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return error_response(400, "request body must be JSON")
        if not isinstance(body, dict):
            return error_response(400, "request body must be a JSON object")
        model = body.get("model", self.identity.served_model)
        if model != self.identity.served_model:
            return error_response(404, f"The model `{model}` does not exist.", "model")
        try:
            prompt_tokens = prompt_token_count(api, body)
            max_tokens = requested_max_tokens(api, body, self.settings.chat_default_max_tokens)
            live = self.engine.submit(
                prompt_tokens,
                max_tokens,
                body.get("kv_transfer_params"),
                request_id=request.headers.get("X-Request-Id"),
                bootstrap=parse_bootstrap(body),
            )
        except RequestError as err:
            return error_response(400, str(err), err.field)
        except EngineUnavailable as err:
            return error_response(503, str(err))
        prefix = "cmpl" if api == "completions" else "chatcmpl"
        response_id = f"{prefix}-{uuid.uuid4().hex}"
        if body.get("stream"):
            options = body.get("stream_options")
            include_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
            return await self._stream(request, api, live, response_id, include_usage)
        return await self._complete(api, live, response_id)

    async def _complete(self, api: Api, live: LiveRequest, response_id: str) -> web.Response:
        texts: list[str] = []
        final: TokenEvent | None = None
        async for event in self.engine.stream(live):
            if event.finish_reason is None:
                texts.append(event.text)
            else:
                final = event
        assert final is not None
        if final.finish_reason == "error":
            return error_response(500, _failure_message(live))
        text = "".join(texts)
        if api == "completions":
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": final.finish_reason,
                "stop_reason": None,
            }
            obj = "text_completion"
        else:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": final.finish_reason,
                "stop_reason": None,
            }
            obj = "chat.completion"
        return web.json_response(
            {
                "id": response_id,
                "object": obj,
                "created": int(time.time()),
                "model": self.identity.served_model,
                "choices": [choice],
                "usage": _usage(live),
                "kv_transfer_params": dict(final.kv_transfer_params) if final.kv_transfer_params else None,
            }
        )

    async def _stream(
        self, request: web.Request, api: Api, live: LiveRequest, response_id: str, include_usage: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        created = int(time.time())
        obj = "text_completion" if api == "completions" else "chat.completion.chunk"

        def chunk(choice: dict[str, Any], usage: dict[str, int] | None = None) -> bytes:
            payload: dict[str, Any] = {
                "id": response_id,
                "object": obj,
                "created": created,
                "model": self.identity.served_model,
                "choices": [choice] if choice else [],
            }
            if usage is not None:
                payload["usage"] = usage
            return f"data: {json.dumps(payload)}\n\n".encode()

        try:
            if api == "chat":
                await response.write(chunk({"index": 0, "delta": {"role": "assistant", "content": ""}}))
            async for event in self.engine.stream(live):
                if event.finish_reason is None:
                    if api == "completions":
                        choice = {"index": 0, "text": event.text, "logprobs": None, "finish_reason": None}
                    else:
                        choice = {"index": 0, "delta": {"content": event.text}, "finish_reason": None}
                    await response.write(chunk(choice))
                    continue
                if event.finish_reason == "error":  # vLLM sends the error as the next chunk of a 200
                    error = {"message": _failure_message(live), "type": "InternalServerError", "code": 500}
                    await response.write(f"data: {json.dumps({'error': error})}\n\n".encode())
                    break
                if api == "completions":
                    choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": event.finish_reason}
                else:
                    choice = {"index": 0, "delta": {}, "finish_reason": event.finish_reason}
                await response.write(chunk(choice))
            if include_usage:
                await response.write(chunk({}, _usage(live)))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (ConnectionResetError, ConnectionError):
            self.engine.abort(live)
        return response


def _failure_message(live: LiveRequest) -> str:
    # vllm 0.33.0 wheel, vllm/exceptions.py GenerationError: "Internal server error" (HTTP 500)
    return (
        f"Internal server error: KV load failed ({live.detail})" if live.detail else "Internal server error"
    )


async def _serve(app: web.Application, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def _usage(live: LiveRequest) -> dict[str, int]:
    return {
        "prompt_tokens": live.prompt_tokens,
        "completion_tokens": live.generated,
        "total_tokens": live.prompt_tokens + live.generated,
    }


def bound_port(runner: web.AppRunner) -> int:
    for site in runner.sites:
        server = getattr(site, "_server", None)
        sockets = getattr(server, "sockets", None) or []
        for sock in sockets:
            return int(sock.getsockname()[1])
    raise RuntimeError("the server has no bound socket")
