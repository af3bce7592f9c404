"""A real-time emulated engine: continuous batching paced by the latency model, one per simulated pod.

The scheduler follows vLLM v1's shape: every step first gives each running request that has its
context in KV one decode token, then fills the rest of the ``max_num_batched_tokens`` budget with
prefill chunks (chunked prefill), admitting waiting requests while ``max_num_seqs`` and the KV blocks
allow; when a growing decode no longer fits in KV the newest request is preempted and recomputed
later. The step takes the latency model's time for that batch, slept on the wall clock scaled by
``time_scale`` (0.1 runs ten times faster than a GPU would). All timings the engine reports (metrics,
records) are in engine seconds, i.e. wall seconds divided by ``time_scale``.

A request carrying vLLM's NIXL ``kv_transfer_params`` with ``do_remote_prefill`` skips its prefill: it
holds its KV blocks while it waits for the transfer (``kv_transfer_time_s`` of the latency model,
counted as waiting, like vLLM's WAITING_FOR_REMOTE_KVS) and then decodes. A request with
``do_remote_decode`` ends after its prefill token and answers with the ``kv_transfer_params`` a decode
engine needs. Token text is synthetic: deterministic words, not a language model's output.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from disagg.twin.live.exposition import EngineGauges, EngineMetrics, FinishedRequest
from disagg.twin.live.latency import StepLatency

Role = Literal["prefill", "decode", "colocated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "colocated")

# Deterministic filler for the synthetic token text.
_WORDS = (
    "the", "twin", "serves", "tokens", "from", "a", "model", "of", "latency", "and", "every",
    "step", "is", "paced", "by", "measured", "kernel", "times", "on", "simulated", "gpus",
)  # fmt: skip


def synthetic_token(request_id: str, index: int) -> str:
    """The text of output token ``index`` of a request (stable across runs)."""
    offset = sum(request_id.encode()) % len(_WORDS)
    return " " + _WORDS[(offset + 7 * index) % len(_WORDS)]


@dataclass(frozen=True)
class EngineSettings:
    """Scheduler limits and pacing of one emulated engine."""

    # vLLM v1 defaults for the OpenAI server on GPUs with >= 70 GiB that are not A100 (H100 class):
    # max_num_batched_tokens 8192, max_num_seqs 1024 (vllm/engine/arg_utils.py, get_batch_defaults).
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    block_size: int = 16  # vLLM's default --block-size for CUDA
    max_model_len: int = 131072  # Llama-3.1 context length (config.json max_position_embeddings)
    kv_capacity_tokens: int = 0  # 0: take the latency model's capacity
    time_scale: float = 1.0  # wall seconds per engine second
    kv_link: str = "nic"  # the link a remote prefill's KV crosses (passed to kv_transfer_time_s)
    drain_timeout_s: float = 30.0  # engine seconds a removed pod keeps serving its in-flight requests

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_capacity_tokens < 0:
            raise ValueError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")


class RequestError(ValueError):
    """A request the engine refuses; ``field`` names the offending request field."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


class EngineUnavailable(RuntimeError):
    """The engine is starting or draining and takes no new requests."""


@dataclass(frozen=True)
class RemotePrefill:
    """Where a decode request's KV comes from (vLLM NixlConnector's kv_transfer_params)."""

    engine_id: str
    block_ids: tuple[int, ...]
    host: str
    port: int
    request_id: str | None = None


@dataclass(frozen=True)
class TokenEvent:
    """One streamed output token, or the end of the stream (``finish_reason`` set)."""

    index: int
    text: str
    finish_reason: str | None = None
    kv_transfer_params: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RequestRecord:
    """What the engine measured for one finished request (engine seconds)."""

    request_id: str
    prompt_tokens: int
    generation_tokens: int
    ttft_s: float | None
    itls_s: tuple[float, ...]
    e2e_s: float
    finish_reason: str


@dataclass(eq=False)
class LiveRequest:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival: float
    remote_prefill: RemotePrefill | None
    do_remote_decode: bool
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    context_target: int = 0  # tokens that must be in KV before it decodes (prompt, or more after preemption)
    computed: int = 0
    generated: int = 0
    blocks: int = 0
    block_ids: tuple[int, ...] = ()
    kv_ready: bool = True
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    itls: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def context(self) -> int:
        """Tokens in KV once the request has its context: the prompt plus what it generated."""
        return self.prompt_tokens + self.generated

    @property
    def prefill_done(self) -> bool:
        return self.computed >= self.context_target


