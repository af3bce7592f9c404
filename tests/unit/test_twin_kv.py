"""KV accounting of the twin's engine core with prefix caching: cached blocks are looked up and referenced
when a request is scheduled (never while it waits), a block shared by running requests occupies KV once,
unreferenced cached blocks are evicted least recently freed first, and a replica never stalls."""

from __future__ import annotations

from disagg.perf.latency import load_latency_model
from disagg.twin.engine import EngineCore, EngineSettings, SimRequest, StepEvents
from disagg.twin.sim import PoolSpec, SimDeployment, Simulator
from disagg.twin.traffic import Request

LAT_8B = load_latency_model("llama-3.1-8b", "h100", 1)
BLOCK = 512


def cached_core(capacity: int, role: str = "colocated") -> EngineCore:
    return EngineCore(
        LAT_8B,
        EngineSettings(role=role, kv_capacity_tokens=capacity, prefix_caching=True),  # type: ignore[arg-type]
    )


def drain(core: EngineCore, now: float = 0.0) -> tuple[float, list[StepEvents]]:
    """Run the engine until it has nothing to do, checking KV never exceeds capacity at any step."""
    events = []
    while (step := core.plan_step(now)) is not None:
        assert 0 <= core.kv_used <= core.kv_capacity
        assert core.kv_used + step.decode_batch * step.steps + step.prefill_tokens <= core.kv_capacity
        events.append(core.complete_step(step))
        now = step.end
        assert len(events) < 100_000, "the engine does not converge"
    return now, events


def test_a_deep_queue_sharing_a_cached_prefix_does_not_deadlock() -> None:
    """The bug: hits were charged to KV at admission, once per WAITING request, so a queue of requests
    sharing a cached prefix pushed KV use past capacity and the replica never took another step."""
    core = cached_core(6000)
    prefix = (1, 2, 3, 4)
    warm = SimRequest(0, 0.0, 2100, 5, prefix)
    core.admit(warm, 0.0)
    now, _ = drain(core)
    queued = [SimRequest(i, now, 2100, 50, (*prefix, 100 + i)) for i in range(1, 21)]
    for r in queued:
        core.admit(r, now)
    assert core.kv_used == 0  # queued requests hold no KV, cached or not
    drain(core, now)
    assert all(r.generated == r.output and r.error is None for r in queued)
    assert all(r.cached == 4 * BLOCK for r in queued)
    assert core.kv_used == 0 and core.outstanding_tokens == 0 and core.idle


def test_a_cached_block_shared_by_running_requests_is_counted_once() -> None:
    core = cached_core(100_000)
    prefix = (1, 2, 3, 4)
    core.admit(SimRequest(0, 0.0, 2100, 5, prefix), 0.0)
    now, _ = drain(core)
    a, b = SimRequest(1, now, 2100, 30, (*prefix, 11)), SimRequest(2, now, 2300, 30, (*prefix, 12))
    core.admit(a, now)
    core.admit(b, now)
    step = core.plan_step(now)
    assert step is not None and sorted(n for _, n in step.chunks) == [2100 - 4 * BLOCK, 2300 - 4 * BLOCK]
    assert core.kv_used == 4 * BLOCK  # the hit blocks, referenced by both, held once
    core.complete_step(step)
    assert core.kv_used == 4 * BLOCK + (2100 - 4 * BLOCK) + (2300 - 4 * BLOCK)
    drain(core, step.end)
    assert core.kv_used == 0 and core.prefix_hit_tokens == 2 * 4 * BLOCK


def test_cache_hits_are_whole_blocks_short_of_the_last_prompt_token() -> None:
    """vLLM looks up at most prompt - 1 tokens, in whole blocks: a prompt of exactly 3 cached blocks hits
    2 of them and recomputes the third."""
    core = cached_core(100_000)
    core.admit(SimRequest(0, 0.0, 3 * BLOCK, 5, (1, 2, 3)), 0.0)
    now, _ = drain(core)
    again = SimRequest(1, now, 3 * BLOCK, 5, (1, 2, 3))
    core.admit(again, now)
    drain(core, now)
    assert again.cached == 2 * BLOCK


def test_unreferenced_cached_blocks_are_evicted_least_recently_freed_first() -> None:
    core = cached_core(4096)
    first, second = SimRequest(0, 0.0, 1100, 2, (1, 2, 9)), SimRequest(1, 0.0, 1100, 2, (3, 4, 9))
    core.admit(first, 0.0)
    now, _ = drain(core)
    core.admit(second, now)
    now, _ = drain(core, now)
    # free pool now holds, eviction order first: 2, 1 (first's blocks, tail first), then 4, 3.
    # A prompt with no prefix leaves room for 3 cached blocks: only block 2 goes.
    core.admit(SimRequest(2, now, 2500, 2), now)
    now, _ = drain(core, now)
    probe_first, probe_second = SimRequest(3, now, 1100, 2, (1, 2, 7)), SimRequest(4, now, 1100, 2, (3, 4, 8))
    core.admit(probe_first, now)
    core.admit(probe_second, now)
    drain(core, now)
    assert probe_first.cached == BLOCK  # its leading block outlived its tail
    assert probe_second.cached == 2 * BLOCK  # freed later: kept whole


