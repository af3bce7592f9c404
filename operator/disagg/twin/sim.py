"""Discrete-event simulation of a serving deployment: pools of replicas, routing, KV transfer, scaling.

``simulate(deployment, requests, controller=None, interval_s=30, seed=0) -> SimResult``.

* P/D mode: a request is routed to a prefill replica, its prompt is computed there (chunked to the step
  budget), its KV moves over the link (bytes / bandwidth of the prefill replica's NICs, transfers from one
  replica queued behind each other, plus a setup latency; the decode side's inbound bandwidth is not
  modelled) and it is routed to a decode replica, whose first step emits the first token.
  TTFT = front-end overhead + router queue + engine queue + prefill + transfer + first decode step.
* Colocated mode: one pool, chunked prefill mixing prompt chunks with decodes in every step.
* Routing: ``round_robin`` or ``least_outstanding`` (prompt tokens still to compute plus output tokens
  still to emit, per replica). A pool with no ready replica holds requests at the router.
* Scaling: every ``interval_s`` the controller gets a :class:`disagg.policy.types.Observation` of the last
  window and may return target replicas per role (a colocated deployment's observation shows its one pool
  as both roles; its controller returns ``{"colocated": n}``). New replicas become ready after
  ``startup_delay_s``; removed ones drain (no new requests, finish in-flight ones). GPU-hours integrate
  every allocated replica (starting, ready, draining) times its GPUs.
* Per request: TTFT, end-to-end latency and the mean inter-token gap (its TPOT); all gaps go into a
  log-bucket histogram (2.9% wide buckets), globally and per window, instead of a list of floats.
* Deterministic: the event order is fixed (time, then insertion order); ``seed`` only breaks routing ties
  for the ``random`` policy.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from disagg.perf.latency import LatencyModel, load_latency_model
from disagg.policy.types import (
    MISSING,
    Measured,
    Observation,
    RoleObservation,
)
from disagg.twin.deployment import PoolSpec, Routing, SimDeployment
from disagg.twin.engine import (
    EngineCore,
    EngineRole,
    EngineSettings,
    SimRequest,
    Step,
)
from disagg.twin.traffic import Request

# PoolSpec and SimDeployment (disagg.twin.deployment) are imported from here by the benches, tests and CLI.
__all__ = [
    "ClosedLoop",
    "Controller",
    "FrontEndLoad",
    "LogHistogram",
    "PoolSpec",
    "Routing",
    "SimDeployment",
    "SimResult",
    "Simulator",
    "Window",
    "simulate",
]

if TYPE_CHECKING:
    from disagg.twin.report import Report

Controller = Callable[[Observation], Mapping[str, int] | None]


# --- measurement helpers -------------------------------------------------------------------------------
class LogHistogram:
    """Counts in log-spaced buckets from 0.1 ms to ~3 h (80 per decade, about 2.9% wide)."""

    LO = 1e-4
    PER_DECADE = 80
    NBINS = 8 * 80

    def __init__(self) -> None:
        self.counts = [0.0] * (self.NBINS + 1)
        self.total = 0.0
        self.sum = 0.0

    def add(self, value: float, weight: float = 1.0) -> None:
        if weight <= 0 or math.isnan(value):
            return
        i = 0 if value <= self.LO else min(self.NBINS, int(math.log10(value / self.LO) * self.PER_DECADE) + 1)
        self.counts[i] += weight
        self.total += weight
        self.sum += value * weight

    def upper_bound(self, i: int) -> float:
        return float(self.LO * 10 ** (i / self.PER_DECADE))

    def quantile(self, q: float) -> float | None:
        if self.total <= 0:
            return None
        target = q * self.total
        acc = 0.0
        for i, c in enumerate(self.counts):
            acc += c
            if acc >= target and c > 0:
                # geometric midpoint of the bucket
                lo = self.upper_bound(i - 1) if i > 0 else self.LO
                return math.sqrt(lo * self.upper_bound(i))
        return self.upper_bound(self.NBINS)

    @property
    def mean(self) -> float | None:
        return self.sum / self.total if self.total > 0 else None

    def merge(self, other: LogHistogram) -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.sum += other.sum


@dataclass
class Window:
    """What happened during one controller interval."""

    start: float
    ttft: LogHistogram = field(default_factory=LogHistogram)
    itl: LogHistogram = field(default_factory=LogHistogram)
    arrivals: int = 0
    prompt_lens: list[int] = field(default_factory=list)
    output_lens: list[int] = field(default_factory=list)
    queue_time: dict[str, list[float]] = field(default_factory=lambda: {"prefill": [], "decode": []})
    prefill_time: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens the prefill replicas served from their prefix caches

    @staticmethod
    def merged(windows: Sequence[Window]) -> Window:
        """One window covering consecutive windows (the policy's metric window spans several intervals)."""
        out = Window(windows[0].start)
        for w in windows:
            out.ttft.merge(w.ttft)
            out.itl.merge(w.itl)
            out.arrivals += w.arrivals
            out.prompt_lens.extend(w.prompt_lens)
            out.output_lens.extend(w.output_lens)
            for role, values in w.queue_time.items():
                out.queue_time[role].extend(values)
            out.prefill_time.extend(w.prefill_time)
            out.prompt_tokens += w.prompt_tokens
            out.generated_tokens += w.generated_tokens
            out.prefix_hit_tokens += w.prefix_hit_tokens
        return out


# --- replicas and pools --------------------------------------------------------------------------------
class Replica:
    __slots__ = ("core", "hits_seen", "index", "link_free", "pool", "ready_at", "state", "step", "version")

    def __init__(self, pool: Pool, index: int, core: EngineCore, ready_at: float) -> None:
        self.pool = pool
        self.index = index
        self.core = core
        self.ready_at = ready_at
        self.state: Literal["starting", "ready", "draining", "gone"] = "starting"
        self.step: Step | None = None
        self.version = 0
        self.link_free = 0.0  # when this replica's NICs finish the KV transfers queued on them
        self.hits_seen = 0  # prefix-cache hit tokens already counted into a window


class Pool:
    def __init__(self, role: EngineRole, spec: PoolSpec, latency: LatencyModel, prefix_caching: bool) -> None:
        self.role = role
        self.spec = spec
        self.latency = latency
        # the engine limits are per data-parallel rank: each rank is an engine core with its own
        # scheduler (vLLM data parallelism: one EngineCore per DP rank, each with the scheduler config's
        # max_num_seqs and max_num_batched_tokens); the twin steps the replica as one engine whose step
        # the latency model splits over the ranks, so its limits are the ranks' together
        self.settings = EngineSettings(
            role=role,
            max_num_seqs=spec.max_num_seqs * spec.dp,
            max_num_batched_tokens=spec.max_num_batched_tokens * spec.dp,
            # the KV cache vLLM sizes under the pool's engine flags (each DP rank profiles its own share)
            kv_capacity_tokens=latency.kv_capacity_for(spec.engine_memory(latency.default_memory)),
            prefix_caching=prefix_caching,
            hold_kv_until_released=role == "prefill",
        )
        self.replicas: list[Replica] = []
        self.pending: deque[SimRequest] = deque()
        self.rr = 0
        self.counter = itertools.count()
        self.target = spec.replicas

    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.state == "ready"]

    def allocated(self) -> int:
        return sum(1 for r in self.replicas if r.state != "gone")

    def active(self) -> list[Replica]:
        """Replicas that count towards the target: starting or ready (not draining)."""
        return [r for r in self.replicas if r.state in ("starting", "ready")]


