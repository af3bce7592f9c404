"""One replica's continuous-batching scheduler, driven by events: the twin's emulated vLLM engine core.

The same class runs offline (``disagg.twin.sim`` advances a virtual clock) and live (the live twin sleeps for
each step's duration in real time). The protocol is::

    core = EngineCore(latency_model, EngineSettings(role="colocated"))
    core.admit(req, now)                 # a request arrives (or its KV arrives, for a decode replica)
    step = core.plan_step(now)           # what runs next and for how long; None when idle
    ...wait until step.end (or until something new is admitted: core.interrupt(step, now) shortens it)...
    events = core.complete_step(step)    # tokens emitted, prefills finished, requests finished

Scheduling follows vLLM's V1 scheduler: running requests first (one decode token each, then the chunks of
partially prefilled prompts), then waiting requests in arrival order while ``max_num_seqs`` and the
``max_num_batched_tokens`` budget allow; KV is allocated per computed token and, when a decode step would
not fit, the newest running request (the last admitted: a partial prefill if there is one) is preempted and
recomputed later (vLLM's default RECOMPUTE policy), and a step that preempted admits no waiting request
(source: vllm/v1/core/sched/scheduler.py, ``Scheduler.schedule``: ``preempted_req = self.running.pop()``,
then "Next, schedule the WAITING requests." under ``if not preempted_reqs``). Without that gate a
preempted prompt is readmitted into the very step that evicted it and the replica thrashes.

Roles: ``colocated`` (chunked prefill mixed with decodes), ``prefill`` (a P/D prefill replica: a request
leaves once its prompt is computed; its KV is freed when handed to the transfer), ``decode`` (a P/D decode
replica: requests arrive with their prompt's KV and decode; a preempted one is recomputed locally).

Automatic prefix caching follows vLLM V1's KV cache manager: a waiting request looks its leading prompt
blocks up in the cache only when it is *scheduled* (``Scheduler.schedule`` calls
``kv_cache_manager.get_computed_blocks`` for a WAITING request whose ``num_computed_tokens == 0``, then
``allocate_slots`` with those blocks; source: vllm/v1/core/sched/scheduler.py), never while it queues; at
most ``prompt - 1`` tokens can hit, in whole blocks (``max_cache_hit_length = request.num_tokens - 1``;
source: vllm/v1/core/kv_cache_manager.py, ``get_computed_blocks``). A hit block is referenced (reference
count, source: vllm/v1/core/block_pool.py, ``BlockPool.touch``): a block shared by several running
requests occupies KV once. A block nobody references stays cached in the free pool and is evicted least
recently freed first when new KV is allocated (``free_blocks`` appends to the free queue's tail,
``get_new_blocks`` pops its head and evicts the cached block there; a request's blocks are freed in reverse
order so its leading, most shared blocks go last; source: vllm/v1/core/block_pool.py and
single_type_kv_cache_manager.py, ``free``). ``kv_used`` is what running (and held) requests reference,
as vLLM's ``kv_cache_usage`` counts only blocks outside the free pool. A replica never stalls: if nothing
runs or is held and the head of the queue still cannot be scheduled, that request is rejected (reported
in ``StepEvents.rejected`` with ``SimRequest.error`` set) instead of blocking the queue forever.

A step in which nothing but decodes run, with nothing admissible waiting, is planned as a *jump* of k
identical-shape steps ending at the next completion (or the KV limit); its duration has a closed form
(the latency model's decode time is affine in the context), so a long decode phase costs one event.
Token bookkeeping is lazy: a decoding request's generated count is ``gen_at_join + (steps - join_step)``,
so a step costs O(1) plus O(log n) per finished request, not O(batch).
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

from disagg.perf.latency import LatencyModel

EngineRole = Literal["colocated", "prefill", "decode"]

# vLLM defaults: --max-num-seqs 256; --max-num-batched-tokens 8192 for the OpenAI server on large-memory GPUs
# (source: vLLM engine arguments docs, https://docs.vllm.ai/en/stable/configuration/engine_args.html).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_BATCHED_TOKENS = 8192


@dataclass(frozen=True)
class EngineSettings:
    role: EngineRole = "colocated"
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    kv_capacity_tokens: int | None = None  # None: the latency model's KV capacity
    max_jump_steps: int = 1_000_000
    # Automatic prefix caching (on by default in vLLM V1): prompts whose leading blocks' hashes were computed
    # on this replica before skip those tokens. Blocks are the trace's hash granularity (Mooncake: 512
    # tokens per hash id); unreferenced cached blocks live in the free KV and are evicted LRU.
    prefix_caching: bool = False
    prefix_block_tokens: int = 512
    # Prefill role: keep a finished prompt's KV until the caller reports the transfer done (release_kv), as
    # a P/D prefill engine holds its blocks until the decode side has pulled them.
    hold_kv_until_released: bool = False

    def __post_init__(self) -> None:
        if self.role not in ("colocated", "prefill", "decode"):
            raise ValueError(f"role: {self.role!r} is not colocated, prefill or decode")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs: must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens: must be >= 1, got {self.max_num_batched_tokens}")


class SimRequest:
    """A request's state as it moves through engines. Times are seconds on the simulation clock."""

    __slots__ = (
        "arrival",
        "blocks",
        "cached",
        "computed",
        "engine_arrival",
        "epoch",
        "error",
        "finish_time",
        "first_scheduled",
        "first_token_time",
        "gen_at_join",
        "generated",
        "hashes",
        "join_step",
        "output",
        "preemptions",
        "prefill_done_time",
        "prefill_start",
        "prompt",
        "rid",
    )

    def __init__(
        self, rid: int, arrival: float, prompt: int, output: int, hashes: tuple[int, ...] = ()
    ) -> None:
        self.rid = rid
        self.hashes = hashes  # prefix block hashes (e.g. Mooncake hash_ids), for prefix caching
        self.cached = 0  # prompt tokens served from the prefix cache when it was last scheduled
        self.blocks: tuple[int, ...] = ()  # cached prefix blocks it references on its current engine
        self.error: str | None = None  # why an engine rejected it (it never finishes)
        self.arrival = arrival
        self.prompt = max(1, prompt)
        self.output = max(1, output)
        self.computed = 0  # tokens whose KV exists on the current engine
        self.generated = 0  # output tokens emitted so far (materialised when not decoding)
        self.gen_at_join = 0
        self.join_step = 0
        self.epoch = 0
        self.engine_arrival = arrival
        self.first_scheduled = math.nan
        self.prefill_start = math.nan
        self.prefill_done_time = math.nan
        self.first_token_time = math.nan
        self.finish_time = math.nan
        self.preemptions = 0

    @property
    def context(self) -> int:
        """Tokens whose KV a decode of this request needs: prompt plus generated output."""
        return self.prompt + self.generated