def test_a_request_that_can_never_fit_is_rejected_not_stalled() -> None:
    """Admission already refuses prompt+output above capacity, so the invariant is exercised by shrinking
    the replica's KV under queued work: the one that cannot fit is rejected (reported, with its error) and
    the work queued behind it still runs."""
    core = cached_core(3000)
    big, small = SimRequest(0, 0.0, 1000, 500), SimRequest(1, 0.0, 100, 10)
    core.admit(big, 0.0)
    core.admit(small, 0.0)
    core.kv_capacity = 800
    _, events = drain(core)
    assert [r.rid for ev in events for r in ev.rejected] == [0]
    assert big.error is not None and "prompt+output 1500" in big.error
    assert small.generated == small.output and small.error is None
    assert core.rejected == 1 and core.kv_used == 0 and core.outstanding_tokens == 0 and core.idle


def test_a_queued_head_that_cannot_fit_is_rejected() -> None:
    core = cached_core(3000, role="decode")
    req = SimRequest(0, 0.0, 1000, 500)
    core.admit(req, 0.0)  # a decode replica: its prompt's KV arrived, it needs room for its context
    core.kv_capacity = 900
    _, events = drain(core)
    assert [r.rid for ev in events for r in ev.rejected] == [0] and req.error is not None
    assert core.idle and core.kv_used == 0


def test_no_stall_on_a_deep_prefill_queue_with_shared_prefixes() -> None:
    """A burst of long prompts sharing a few prefixes (the shape of the Mooncake trace) on one prefill
    replica: every request finishes, none is rejected and all KV comes back."""
    groups = [tuple(1000 * g + b for b in range(12)) for g in range(4)]
    reqs = [Request(0.02 * i, 6500 + 37 * (i % 11), 40, (*groups[i % 4], 10_000 + i)) for i in range(400)]
    dep = SimDeployment(model="llama-3.1-8b", prefill=PoolSpec(1, 1), decode=PoolSpec(1, 1))
    sim = Simulator(dep, reqs)
    res = sim.run()
    assert res.rejected == 0 and res.finished == len(reqs)
    cores = [r.core for p in sim.pools.values() for r in p.replicas]
    assert all(c.kv_used == 0 and c.idle for c in cores)
    prefill = sim.pools["prefill"].replicas[0].core
    assert prefill.prefix_hit_tokens >= (len(reqs) - 4) * 12 * BLOCK * 0.9


def test_a_prefill_replica_waits_for_held_kv_instead_of_rejecting() -> None:
    """KV held for transfers is not evictable but will be freed: the next prompt waits for release_kv,
    and the released prompt's blocks stay cached (as far as they fit) for a request with the same prefix."""
    core = EngineCore(
        LAT_8B,
        EngineSettings(
            role="prefill", kv_capacity_tokens=4000, prefix_caching=True, hold_kv_until_released=True
        ),
    )
    first = SimRequest(0, 0.0, 2600, 5, (1, 2, 3, 4, 5))
    core.admit(first, 0.0)
    now, events = drain(core)
    assert [r.rid for ev in events for r in ev.prefilled] == [0] and core.kv_used == 2600
    second = SimRequest(1, now, 2000, 5, (1, 2, 3, 9))
    third = SimRequest(2, now, 3000, 5)  # no shared prefix: cannot fit until the held KV is released
    core.admit(third, now)
    now, _ = drain(
        core, now
    )  # a chunk fits beside the held prompt; then it waits, neither stalled nor rejected
    assert core.rejected == 0 and core.num_running == 1 and core.kv_used == core.kv_capacity
    core.release_kv(first)
    assert core.kv_used == third.computed
    core.admit(second, now)
    now, events = drain(core, now)
    # the rest of the third prompt was allocated first (running before waiting) and left room for one
    # cached block: the leading one, as the released prompt's tail blocks were evicted first
    assert [r.rid for ev in events for r in ev.prefilled] == [2] and second.cached == BLOCK
    core.release_kv(third)  # the second prompt, part computed, waits for this
    now, events = drain(core, now)
    assert [r.rid for ev in events for r in ev.prefilled] == [1]
    core.release_kv(second)
    assert core.kv_used == 0 and core.idle and core.rejected == 0