def parse_kv_transfer_params(params: Any) -> tuple[bool, RemotePrefill | None]:
    """(do_remote_decode, remote prefill source) from a request's ``kv_transfer_params``.

    Field names are vLLM's NixlConnector (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py,
    ``request_finished`` and ``get_num_new_matched_tokens``; the toy proxy
    tests/v1/kv_connector/nixl_integration/toy_proxy_server.py sends ``do_remote_decode: true``).
    """
    if params is None:
        return False, None
    if not isinstance(params, Mapping):
        raise RequestError("kv_transfer_params", "must be an object")
    remote_decode = bool(params.get("do_remote_decode", False))
    if not params.get("do_remote_prefill", False):
        return remote_decode, None
    if remote_decode:
        raise RequestError("kv_transfer_params", "do_remote_prefill and do_remote_decode are exclusive")
    engine_id = params.get("remote_engine_id")
    if not isinstance(engine_id, str) or not engine_id:
        raise RequestError("kv_transfer_params.remote_engine_id", "required with do_remote_prefill")
    block_ids = params.get("remote_block_ids")
    if not isinstance(block_ids, list) or not all(isinstance(b, int) for b in block_ids):
        raise RequestError("kv_transfer_params.remote_block_ids", "must be a list of block ids")
    host = params.get("remote_host")
    if not isinstance(host, str) or not host:
        raise RequestError("kv_transfer_params.remote_host", "required with do_remote_prefill")
    port = params.get("remote_port")
    if not isinstance(port, int) or not 0 < port < 65536:
        raise RequestError("kv_transfer_params.remote_port", "must be a TCP port")
    remote_id = params.get("remote_request_id")
    return False, RemotePrefill(engine_id, tuple(block_ids), host, port, remote_id if remote_id else None)


