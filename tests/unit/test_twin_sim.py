"""Invariants of the twin's engine core and simulator (pure, small traces, seconds in total)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.perf.latency import load_latency_model
from disagg.policy.types import Observation
from disagg.twin.engine import EngineCore, EngineSettings, SimRequest
from disagg.twin.sim import LogHistogram, PoolSpec, SimDeployment, Simulator, simulate
from disagg.twin.traffic import LengthDist, Request, poisson

LAT_8B = load_latency_model("llama-3.1-8b", "h100", 1)


def pd_8b(prefill: int = 1, decode: int = 1, **kw: object) -> SimDeployment:
    return SimDeployment(
        model="llama-3.1-8b",
        prefill=PoolSpec(prefill, 1),
        decode=PoolSpec(decode, 1),
        **kw,  # type: ignore[arg-type]
    )


def trace(rate: float = 4.0, duration: float = 120.0, seed: int = 3) -> list[Request]:
    return poisson(rate, duration, LengthDist(1500, 0.8, hi=8000), LengthDist(150, 1.0, hi=1000), seed=seed)


def run_engine(core: EngineCore, reqs: list[SimRequest]) -> list[tuple[int, int, int, int]]:
    """Drive one engine to completion with every request admitted at t=0; returns the planned steps."""
    now = 0.0
    for r in reqs:
        core.admit(r, now)
    steps = []
    while (step := core.plan_step(now)) is not None:
        steps.append((step.prefill_tokens, step.decode_batch, step.steps, core.kv_used))
        assert core.kv_used + step.decode_batch * step.steps + step.prefill_tokens <= core.kv_capacity
        core.complete_step(step)
        now = step.end
    return steps


def test_every_request_finishes_once_and_ttft_covers_prefill_and_transfer() -> None:
    reqs = trace()
    for dep in (pd_8b(), pd_8b().colocated_equivalent()):
        res = simulate(dep, reqs)
        assert res.finished + res.rejected == len(reqs)
        assert res.rejected == 0
        standalone = np.array([LAT_8B.prefill_time_s([int(p)]) for p in res.prompt])
        floor = standalone
        if dep.mode == "pd":
            floor = floor + np.array([LAT_8B.kv_transfer_time_s(int(p)) for p in res.prompt])
        assert np.all(res.ttft >= floor - 1e-9)
        assert np.all(res.e2e >= res.ttft)
        assert res.itl_hist.total == pytest.approx(float(np.sum(res.output - 1)))


def test_same_seed_same_result() -> None:
    reqs = trace(seed=7)
    a, b = simulate(pd_8b(routing="random"), reqs, seed=11), simulate(pd_8b(routing="random"), reqs, seed=11)
    np.testing.assert_array_equal(a.ttft, b.ttft)
    np.testing.assert_array_equal(a.e2e, b.e2e)
    assert a.gpu_hours == b.gpu_hours


def test_chunked_prefill_respects_token_budget_and_seq_limit() -> None:
    core = EngineCore(LAT_8B, EngineSettings(role="colocated", max_num_batched_tokens=1024, max_num_seqs=8))
    reqs = [SimRequest(i, 0.0, 700 + 300 * i, 40) for i in range(12)]
    steps = run_engine(core, reqs)
    assert all(p + d <= 1024 for p, d, k, _ in steps if k == 1)
    assert max(d for _, d, _, _ in steps) <= 8
    assert any(p > 0 and d > 0 for p, d, _, _ in steps)  # chunks really mix with decodes
    assert all(r.generated == r.output for r in reqs)
    assert core.kv_used == 0 and core.outstanding_tokens == 0


def test_kv_pressure_preempts_and_recomputes() -> None:
    core = EngineCore(LAT_8B, EngineSettings(role="colocated", kv_capacity_tokens=6000))
    reqs = [SimRequest(i, 0.0, 1000, 800) for i in range(6)]
    run_engine(core, reqs)
    assert sum(r.preemptions for r in reqs) > 0
    assert all(r.generated == r.output and r.finish_time == r.finish_time for r in reqs)
    assert core.kv_used == 0


def test_decode_jumps_equal_single_steps() -> None:
    reqs_a = [SimRequest(i, 0.0, 500 + 10 * i, 30 + 17 * i) for i in range(10)]
    reqs_b = [SimRequest(i, 0.0, 500 + 10 * i, 30 + 17 * i) for i in range(10)]
    jumping = run_engine(EngineCore(LAT_8B, EngineSettings(role="decode")), reqs_a)
    stepping = run_engine(EngineCore(LAT_8B, EngineSettings(role="decode", max_jump_steps=1)), reqs_b)
    assert len(jumping) < len(stepping) / 5
    for a, b in zip(reqs_a, reqs_b, strict=True):
        assert a.finish_time == pytest.approx(b.finish_time, rel=1e-9)
        assert a.first_token_time == pytest.approx(b.first_token_time, rel=1e-9)


def test_interrupting_a_jump_keeps_time_consistent() -> None:
    core = EngineCore(LAT_8B, EngineSettings(role="decode"))
    core.admit(SimRequest(0, 0.0, 1000, 500), 0.0)
    step = core.plan_step(0.0)
    assert step is not None and step.steps == 500
    core.interrupt(step, step.first_step_time * 10.5)
    assert step.steps == 11
    core.complete_step(step)
    assert core.generated_of(core.decoding[0]) == 11


class ScaleAt:
    """A controller that asks for fixed targets from a given time on, recording what it saw."""

    def __init__(self, at: float, target: Mapping[str, int]) -> None:
        self.at, self.target = at, dict(target)
        self.seen: list[Observation] = []

    def __call__(self, obs: Observation) -> dict[str, int] | None:
        self.seen.append(obs)
        return self.target if obs.time >= self.at else None


def test_new_replicas_wait_for_startup_and_cost_gpu_hours_meanwhile() -> None:
    reqs = trace(duration=400)
    ctl = ScaleAt(30.0, {"prefill": 2, "decode": 1})
    res = simulate(pd_8b(startup_delay_s=120.0), reqs, controller=ctl, interval_s=30.0)
    first_alloc = min(t for t, d in res.replicas if d["prefill"][0] == 2)
    first_ready = min(t for t, d in res.replicas if d["prefill"][1] == 2)
    assert first_alloc == pytest.approx(30.0)
    assert first_ready == pytest.approx(150.0)
    static = simulate(pd_8b(), reqs)
    assert res.gpu_hours - static.gpu_hours == pytest.approx((res.duration_s - 30.0) / 3600, rel=0.02)
    assert ctl.seen[0].prefill.replicas == 1 and ctl.seen[-1].prefill.ready == 2


def test_scale_down_drains_in_flight_work() -> None:
    reqs = trace(rate=6.0, duration=200)
    res = simulate(pd_8b(decode=2), reqs, controller=ScaleAt(60.0, {"prefill": 1, "decode": 1}))
    assert res.finished == len(reqs)
    decode_alloc = [d["decode"][0] for _, d in res.replicas]
    assert decode_alloc[0] == 2 and decode_alloc[-1] == 1
    drained_at = min(t for t, d in res.replicas if d["decode"][0] == 1)
    assert drained_at > 60.0  # the removed replica finished its requests first


def test_observation_reports_missing_signals_as_missing() -> None:
    ctl = ScaleAt(1e9, {})
    simulate(pd_8b(), [Request(200.0, 100, 10)], controller=ctl, interval_s=30.0)
    idle = ctl.seen[0]
    assert not idle.ttft.ok and not idle.itl.ok and idle.request_rate.value == 0.0
    assert idle.prefill.ready == 1 and idle.decode.gpus_per_replica == 1


def test_log_histogram_quantiles_within_a_bucket() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(-3.5, 0.6, 20000)
    h = LogHistogram()
    for v in values:
        h.add(float(v))
    for q in (0.5, 0.9, 0.99):
        assert h.quantile(q) == pytest.approx(float(np.quantile(values, q)), rel=0.03)


def test_oversized_request_is_rejected_not_hung() -> None:
    res = simulate(pd_8b(), [Request(0.0, 10_000_000, 10), Request(1.0, 100, 10)])
    assert res.rejected == 1 and res.finished == 1


def test_bad_deployment_names_the_field() -> None:
    with pytest.raises(ValueError, match=r"^prefill/decode"):
        SimDeployment(model="llama-3.1-8b", prefill=PoolSpec(1, 1))
    with pytest.raises(ValueError, match=r"^tp"):
        PoolSpec(1, 3)
    with pytest.raises(ValueError, match=r"^routing"):
        pd_8b(routing="fastest")


def test_observation_spans_the_metric_window() -> None:
    ctl = ScaleAt(1e9, {})
    reqs = [Request(5.0, 100, 10), Request(44.0, 100, 10)]
    simulate(pd_8b(), reqs, controller=ctl, interval_s=10.0, window_s=30.0)
    rates = [(o.time, o.request_rate.value) for o in ctl.seen[:4]]
    assert rates == [
        (10.0, pytest.approx(1 / 10)),
        (20.0, pytest.approx(1 / 20)),
        (30.0, pytest.approx(1 / 30)),
        (40.0, 0.0),
    ]


def test_prefix_cache_skips_shared_blocks_and_frees_kv() -> None:
    core = EngineCore(LAT_8B, EngineSettings(role="colocated", prefix_caching=True))
    shared = (1, 2, 3, 4)
    first = SimRequest(0, 0.0, 2100, 5, (*shared, 10))
    run_engine(core, [first])
    again = SimRequest(1, 0.0, 2300, 5, (*shared, 20, 21))
    other = SimRequest(2, 0.0, 2300, 5, (99, 2, 3, 4, 5))
    run_engine(core, [again])
    run_engine(core, [other])
    assert again.cached == 4 * 512 and other.cached == 0  # only a leading run of equal hashes counts
    assert core.prefix_hit_tokens == 4 * 512
    assert (again.prefill_done_time - again.prefill_start) < (first.prefill_done_time - first.prefill_start)
    assert core.kv_used == 0 and core.outstanding_tokens == 0


def test_prefix_caching_only_matters_for_traces_with_hashes() -> None:
    reqs = trace(rate=2.0, duration=60.0)
    on, off = simulate(pd_8b(), reqs), simulate(pd_8b(prefix_caching=False), reqs)
    np.testing.assert_array_equal(on.ttft, off.ttft)


def test_kv_transfers_from_one_prefill_replica_queue_on_its_link() -> None:
    dep = pd_8b(link_gbytes_per_s=0.1, request_overhead_s=0.0)
    res = simulate(dep, [Request(0.0, 1000, 5), Request(0.0, 1000, 5)])
    one_transfer = 1000 * LAT_8B.kv_bytes_per_token / 0.1e9
    first, second = sorted(res.ttft)
    assert first >= one_transfer
    assert second - first >= one_transfer * 0.99


def test_all_kv_is_released_when_the_trace_is_done() -> None:
    for dep in (pd_8b(prefill=2, decode=2), pd_8b().colocated_equivalent()):
        sim = Simulator(dep, trace(rate=8.0, duration=60.0))
        sim.run()
        assert [r.core.kv_used for p in sim.pools.values() for r in p.replicas] == [0] * sum(
            len(p.replicas) for p in sim.pools.values()
        )


@settings(max_examples=40, deadline=None)
@given(
    role=st.sampled_from(["colocated", "decode", "prefill"]),
    budget=st.integers(64, 4096),
    seqs=st.integers(1, 16),
    capacity=st.integers(3000, 20000),
    shapes=st.lists(st.tuples(st.integers(1, 1500), st.integers(1, 300)), min_size=1, max_size=25),
)
def test_engine_accounting_holds_for_any_workload(
    role: str, budget: int, seqs: int, capacity: int, shapes: list[tuple[int, int]]
) -> None:
    core = EngineCore(
        LAT_8B,
        EngineSettings(
            role=role,  # type: ignore[arg-type]
            max_num_batched_tokens=budget,
            max_num_seqs=seqs,
            kv_capacity_tokens=capacity,
            prefix_caching=True,
        ),
    )
    reqs = [SimRequest(i, 0.0, p, o, (i % 3, 7)) for i, (p, o) in enumerate(shapes)]
    steps = run_engine(core, reqs)
    assert all(p + d <= budget for p, d, k, _ in steps if k == 1)
    done = [r for r in reqs if r.finish_time == r.finish_time or r.prefill_done_time == r.prefill_done_time]
    assert len(done) == len(reqs)
    if role != "prefill":
        assert all(r.generated == r.output for r in reqs)
    assert core.kv_used == 0 and core.outstanding_tokens == 0 and core.idle


def test_a_step_that_preempts_admits_no_waiting_request() -> None:
    """vLLM V1 admits waiting requests only when the step preempted nothing; otherwise the evicted prompt
    is readmitted at once and recomputed while the decodes that needed its room preempt it again."""
    core = EngineCore(LAT_8B, EngineSettings(kv_capacity_tokens=3000))
    reqs = [SimRequest(i, 0.0, 900, 400) for i in range(4)]
    for r in reqs:
        core.admit(r, 0.0)
    now, preempting_steps = 0.0, 0
    while not core.idle:
        waiting_before = {r.rid for r in core.waiting}
        counts = {r.rid: r.preemptions for r in reqs}
        step = core.plan_step(now)
        assert step is not None
        evicted = {r.rid for r in reqs if r.preemptions > counts[r.rid]}
        if evicted:
            preempting_steps += 1
            assert evicted | waiting_before <= {r.rid for r in core.waiting}
        core.complete_step(step)
        now = step.end
    assert preempting_steps >= 1
    assert all(r.generated == r.output for r in reqs) and core.kv_used == 0


def test_kv_cache_dtype_comes_from_the_engine_args_of_a_disaggregated_deployment() -> None:
    import copy
    from pathlib import Path

    import yaml

    example = Path(__file__).resolve().parents[2] / "examples" / "vllm-nixl.yaml"
    dd = yaml.safe_load(example.read_text())
    assert SimDeployment.from_dict(dd).kv_dtype == "bf16"
    fp8 = copy.deepcopy(dd)
    fp8["spec"]["decode"]["args"] = ["--kv-cache-dtype=fp8_e4m3"]
    assert SimDeployment.from_dict(fp8).kv_dtype == "fp8"
    with pytest.raises(ValueError, match=r"^kv_dtype"):
        pd_8b(kv_dtype="int4")


def test_closed_loop_clients_start_together_and_drift_by_jitter() -> None:
    """ClosedLoop.jitter_s: all clients send at t=0 and each later request follows its client's previous
    one by a seeded uniform delay in [0, jitter_s]; every request of ``total`` is still served."""
    from disagg.twin.sim import ClosedLoop

    dep = SimDeployment(model="llama-3.1-8b", mode="colocated", colocated=PoolSpec(1, 1))
    locked = simulate(dep, [], closed_loop=ClosedLoop(4, 512, 32, 24), seed=1)
    drift = simulate(dep, [], closed_loop=ClosedLoop(4, 512, 32, 24, jitter_s=0.5), seed=1)
    for res in (locked, drift):
        assert len(res.ttft) == 24 and np.all(np.isfinite(res.ttft))
        assert np.all(res.arrival[:4] == 0.0)
    # without drift a request is sent the moment one finishes; with it, clients fall out of step
    finish = np.sort(locked.arrival[:20] + locked.e2e[:20])
    assert set(np.round(locked.arrival[4:], 9)) <= set(np.round(finish, 9))
    assert np.ptp(drift.arrival[20:]) > np.ptp(locked.arrival[20:])
    again = simulate(dep, [], closed_loop=ClosedLoop(4, 512, 32, 24, jitter_s=0.5), seed=1)
    assert np.array_equal(again.arrival, drift.arrival)


def test_front_end_load_stretches_arrivals_by_the_token_rate_and_leaves_tpot() -> None:
    """sim.FrontEndLoad: with no per-token cost the run is the plain one; with one, each request's front-end
    time is request overhead / (1 - rho), rho from the tokens/s the replica streamed over the last window
    (capped at max_util), so TTFT grows with the cost while the engine's steps (TPOT) stay as they were."""
    from disagg.twin.sim import ClosedLoop, FrontEndLoad

    dep = SimDeployment(model="llama-3.1-8b", mode="colocated", colocated=PoolSpec(1, 1))
    loop = ClosedLoop(16, 512, 64, 96, ramp_s=1.0, random_start=True)
    plain = simulate(dep, [], closed_loop=loop, seed=1)
    zero = simulate(dep, [], closed_loop=loop, seed=1, front_end_load=FrontEndLoad())
    assert np.array_equal(plain.ttft, zero.ttft)
    ttfts, tpots = [], []
    for cost in (100e-6, 300e-6, 1.0):
        res = simulate(dep, [], closed_loop=loop, seed=1, front_end_load=FrontEndLoad(output_token_s=cost))
        ttfts.append(float(np.mean(res.ttft[32:])))
        tpots.append(float(np.mean(res.itl_mean[32:])))
    assert float(np.mean(plain.ttft[32:])) < ttfts[0] < ttfts[1] < ttfts[2]
    # saturated (cost 1 s per token): every front-end time is capped at overhead / (1 - max_util)
    ovh = load_latency_model("llama-3.1-8b", "h100", 1).runtime.request_overhead_s
    assert ttfts[2] >= ovh / (1 - FrontEndLoad().max_util) * 0.9
    base_tpot = float(np.mean(plain.itl_mean[32:]))
    assert all(abs(t - base_tpot) / base_tpot < 0.10 for t in tpots), (base_tpot, tpots)
