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

from disagg.twin.latency import LatencyModel

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
    # tokens per hash id); the cache is LRU over at most the KV capacity's worth of blocks.
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
        "cached",
        "computed",
        "engine_arrival",
        "epoch",
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
        self.cached = 0  # prompt tokens served from the prefix cache at the last admission
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
        self._prefix: OrderedDict[int, None] | None = OrderedDict() if self.settings.prefix_caching else None
        self._prefix_capacity = self.kv_capacity // max(1, self.settings.prefix_block_tokens)
        self.prefix_hit_tokens = 0

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
        if not ready and self._prefix is not None and req.hashes and req.generated == 0:
            req.cached = req.computed = self._prefix_hits(req)
            self.kv_used += req.cached
            self.prefix_hit_tokens += req.cached
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
            if free <= 0:
                break
            self.waiting.popleft()
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
            if self.prefilling and self._preempt_newest_prefill():
                return self.plan_step(now)  # KV was full of partial prompts: recompute the newest later
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
        return ev

    # --- internals -----------------------------------------------------------------------------------
    def _prefix_hits(self, req: SimRequest) -> int:
        """Prompt tokens whose leading blocks are cached here (at least one token is always computed)."""
        cache = self._prefix
        assert cache is not None
        hits = 0
        for h in req.hashes:
            if h not in cache:
                break
            cache.move_to_end(h)
            hits += 1
        return min(hits * self.settings.prefix_block_tokens, req.prompt - 1)

    def _remember_prefix(self, req: SimRequest) -> None:
        cache = self._prefix
        if cache is None or not req.hashes:
            return
        for h in req.hashes[: req.prompt // self.settings.prefix_block_tokens]:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > self._prefix_capacity:
            cache.popitem(last=False)

    def _prefill_finished(self, req: SimRequest, now: float, ev: StepEvents) -> None:
        self.prefilling.remove(req)
        self._remember_prefix(req)
        if math.isnan(req.prefill_done_time):
            req.prefill_done_time = now
        if self.settings.role == "prefill":
            if not self.settings.hold_kv_until_released:
                self.kv_used -= req.computed
            req.computed = 0
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
            self.kv_used -= held
            req.computed = 0
            self._finish(req, now, ev)

    def _finish(self, req: SimRequest, now: float, ev: StepEvents) -> None:
        if req.rid in self.decoding:
            del self.decoding[req.rid]
            self.decode_context -= req.computed
            self.kv_used -= req.computed
            req.computed = 0
        elif req.computed:
            self.kv_used -= req.computed
            req.computed = 0
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
                self.kv_used -= victim.computed
                self.outstanding_tokens += victim.computed
                victim.computed = 0
                victim.preemptions += 1
                self.waiting.appendleft(victim)
                continue
            rid = next(reversed(self.decoding))
            req = self.decoding[rid]
            held = self._held_kv(req)
            req.generated = req.gen_at_join + (self.steps - req.join_step)
            del self.decoding[rid]
            self.decode_context -= held
            self.kv_used -= held
            self.outstanding_tokens += req.prompt + req.generated
            if req in self._awaiting_first:
                self._awaiting_first.remove(req)
            req.computed = 0
            req.epoch += 1
            req.preemptions += 1
            self.waiting.appendleft(req)
        return preempted

    def release_kv(self, tokens: int) -> None:
        """A held prompt's KV left the replica (hold_kv_until_released)."""
        self.kv_used -= tokens

    def _held_kv(self, req: SimRequest) -> int:
        """KV tokens a decoding request holds: what it joined with plus one per decode step since."""
        return req.computed + (self.steps - req.join_step)

    def _preempt_newest_prefill(self) -> bool:
        if len(self.prefilling) < 2 and self.kv_used < self.kv_capacity:
            return False
        req = self.prefilling.pop()
        self.kv_used -= req.computed
        self.outstanding_tokens += req.computed
        req.computed = 0
        req.preemptions += 1
        self.waiting.appendleft(req)
        return True

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