# --- results -------------------------------------------------------------------------------------------
@dataclass
class SimResult:
    deployment: SimDeployment
    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft: np.ndarray  # NaN where the request never got a first token
    e2e: np.ndarray  # NaN where unfinished
    itl_mean: np.ndarray  # mean gap between output tokens; NaN for single-token outputs or unfinished
    preemptions: np.ndarray
    itl_hist: LogHistogram
    ttft_hist: LogHistogram
    gpu_hours: float
    duration_s: float
    timeline: list[dict[str, float | None]]  # per interval: time, ttft/itl percentiles, rate
    replicas: list[tuple[float, dict[str, tuple[int, int]]]]  # time -> role -> (allocated, ready)
    decisions: list[tuple[float, dict[str, int]]]
    rejected: int = 0

    @property
    def finished(self) -> int:
        return int(np.sum(~np.isnan(self.e2e)))

    def met_ttft(self, ttft_s: float) -> np.ndarray:
        """Per request: finished, with its first token within ``ttft_s``."""
        met: np.ndarray = ~np.isnan(self.e2e) & (np.nan_to_num(self.ttft, nan=math.inf) <= ttft_s)
        return met

    def met_itl(self, itl_s: float) -> np.ndarray:
        """Per request: finished, with its mean inter-token gap within ``itl_s`` (a single-token answer
        has no gap to miss)."""
        gaps_ok = (self.output <= 1) | (np.nan_to_num(self.itl_mean, nan=math.inf) <= itl_s)
        met: np.ndarray = ~np.isnan(self.e2e) & gaps_ok
        return met

    def met_slo(self, ttft_s: float, itl_s: float) -> np.ndarray:
        """Per request: finished and within both targets (a *good* request)."""
        met: np.ndarray = self.met_ttft(ttft_s) & self.met_itl(itl_s)
        return met

    def report(self, ttft_slo_s: float, itl_slo_s: float, percentile: float = 0.9) -> Report:
        from disagg.twin.report import build_report

        return build_report(self, ttft_slo_s, itl_slo_s, percentile)