@dataclass
class Step:
    """A planned step (or a jump of ``steps`` identical-shape decode steps)."""

    start: float
    duration: float
    steps: int = 1
    decode_batch: int = 0
    chunks: list[tuple[SimRequest, int]] = field(default_factory=list)  # (request, tokens this step)
    first_step_time: float = 0.0
    slope: float = 0.0  # growth of the step time per step inside a jump
    context_tokens: int = 0

    @property
    def end(self) -> float:
        return self.start + self.duration

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, n in self.chunks)


@dataclass
class StepEvents:
    """What a completed step produced."""

    end: float
    first_tokens: list[SimRequest] = field(default_factory=list)  # requests that emitted their first token
    prefilled: list[SimRequest] = field(default_factory=list)  # prefill role: prompt computed, ready to move
    finished: list[SimRequest] = field(default_factory=list)
    preempted: list[SimRequest] = field(default_factory=list)
    rejected: list[SimRequest] = field(default_factory=list)  # could never be scheduled here; error set
    decode_tokens: int = 0  # tokens emitted by requests that were already decoding (ITL gaps)
    mean_gap: float = 0.0  # mean step time of those tokens
    prefill_tokens: int = 0


class EngineCore:
    """The scheduler state of one replica. Not thread-safe; the caller owns the clock."""

    def __init__(self, latency: LatencyModel, settings: EngineSettings | None = None) -> None:
        self.latency = latency
        self.settings = settings or EngineSettings()
        cap = self.settings.kv_capacity_tokens
        self.kv_capacity = latency.kv_capacity_tokens if cap is None else cap
        self.waiting: deque[SimRequest] = deque()
        self.prefilling: list[SimRequest] = []
        self.decoding: dict[int, SimRequest] = {}
        self._finish_heap: list[tuple[int, int, int]] = []  # (finish step, rid, epoch)
        self._awaiting_first: list[SimRequest] = []
        self.steps = 0  # decode steps executed (drives the lazy token counts)
        self.kv_used = 0
        self.decode_context = 0  # sum of context over decoding requests (kept exact)
        self.outstanding_tokens = 0  # prompt tokens to compute + output tokens to emit, for routing
        self.busy_time = 0.0
        self.prompt_tokens_done = 0
        self.tokens_generated = 0
        self.current: Step | None = None
        # prefix cache: referenced blocks (hash -> reference count, counted in kv_used once) and unreferenced
        # cached blocks in the free KV, least recently freed first (evicted first)
        self._caching = self.settings.prefix_caching
        self._block = max(1, self.settings.prefix_block_tokens)
        self._refs: dict[int, int] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._held: dict[int, tuple[int, tuple[int, ...]]] = {}  # rid -> (tokens, blocks) kept for transfer
        self._rejected: list[SimRequest] = []
        self.prefix_hit_tokens = 0
        self.rejected = 0

    # --- queries -------------------------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.decoding) + len(self.prefilling)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_usage(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity else 0.0

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.prefilling and not self.decoding

    def generated_of(self, req: SimRequest) -> int:
        if req.rid in self.decoding:
            return req.gen_at_join + (self.steps - req.join_step)
        return req.generated

    # --- protocol ------------------------------------------------------------------------------------
    def admit(self, req: SimRequest, now: float, kv_ready: bool | None = None) -> None:
        """Queue a request. ``kv_ready``: its prompt's KV was transferred in (default: decode role only)."""
        if req.prompt + req.output > self.kv_capacity:
            raise ValueError(
                f"request {req.rid}: prompt+output {req.prompt + req.output} tokens exceed the replica's "
                f"KV capacity {self.kv_capacity}"
            )
        req.engine_arrival = now
        ready = self.settings.role == "decode" if kv_ready is None else kv_ready
        req.computed = req.prompt if ready else 0
        req.cached = 0
        req.blocks = ()
        self.waiting.append(req)
        self.outstanding_tokens += self._remaining_work(req)

    def _remaining_work(self, req: SimRequest) -> int:
        prefill = max(0, req.prompt + req.generated - req.computed)
        if self.settings.role == "prefill":
            return prefill
        return prefill + req.output - req.generated

    def plan_step(self, now: float) -> Step | None:
        """Decide the next step (or jump). Returns None when there is nothing to run."""
        s = self.settings
        preempted = self._ensure_decode_kv(now)
        batch = len(self.decoding)
        budget = s.max_num_batched_tokens - batch
        chunks: list[tuple[SimRequest, int]] = []
        free = self.kv_capacity - self.kv_used - batch
        for req in self.prefilling:
            if budget <= 0 or free <= 0:
                break
            n = min(req.prompt + req.generated - req.computed, budget, free)
            chunks.append((req, n))
            budget -= n
            free -= n
        while not preempted and self.waiting and budget > 0 and self.num_running < s.max_num_seqs:
            req = self.waiting[0]
            need = req.prompt + req.generated - req.computed
            if need == 0:  # decode replica: KV arrived; needs room for its context
                if req.context + 1 > free:
                    break
                self.waiting.popleft()
                self._start_decoding(req, now, joined_by_transfer=True)
                free -= req.context + 1
                batch += 1
                budget -= 1
                continue
            hits: tuple[int, ...] = ()
            cost = 0  # KV the hit blocks take out of the free pool (those nobody references yet)
            if self._caching and req.hashes and req.computed == 0:
                self._evict_cached(free)
                hits = self._cached_prefix(req)
                cost = self._block * sum(1 for h in hits if h not in self._refs)
            if free - cost <= 0:
                break
            self.waiting.popleft()
            if hits:
                self._reference(req, hits)
                free -= cost
                need = req.prompt + req.generated - req.computed
            if math.isnan(req.first_scheduled):
                req.first_scheduled = now
            req.prefill_start = now
            self.prefilling.append(req)
            n = min(need, budget, free)
            chunks.append((req, n))
            budget -= n
            free -= n
        batch = len(self.decoding)
        if not chunks and batch == 0:
            # Nothing can run. Never stall: make room, admit, or reject what can never fit; wait only for
            # KV held for transfers, which release_kv frees.
            if len(self.prefilling) > 1:
                self._preempt_newest_prefill()  # KV is full of partial prompts: recompute the newest later
                return self.plan_step(now)
            if preempted and self.waiting:
                return self.plan_step(now)  # every running request was preempted: admit from the queue
            if not self._held and (self.prefilling or self.waiting):
                # The one request in KV (or the head of the queue, with every cached block evictable)
                # does not fit the whole replica: reject it rather than block everything behind it forever.
                if self.prefilling:
                    self._reject(self.prefilling.pop(), holds_kv=True)
                else:
                    self._reject(self.waiting.popleft(), holds_kv=False)
                return self.plan_step(now)
            if self._rejected:
                step = Step(now, 0.0)  # report the rejections through complete_step
                self.current = step
                return step
            self.current = None
            return None
        ctx = self.decode_context
        if chunks:
            work = float(sum(2 * n * r.computed + n * n for r, n in chunks))
            ntok = sum(n for _, n in chunks)
            t = self.latency.step_time_s(ntok + batch, batch + len(chunks), work, batch, ctx)
            step = Step(now, t, 1, batch, chunks, t, 0.0, ctx)
        else:
            k = self._jump_length(batch)
            first = self.latency.decode_step_time_s(batch, ctx)
            slope = self.latency.decode_step_slope_s(batch)
            step = Step(now, k * first + slope * k * (k - 1) / 2, k, batch, [], first, slope, ctx)
        self.current = step
        return step

    def _jump_length(self, batch: int) -> int:
        """Identical-shape decode steps until the next completion, KV limit or admissible arrival."""
        next_finish = self._peek_finish() - self.steps
        kv_room = (self.kv_capacity - self.kv_used) // batch
        k = min(next_finish, kv_room, self.settings.max_jump_steps)
        return max(1, k)

    def _peek_finish(self) -> int:
        heap = self._finish_heap
        while heap:
            fstep, rid, epoch = heap[0]
            req = self.decoding.get(rid)
            if req is not None and req.epoch == epoch:
                return fstep
            heapq.heappop(heap)
        return self.steps + 1

    def interrupt(self, step: Step, now: float) -> Step:
        """Shorten a planned jump so it ends after the step running at ``now`` (new work arrived)."""
        if step.steps <= 1 or now >= step.end:
            return step
        elapsed = now - step.start
        j = _steps_started(step.first_step_time, step.slope, elapsed, step.steps)
        j = max(1, min(step.steps, j))
        step.steps = j
        step.duration = j * step.first_step_time + step.slope * j * (j - 1) / 2
        return step

    def complete_step(self, step: Step) -> StepEvents:
        """Apply a finished step: emit tokens, finish prefills and requests, free KV."""
        ev = StepEvents(end=step.end)
        k = step.steps
        self.busy_time += step.duration
        self.current = None
        batch = step.decode_batch
        if batch:
            # Requests that joined decoding since the last step emit their first token at this step's end
            # (the first of a jump); the rest emit tokens separated by the step times.
            first_end = step.start + step.first_step_time
            newcomers = len(self._awaiting_first)
            for req in self._awaiting_first:
                if math.isnan(req.first_token_time):
                    req.first_token_time = first_end
                    ev.first_tokens.append(req)
            self._awaiting_first = []
            self.steps += k
            self.kv_used += batch * k
            self.decode_context += batch * k
            self.tokens_generated += batch * k
            self.outstanding_tokens -= batch * k
            ev.decode_tokens = batch * k - newcomers
            ev.mean_gap = step.duration / k
        for req, n in step.chunks:
            req.computed += n
            self.kv_used += n
            self.prompt_tokens_done += n
            self.outstanding_tokens -= n
            ev.prefill_tokens += n
            if req.computed >= req.prompt + req.generated:
                self._prefill_finished(req, step.end, ev)
        self._pop_finished(step.end, ev)
        if self._rejected:
            ev.rejected, self._rejected = self._rejected, []
        if self._lru:
            self._evict_cached(self.kv_capacity - self.kv_used)
        return ev

    # --- internals -----------------------------------------------------------------------------------
    def _cached_prefix(self, req: SimRequest) -> tuple[int, ...]:
        """The leading prompt blocks cached here, whole blocks within ``prompt + generated - 1`` tokens."""
        limit = min(len(req.hashes), (req.prompt + req.generated - 1) // self._block)
        n = 0
        refs, lru = self._refs, self._lru
        while n < limit and (req.hashes[n] in refs or req.hashes[n] in lru):
            n += 1
        return req.hashes[:n]

    def _reference(self, req: SimRequest, hits: tuple[int, ...]) -> None:
        """Schedule ``req`` on its cached prefix: reference the blocks (taking unreferenced ones out of the
        free pool) and skip their tokens."""
        refs, lru = self._refs, self._lru
        for h in hits:
            count = refs.get(h, 0)
            if count == 0:
                del lru[h]
                self.kv_used += self._block
            refs[h] = count + 1
        tokens = len(hits) * self._block
        req.blocks = hits
        req.cached = req.computed = tokens
        self.outstanding_tokens -= tokens
        self.prefix_hit_tokens += tokens

    def _register_prefix(self, req: SimRequest) -> None:
        """A computed prompt's full blocks become cached blocks that ``req`` references. A block whose hash
        is already cached (computed twice concurrently) stays the request's own and is freed with it."""
        if not self._caching or not req.hashes:
            return
        refs, lru = self._refs, self._lru
        new: list[int] = []
        for h in req.hashes[len(req.blocks) : req.prompt // self._block]:
            if h not in refs and h not in lru:
                refs[h] = 1
                new.append(h)
        if new:
            req.blocks = (*req.blocks, *new)

    def _free_kv(self, req: SimRequest, tokens: int) -> None:
        """Free the KV of ``req`` (``tokens`` in all, its referenced blocks among them): its own tokens go,
        its blocks lose a reference and, unreferenced, join the free pool's tail (last block first)."""
        self._release_blocks(tokens, req.blocks)
        req.blocks = ()
        req.computed = 0

    def _release_blocks(self, tokens: int, blocks: tuple[int, ...]) -> None:
        self.kv_used -= tokens - len(blocks) * self._block
        refs, lru = self._refs, self._lru
        for h in reversed(blocks):
            count = refs[h] - 1
            if count:
                refs[h] = count
                continue
            del refs[h]
            lru[h] = None
            self.kv_used -= self._block

    def _evict_cached(self, free: int) -> None:
        """Evict least recently freed cached blocks until the rest fit in ``free`` tokens of KV."""
        lru = self._lru
        excess = len(lru) - max(0, free) // self._block
        for _ in range(max(0, excess)):
            lru.popitem(last=False)

    def _reject(self, req: SimRequest, holds_kv: bool) -> None:
        """End a request that can never be scheduled here (``error`` says why), freeing the KV it holds (a
        queued request holds none)."""
        self.outstanding_tokens -= self._remaining_work(req)
        self._free_kv(req, req.computed if holds_kv else 0)
        req.error = (
            f"request {req.rid}: prompt+output {req.prompt + req.output} tokens cannot be scheduled with "
            f"{self.kv_capacity - self.kv_used} of the replica's {self.kv_capacity} KV tokens free and "
            "nothing running"
        )
        self.rejected += 1
        self._rejected.append(req)

    def _prefill_finished(self, req: SimRequest, now: float, ev: StepEvents) -> None:
        self.prefilling.remove(req)
        self._register_prefix(req)
        if math.isnan(req.prefill_done_time):
            req.prefill_done_time = now
        if self.settings.role == "prefill":
            if self.settings.hold_kv_until_released:
                self._held[req.rid] = (req.computed, req.blocks)
                req.blocks = ()
                req.computed = 0
            else:
                self._free_kv(req, req.computed)
            ev.prefilled.append(req)
            return
        # vLLM samples a token in the step that completes a prompt (also after a recompute).
        req.generated += 1
        self.tokens_generated += 1
        self.outstanding_tokens -= 1
        if math.isnan(req.first_token_time):
            req.first_token_time = now
            ev.first_tokens.append(req)
        if req.generated >= req.output:
            self._finish(req, now, ev)
            return
        self._start_decoding(req, now, joined_by_transfer=False)

    def _start_decoding(self, req: SimRequest, now: float, joined_by_transfer: bool) -> None:
        if joined_by_transfer:
            if math.isnan(req.first_scheduled):
                req.first_scheduled = now
            req.computed = req.prompt + req.generated
            self.kv_used += req.computed
            self._awaiting_first.append(req)
        req.epoch += 1
        req.gen_at_join = req.generated
        req.join_step = self.steps
        self.decoding[req.rid] = req
        self.decode_context += req.computed
        heapq.heappush(self._finish_heap, (self.steps + req.output - req.generated, req.rid, req.epoch))

    def _pop_finished(self, now: float, ev: StepEvents) -> None:
        heap = self._finish_heap
        while heap and heap[0][0] <= self.steps:
            _, rid, epoch = heapq.heappop(heap)
            req = self.decoding.get(rid)
            if req is None or req.epoch != epoch:
                continue
            held = self._held_kv(req)
            del self.decoding[rid]
            req.generated = req.output
            self.decode_context -= held
            self._free_kv(req, held)
            self._finish(req, now, ev)

    def _finish(self, req: SimRequest, now: float, ev: StepEvents) -> None:
        if req.rid in self.decoding:
            del self.decoding[req.rid]
            self.decode_context -= req.computed
            self._free_kv(req, req.computed)
        elif req.computed:
            self._free_kv(req, req.computed)
        req.finish_time = now
        ev.finished.append(req)

    def _ensure_decode_kv(self, now: float) -> bool:
        """Preempt the newest running requests until one decode step's KV fits (recompute policy); True if
        any was preempted. Partial prefills were admitted after every decoding request (chunks are served
        in admission order), so they go first, newest first."""
        preempted = False
        while self.decoding and self.kv_used + len(self.decoding) > self.kv_capacity:
            preempted = True
            if self.prefilling:
                victim = self.prefilling.pop()
                self.outstanding_tokens += victim.computed
                self._free_kv(victim, victim.computed)
                victim.preemptions += 1
                self.waiting.appendleft(victim)
                continue
            rid = next(reversed(self.decoding))
            req = self.decoding[rid]
            held = self._held_kv(req)
            req.generated = req.gen_at_join + (self.steps - req.join_step)
            del self.decoding[rid]
            self.decode_context -= held
            self._free_kv(req, held)
            self.outstanding_tokens += req.prompt + req.generated
            if req in self._awaiting_first:
                self._awaiting_first.remove(req)
            req.epoch += 1
            req.preemptions += 1
            self.waiting.appendleft(req)
        return preempted

    def release_kv(self, req: SimRequest) -> None:
        """The held KV of ``req``'s prompt left the replica (hold_kv_until_released); nothing if the replica
        no longer holds it (drained)."""
        held = self._held.pop(req.rid, None)
        if held is not None:
            self._release_blocks(*held)

    def _held_kv(self, req: SimRequest) -> int:
        """KV tokens a decoding request holds: what it joined with plus one per decode step since."""
        return req.computed + (self.steps - req.join_step)

    def _preempt_newest_prefill(self) -> None:
        req = self.prefilling.pop()
        self.outstanding_tokens += req.computed
        self._free_kv(req, req.computed)
        req.preemptions += 1
        self.waiting.appendleft(req)

    def drain_all(self) -> list[SimRequest]:
        """Remove every request (replica deleted before finishing); returns them, state materialised."""
        out: list[SimRequest] = []
        for req in list(self.decoding.values()):
            req.generated = req.gen_at_join + (self.steps - req.join_step)
            out.append(req)
        out.extend(self.prefilling)
        out.extend(self.waiting)
        self.decoding.clear()
        self.prefilling.clear()
        self.waiting.clear()
        self._finish_heap.clear()
        self._awaiting_first.clear()
        self.kv_used = self.decode_context = self.outstanding_tokens = 0
        for req in out:
            req.computed = 0
            req.blocks = ()
        self._refs.clear()
        self._lru.clear()
        self._held.clear()
        return out


def _steps_started(first: float, slope: float, elapsed: float, limit: int) -> int:
    """Number of steps of a jump that start before ``elapsed`` (step i starts at i*first + slope*i(i-1)/2)."""
    if first <= 0:
        return limit
    if slope <= 0:
        return min(limit, math.floor(elapsed / first) + 1)
    # solve slope/2 * j^2 + (first - slope/2) * j - elapsed = 0 for the last start before elapsed
    a, b = slope / 2, first - slope / 2
    j = (-b + math.sqrt(b * b + 4 * a * elapsed)) / (2 * a)
    return min(limit, math.floor(j) + 1)
