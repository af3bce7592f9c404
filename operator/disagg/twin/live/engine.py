"""A real-time emulated engine, one per simulated pod: the twin's engine core, paced by the wall clock.

Scheduling is ``disagg.twin.engine.EngineCore`` (the same vLLM-V1-shaped continuous batching the offline
simulator runs: decode tokens first, then chunked prefill within ``max_num_batched_tokens``, admission by
``max_num_seqs`` and KV capacity, recompute preemption), planned one step at a time. Each step sleeps its
modelled duration on the wall clock scaled by ``time_scale`` (0.1 runs ten times faster than a GPU would),
then every request in it streams the tokens the core says it produced. All timings the engine reports
(metrics, records) are measured on that clock in engine seconds, i.e. wall seconds / ``time_scale``.

A request carrying vLLM's NIXL ``kv_transfer_params`` with ``do_remote_prefill`` skips its prefill: it
pulls the prompt's KV from the prefill engine the params name (through that engine's side channel, see
``kv_puller``), waits for the transfer (the latency model's ``kv_transfer_time_s``, counted as waiting like
vLLM's WAITING_FOR_REMOTE_KVS) and then joins the decode batch. A request with ``do_remote_decode`` ends
after its prefill token, keeps its blocks for the decode engine to read, and answers with the
``kv_transfer_params`` a decode engine needs. Params a decode engine cannot load from are a KV load failure,
handled per ``kv_load_failure_policy`` as vLLM does: ``fail`` (vLLM's default) ends the request with an
error, ``recompute`` computes the prompt locally. Every request's exchange is kept in ``transfers``. Token
text is synthetic: deterministic words, not a language model's output.

Prefix-cache lookups are reported as the engines count them (see ``EngineMetrics.record_prefix_cache``):
each request once, on the step that first schedules it, with its prompt tokens looked up and the tokens
the core served from its prefix cache (``SimRequest.cached``; re-admissions after a preemption are not
counted again, as neither engine counts them). The live core runs without prefix caching, i.e. every
lookup misses, which is what a real engine reports for the load generator's prompts (no two share a
prefix, see ``disagg.twin.live.load.synthetic_prompt``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from disagg.perf.latency import LatencyModel
from disagg.twin.engine import DEFAULT_MAX_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS, EngineCore, SimRequest
from disagg.twin.engine import EngineSettings as CoreSettings
from disagg.twin.live.exposition import EngineGauges, EngineMetrics, FinishedRequest
from disagg.twin.live.kv_exchange import (
    BlockIds,
    Bootstrap,
    BootstrapProbe,
    KvPuller,
    RemotePrefill,
    Rendezvous,
    RequestError,
    parse_kv_transfer_params,
)

log = logging.getLogger(__name__)

Role = Literal["prefill", "decode", "colocated"]
ROLES: tuple[Role, ...] = ("prefill", "decode", "colocated")
# vllm 0.33.0 wheel, vllm/config/kv_transfer.py KVTransferConfig.kv_load_failure_policy (default "fail")
KvLoadFailurePolicy = Literal["recompute", "fail"]
KV_LOAD_FAILURE_POLICIES: tuple[KvLoadFailurePolicy, ...] = ("recompute", "fail")

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

    # the offline simulator's defaults (vLLM's, see disagg.twin.engine), so live and offline agree
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    block_size: int = 16  # vLLM's default --block-size for CUDA (names the NIXL block ids)
    max_model_len: int = 131072  # Llama-3.1 context length (config.json max_position_embeddings)
    kv_capacity_tokens: int = 0  # 0: take the latency model's capacity
    time_scale: float = 1.0  # wall seconds per engine second
    kv_link: str = "nic"  # the link a remote prefill's KV crosses (passed to kv_transfer_time_s)
    drain_timeout_s: float = 30.0  # engine seconds a removed pod keeps serving its in-flight requests
    bootstrap_timeout_s: float = 300.0  # engine seconds an SGLang decode request waits for its prefill
    kv_load_failure_policy: KvLoadFailurePolicy = "fail"  # vLLM's default
    transfer_record_limit: int = 10_000  # exchanges kept in LiveEngine.transfers (oldest dropped)
    held_blocks_limit: int = 10_000  # prefilled requests whose blocks wait for a decode engine's read
    # A step planned within this many wall seconds of the previous step's end continues that timeline:
    # steps run back to back on absolute deadlines, so the event loop's wake-up lateness (about a
    # millisecond, i.e. 1/time_scale ms of engine time) is absorbed instead of adding to every step.
    max_lag_s: float = 0.005

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_capacity_tokens < 0:
            raise ValueError(f"kv_capacity_tokens must be >= 0, got {self.kv_capacity_tokens}")
        if not self.time_scale > 0:
            raise ValueError(f"time_scale must be > 0, got {self.time_scale}")
        if self.kv_load_failure_policy not in KV_LOAD_FAILURE_POLICIES:
            raise ValueError(
                f"kv_load_failure_policy must be one of {KV_LOAD_FAILURE_POLICIES}, "
                f"got {self.kv_load_failure_policy!r}"
            )


class EngineUnavailable(RuntimeError):
    """The engine is starting or draining and takes no new requests."""


@dataclass(frozen=True)
class TransferRecord:
    """One request's KV-transfer exchange as this engine saw it (for tests and reports)."""

    request_id: str
    received: Mapping[str, Any] | None  # the request's kv_transfer_params, as sent
    returned: Mapping[str, Any] | None  # the kv_transfer_params the engine answered with (prefill side)
    # "local" (no exchange), "remote-decode" (prefilled for a decode engine), "kv-loaded" (decoded from a
    # prefill engine's KV), "kv-load-failed-recomputed", "kv-load-failed" (ended with an error); SGLang:
    # "bootstrap-prefill" (published its room), "bootstrap-decode" (decoded from the room's prefill),
    # "bootstrap-failed" (the bootstrap server named could not be reached)
    outcome: str
    detail: str = ""
    finish_reason: str = ""
    bootstrap: Bootstrap | None = None  # SGLang's bootstrap_host/port/room, as sent


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
    """A request in flight: the core's SimRequest plus what the HTTP side needs to stream it."""

    request_id: str
    core: SimRequest
    max_tokens: int
    arrival: float
    remote_prefill: RemotePrefill | None
    do_remote_decode: bool
    bootstrap: Bootstrap | None = None
    received_params: Mapping[str, Any] | None = None
    outcome: str = "local"
    detail: str = ""
    events: asyncio.Queue[TokenEvent] = field(default_factory=asyncio.Queue)
    emitted: int = 0
    block_ids: BlockIds = ()
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    itls: list[float] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def prompt_tokens(self) -> int:
        return self.core.prompt

    @property
    def generated(self) -> int:
        return self.emitted