class LiveEngine:
    """One emulated engine (one pod). Create inside a running event loop; ``start()`` then ``submit``."""

    def __init__(
        self,
        latency: StepLatency,
        metrics: EngineMetrics,
        settings: EngineSettings,
        *,
        engine_id: str,
        role: Role = "colocated",
        kv_capacity_tokens: int,
        tp_size: int = 1,
        side_channel: tuple[str, int] = ("127.0.0.1", 0),
        record_limit: int = 100_000,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        capacity = settings.kv_capacity_tokens or kv_capacity_tokens
        if capacity < settings.block_size:
            raise ValueError(f"kv_capacity_tokens must hold at least one block, got {capacity}")
        self.latency = latency
        self.metrics = metrics
        self.settings = settings
        self.engine_id = engine_id
        self.role = role
        self.tp_size = tp_size
        self.side_channel = side_channel
        self.total_blocks = capacity // settings.block_size
        self.used_blocks = 0
        self.accepting = False
        self.records: deque[RequestRecord] = deque(maxlen=record_limit)
        self._waiting: deque[LiveRequest] = deque()
        self._running: list[LiveRequest] = []
        self._transfers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._block_ids = itertools.count()
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()

    # clock -----------------------------------------------------------------------------------------
    def now(self) -> float:
        """Engine seconds since the engine was created."""
        return (time.monotonic() - self._t0) / self.settings.time_scale

    # lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"engine-{self.engine_id}")
        self.accepting = True

    @property
    def in_flight(self) -> int:
        return len(self._waiting) + len(self._running)

    async def drain(self, timeout_s: float | None = None) -> int:
        """Stop taking requests, let in-flight ones finish (engine seconds), abort the rest.

        Returns how many requests were aborted.
        """
        self.accepting = False
        limit = self.settings.drain_timeout_s if timeout_s is None else timeout_s
        deadline = self.now() + limit
        while self.in_flight and self.now() < deadline:
            await asyncio.sleep(min(0.05, limit * self.settings.time_scale))
        return await self.stop()

    async def stop(self) -> int:
        """Abort everything still queued or running and end the loop; returns how many were aborted."""
        self.accepting = False
        aborted = 0
        for request in [*self._waiting, *self._running]:
            self._finish(request, "abort", self.now())
            aborted += 1
        self._waiting.clear()
        self._running.clear()
        for task in list(self._transfers):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        return aborted

    # requests --------------------------------------------------------------------------------------
    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        kv_transfer_params: Any = None,
        request_id: str | None = None,
    ) -> LiveRequest:
        """Queue a request; raises RequestError (naming the field) or EngineUnavailable."""
        if not self.accepting:
            raise EngineUnavailable(f"engine {self.engine_id} is not serving")
        if prompt_tokens < 1:
            raise RequestError("prompt", "must have at least one token")
        if max_tokens < 1:
            raise RequestError("max_tokens", f"must be >= 1, got {max_tokens}")
        if prompt_tokens + max_tokens > self.settings.max_model_len:
            raise RequestError(
                "max_tokens",
                f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds max_model_len "
                f"{self.settings.max_model_len}",
            )
        remote_decode, remote = parse_kv_transfer_params(kv_transfer_params)
        rid = request_id or f"{self.engine_id}-{next(self._ids)}"
        request = LiveRequest(
            request_id=rid,
            prompt_tokens=prompt_tokens,
            max_tokens=1 if remote_decode else max_tokens,
            arrival=self.now(),
            remote_prefill=remote,
            do_remote_decode=remote_decode,
            context_target=prompt_tokens,
        )
        if remote is not None:
            request.kv_ready = False
        self._waiting.append(request)
        self._work.set()
        return request

    def abort(self, request: LiveRequest) -> None:
        """End a request early (its client went away)."""
        if request.finish_reason is not None:
            return
        if request in self._waiting:
            self._waiting.remove(request)
        if request in self._running:
            self._running.remove(request)
        self._finish(request, "abort", self.now())

    async def stream(self, request: LiveRequest) -> AsyncIterator[TokenEvent]:
        """The request's tokens as they are produced, ending with the event that has finish_reason."""
        while True:
            event = await request.events.get()
            yield event
            if event.finish_reason is not None:
                return

    # scheduler -------------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.settings.block_size)

    def _admit(self, budget: int) -> list[LiveRequest]:
        """Move waiting requests into the running set while seats, KV blocks and the token budget allow.

        A remote-prefill request gets its KV blocks first and waits, off the running set, until its
        transfer lands (vLLM's WAITING_FOR_REMOTE_KVS); others keep their first-come order.
        """
        admitted: list[LiveRequest] = []
        for request in list(self._waiting):
            if len(self._running) >= self.settings.max_num_seqs:
                break
            if request.remote_prefill is not None and not request.kv_ready:
                if not request.blocks:
                    need = self._blocks_for(request.prompt_tokens + 1)
                    if self.used_blocks + need > self.total_blocks:
                        break
                    self._allocate(request, need)
                    self._start_transfer(request)
                continue
            if request.remote_prefill is None and budget <= 0:
                break
            need = self._blocks_for(request.context_target + 1) - request.blocks
            if self.used_blocks + need > self.total_blocks:
                break
            self._allocate(request, need)
            self._waiting.remove(request)
            if request.scheduled_at is None:
                request.scheduled_at = self.now()
            if request.remote_prefill is not None:
                request.computed = request.context_target  # the KV came over the wire
            else:
                budget -= request.context_target - request.computed
            self._running.append(request)
            admitted.append(request)
        return admitted

    def _allocate(self, request: LiveRequest, blocks: int) -> None:
        self.used_blocks += blocks
        request.blocks += blocks
        request.block_ids = request.block_ids + tuple(next(self._block_ids) for _ in range(blocks))

    def _free(self, request: LiveRequest) -> None:
        self.used_blocks -= request.blocks
        request.blocks = 0

    def _start_transfer(self, request: LiveRequest) -> None:
        assert request.remote_prefill is not None
        seconds = self.latency.kv_transfer_time_s(request.prompt_tokens, self.settings.kv_link)

        async def transfer() -> None:
            await asyncio.sleep(seconds * self.settings.time_scale)
            request.kv_ready = True
            self._work.set()

        task = asyncio.get_running_loop().create_task(transfer())
        self._transfers.add(task)
        task.add_done_callback(self._transfers.discard)

    def _preempt_for_growth(self) -> int:
        """Grow running decodes by a block where needed; preempt the newest when KV runs out."""
        preempted = 0
        for request in list(self._running):
            if request not in self._running or not request.prefill_done:
                continue
            need = self._blocks_for(request.context + 1) - request.blocks
            while need > 0 and self.used_blocks + need > self.total_blocks and len(self._running) > 1:
                victim = self._running.pop()
                self._free(victim)
                victim.computed = 0
                victim.context_target = victim.context
                self._waiting.appendleft(victim)
                preempted += 1
                if victim is request:
                    need = 0
            if need > 0 and request in self._running and self.used_blocks + need <= self.total_blocks:
                self._allocate(request, need)
        return preempted

    def _plan_step(self) -> tuple[list[LiveRequest], list[tuple[LiveRequest, int]]]:
        """(decodes, prefill chunks) of the next step."""
        preempted = self._preempt_for_growth()
        if preempted:
            self.metrics.record_preemptions(preempted)
        decodes = [r for r in self._running if r.prefill_done]
        budget = self.settings.max_num_batched_tokens - len(decodes)
        chunks: list[tuple[LiveRequest, int]] = []
        pending = [r for r in self._running if not r.prefill_done]
        for request in [*pending, *self._admit(budget - sum(r.context_target - r.computed for r in pending))]:
            if request.prefill_done:
                decodes.append(request)
            elif budget > 0:
                chunk = min(request.context_target - request.computed, budget)
                chunks.append((request, chunk))
                budget -= chunk
        return decodes, chunks

    def _step_time(self, decodes: list[LiveRequest], chunks: list[tuple[LiveRequest, int]]) -> float:
        prefill_tokens = sum(c for _, c in chunks)
        context = sum(r.context for r in decodes)
        if prefill_tokens and decodes:
            return self.latency.mixed_step_time_s(prefill_tokens, len(decodes), context)
        if prefill_tokens:
            return self.latency.prefill_time_s([c for _, c in chunks])
        return self.latency.decode_step_time_s(len(decodes), context)

    async def _loop(self) -> None:
        while True:
            decodes, chunks = self._plan_step()
            if not decodes and not chunks:
                self._report_gauges(0)
                self._work.clear()
                await self._work.wait()
                continue
            started = time.monotonic()
            seconds = self._step_time(decodes, chunks)
            await asyncio.sleep(max(0.0, started + seconds * self.settings.time_scale - time.monotonic()))
            self._complete_step(decodes, chunks, seconds)

    def _complete_step(
        self, decodes: list[LiveRequest], chunks: list[tuple[LiveRequest, int]], seconds: float
    ) -> None:
        now = self.now()
        generated = 0
        prompt_tokens = 0
        for request, chunk in chunks:
            request.computed += chunk
            if request.generated == 0:
                prompt_tokens += chunk
            if request.prefill_done:
                self._emit(request, now)
                generated += 1
        for request in decodes:
            self._emit(request, now)
            generated += 1
        self.metrics.record_step_tokens(prompt_tokens, generated)
        for request in [r for r in self._running if r.finish_reason is not None]:
            self._running.remove(request)
        self._report_gauges(generated / seconds if seconds > 0 else 0.0)

    def _emit(self, request: LiveRequest, now: float) -> None:
        index = request.generated
        request.generated += 1
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.record_first_token(now - request.arrival)
        elif request.last_token_at is not None:
            gap = now - request.last_token_at
            request.itls.append(gap)
            self.metrics.record_inter_token(gap)
        request.last_token_at = now
        request.events.put_nowait(TokenEvent(index, synthetic_token(request.request_id, index)))
        if request.generated >= request.max_tokens:
            self._finish(request, "length", now)

    def _finish(self, request: LiveRequest, reason: str, now: float) -> None:
        request.finish_reason = reason
        self._free(request)
        params = (
            self._kv_transfer_params(request) if reason == "length" and request.do_remote_decode else None
        )
        request.events.put_nowait(TokenEvent(request.generated, "", reason, params))
        scheduled = request.scheduled_at if request.scheduled_at is not None else now
        first = request.first_token_at if request.first_token_at is not None else now
        last = request.last_token_at if request.last_token_at is not None else now
        self.metrics.record_finished(
            FinishedRequest(
                prompt_tokens=request.prompt_tokens,
                generation_tokens=request.generated,
                max_tokens=request.max_tokens,
                finish_reason=reason,
                e2e_s=last - request.arrival,
                queue_s=scheduled - request.arrival,
                prefill_s=first - scheduled,
                decode_s=last - first,
                inference_s=last - scheduled,
            )
        )
        self.records.append(
            RequestRecord(
                request_id=request.request_id,
                prompt_tokens=request.prompt_tokens,
                generation_tokens=request.generated,
                ttft_s=None if request.first_token_at is None else request.first_token_at - request.arrival,
                itls_s=tuple(request.itls),
                e2e_s=last - request.arrival,
                finish_reason=reason,
            )
        )

    def _kv_transfer_params(self, request: LiveRequest) -> dict[str, Any]:
        """What vLLM's NixlConnector returns from a prefill with do_remote_decode (request_finished)."""
        host, port = self.side_channel
        full_blocks = request.prompt_tokens // self.settings.block_size
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(request.block_ids[:full_blocks]),  # full blocks only, as vLLM
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": self.tp_size,
        }

    def _report_gauges(self, throughput: float) -> None:
        self.metrics.record_gauges(
            EngineGauges(
                running=len(self._running),
                waiting=len(self._waiting),
                kv_usage=self.used_blocks / self.total_blocks,
                kv_used_tokens=self.used_blocks * self.settings.block_size,
                generation_throughput=throughput,
            )
        )