# --- the simulator -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ClosedLoop:
    """``concurrency`` clients each keep one request of fixed shape in flight, ``total`` requests in all."""

    concurrency: int
    prompt_tokens: int
    output_tokens: int
    total: int
    ramp_s: float = 0.0  # client i sends its first request at i * ramp_s / concurrency (desynchronises)
    random_start: bool = False  # first requests at seeded uniform-random times in [0, ramp_s] instead
    # each later request is sent a seeded uniform-random [0, jitter_s] after its client's previous one
    # finished (client and server-side per-request time the engine does not see): how clients that start
    # together drift apart
    jitter_s: float = 0.0


@dataclass(frozen=True)
class FrontEndLoad:
    """A front end (one API-server process per replica of the first pool) whose CPU tokenises every prompt
    and detokenises and streams every output token, and is shared by all the requests it serves.

    An asyncio event loop serves its tasks roughly in turn, i.e. as a processor-sharing server: a new
    request's own front-end work then takes ``request_overhead / (1 - rho)`` (M/G/1-PS sojourn time given
    the job size), where ``rho = prompt_token_s x prompt tokens/s + output_token_s x output tokens/s`` is the
    process's utilisation by everything else, capped at ``max_util``. Both rates are counted over the last
    ``window_s`` before the request arrives, summed over the replicas and divided among the first pool's
    ready replicas (a decode jump's tokens count when it ends). The stretch applies to the request's
    arrival (its TTFT); token delivery is a stable queue (rho < 1), so the client sees the tokens at the
    rate they are generated and TPOT is unchanged. A what-if (disagg.twin.fidelity.FRONT_END_LOAD_WHAT_IF),
    not in the shipped twin."""

    prompt_token_s: float = 0.0  # front-end CPU seconds per prompt token (tokenisation)
    output_token_s: float = 0.0  # front-end CPU seconds per output token (detokenise, SSE event)
    max_util: float = 0.95
    window_s: float = 4.0


_ARRIVAL_DONE = math.inf