class LiveEngine:
    """One emulated engine (one pod). Create inside a running event loop; ``start()`` then ``submit``."""

    def __init__(
        self,
        latency: LatencyModel,
        metrics: EngineMetrics,
        settings: EngineSettings,
        *,
        engine_id: str,
        role: Role = "colocated",
        tp_size: int = 1,
        side_channel: tuple[str, int] = ("127.0.0.1", 0),
        record_limit: int = 100_000,
        rendezvous: Rendezvous | None = None,
    ) -> None:
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        self.latency = latency
        self.metrics = metrics
        self.settings = settings
        self.engine_id = engine_id
        self.role = role
        self.tp_size = tp_size
        self.side_channel = side_channel
        self.rendezvous = rendezvous or Rendezvous()
        # Every pod runs the core's colocated scheduler: a prefill pod's P/D requests ask for one token and
        # so end with their prompt; a decode pod's P/D requests arrive with their KV (see _admit_core) and
        # a plain request sent to either is served whole, as vLLM's kv_both engines do.
        self.core = EngineCore(
            latency,
            CoreSettings(
                role="colocated",
                max_num_seqs=settings.max_num_seqs,
                max_num_batched_tokens=settings.max_num_batched_tokens,
                kv_capacity_tokens=settings.kv_capacity_tokens or None,
                max_jump_steps=1,  # one step per token: every token is streamed when it is produced
            ),
        )
        self.accepting = False
        self.records: deque[RequestRecord] = deque(maxlen=record_limit)
        self.transfers: deque[TransferRecord] = deque(maxlen=settings.transfer_record_limit)
        # prefilled requests' blocks a decode engine has yet to read: request id -> block ids
        self.held: OrderedDict[str, BlockIds] = OrderedDict()
        self.kv_puller: KvPuller | None = None  # reads a remote prefill's KV (the server's side channel)
        self.bootstrap_probe: BootstrapProbe | None = None  # checks an SGLang bootstrap address
        self._live: dict[int, LiveRequest] = {}  # core rid -> request, everything not finished
        self._transferring = 0
        self._transfers: set[asyncio.Task[None]] = set()
        self._ids = itertools.count()
        self._block_ids = itertools.count()
        self._preemptions = 0
        self._work = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._t0 = time.monotonic()
        self._last_admit_wall = 0.0

    # clock -----------------------------------------------------------------------------------------
    def _wall(self) -> float:
        """Wall seconds since the engine was created. The step loop plans on this small number rather than
        on time.monotonic() itself: that one is the time since boot, and its rounding (1e-9 s after four
        months up, 1/time_scale times more in engine seconds) would make steps and gaps come out shorter
        than the model says on a machine that has been up long."""
        return time.monotonic() - self._t0

    def now(self) -> float:
        """Engine seconds since the engine was created."""
        return self._wall() / self.settings.time_scale

    # lifecycle -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"engine-{self.engine_id}")
        self.accepting = True

    @property
    def in_flight(self) -> int:
        return len(self._live)

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
        for task in list(self._transfers):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        aborted = list(self._live.values())
        self.core.drain_all()
        for request in aborted:
            self._finish(request, "abort", self.now())
        return len(aborted)

    # requests --------------------------------------------------------------------------------------
    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        kv_transfer_params: Any = None,
        request_id: str | None = None,
        bootstrap: Bootstrap | None = None,
    ) -> LiveRequest:
        """Queue a request; raises RequestError (naming the field) or EngineUnavailable.

        ``kv_transfer_params`` is vLLM's NIXL handshake; ``bootstrap`` is SGLang's: on a prefill pod the
        request ends with its prompt and publishes the room, on a decode pod it waits for that room's
        prefill, pays the KV transfer and decodes. Elsewhere either is ignored (served whole).
        """
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
        if prompt_tokens + max_tokens > self.core.kv_capacity:
            raise RequestError(
                "max_tokens",
                f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) exceeds the engine's KV capacity "
                f"{self.core.kv_capacity} tokens",
            )
        remote_decode, remote, invalid = parse_kv_transfer_params(kv_transfer_params)
        if bootstrap is not None and self.role == "colocated":
            bootstrap = None
        rid = next(self._ids)
        now = self.now()
        wanted = 1 if remote_decode or (bootstrap is not None and self.role == "prefill") else max_tokens
        request = LiveRequest(
            request_id=request_id or f"{self.engine_id}-{rid}",
            core=SimRequest(rid, now, prompt_tokens, wanted),
            max_tokens=wanted,
            arrival=now,
            remote_prefill=remote,
            do_remote_decode=remote_decode,
            bootstrap=bootstrap,
            received_params=dict(kv_transfer_params) if isinstance(kv_transfer_params, Mapping) else None,
            outcome="remote-decode" if remote_decode else "local",
        )
        if bootstrap is not None:
            request.outcome = "bootstrap-prefill" if self.role == "prefill" else "bootstrap-decode"
        self._live[rid] = request
        if invalid is not None:
            log.warning("engine %s: got invalid KVTransferParams (%s)", self.engine_id, invalid)
            self._kv_load_failed(request, invalid)
        elif remote is not None or (bootstrap is not None and self.role == "decode"):
            self._start_transfer(request)
        else:
            self._admit_local(request)
        return request

    def _admit_local(self, request: LiveRequest) -> None:
        """Queue a request whose prompt this engine computes itself."""
        self.core.admit(request.core, self.now())
        self._last_admit_wall = self._wall()
        self._work.set()

    def _kv_load_failed(self, request: LiveRequest, why: str) -> None:
        """The prompt's KV could not be read: recompute it here, or end the request with an error, as
        vLLM's scheduler does per kv_load_failure_policy (vllm 0.33.0 wheel, vllm/v1/core/sched/
        scheduler.py: recompute_kv_load_failures, else RequestStatus.FINISHED_ERROR)."""
        request.detail = why
        if self.settings.kv_load_failure_policy == "recompute":
            request.outcome = "kv-load-failed-recomputed"
            self._admit_local(request)
        else:
            request.outcome = "kv-load-failed"
            self._finish(request, "error", self.now())

    def release_blocks(self, request_id: str, block_ids: BlockIds) -> str | None:
        """A decode engine reads the blocks a prefilled request holds (and so frees them); None when they
        are here, else why not."""
        held = self.held.get(request_id)
        if held is None:
            return f"engine {self.engine_id} holds no blocks for request {request_id}"
        if tuple(tuple(g) for g in block_ids) != held:
            return f"engine {self.engine_id}: request {request_id} holds blocks {held}, not {block_ids}"
        del self.held[request_id]
        return None

    def abort(self, request: LiveRequest) -> None:
        """End a request early (its client went away): it finishes as aborted; the core's step ends it."""
        if request.finish_reason is None:
            self._finish(request, "abort", self.now())

    async def stream(self, request: LiveRequest) -> AsyncIterator[TokenEvent]:
        """The request's tokens as they are produced, ending with the event that has finish_reason."""
        while True:
            event = await request.events.get()
            yield event
            if event.finish_reason is not None:
                return

    # transfers -------------------------------------------------------------------------------------
    def _start_transfer(self, request: LiveRequest) -> None:
        """Wait (off the batch, counted as waiting) for the prompt's KV, then admit the request."""
        scale = self.settings.time_scale
        seconds = self.latency.kv_transfer_time_s(request.prompt_tokens, self.settings.kv_link)
        self._transferring += 1

        async def transfer() -> None:
            failure: str | None = None
            try:
                if request.bootstrap is not None:
                    if self.bootstrap_probe is not None:
                        failure = await self.bootstrap_probe(request.bootstrap)
                    if failure is None:
                        timeout = self.settings.bootstrap_timeout_s * scale
                        await self.rendezvous.wait(request.bootstrap, timeout)
                elif request.remote_prefill is not None and self.kv_puller is not None:
                    failure = await self.kv_puller(request.remote_prefill)
                if failure is None:
                    await asyncio.sleep(seconds * scale)
            except TimeoutError:
                self.abort(request)
                return
            finally:
                self._transferring -= 1
            if request.finish_reason is not None:
                return
            if failure is not None and request.bootstrap is not None:
                # SGLang's decode side fails the request when its prefill's bootstrap server is not there
                log.warning(
                    "engine %s: bootstrap of %s failed: %s", self.engine_id, request.request_id, failure
                )
                request.outcome, request.detail = "bootstrap-failed", failure
                self._finish(request, "error", self.now())
                return
            if failure is not None:
                log.warning(
                    "engine %s: KV load of %s failed: %s", self.engine_id, request.request_id, failure
                )
                self._kv_load_failed(request, failure)
                return
            if request.remote_prefill is not None:
                request.outcome = "kv-loaded"
            self._admit_core(request)

        task = asyncio.get_running_loop().create_task(transfer())
        self._transfers.add(task)
        task.add_done_callback(self._transfers.discard)

    def _admit_core(self, request: LiveRequest) -> None:
        """Hand a request whose prompt KV has arrived to the core, as already computed.

        The core's scheduler starts a queued request whose prompt is fully computed as a decode (the path
        its decode replicas use); its outstanding-work counter, used only for routing offline, is kept
        consistent by taking back the prompt it counted on admission.
        """
        self.core.admit(request.core, self.now())
        request.core.computed = request.core.prompt
        self.core.outstanding_tokens -= request.core.prompt
        self._last_admit_wall = self._wall()
        self._work.set()

    # the step loop ---------------------------------------------------------------------------------
    def _engine_time(self, wall: float) -> float:
        return wall / self.settings.time_scale

    async def _loop(self) -> None:
        deadline = self._wall()  # wall time at which the previous step ended (planned)
        while True:
            wall = self._wall()
            start = deadline if 0.0 <= wall - deadline <= self.settings.max_lag_s else wall
            start = max(start, self._last_admit_wall)  # never before the work it plans arrived
            step = self.core.plan_step(self._engine_time(start))
            if step is None:
                self._report_gauges(0.0)
                self._work.clear()
                await self._work.wait()
                deadline = -math.inf  # idle: the next step starts when it is planned
                continue
            involved = [self._live[r.rid] for r in self.core.decoding.values() if r.rid in self._live]
            involved += [self._live[r.rid] for r, _ in step.chunks if r.rid in self._live]
            queried = hits = 0
            for request in involved:
                if request.scheduled_at is None:
                    request.scheduled_at = self._engine_time(start)
                    queried += request.prompt_tokens
                    hits += request.core.cached
            computed = sum(n for r, n in step.chunks if r.preemptions == 0)
            self.metrics.record_prefix_cache(queried, hits, computed)
            deadline = start + step.duration * self.settings.time_scale
            await asyncio.sleep(max(0.0, deadline - self._wall()))
            events = self.core.complete_step(step)
            self._after_step(
                involved, events.finished, events.prefill_tokens, step.duration, self._engine_time(deadline)
            )

    def _after_step(
        self,
        involved: list[LiveRequest],
        finished: list[SimRequest],
        prefill_tokens: int,
        seconds: float,
        now: float,
    ) -> None:
        """Stream what the step produced; ``now`` is the step's planned end (engine seconds)."""
        generated = 0
        for request in involved:
            if request.finish_reason is not None:
                continue
            target = self.core.generated_of(request.core)
            while request.emitted < target:
                self._emit(request, now)
                generated += 1
        for sim in finished:
            done = self._live.get(sim.rid)
            if done is not None:
                while done.emitted < sim.output:
                    self._emit(done, now)
                    generated += 1
                self._finish(done, "length", now)
        preemptions = sum(r.core.preemptions for r in self._live.values())
        if preemptions > self._preemptions:
            self.metrics.record_preemptions(preemptions - self._preemptions)
        self._preemptions = preemptions
        self.metrics.record_step_tokens(prefill_tokens, generated)
        self._report_gauges(generated / seconds if seconds > 0 else 0.0)

    def _emit(self, request: LiveRequest, now: float) -> None:
        index = request.emitted
        request.emitted += 1
        if request.first_token_at is None:
            request.first_token_at = now
            self.metrics.record_first_token(now - request.arrival)
        elif request.last_token_at is not None:
            gap = now - request.last_token_at
            request.itls.append(gap)
            self.metrics.record_inter_token(gap)
        request.last_token_at = now
        request.events.put_nowait(TokenEvent(index, synthetic_token(request.request_id, index)))

    def _finish(self, request: LiveRequest, reason: str, now: float) -> None:
        request.finish_reason = reason
        self._live.pop(request.core.rid, None)
        if reason == "length" and request.bootstrap is not None and self.role == "prefill":
            self.rendezvous.publish(request.bootstrap, request.prompt_tokens)
        if reason == "length" and request.do_remote_decode:
            blocks = math.ceil(request.prompt_tokens / self.settings.block_size)
            request.block_ids = (tuple(next(self._block_ids) for _ in range(blocks)),)
            self._hold(request)
            params: dict[str, Any] | None = self._kv_transfer_params(request)
        else:
            params = None
        request.events.put_nowait(TokenEvent(request.emitted, "", reason, params))
        self.transfers.append(
            TransferRecord(
                request_id=request.request_id,
                received=request.received_params,
                returned=params,
                outcome=request.outcome,
                detail=request.detail,
                finish_reason=reason,
                bootstrap=request.bootstrap,
            )
        )
        scheduled = request.scheduled_at if request.scheduled_at is not None else now
        first = request.first_token_at if request.first_token_at is not None else now
        last = request.last_token_at if request.last_token_at is not None else now
        self.metrics.record_finished(
            FinishedRequest(
                prompt_tokens=request.prompt_tokens,
                generation_tokens=request.emitted,
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
                generation_tokens=request.emitted,
                ttft_s=None if request.first_token_at is None else request.first_token_at - request.arrival,
                itls_s=tuple(request.itls),
                e2e_s=last - request.arrival,
                finish_reason=reason,
            )
        )

    def _hold(self, request: LiveRequest) -> None:
        """Keep a prefilled request's blocks until a decode engine reads them (the oldest go first)."""
        self.held[request.request_id] = request.block_ids
        while len(self.held) > self.settings.held_blocks_limit:
            self.held.popitem(last=False)

    def _kv_transfer_params(self, request: LiveRequest) -> dict[str, Any]:
        """What vLLM's NixlConnector returns from a prefill with do_remote_decode: vllm 0.33.0 wheel,
        vllm/distributed/kv_transfer/kv_connector/v1/nixl/pull_scheduler.py ``request_finished`` (the
        remote_* fields name this engine and its side channel, VLLM_NIXL_SIDE_CHANNEL_HOST/PORT)."""
        host, port = self.side_channel
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(group) for group in request.block_ids],  # one list per KV cache group
            "remote_engine_id": self.engine_id,
            "remote_request_id": request.request_id,
            "remote_host": host,
            "remote_port": port,
            "tp_size": self.tp_size,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": request.prompt_tokens,
            "remote_blocks_expiry_time": None,
            "remote_registration_generation": 0,
            "transfer_mode": "pull",
        }

    def _report_gauges(self, throughput: float) -> None:
        self.metrics.record_gauges(
            EngineGauges(
                running=self.core.num_running,
                waiting=self.core.num_waiting + self._transferring,
                kv_usage=self.core.kv_usage,
                kv_used_tokens=self.core.kv_used,
                generation_throughput=throughput,
            )
        )