class Simulator:
    def __init__(
        self,
        deployment: SimDeployment,
        requests: Sequence[Request],
        controller: Controller | None = None,
        interval_s: float = 30.0,
        seed: int = 0,
        percentile: float = 0.9,
        max_time_s: float | None = None,
        progress: Callable[[float, int, int], None] | None = None,
        closed_loop: ClosedLoop | None = None,
        window_s: float | None = None,
        stream_overhead_s: float = 0.0,
        front_end_load: FrontEndLoad | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s: must be > 0, got {interval_s}")
        self.dep = deployment
        self.controller = controller
        self.interval = interval_s
        self.percentile = percentile
        self.rng = random.Random(seed)
        self.progress = progress
        self.closed_loop = closed_loop
        self._closed_issued = 0
        self._clients_waiting = 0  # closed-loop clients whose next send is scheduled (jitter_s)
        self.reqs = [
            SimRequest(i, r.arrival_s, r.prompt_tokens, r.output_tokens, r.prefix_hashes)
            for i, r in enumerate(sorted(requests, key=lambda r: r.arrival_s))
        ]
        last = self.reqs[-1].arrival if self.reqs else 0.0
        self.max_time = max_time_s if max_time_s is not None else last + 4 * 3600.0
        self.heap: list[tuple[float, int, int, Any, int]] = []
        self.seq = itertools.count()
        self.now = 0.0
        self.pools: dict[str, Pool] = {}
        roles: list[tuple[EngineRole, PoolSpec | None]] = (
            [("prefill", deployment.prefill), ("decode", deployment.decode)]
            if deployment.mode == "pd"
            else [("colocated", deployment.colocated)]
        )
        for role, spec in roles:
            assert spec is not None
            lat = load_latency_model(
                deployment.model,
                deployment.gpu,
                spec.tp,
                deployment.dtype,
                deployment.kv_dtype,
                spec.parallelism(),
                spec.speculation(),
            )
            pool = Pool(role, spec, lat, deployment.prefix_caching and role != "decode")
            self.pools[role] = pool
            for _ in range(spec.replicas):
                self._add_replica(pool, ready_at=0.0)
        self.first_pool = self.pools["prefill" if deployment.mode == "pd" else "colocated"]
        ovh = deployment.request_overhead_s
        self.frontend_s = self.first_pool.latency.runtime.request_overhead_s if ovh is None else ovh
        # front-end time per other request it is streaming when one arrives (an API server whose per-request
        # cost grows with concurrency); 0 in the shipped twin, see disagg.twin.fidelity
        self.stream_overhead_s = stream_overhead_s
        # front-end time stretched by its CPU load (FrontEndLoad); None in the shipped twin
        self.front_end_load = front_end_load
        self._recent_prompts: deque[tuple[float, int]] = deque()
        self._recent_prompt_tokens = 0
        self._recent_outputs: deque[tuple[float, int]] = deque()
        self._recent_output_tokens = 0
        self._arrived = 0
        self.gpu_seconds = 0.0
        self._gpu_alloc = sum(p.allocated() * p.spec.gpus_per_replica for p in self.pools.values())
        self._gpu_t = 0.0
        self.window = Window(0.0)
        keep = max(1, round((window_s or interval_s) / interval_s))
        self.past_windows: deque[Window] = deque(maxlen=keep - 1) if keep > 1 else deque(maxlen=0)
        self.ttft_hist = LogHistogram()
        self.itl_hist = LogHistogram()
        self.timeline: list[dict[str, float | None]] = []
        self.replica_log: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self.decisions: list[tuple[float, dict[str, int]]] = []
        self.done = 0
        self.rejected = 0
        self._log_replicas()

    def _issue_closed_loop(self) -> None:
        """Closed loop: a client sends its next request as soon as its previous one finished."""
        cl = self.closed_loop
        assert cl is not None
        if self._closed_issued >= cl.total:
            return
        req = SimRequest(len(self.reqs), self.now, cl.prompt_tokens, cl.output_tokens)
        self._closed_issued += 1
        self.reqs.append(req)
        self._on_arrival(req)

    # event kinds
    STEP, TRANSFER, READY, TICK, CLIENT, FRONTEND = range(6)

    def _push(self, t: float, kind: int, obj: Any, version: int = 0) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, obj, version))

    # --- replicas ----------------------------------------------------------------------------------
    def _add_replica(self, pool: Pool, ready_at: float) -> Replica:
        rep = Replica(pool, next(pool.counter), EngineCore(pool.latency, pool.settings), ready_at)
        pool.replicas.append(rep)
        if ready_at <= self.now:
            rep.state = "ready"
        else:
            self._push(ready_at, self.READY, rep)
        return rep

    def _account_gpus(self) -> None:
        self.gpu_seconds += self._gpu_alloc * (self.now - self._gpu_t)
        self._gpu_t = self.now
        self._gpu_alloc = sum(p.allocated() * p.spec.gpus_per_replica for p in self.pools.values())

    def _log_replicas(self) -> None:
        self.replica_log.append(
            (self.now, {role: (p.allocated(), len(p.ready())) for role, p in self.pools.items()})
        )

    def scale(self, role: str, target: int) -> None:
        pool = self.pools[role]
        target = max(pool.spec.min_replicas, min(pool.spec.max_replicas, int(target)))
        pool.target = target
        active = pool.active()
        self._account_gpus()
        if target > len(active):
            for _ in range(target - len(active)):
                self._add_replica(pool, self.now + self.dep.startup_delay_s)
        elif target < len(active):
            surplus = len(active) - target
            starting = [r for r in active if r.state == "starting"][::-1]
            for rep in starting[:surplus]:
                rep.state = "gone"  # never became ready: stop paying at once
            surplus -= min(surplus, len(starting))
            ready = sorted(pool.ready(), key=lambda r: (r.core.outstanding_tokens, -r.index))
            for rep in ready[:surplus]:
                rep.state = "draining"
                self._maybe_retire(rep)
        self._account_gpus()
        self._log_replicas()

    def _maybe_retire(self, rep: Replica) -> None:
        if rep.state == "draining" and rep.core.idle and rep.step is None:
            rep.state = "gone"
            self._account_gpus()
            self._log_replicas()

    # --- routing -----------------------------------------------------------------------------------
    def _route(self, pool: Pool, req: SimRequest) -> None:
        ready = pool.ready()
        if not ready:
            pool.pending.append(req)
            return
        if self.dep.routing == "round_robin":
            rep = ready[pool.rr % len(ready)]
            pool.rr += 1
        elif self.dep.routing == "random":
            rep = ready[self.rng.randrange(len(ready))]
        else:
            rep = min(ready, key=lambda r: r.core.outstanding_tokens)
        try:
            rep.core.admit(req, self.now)
        except ValueError:
            self.rejected += 1
            self.done += 1
            return
        self._kick(rep)

    def _kick(self, rep: Replica) -> None:
        """Start a step on an idle replica, or cut a running jump short so new work is seen."""
        if rep.step is None:
            step = rep.core.plan_step(self.now)
            if step is not None:
                rep.step = step
                rep.version += 1
                self._push(step.end, self.STEP, rep, rep.version)
            return
        if rep.step.steps > 1:
            old = rep.step.steps
            rep.core.interrupt(rep.step, self.now)
            if rep.step.steps != old:
                rep.version += 1
                self._push(rep.step.end, self.STEP, rep, rep.version)

    # --- event handlers ----------------------------------------------------------------------------
    def _on_arrival(self, req: SimRequest) -> None:
        w = self.window
        w.arrivals += 1
        w.prompt_lens.append(req.prompt)
        w.output_lens.append(req.output)
        delay = self.frontend_s + self.stream_overhead_s * (self._arrived - self.done)
        if self.front_end_load is not None:
            delay /= 1.0 - self._front_end_util(req.prompt)
        self._arrived += 1
        if delay > 0:
            self._push(self.now + delay, self.FRONTEND, req)
        else:
            self._route(self.first_pool, req)

    def _front_end_util(self, prompt_tokens: int) -> float:
        """Utilisation of one API-server process by the other requests' tokens (FrontEndLoad)."""
        fe = self.front_end_load
        assert fe is not None
        since = self.now - fe.window_s
        while self._recent_prompts and self._recent_prompts[0][0] <= since:
            self._recent_prompt_tokens -= self._recent_prompts.popleft()[1]
        while self._recent_outputs and self._recent_outputs[0][0] <= since:
            self._recent_output_tokens -= self._recent_outputs.popleft()[1]
        prompt_rate = self._recent_prompt_tokens / fe.window_s
        out_rate = self._recent_output_tokens / fe.window_s
        self._recent_prompts.append((self.now, prompt_tokens))
        self._recent_prompt_tokens += prompt_tokens
        servers = max(1, len(self.first_pool.ready()))
        util = (fe.prompt_token_s * prompt_rate + fe.output_token_s * out_rate) / servers
        return min(fe.max_util, util)

    def _on_step(self, rep: Replica) -> None:
        step = rep.step
        assert step is not None
        rep.step = None
        ev = rep.core.complete_step(step)
        w = self.window
        if ev.decode_tokens:
            self.itl_hist.add(ev.mean_gap, ev.decode_tokens)
            w.itl.add(ev.mean_gap, ev.decode_tokens)
        w.prompt_tokens += ev.prefill_tokens
        w.prefix_hit_tokens += rep.core.prefix_hit_tokens - rep.hits_seen
        rep.hits_seen = rep.core.prefix_hit_tokens
        role = rep.pool.role
        w.generated_tokens += step.decode_batch * step.steps + (
            len(ev.first_tokens) if role == "colocated" else 0
        )
        for req in ev.first_tokens:
            t = req.first_token_time - req.arrival
            self.ttft_hist.add(t)
            w.ttft.add(t)
            w.queue_time["decode" if role == "decode" else "prefill"].append(
                req.first_scheduled - req.engine_arrival
            )
        for req in ev.prefilled:
            w.queue_time["prefill"].append(req.prefill_start - req.engine_arrival)
            w.prefill_time.append(req.prefill_done_time - req.prefill_start)
            req.first_scheduled = math.nan
            self._push(self._transfer_done_at(rep, req), self.TRANSFER, (req, rep))
        if role == "colocated":
            for req in ev.first_tokens:
                w.prefill_time.append(req.prefill_done_time - req.prefill_start)
        self.done += len(ev.finished) + len(ev.rejected)
        self.rejected += len(ev.rejected)
        cl = self.closed_loop
        if cl is not None:
            for _ in ev.finished:
                if cl.jitter_s > 0 and self._closed_issued + self._clients_waiting < cl.total:
                    self._clients_waiting += 1
                    self._push(self.now + self.rng.uniform(0, cl.jitter_s), self.CLIENT, True)
                else:
                    self._issue_closed_loop()
        if self.front_end_load is not None and role != "prefill":
            emitted = step.decode_batch * step.steps + len(ev.first_tokens)
            self._recent_outputs.append((self.now, emitted))
            self._recent_output_tokens += emitted
        self._kick(rep)
        self._maybe_retire(rep)

    def _on_transfer(self, req: SimRequest, source: Replica) -> None:
        """The KV reached the decode side: the prefill replica frees it and the decode pool takes over."""
        source.core.release_kv(req)
        if source.state in ("ready", "draining"):
            self._kick(source)
        self._route(self.pools["decode"], req)

    def _transfer_done_at(self, rep: Replica, req: SimRequest) -> float:
        """KV of one prompt leaves over the prefill replica's link; transfers queue behind each other."""
        lat = rep.pool.latency
        link = lat.link(self.dep.link)
        setup = link.setup_s if self.dep.kv_setup_s is None else self.dep.kv_setup_s
        bandwidth = (
            link.bandwidth_bytes_per_s
            if self.dep.link_gbytes_per_s is None
            else self.dep.link_gbytes_per_s * 1e9
        )
        start = max(self.now, rep.link_free)
        rep.link_free = start + req.prompt * lat.kv_bytes_per_token / bandwidth
        return rep.link_free + setup

    def _on_ready(self, rep: Replica) -> None:
        if rep.state != "starting":
            return
        self._account_gpus()
        rep.state = "ready"
        pool = rep.pool
        while pool.pending:
            self._route(pool, pool.pending.popleft())
        self._log_replicas()

    def _on_tick(self) -> None:
        obs = self.observation()
        self.timeline.append(self._timeline_point(obs))
        if self.controller is not None:
            target = self.controller(obs)
            if target:
                self.decisions.append((self.now, dict(target)))
                for role, n in target.items():
                    if role in self.pools and n != self.pools[role].target:
                        self.scale(role, n)
        if self.past_windows.maxlen:
            self.past_windows.append(self.window)
        self.window = Window(self.now)
        self._log_replicas()

    def _timeline_point(self, obs: Observation) -> dict[str, float | None]:
        w = self.window
        return {
            "time": self.now,
            "ttft_p50": w.ttft.quantile(0.5),
            "ttft_p90": w.ttft.quantile(0.9),
            "ttft_p99": w.ttft.quantile(0.99),
            "itl_p50": w.itl.quantile(0.5),
            "itl_p90": w.itl.quantile(0.9),
            "itl_p99": w.itl.quantile(0.99),
            "rate": obs.request_rate.value,
        }

    # --- observation -------------------------------------------------------------------------------
    def observation(self) -> Observation:
        """The last metric window (``window_s``, whole intervals) as the policy's Observation."""
        w = Window.merged([*self.past_windows, self.window]) if self.past_windows else self.window
        span = max(self.now - w.start, 1e-9)
        q = self.percentile

        def m(values: Sequence[float] | Sequence[int], fn: Callable[[np.ndarray], float]) -> Measured:
            return Measured.of(float(fn(np.asarray(values, dtype=float)))) if len(values) else MISSING

        looked_up = w.prefix_hit_tokens + w.prompt_tokens
        hit_rate = Measured.of(w.prefix_hit_tokens / looked_up) if looked_up > 0 else MISSING

        def role_obs(role: str) -> RoleObservation:
            pool = self.pools.get(role) or self.pools["colocated"]
            ready = pool.ready()
            serving = [r for r in pool.replicas if r.state in ("ready", "draining")]
            if role == "prefill" or pool.role == "colocated":
                compute = m(w.prefill_time, np.mean)
                # every prompt token, cached ones included, as vLLM's vllm:prompt_tokens_total and
                # SGLang's sglang:prompt_tokens_total count them (see disagg.twin.live.exposition)
                total = w.prompt_tokens + w.prefix_hit_tokens
                thr = Measured.of(total / span) if serving else MISSING
            else:
                compute = Measured.of(w.itl.mean) if w.itl.total else MISSING
                thr = Measured.of(w.generated_tokens / span) if serving else MISSING
            waiting = sum(r.core.num_waiting for r in serving) + len(pool.pending)
            return RoleObservation(
                replicas=pool.target,
                ready=len(ready),
                pending=0,
                gpus_per_replica=pool.spec.gpus_per_replica,
                queue_depth=Measured.of(float(waiting)),
                running=Measured.of(float(sum(r.core.num_running for r in serving))) if serving else MISSING,
                kv_usage=m([r.core.kv_usage for r in serving], np.mean),
                queue_time=m(
                    w.queue_time[role if role in w.queue_time else "prefill"], lambda a: np.quantile(a, q)
                ),
                compute_time=compute,
                token_throughput=thr,
                prefix_hit_rate=hit_rate if role == "prefill" or pool.role == "colocated" else MISSING,
            )

        return Observation(
            time=self.now,
            prefill=role_obs("prefill"),
            decode=role_obs("decode"),
            ttft=Measured.of(w.ttft.quantile(q)) if w.ttft.total else MISSING,
            itl=Measured.of(w.itl.quantile(q)) if w.itl.total else MISSING,
            request_rate=Measured.of(w.arrivals / span),
            prompt_tokens_mean=m(w.prompt_lens, np.mean),
            prompt_tokens_p90=m(w.prompt_lens, lambda a: np.quantile(a, 0.9)),
            output_tokens_mean=m(w.output_lens, np.mean),
            output_tokens_p90=m(w.output_lens, lambda a: np.quantile(a, 0.9)),
        )

    # --- main loop ---------------------------------------------------------------------------------
    def run(self) -> SimResult:
        reqs = self.reqs
        n = len(reqs)
        cl = self.closed_loop
        if cl is not None:
            for c in range(min(cl.concurrency, cl.total)):
                if cl.ramp_s > 0 and c > 0:
                    start = (
                        self.rng.uniform(0, cl.ramp_s) if cl.random_start else c * cl.ramp_s / cl.concurrency
                    )
                    self._push(start, self.CLIENT, None)
                else:
                    self._issue_closed_loop()
        i = 0
        heap = self.heap
        self._push(self.interval, self.TICK, None)
        next_progress = 0.0
        while self.done < len(reqs) or i < n or self._clients_waiting:
            t_arr = reqs[i].arrival if i < n else _ARRIVAL_DONE
            t_evt = heap[0][0] if heap else _ARRIVAL_DONE
            if t_arr == _ARRIVAL_DONE and t_evt == _ARRIVAL_DONE:
                break
            if t_arr <= t_evt:
                self.now = t_arr
                if self.now > self.max_time:
                    break
                self._on_arrival(reqs[i])
                i += 1
                continue
            t, _, kind, obj, version = heapq.heappop(heap)
            self.now = t
            if t > self.max_time:
                break
            if kind == self.STEP:
                if version == obj.version:
                    self._on_step(obj)
            elif kind == self.TRANSFER:
                self._on_transfer(*obj)
            elif kind == self.READY:
                self._on_ready(obj)
            elif kind == self.FRONTEND:
                self._route(self.first_pool, obj)
            elif kind == self.CLIENT:
                self._clients_waiting -= obj is True  # a drifting client's send, not a ramped first one
                self._issue_closed_loop()
            else:
                self._on_tick()
                if self.done < len(reqs) or i < n or self._clients_waiting:
                    self._push(self.now + self.interval, self.TICK, None)
            if self.progress is not None and self.now >= next_progress:
                self.progress(self.now, self.done, len(reqs))
                next_progress = self.now + 60.0
        self._account_gpus()
        self._log_replicas()
        return self._result()

    def _result(self) -> SimResult:
        reqs = self.reqs
        arrival = np.array([r.arrival for r in reqs], dtype=float)
        first = np.array([r.first_token_time for r in reqs], dtype=float)
        fin = np.array([r.finish_time for r in reqs], dtype=float)
        out = np.array([r.output for r in reqs], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            itl = np.where(out > 1, (fin - first) / (out - 1), np.nan)
        return SimResult(
            deployment=self.dep,
            arrival=arrival,
            prompt=np.array([r.prompt for r in reqs], dtype=float),
            output=out,
            ttft=first - arrival,
            e2e=fin - arrival,
            itl_mean=itl,
            preemptions=np.array([r.preemptions for r in reqs], dtype=float),
            itl_hist=self.itl_hist,
            ttft_hist=self.ttft_hist,
            gpu_hours=self.gpu_seconds / 3600.0,
            duration_s=self.now,
            timeline=self.timeline,
            replicas=self.replica_log,
            decisions=self.decisions,
            rejected=self.rejected,
        )


def simulate(
    deployment: SimDeployment,
    requests: Sequence[Request],
    controller: Controller | None = None,
    interval_s: float = 30.0,
    seed: int = 0,
    percentile: float = 0.9,
    max_time_s: float | None = None,
    progress: Callable[[float, int, int], None] | None = None,
    closed_loop: ClosedLoop | None = None,
    window_s: float | None = None,
    stream_overhead_s: float = 0.0,
    front_end_load: FrontEndLoad | None = None,
) -> SimResult:
    """Replay ``requests`` (plus a closed-loop load, if given) through ``deployment``; see the module doc."""
    return Simulator(
        deployment,
        requests,
        controller,
        interval_s,
        seed,
        percentile,
        max_time_s,
        progress,
        closed_loop,
        window_s,
        stream_overhead_s,
        front_end_load,
    ).run()


# --- what a benchmark run of clients that start together reports ----------------------------------------
def first_round(
    deployment: SimDeployment,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
) -> tuple[float, float]:
    """Mean TTFT and mean time per output token (s) of the first requests of a closed loop whose
    ``concurrency`` clients all send at t=0 to idle replicas: the prompts queue behind each other for the
    token budget, so the last of C prompts waits for about C x prompt / budget prefill passes."""
    loop = ClosedLoop(concurrency, prompt_tokens, output_tokens, concurrency)
    res = simulate(deployment, [], closed_loop=loop)
    return mean_or_inf(res.ttft), mean_or_inf(res.itl_mean)


def mean_or_inf(values: np.ndarray) -> float:
    """The mean of the finished requests' values; inf where none finished (a replica that cannot serve)."""
    done = values[~np.isnan(values)]
    return float(done.mean()) if done.size else math.inf


def steady_state(
    deployment: SimDeployment,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    seeds: Sequence[int] = (1,),
    duration_s: float | None = None,
    jitter_s: float = 0.0,
    stream_overhead_s: float = 0.0,
    front_end_load: FrontEndLoad | None = None,
    first_tpot_s: float | None = None,
) -> tuple[float, float]:
    """Mean TTFT and mean time per output token (s) of ``concurrency`` desynchronised clients: first
    requests at seeded random times within one request's duration, ``8 x concurrency`` requests, the first
    third discarded, averaged over ``seeds`` (one run's mean depends on which prompts collide).

    ``duration_s``: the request's duration the phases spread over (0: every client sends at t=0, the
    lockstep what-if); by default the twin's own prediction (one run spread over the first round's duration
    gives the steady time per output token, whose duration spreads the runs that count), so a prediction
    needs no measured TPOT; ``first_tpot_s`` is the first round's time per output token where the caller
    has it. ``jitter_s``: each later request sent up to this long after its client's previous one finished
    (ClosedLoop.jitter_s)."""
    total = max(3, 8 * concurrency)
    skip = total // 3

    def run(ramp_s: float, seed: int) -> SimResult:
        loop = ClosedLoop(concurrency, prompt_tokens, output_tokens, total, ramp_s, True, jitter_s)
        return simulate(
            deployment,
            [],
            closed_loop=loop,
            seed=seed,
            stream_overhead_s=stream_overhead_s,
            front_end_load=front_end_load,
        )

    if duration_s is None:
        first_tpot = first_tpot_s
        if first_tpot is None:
            first_tpot = first_round(deployment, concurrency, prompt_tokens, output_tokens)[1]
        pilot = run(output_tokens * first_tpot, seeds[0]) if math.isfinite(first_tpot) else None
        tpot = mean_or_inf(pilot.itl_mean[skip:]) if pilot is not None else math.inf
        duration_s = output_tokens * tpot if math.isfinite(tpot) else 0.0
    runs = [run(duration_s, seed) for seed in seeds]
    ttft = [mean_or_inf(r.ttft[skip:]) for r in runs]
    tpot_s = [mean_or_inf(r.itl_mean[skip:]) for r in runs]
    return float(np.mean(ttft)), float(np.mean(tpot_s))


def whole_run(
    deployment: SimDeployment,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    requests: int,
    seeds: Sequence[int] = (1,),
    duration_s: float | None = None,
) -> tuple[float, float]:
    """Mean TTFT and mean time per output token (s) a benchmark reports over all ``requests`` of a run whose
    ``concurrency`` clients start together: its first round (:func:`first_round`) and the clients' steady
    state (:func:`steady_state`, ``seeds`` and ``duration_s`` as there) weighed by :func:`run_mean`."""
    first = first_round(deployment, min(concurrency, requests), prompt_tokens, output_tokens)
    hint = first[1] if requests >= concurrency else None  # the whole round's TPOT, reused for the phases
    steady = steady_state(
        deployment, concurrency, prompt_tokens, output_tokens, seeds, duration_s, first_tpot_s=hint
    )
    ttft = run_mean(first[0], steady[0], concurrency, requests)
    return ttft, run_mean(first[1], steady[1], concurrency, requests)


def run_mean(first: float, steady: float, concurrency: int, requests: int) -> float:
    """The mean a benchmark reports over all ``requests`` of a run whose ``concurrency`` clients start
    together (vllm bench serve --max-concurrency, AIPerf/GenAI-Perf --concurrency; neither discards a warm-up
    by default): the first round (``min(concurrency, requests)`` requests) at ``first``
    (:func:`first_round`), every later request at ``steady``, the clients' desynchronised steady state.

    Why not the twin's lockstep: with fixed lengths and no noise the twin's cohorts, once formed, never
    part (a long prefill pass collects every prompt that arrives during it), which overshoots the measured
    4-5-client points of both published sources about 2x; measured runs desynchronise (how fast is not
    published), so the rounds after the first count at the steady state (disagg.twin.fidelity)."""
    if requests < 1 or concurrency < 1:
        raise ValueError(f"requests and concurrency must be >= 1, got {requests} and {concurrency}")
    k = min(concurrency, requests)
    return (k * first + (requests - k) * steady) / requests
