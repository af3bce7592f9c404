"""The ratio policy's invariants and each algorithm's direction on canonical situations."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from disagg.api.ratiopolicy import RatioPolicySpec
from disagg.policy import (
    Bounds,
    Decision,
    Measured,
    Observation,
    PolicyState,
    RoleBounds,
    RoleObservation,
    ServingProfile,
    decide,
)
from disagg.policy.capacity import (
    PrefillService,
    erlang_c,
    load_models,
    pool_prefill_ttft_share,
    prefill_replicas_needed,
    prefill_ttft_share,
)
from disagg.policy.engine import PENDING_GRACE_S
from disagg.policy.feedback import BURSTY_SHRINK_HEADROOM, Band, itl_growth, shrink_ceiling
from disagg.policy.model_based import update_corrections
from disagg.policy.types import MISSING, Recommendation


def spec(**kw: Any) -> RatioPolicySpec:
    """A RatioPolicy for these tests: slo-feedback unless ``algorithm`` says otherwise (most tests here
    are of slo-feedback's rules; model-based is the API's default)."""
    base: dict[str, Any] = {
        "slo": {"ttft": {"targetSeconds": 1.0}, "itl": {"targetSeconds": 0.05}},
        "algorithm": "slo-feedback",
    }
    base.update(kw)
    return RatioPolicySpec.model_validate(base)


def obs(
    t: float = 0.0,
    p: int = 2,
    d: int = 4,
    ttft: float | None = 0.6,
    itl: float | None = 0.035,
    rate: float | None = 4.0,
    queue: float = 0.05,
    prefill_time: float | None = 0.15,
    kv: float = 0.5,
    pending: tuple[int, int] = (0, 0),
    unschedulable_s: tuple[tuple[float, ...], tuple[float, ...]] = ((), ()),
    prompt: float | None = 1000.0,
    output: float | None = 200.0,
    running: float | None = 60.0,
) -> Observation:
    return Observation(
        time=t,
        prefill=RoleObservation(
            replicas=p,
            ready=p - pending[0],
            pending=pending[0],
            unschedulable_s=unschedulable_s[0],
            queue_time=Measured.of(queue),
            compute_time=Measured.of(prefill_time),
        ),
        decode=RoleObservation(
            replicas=d,
            ready=d - pending[1],
            pending=pending[1],
            unschedulable_s=unschedulable_s[1],
            kv_usage=Measured.of(kv),
            running=Measured.of(running),
        ),
        ttft=Measured.of(ttft),
        itl=Measured.of(itl),
        request_rate=Measured.of(rate),
        prompt_tokens_mean=Measured.of(prompt),
        prompt_tokens_p90=Measured.of(prompt * 2 if prompt else None),
        output_tokens_mean=Measured.of(output),
    )


BOUNDS = Bounds(prefill=RoleBounds(1, 16), decode=RoleBounds(1, 16))


def run(
    o: Observation, policy: RatioPolicySpec, state: PolicyState | None = None, bounds: Bounds = BOUNDS
) -> tuple[Decision, PolicyState]:
    return decide(o, policy, state or PolicyState(), o.time, bounds)


def codes(d: Decision) -> set[str]:
    return {r.code for r in d.reasons}


# --- slo-feedback direction ------------------------------------------------------------------------


def test_ttft_breach_from_prefill_queue_grows_prefill_only() -> None:
    d, _ = run(obs(ttft=2.5, queue=2.0, prefill_time=0.3), spec())
    assert d.prefill > 2 and d.decode == 4
    assert d.cause == "TTFTBreachPrefillQueue"
    assert d.changed


def test_ttft_breach_after_prefill_grows_decode() -> None:
    # prefill side 0.2 s of a 2.0 s TTFT, and requests wait at the decode pool (12 queued on 4
    # replicas, 1.2 s admission wait): the time goes into KV transfer and decode admission
    o = obs(ttft=2.0, queue=0.05, prefill_time=0.15)
    o = replace(o, decode=replace(o.decode, queue_depth=Measured.of(12.0), queue_time=Measured.of(1.2)))
    d, _ = run(o, spec())
    assert d.decode > 4 and d.prefill == 2
    assert "TTFTBreachTransferDecode" in codes(d)


def test_ttft_breach_after_prefill_without_decode_queueing_stays_with_prefill() -> None:
    # the same split, but nothing waits at the decode pool: the p90 TTFT tail is prefill queueing
    # (the prefill side is a window mean); more decode replicas would not shorten it
    o = obs(ttft=2.0, queue=0.05, prefill_time=0.15, kv=0.05)
    o = replace(o, decode=replace(o.decode, queue_depth=Measured.of(0.0), queue_time=Measured.of(0.0)))
    d, _ = run(o, spec())
    assert d.decode <= 4
    assert d.prefill > 2
    assert "TTFTBreachTransferDecode" not in codes(d)


def test_itl_breach_grows_decode() -> None:
    d, _ = run(obs(itl=0.09), spec())
    assert d.decode > 4 and d.prefill == 2
    assert d.cause == "ITLBreach"


def test_kv_pressure_grows_decode() -> None:
    d, _ = run(obs(kv=0.97), spec())
    assert d.decode > 4
    assert "KVPressure" in codes(d)


def test_surplus_shrinks_only_after_the_scale_down_window() -> None:
    policy = spec(scaleDown={"stabilizationWindowSeconds": 120, "maxStep": {"prefill": 1, "decode": 1}})
    quiet: dict[str, Any] = {
        "ttft": 0.25,
        "itl": 0.012,
        "rate": 1.0,
        "queue": 0.0,
        "prefill_time": 0.1,
        "kv": 0.1,
    }
    state = PolicyState()
    # the pools were busy (recommendation = current) until t=0, then the load fell
    d, state = run(obs(t=0.0), spec(), state)
    for t in (30.0, 60.0, 90.0):
        d, state = run(obs(t=t, **quiet), policy, state)
        assert (d.prefill, d.decode) == (2, 4), t
    d, state = run(obs(t=150.0, **quiet), policy, state)
    assert d.decode == 3  # one step down per decision (maxStep 1)
    assert d.prefill == 1


def test_shrink_refused_when_survivors_would_breach() -> None:
    # TTFT comfortable but the prefill pool is 70% busy (prompts longer than a step's token budget
    # share no step): one replica fewer would be 140% busy
    d, _ = run(
        obs(ttft=0.5, rate=7.0, prefill_time=0.2, queue=0.1, prompt=10000.0),
        spec(scaleDown={"stabilizationWindowSeconds": 0}),
    )
    assert d.prefill == 2


def test_idle_shrinks_to_minimum() -> None:
    policy = spec(scaleDown={"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 8, "decode": 8}})
    d, _ = run(obs(rate=0.0, ttft=None, itl=None), policy)
    assert (d.prefill, d.decode) == (1, 1)
    assert "IdleShrink" in codes(d)


# --- invariants -------------------------------------------------------------------------------------


def test_fail_static_never_scales_down_on_missing_data() -> None:
    policy = spec(scaleDown={"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 8, "decode": 8}})
    o = replace(obs(p=6, d=8), ttft=MISSING, itl=Measured.missing(), request_rate=MISSING)
    state = PolicyState()
    for t in range(0, 600, 30):
        d, state = run(replace(o, time=float(t)), policy, state)
        assert d.prefill >= 6 and d.decode >= 8
        assert d.cause == "MetricsMissing"
        assert not d.changed


def test_advisory_marks_every_decision() -> None:
    d, _ = run(obs(ttft=3.0, queue=2.5), spec(mode="advisory"))
    assert d.advisory and d.changed and d.prefill > 2
    d2, _ = run(obs(ttft=3.0, queue=2.5), spec())
    assert not d2.advisory


def test_no_flapping_under_constant_load() -> None:
    policy = spec()
    state = PolicyState()
    p, d_ = 2, 4
    history = []
    for t in range(0, 3600, 30):
        # steady load with measurement noise inside the tolerance band
        wobble = 0.05 if (t // 30) % 2 else -0.05
        d, state = run(
            obs(t=float(t), p=p, d=d_, ttft=0.9 * (1 + wobble), itl=0.048 * (1 + wobble)), policy, state
        )
        p, d_ = d.prefill, d.decode
        history.append((p, d_))
    assert len(set(history)) == 1


def test_scale_up_is_immediate_and_step_capped() -> None:
    policy = spec(scaleUp={"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 2, "decode": 2}})
    # 40 req/s x 0.3 s of prefill each (prompts too long to share a step) at 80% utilisation needs 15
    d, _ = run(obs(p=4, ttft=50.0, queue=49.0, rate=40.0, prefill_time=0.3, prompt=10000.0), policy)
    assert d.prefill == 6  # capped at +2
    assert "StepCapped" in codes(d)


def test_scale_up_window_ignores_a_single_spike() -> None:
    policy = spec(scaleUp={"stabilizationWindowSeconds": 60, "maxStep": {"prefill": 4, "decode": 4}})
    state = PolicyState()
    d, state = run(obs(t=0.0), policy, state)
    d, state = run(obs(t=30.0, ttft=3.0, queue=2.5), policy, state)
    assert d.prefill == 2
    assert "Stabilizing" in codes(d)
    d, state = run(obs(t=60.0, ttft=3.0, queue=2.5), policy, state)
    d, state = run(obs(t=90.0, ttft=3.0, queue=2.5), policy, state)
    assert d.prefill > 2  # sustained for the whole window


def test_pending_pods_set_a_ceiling_and_report_scaling_limited() -> None:
    policy = spec(pendingBackoffSeconds=300)
    # 6 prefill replicas asked, 2 not scheduled yet: within the grace period no ceiling is learned
    d, state = run(obs(p=6, ttft=3.0, queue=2.5, pending=(2, 0), unschedulable_s=((5.0, 5.0), ())), policy)
    assert "ScalingLimited" not in codes(d) and state.limited == {}
    # the 2 stay Unschedulable past the grace period (no GPUs of that type left), TTFT still breached
    stuck = ((PENDING_GRACE_S, PENDING_GRACE_S + 30.0), ())
    d, state = run(obs(p=6, ttft=3.0, queue=2.5, pending=(2, 0), unschedulable_s=stuck), policy)
    assert d.prefill == 4
    assert "ScalingLimited" in codes(d)
    assert state.limited["prefill"] == 4
    d, state = run(obs(t=100.0, p=4, ttft=3.0, queue=2.5), policy, state)
    assert d.prefill == 4  # no new Pending pods piled up
    d, state = run(obs(t=400.0, p=4, ttft=3.0, queue=2.5), policy, state)
    assert d.prefill > 4  # after the back-off it probes for capacity again


def test_budget_goes_to_the_breaching_pool() -> None:
    bounds = Bounds(prefill=RoleBounds(1, 16, gpus_per_replica=2), decode=RoleBounds(1, 16), max_gpus=12)
    d, _ = run(obs(p=2, d=8, ttft=3.0, queue=2.5), spec(), bounds=bounds)
    assert d.prefill * 2 + d.decode <= 12
    assert d.prefill > 2  # prefill breached: it gets GPUs, decode gives some up
    assert "BudgetClamp" in codes(d)


def test_policy_budget_lower_than_deployment_budget_wins() -> None:
    d, _ = run(obs(p=2, d=4, itl=0.2), spec(gpuBudget={"maxGPUs": 7}))
    assert d.prefill + d.decode <= 7


observations = st.builds(
    obs,
    t=st.just(0.0),
    p=st.integers(1, 12),
    d=st.integers(1, 12),
    ttft=st.one_of(st.none(), st.floats(0.01, 30.0)),
    itl=st.one_of(st.none(), st.floats(0.001, 0.5)),
    rate=st.one_of(st.none(), st.floats(0.0, 50.0)),
    queue=st.floats(0.0, 10.0),
    prefill_time=st.floats(0.01, 2.0),
    kv=st.floats(0.0, 1.0),
)


@settings(max_examples=150, deadline=None)
@given(
    o=observations,
    algorithm=st.sampled_from(["slo-feedback", "fixed-ratio", "model-based"]),
    budget=st.one_of(st.none(), st.integers(4, 30)),
)
def test_bounds_and_budget_always_hold(o: Observation, algorithm: str, budget: int | None) -> None:
    bounds = Bounds(
        prefill=RoleBounds(1, 10, gpus_per_replica=1),
        decode=RoleBounds(2, 12, gpus_per_replica=2),
        max_gpus=budget,
        profile=ServingProfile("llama-3.1-8b", "h100"),
    )
    policy = spec(algorithm=algorithm, fixedRatio={"prefill": 1, "decode": 2})
    d, state = decide(o, policy, PolicyState(), 0.0, bounds)
    assert 1 <= d.prefill <= 10 and 2 <= d.decode <= 12
    if budget is not None and budget >= 1 + 2 * 2:
        assert d.prefill + 2 * d.decode <= budget
    assert d.reasons
    if not o.ttft.ok and not o.itl.ok and not o.request_rate.ok and budget is None:  # fail-static
        assert d.prefill >= min(o.prefill.replicas, 10) and d.decode >= max(min(o.decode.replicas, 12), 2)
    assert state.recommendations[-1].time == 0.0


# --- fixed-ratio and model-based ---------------------------------------------------------------------


def test_fixed_ratio_keeps_the_ratio() -> None:
    policy = spec(
        algorithm="fixed-ratio",
        fixedRatio={"prefill": 1, "decode": 3},
        scaleUp={"maxStep": {"prefill": 16, "decode": 16}},
    )
    d, _ = run(obs(p=2, d=6, itl=0.09), policy)
    assert d.decode == 3 * d.prefill
    assert d.prefill > 2


MB_BOUNDS = Bounds(
    prefill=RoleBounds(1, 64), decode=RoleBounds(1, 64), profile=ServingProfile("llama-3.1-8b", "h100")
)


FREE = {
    "scaleDown": {"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 64, "decode": 64}},
    "scaleUp": {"maxStep": {"prefill": 64, "decode": 64}},
}


def test_model_based_grows_with_load() -> None:
    policy = spec(algorithm="model-based", **FREE)
    low, _ = run(obs(rate=2.0), policy, bounds=MB_BOUNDS)
    high, _ = run(obs(rate=150.0), policy, bounds=MB_BOUNDS)
    assert high.prefill >= low.prefill and high.decode > low.decode
    assert "ModelCapacity" in codes(high)


def test_model_based_moves_toward_prefill_when_prompts_grow() -> None:
    policy = spec(algorithm="model-based", **FREE)
    # no latency samples to correct the model with: the model's own capacity decides
    neutral: dict[str, Any] = {"p": 8, "d": 8, "rate": 40.0, "prefill_time": None, "running": None}
    chat, _ = run(obs(prompt=300.0, output=300.0, **neutral), policy, bounds=MB_BOUNDS)
    docs, _ = run(obs(prompt=8000.0, output=100.0, **neutral), policy, bounds=MB_BOUNDS)
    assert docs.prefill / docs.decode > chat.prefill / chat.decode


def test_model_based_correction_follows_observed_latency() -> None:
    policy = spec(algorithm="model-based")
    _, fast = run(obs(prefill_time=0.01, queue=0.0), policy, bounds=MB_BOUNDS)
    _, slow = run(obs(prefill_time=0.5, queue=0.0), policy, bounds=MB_BOUNDS)
    assert slow.correction["prefill"] > fast.correction["prefill"]


def test_prefill_correction_compares_with_the_step_a_request_shares_at_this_load() -> None:
    # 8B on H100: a lone 1000-token prefill takes tens of ms; at 2 req/s per replica requests mostly run
    # alone, so an engine reporting exactly the model's lone-request time reads as ~1x, not as the 0.25x
    # a comparison with a full 8-prompt batch gave
    models = load_models(ServingProfile("llama-3.1-8b", "h100"))
    alone = models.prefill.prefill_time_s([1000])
    o = obs(prefill_time=alone, queue=0.0, rate=4.0, p=2)
    o = replace(o, prompt_tokens_p90=Measured.of(1000.0))
    corr = update_corrections(o, models, PolicyState(), 1.0, 8192)
    assert 0.8 <= corr["prefill"] <= 1.0


def test_prefill_correction_does_not_learn_from_a_draining_backlog() -> None:
    # a queue longer than the prefill time: full steps drain it, which says nothing about the engine
    models = load_models(ServingProfile("llama-3.1-8b", "h100"))
    o = obs(prefill_time=0.5, queue=3.0, rate=4.0)
    assert "prefill" not in update_corrections(o, models, PolicyState(), 1.0, 8192)


def test_model_based_without_profile_falls_back_to_feedback() -> None:
    d, _ = run(obs(itl=0.09), spec(algorithm="model-based"))
    assert d.decode > 4
    assert "ModelUnavailable" in codes(d)


def test_model_based_holds_on_missing_load() -> None:
    d, _ = run(obs(rate=None, p=5, d=5), spec(algorithm="model-based"), bounds=MB_BOUNDS)
    assert (d.prefill, d.decode) == (5, 5)
    assert d.cause == "MetricsMissing"


# --- tuning: backlogs, bursts and the scale-down window's memory ----------------------------------


def with_queue(o: Observation, depth: float) -> Observation:
    return replace(o, prefill=replace(o.prefill, queue_depth=Measured.of(depth)))


def test_backlog_breach_holds_prefill_when_capacity_fits_the_load() -> None:
    # all 4 replicas ready, 1 req/s x 0.4 s per request = 10% busy, yet 40 requests queued from before:
    # new replicas would take only new arrivals, so the pool holds while the backlog drains
    backlog = with_queue(obs(p=4, ttft=8.0, queue=7.5, prefill_time=0.4, rate=1.0), 40.0)
    d, _ = run(backlog, spec())
    assert d.prefill == 4
    assert d.cause == "TTFTBreachBacklog"


def test_breach_with_load_beyond_capacity_still_grows() -> None:
    # same queue, but 10 req/s x 0.4 s = 4 replicas' worth of work on 4 replicas: more are needed
    overload = with_queue(obs(p=4, ttft=8.0, queue=7.5, prefill_time=0.4, rate=10.0), 40.0)
    d, _ = run(overload, spec())
    assert d.prefill > 4
    assert d.cause == "TTFTBreachPrefillQueue"


def test_shrink_is_judged_against_the_scale_down_window_peak() -> None:
    policy = spec(scaleDown={"stabilizationWindowSeconds": 300, "maxStep": {"prefill": 1, "decode": 1}})
    quiet = obs(t=1000.0, ttft=0.25, rate=1.0, queue=0.0, prefill_time=0.1, prompt=10000.0)
    old = (Recommendation(0.0, 2, 4),)  # older than every window: no stabilisation hold
    calm, _ = run(quiet, policy, PolicyState(recommendations=old))
    assert calm.prefill == 1
    # a burst of 12 req/s 200 s ago (outside the 120 s metric window, inside the 300 s scale-down
    # window): one replica would be 120% busy at that rate, so the pool keeps both
    burst = PolicyState(recommendations=old, load_history=((800.0, 12.0),))
    kept, _ = run(quiet, policy, burst)
    assert kept.prefill == 2


def test_model_based_shrink_needs_the_observed_latencies_to_agree() -> None:
    policy = spec(algorithm="model-based", **FREE)
    # the model sizes 1 req/s of 1000-token prompts at one replica, but the prefill pool's requests
    # queued 0.3 s at p90 on 8 replicas (bursts): halving the pool would double that wait
    bursty, _ = run(obs(p=8, rate=1.0, ttft=0.5, queue=0.3, prefill_time=0.15), policy, bounds=MB_BOUNDS)
    smooth, _ = run(obs(p=8, rate=1.0, ttft=0.5, queue=0.0, prefill_time=0.15), policy, bounds=MB_BOUNDS)
    assert smooth.prefill < bursty.prefill < 8
    assert bursty.prefill == 4  # 0.05 s decode side + 0.15 s prefill + 0.3 s x 8/4 = 0.8 s <= 0.9 s


def test_default_scale_down_window_is_the_hpa_default() -> None:
    assert RatioPolicySpec().scale_down.stabilization_window_seconds == 300


def test_the_default_algorithm_is_model_based() -> None:
    # the one with the best worst case on the held-out families (docs/policy-bench.md)
    assert RatioPolicySpec().algorithm.value == "model-based"


def test_short_prompts_are_not_counted_as_nearly_free_when_batched() -> None:
    # 6 req/s of 1000-token prompts at 0.3 s each: 90% of one replica. Prefill is compute-bound, so
    # batching eight of them into one 8192-token step does not make each cost an eighth (the old work
    # model did, and shrank this pool to one replica); without a latency model the measured time judges
    policy = spec(scaleDown={"stabilizationWindowSeconds": 300, "maxStep": {"prefill": 1, "decode": 1}})
    old = (Recommendation(0.0, 2, 4),)
    now = obs(t=1000.0, p=2, ttft=0.5, rate=6.0, queue=0.0, prefill_time=0.3, prompt=1000.0)
    steady = PolicyState(recommendations=old, load_history=tuple((1000.0 - 30 * k, 6.0) for k in range(1, 9)))
    d, _ = run(now, policy, steady)
    assert d.prefill >= 2
    assert "SurplusCapacity" not in codes(d)


def test_batched_prefill_work_comes_from_the_latency_model_when_the_profile_is_known() -> None:
    # the 8B model on H100 prefills a 1000-token prompt in tens of ms: at 6 req/s two replicas are
    # mostly idle and, with the model's batched cost, one is proven enough
    policy = spec(scaleDown={"stabilizationWindowSeconds": 300, "maxStep": {"prefill": 1, "decode": 1}})
    models = load_models(ServingProfile("llama-3.1-8b", "h100"))
    alone = models.prefill.prefill_time_s([1000])
    old = (Recommendation(0.0, 2, 4),)
    now = obs(t=1000.0, p=2, ttft=0.2, rate=6.0, queue=0.0, prefill_time=alone, prompt=1000.0)
    steady = PolicyState(recommendations=old, load_history=tuple((1000.0 - 30 * k, 6.0) for k in range(1, 9)))
    d, _ = run(now, policy, steady, bounds=MB_BOUNDS)
    assert d.prefill == 1
    assert "SurplusCapacity" in codes(d)


def test_flapping_pool_earns_a_longer_scale_down_window() -> None:
    # the reversal budget lifted (it would hold the second shrink on its own: see the tests below)
    policy = spec(
        scaleDown={"stabilizationWindowSeconds": 120, "maxStep": {"prefill": 1, "decode": 1}},
        maxReversalsPerHour=120,
    )
    quiet: dict[str, Any] = {"ttft": 0.25, "rate": 1.0, "queue": 0.0, "prefill_time": 0.1, "prompt": 10000.0}
    busy: dict[str, Any] = {"ttft": 3.0, "rate": 1.0, "queue": 2.5, "prefill_time": 0.3, "prompt": 10000.0}
    state = PolicyState(recommendations=(Recommendation(-1000.0, 3, 4),))
    d, state = run(obs(t=0.0, p=3, **quiet), policy, state)
    assert d.prefill == 2  # first shrink, no history of flapping
    d, state = run(obs(t=30.0, p=2, **busy), policy, state)
    assert d.prefill == 3  # grew back right after the shrink: a flap
    assert state.flaps["prefill"] == (30.0,)
    # quiet again: the 120 s window would allow a shrink at t=180, the doubled one (240 s) not before 270
    for t in (60.0, 90.0, 120.0, 150.0, 180.0, 210.0, 240.0):
        d, state = run(obs(t=t, p=3, **quiet), policy, state)
        assert d.prefill == 3, t
    assert "FlapDamping" in codes(d)
    d, state = run(obs(t=270.0, p=3, **quiet), policy, state)
    assert d.prefill == 2


QUIET: dict[str, Any] = {"ttft": 0.25, "rate": 1.0, "queue": 0.0, "prefill_time": 0.1, "prompt": 10000.0}
BUSY: dict[str, Any] = {"ttft": 3.0, "rate": 1.0, "queue": 2.5, "prefill_time": 0.3, "prompt": 10000.0}


def test_a_shrink_waits_while_it_and_the_growth_that_may_follow_would_pass_the_reversal_budget() -> None:
    policy = spec(**FREE)  # maxReversalsPerHour: 2 (the default)
    assert policy.max_reversals_per_hour == 2
    old = (Recommendation(-1000.0, 3, 4),)
    # prefill grew last (t=-100) and already reversed once within the hour (t=-2000)
    grew = PolicyState(
        recommendations=old, last_scale_up={"prefill": -100.0}, last_scale_down={"prefill": -900.0}
    )
    once = replace(grew, reversals={"prefill": (-2000.0,)})
    free, _ = run(obs(t=0.0, p=3, **QUIET), policy, grew)
    assert free.prefill < 3  # no reversal yet: the shrink and a regrowth fit in 2
    held, state = run(obs(t=0.0, p=3, **QUIET), policy, once)
    assert held.prefill == 3
    assert "ReversalBudget" in codes(held)
    why = next(r.message for r in held.reasons if r.code == "ReversalBudget")
    assert (
        "prefill held at 3" in why and "1 direction reversal(s)" in why and "maxReversalsPerHour (2)" in why
    )
    # the reversal ages out of the hour: the shrink goes ahead, and is recorded as a reversal
    later, state = run(obs(t=1700.0, p=3, **QUIET), policy, replace(once, recommendations=()))
    assert later.prefill < 3 and "ReversalBudget" not in codes(later)
    assert state.reversals["prefill"] == (1700.0,)
    # growth never waits, and a growth after that shrink is the second reversal
    grown, state = run(obs(t=1730.0, p=later.prefill, **BUSY), policy, state)
    assert grown.prefill > later.prefill
    assert state.reversals["prefill"] == (1700.0, 1730.0)
    # a higher budget lets the held shrink through
    roomy, _ = run(obs(t=0.0, p=3, **QUIET), spec(**FREE, maxReversalsPerHour=3), once)
    assert roomy.prefill < 3


def test_a_shrink_that_continues_a_shrink_is_no_reversal_and_never_waits() -> None:
    policy = spec(**FREE)
    shrinking = PolicyState(
        recommendations=(Recommendation(-1000.0, 3, 4),),
        last_scale_up={"prefill": -900.0},
        last_scale_down={"prefill": -100.0},
        reversals={"prefill": (-1500.0, -100.0)},  # the budget is spent
    )
    d, state = run(obs(t=0.0, p=3, **QUIET), policy, shrinking)
    assert d.prefill < 3 and "ReversalBudget" not in codes(d)
    assert state.reversals["prefill"] == (-1500.0, -100.0)


def test_the_reversal_budget_holds_only_shrinks_that_reverse_a_growth() -> None:
    from disagg.policy.engine import reversal_hold

    policy = spec(**FREE)
    grew = PolicyState(last_scale_up={"decode": 50.0}, last_scale_down={"decode": 10.0})
    assert reversal_hold("decode", 5, 4, grew, (), policy) is None  # the shrink and a regrowth fit in 2
    assert reversal_hold("decode", 5, 4, grew, (20.0,), policy) is not None
    assert reversal_hold("decode", 5, 6, grew, (20.0, 40.0), policy) is None  # growth never waits
    assert reversal_hold("decode", 5, 5, grew, (20.0, 40.0), policy) is None
    fresh = PolicyState()  # no move yet: the first shrink reverses nothing
    assert reversal_hold("decode", 5, 4, fresh, (20.0, 40.0), policy) is None


def test_shrink_is_anchored_on_the_observed_ttft() -> None:
    # long prompts: TTFT p90 (5.9 s) sits far above the mean prefill time (2 s) with no queueing; the
    # shrink adds only the waiting it causes, so 13 replicas at 4 req/s (62% busy) can lose a few
    policy = spec(
        slo={"ttft": {"targetSeconds": 10.0}, "itl": {"targetSeconds": 0.05}},
        scaleDown={"stabilizationWindowSeconds": 0, "maxStep": {"prefill": 8, "decode": 8}},
    )
    d, _ = run(obs(p=13, ttft=5.9, queue=0.0, prefill_time=2.0, rate=4.0, prompt=15000.0), policy)
    assert 10 <= d.prefill < 13  # never past the 80% utilisation cap (10 replicas)
    assert d.cause == "SurplusCapacity"


def test_erlang_c_matches_closed_forms() -> None:
    assert erlang_c(1, 0.6) == pytest.approx(0.6)  # M/M/1: an arrival waits with probability rho
    assert erlang_c(2, 1.0) == pytest.approx(1.0 / 3.0)
    assert erlang_c(4, 4.0) == 1.0  # saturated
    assert erlang_c(8, 0.0) == 0.0


def test_load_balanced_pool_needs_fewer_prefill_replicas_than_split_queues() -> None:
    # long, heavy-tailed prompts (Mooncake-like: mean share 1.67 s, cs^2 ~ 3.4) at 4 req/s
    service = PrefillService(mean_s=1.67, second_moment=12.2, latency_tail_s=4.4, mean_latency_s=1.8)
    assert pool_prefill_ttft_share(service, 4.0, 10, 90) < prefill_ttft_share(service, 0.4, 90)
    n = prefill_replicas_needed(service, 4.0, 9.9, 90, 0.85, 16)
    assert math.ceil(4.0 * 1.67 / 0.85) <= n < 16  # work-bound below, and no longer pinned at the maximum


def test_bursty_arrivals_shrink_prefill_only_with_headroom_below_the_target() -> None:
    policy = spec(**FREE)  # TTFT target 1 s, tolerance band edge 0.9 s
    now = obs(t=1000.0, p=4, ttft=0.4, rate=2.0, queue=0.05, prefill_time=0.1, prompt=1000.0)
    steady = PolicyState(load_history=tuple((1000.0 - 30 * k, 2.0) for k in range(1, 9)))
    d, _ = run(now, policy, steady)
    assert d.prefill == 1  # predicted ~0.55 s on one replica: inside the band
    # same present, but a 6 req/s burst earlier in the window: one replica is predicted at ~0.78 s,
    # inside the band's 0.9 s yet above half the target, so only two survive (predicted ~0.47 s)
    bursty = PolicyState(
        load_history=tuple((1000.0 - 30 * k, 6.0 if k == 4 else 0.5) for k in range(1, 9)),
    )
    d, _ = run(now, policy, bursty)
    assert d.prefill == 2
    assert d.cause == "SurplusCapacity"


def test_shrink_ceiling_is_tighter_for_bursty_arrivals() -> None:
    band = Band(2.0, 0.1)
    assert shrink_ceiling(band, steady=True) == pytest.approx(1.8)
    assert shrink_ceiling(band, steady=False) == pytest.approx(2.0 * BURSTY_SHRINK_HEADROOM)
    assert shrink_ceiling(band, steady=False) <= shrink_ceiling(band, steady=True)


def test_measured_prefill_work_sizes_a_breach_beyond_doubling_within_the_step_cap() -> None:
    # 10 req/s of 10k-token prompts (longer than a step's token budget: unshared), 1 s each, on 2
    # replicas: the work needs ceil(10 x 1 / 0.8) = 13 replicas, more than doubling the pool
    breach: dict[str, Any] = {"p": 2, "ttft": 5.0, "rate": 10.0, "queue": 4.0, "prefill_time": 1.0}
    d, _ = run(obs(prompt=10000.0, **breach), spec(**FREE))
    assert d.prefill == 13
    assert d.cause == "TTFTBreachPrefillQueue"
    capped, _ = run(obs(prompt=10000.0, **breach), spec(scaleUp={"maxStep": {"prefill": 4, "decode": 4}}))
    assert capped.prefill == 6  # the per-step cap still binds


def test_prefill_side_ttft_breach_does_not_hold_a_surplus_decode_pool() -> None:
    quiet_decode: dict[str, Any] = {"itl": 0.02, "kv": 0.2, "ttft": 2.5}
    d, _ = run(obs(queue=2.0, prefill_time=0.3, **quiet_decode), spec(**FREE))
    assert d.prefill > 2 and d.decode < 4  # prefill grows, decode proves its surplus by ITL and KV
    # the breach cannot be attributed (no prefill-side latencies): decode holds
    d, _ = run(obs(queue=2.0, prefill_time=None, **quiet_decode), spec(**FREE))
    assert d.decode == 4


# --- leading signals: prefill saturation, decode step shape ---------------------------------------------

LONG_CONTEXT: dict[str, Any] = {
    "ttft": 6.0,
    "queue": 1.0,
    "prefill_time": 2.0,
    "rate": 4.0,
    "prompt": 15000.0,
}
TEN_S = {"slo": {"ttft": {"targetSeconds": 10.0}, "itl": {"targetSeconds": 0.05}}}


def test_steady_load_near_saturation_grows_prefill_before_ttft_breaches() -> None:
    # 4 req/s of 15k-token prompts (unshared: longer than a step's budget), 2 s each, on 9 replicas:
    # 89% busy while TTFT p90 (6 s) still sits inside the 10 s target; ceil(4 x 2 / 0.8) = 10
    steady = PolicyState(load_history=tuple((1000.0 - 30 * k, 4.0) for k in range(1, 9)))
    d, _ = run(obs(t=1000.0, p=9, **LONG_CONTEXT), spec(**TEN_S, **FREE), steady)
    assert d.prefill == 10
    assert d.cause == "PrefillSaturation"
    assert d.decode == 4


def test_saturation_waits_for_starting_replicas_and_ignores_bursty_windows() -> None:
    steady = PolicyState(load_history=tuple((1000.0 - 30 * k, 4.0) for k in range(1, 9)))
    starting = obs(t=1000.0, p=9, pending=(0, 0), **LONG_CONTEXT)
    starting = replace(starting, prefill=replace(starting.prefill, ready=8))
    d, _ = run(starting, spec(**TEN_S, **FREE), steady)
    assert d.prefill == 9 and "PrefillSaturation" not in codes(d)
    bursty = PolicyState(load_history=tuple((1000.0 - 30 * k, 12.0 if k == 4 else 0.5) for k in range(1, 9)))
    d, _ = run(obs(t=1000.0, p=9, **LONG_CONTEXT), spec(**TEN_S, **FREE), bursty)
    assert "PrefillSaturation" not in codes(d)


def test_itl_growth_uses_the_step_shape_and_never_exceeds_the_linear_bound() -> None:
    o = obs(d=2, running=20.0)
    fixed_plus_linear = lambda b: 0.020 + 0.0005 * b  # noqa: E731
    assert itl_growth(o, 2, 1, None) == pytest.approx(2.0)
    assert itl_growth(o, 2, 1, fixed_plus_linear) == pytest.approx(0.030 / 0.025)
    assert itl_growth(o, 2, 1, lambda b: 0.001) == 1.0  # never predicts a faster step
    assert itl_growth(replace(o, decode=replace(o.decode, running=MISSING)), 2, 1, fixed_plus_linear) == 2.0


def test_decode_shrinks_further_when_the_profile_gives_the_step_shape() -> None:
    # 2 decode replicas at ITL 26 ms, 20 requests running: the linear bound predicts 52 ms on one
    # replica (over the 45 ms band edge); the 70B latency model's step grows far less at batch 20
    # (4k-token prompts: 20 of them fit one replica's KV cache even at their 90th percentile)
    o = obs(p=8, d=2, ttft=3.0, queue=0.0, prefill_time=1.5, rate=3.0, prompt=4000.0, itl=0.026, running=20.0)
    o = replace(o, decode=replace(o.decode, kv_usage=Measured.of(0.2)))
    policy = spec(**TEN_S, **FREE)
    blind, _ = run(o, policy)
    assert blind.decode == 2
    profiled = replace(BOUNDS, profile=ServingProfile("llama-3.1-70b", "h100", 2, 2, "fp8"))
    d, _ = run(o, policy, bounds=profiled)
    assert d.decode == 1
    assert any(r.code == "SurplusCapacity" and r.role == "decode" for r in d.reasons)


# --- issue 11: evidence at decode, KV headroom, bounded damping, error budget ---------------------------


def test_a_ttft_breach_after_prefill_does_not_grow_decode_once_its_queue_has_drained() -> None:
    # the window's decode queue-time percentile still shows a wait, but nothing waits at decode now and
    # its KV cache is mostly free: more decode replicas would not shorten TTFT
    o = obs(ttft=2.0, queue=0.05, prefill_time=0.15, kv=0.14)
    o = replace(o, decode=replace(o.decode, queue_depth=Measured.of(0.0), queue_time=Measured.of(1.2)))
    d, _ = run(o, spec())
    assert d.decode <= 4
    assert "TTFTBreachTransferDecode" not in codes(d)


def test_decode_shrink_must_prove_kv_headroom_at_the_peak_it_will_face() -> None:
    # 45% KV on 4 replicas now; shrinking to 3 would be 60%, fine at today's load, but the scale-down
    # window saw twice this rate: at that peak 3 replicas would hold 120% of their cache
    policy = spec(scaleDown={"stabilizationWindowSeconds": 300, "maxStep": {"prefill": 1, "decode": 1}})
    old = (Recommendation(0.0, 2, 4),)
    now = obs(t=1000.0, d=4, kv=0.45, itl=0.02, rate=4.0, running=20.0)
    calm = PolicyState(recommendations=old, load_history=tuple((1000.0 - 30 * k, 4.0) for k in range(1, 9)))
    peak = PolicyState(
        recommendations=old,
        load_history=tuple((1000.0 - 30 * k, 8.0 if k == 3 else 4.0) for k in range(1, 9)),
    )
    shrunk, _ = run(now, policy, calm)
    held, _ = run(now, policy, peak)
    assert shrunk.decode < 4
    assert held.decode == 4


def test_a_long_context_decode_pool_keeps_the_replicas_its_kv_needs_at_the_90th_percentile() -> None:
    # the same 20 sequences with 12k-token prompts (p90 24k): one replica would hold ~300k tokens of KV,
    # more than the 70B profile's cache at the target utilisation, whatever the instantaneous 20% says
    o = obs(
        p=8, d=2, ttft=3.0, queue=0.0, prefill_time=1.5, rate=3.0, prompt=12000.0, itl=0.026, running=20.0
    )
    o = replace(o, decode=replace(o.decode, kv_usage=Measured.of(0.2)))
    profiled = replace(BOUNDS, profile=ServingProfile("llama-3.1-70b", "h100", 2, 2, "fp8"))
    d, _ = run(o, spec(**TEN_S, **FREE), bounds=profiled)
    assert d.decode == 2


def test_flap_damping_never_stretches_the_window_past_twice_the_configured_one() -> None:
    from disagg.policy.engine import DAMPING

    many = tuple(float(t) for t in range(0, 600, 60))
    assert DAMPING.window(300.0, many, 600.0) == 600.0
    assert DAMPING.window(300.0, (), 600.0) == 300.0


def test_an_unspent_error_budget_lets_replicas_run_busier_and_an_overspent_one_keeps_a_reserve() -> None:
    from disagg.policy.model_based import MIN_UTILIZATION, budget_utilization, updated_spend

    policy = spec(algorithm="model-based")
    base = policy.model_based.target_utilization
    assert budget_utilization(policy, None) == base  # no history: the configured target
    calm = budget_utilization(policy, 0.0)
    assert base < calm <= 0.97
    assert budget_utilization(policy, updated_spend(None, False, policy)) > base  # one good evaluation
    spend: float | None = 0.0
    levels = []
    for _ in range(40):  # twenty minutes of breaches at 30 s evaluations
        spend = updated_spend(spend, True, policy)
        levels.append(budget_utilization(policy, spend))
    # the headroom comes back first, then a reserve below the target grows with the overspend, to a floor
    assert levels == sorted(levels, reverse=True)
    assert levels[0] > base and levels[-1] < base
    assert min(levels) >= min(MIN_UTILIZATION, base)
    assert updated_spend(0.2, None, policy) == 0.2  # no latencies measured: nothing learned


def test_hysteresis_grows_at_the_utilisation_and_shrinks_only_with_the_band() -> None:
    from disagg.policy.model_based import with_hysteresis

    assert with_hysteresis(3, 4, 5) == 4  # growth: what the utilisation needs
    assert with_hysteresis(3, 2, 3) == 3  # the banded need is still 3: hold
    assert with_hysteresis(5, 2, 3) == 3  # shrink only as far as the banded need
    assert with_hysteresis(3, 3, 9) == 3


def test_prefix_cache_hits_cut_the_modelled_prefill_work() -> None:
    from disagg.policy.model_based import computed_prompts, computed_share

    o = obs(prompt=6000.0)
    assert computed_share(o) == 1.0  # unmeasured: every token is computed
    cached = replace(o, prefill=replace(o.prefill, prefix_hit_rate=Measured.of(0.75)))
    assert computed_share(cached) == pytest.approx(0.25)
    mean, p90 = computed_prompts(cached)
    assert mean == pytest.approx(1500.0) and p90 == pytest.approx(3000.0)
    every = replace(o, prefill=replace(o.prefill, prefix_hit_rate=Measured.of(1.0)))
    assert computed_share(every) == pytest.approx(0.05)  # never free


def test_a_saturated_prefill_pool_teaches_the_model_its_real_capacity() -> None:
    from disagg.policy.capacity import PrefillService
    from disagg.policy.model_based import saturated_prefill_correction

    service = PrefillService(mean_s=0.1, second_moment=0.01, latency_tail_s=0.5, mean_latency_s=0.3)
    # the model: 2000 tokens per 0.1 s = 20k tokens/s per replica; 40k tokens/s arrive, 20k are computed
    busy = obs(p=2, prompt=2000.0, rate=20.0)
    busy = replace(
        busy,
        prefill=replace(busy.prefill, queue_depth=Measured.of(50.0), token_throughput=Measured.of(20000.0)),
    )
    assert saturated_prefill_correction(busy, service, 2000.0) == pytest.approx(2.0)  # 10k measured
    calm = replace(busy, prefill=replace(busy.prefill, queue_depth=Measured.of(1.0)))
    assert saturated_prefill_correction(calm, service, 2000.0) is None
    # a queue at this instant, but over the window the pool computed all that arrived (20k of 20k):
    # it kept up, and its throughput says nothing about its capacity
    keeping_up = replace(busy, request_rate=Measured.of(10.0))
    assert saturated_prefill_correction(keeping_up, service, 2000.0) is None
    # the engines count cached prompt tokens too: with half of each 4000-token prompt a prefix-cache
    # hit, the 20k tokens/s the counter shows are 10k computed (5k per replica against the model's 20k:
    # x4), where reading the counter as computed tokens would say x2
    half_cached = replace(
        busy,
        prompt_tokens_mean=Measured.of(4000.0),
        prefill=replace(busy.prefill, prefix_hit_rate=Measured.of(0.5)),
    )
    assert saturated_prefill_correction(half_cached, service, 2000.0) == pytest.approx(4.0)


def test_a_saturated_pool_raises_the_correction_only_once_it_served_a_window_at_its_size() -> None:
    policy = spec(algorithm="model-based", **FREE)
    o = obs(p=2, d=2, rate=20.0, prompt=2000.0, output=100.0)
    o = replace(
        o, prefill=replace(o.prefill, queue_depth=Measured.of(200.0), token_throughput=Measured.of(5000.0))
    )
    _, settled = run(o, policy, bounds=MB_BOUNDS)
    # the same observation 30 s after prefill grew: the window's throughput is partly the old pool's
    grown = PolicyState(last_scale_up={"prefill": o.time - 30.0})
    _, fresh = run(o, policy, state=grown, bounds=MB_BOUNDS)
    assert settled.correction["prefill"] > 1.0
    assert fresh.correction.get("prefill", 1.0) == pytest.approx(1.0)


def test_model_based_grows_prefill_on_a_ttft_breach_only_where_requests_queue() -> None:
    # TTFT p90 over target, but nothing waits at prefill (the tail is long prompts' own prefill time):
    # more prefill replicas would not shorten it
    policy = spec(algorithm="model-based", **FREE)
    o = obs(p=4, d=4, ttft=3.0, queue=0.0, prefill_time=2.0, rate=0.5, prompt=20000.0)
    o = replace(o, prefill=replace(o.prefill, queue_depth=Measured.of(0.0)))
    d, _ = run(o, policy, bounds=MB_BOUNDS)
    assert d.prefill <= 4


def test_the_queue_correction_learns_only_where_the_model_expects_real_waiting() -> None:
    from disagg.policy.model_based import queue_correction

    policy = spec(algorithm="model-based")
    service = PrefillService(mean_s=0.2, second_moment=0.06, latency_tail_s=0.4, mean_latency_s=0.3)
    # 4 replicas at 16 req/s: 80% busy, the model expects real waiting; users saw almost none
    busy = obs(p=4, rate=16.0, ttft=0.6, prompt=2000.0)
    learned = queue_correction(busy, service, lambda _: 0.4, policy, PolicyState(), 0.05)
    assert learned < 1.0
    # 1 req/s on 4 replicas: the model expects no waiting, so nothing is learned
    idle = obs(p=4, rate=1.0, ttft=0.45, prompt=2000.0)
    assert queue_correction(idle, service, lambda _: 0.4, policy, PolicyState(), 0.05) == 1.0


def test_model_based_decode_shrink_must_be_proven_by_the_observed_itl() -> None:
    # the model says one decode replica holds 40 running sequences, but ITL p90 is already at 44 ms of
    # a 50 ms target on two: halving the replicas would breach it, so decode holds
    policy = spec(algorithm="model-based", **FREE)
    o = obs(p=2, d=2, rate=2.0, itl=0.044, running=40.0, kv=0.2, prompt=1000.0, output=200.0)
    d, _ = run(o, policy, bounds=MB_BOUNDS)
    assert d.decode == 2
    calm = replace(o, itl=Measured.of(0.012))
    d, _ = run(calm, policy, bounds=MB_BOUNDS)
    assert d.decode == 1


def test_model_based_plans_each_pool_for_its_work_not_the_request_rate() -> None:
    from disagg.policy.model_based import work_plan

    # chat at 20 req/s of 2000-token prompts and 100-token answers gives way to documents: 6 req/s of
    # 7000-token prompts and 300-token answers. Prefill work stays ~40k tokens/s; the window's peak
    # request rate (20) at the new prompt length would plan for 140k tokens/s
    policy = spec(algorithm="model-based")
    now = 600.0
    history = tuple((now - 30.0 * i, 20.0) for i in range(12, 0, -1))
    work = tuple((t, r * 2000.0, r * 100.0) for t, r in history)
    state = PolicyState(load_history=history, work_history=work)
    prefill = work_plan(state, "prefill", now, 6.0, 7000.0, policy, MB_BOUNDS, 300.0)
    decode = work_plan(state, "decode", now, 6.0, 300.0, policy, MB_BOUNDS, 300.0)
    assert prefill.plan == pytest.approx(40_000.0 / 7000.0, rel=0.05)
    assert prefill.shrink_peak == pytest.approx(40_000.0 / 7000.0, rel=0.05)
    assert decode.plan == pytest.approx(6.0, rel=0.15)  # 2000 tokens/s then, 1800 now
    # an operator restored from memory without a work history plans from the rates at today's lengths
    rates_only = work_plan(
        PolicyState(load_history=history), "prefill", now, 6.0, 7000.0, policy, MB_BOUNDS, 300.0
    )
    assert rates_only.plan > 2.5 * prefill.plan


def test_a_queue_growing_at_each_evaluation_is_read_as_arrivals_outrunning_the_pool() -> None:
    from disagg.policy.model_based import queue_growth_rate

    # 10 -> 130 -> 400 requests over two evaluations: arrivals outrun 2 ready replicas by 9 req/s now
    assert queue_growth_rate(((0.0, 10.0), (30.0, 130.0)), 60.0, 400.0, 2) == pytest.approx(9.0)
    # a burst shorter than an evaluation fills the queue once; it is already draining
    assert queue_growth_rate(((0.0, 10.0), (30.0, 400.0)), 60.0, 150.0, 2) == 0.0
    # one sample of history is not a trend, and a queue within one request per replica is noise
    assert queue_growth_rate(((30.0, 10.0),), 60.0, 400.0, 2) == 0.0
    assert queue_growth_rate(((0.0, 0.0), (30.0, 1.0)), 60.0, 2.0, 4) == 0.0


def test_model_based_grows_prefill_ahead_of_the_window_when_its_queue_keeps_growing() -> None:
    policy = spec(algorithm="model-based", **FREE)
    o = obs(t=60.0, p=2, d=2, rate=14.0, prompt=1400.0, output=200.0, ttft=0.8)
    o = replace(o, prefill=replace(o.prefill, queue_depth=Measured.of(400.0)))
    calm, _ = run(o, policy, bounds=MB_BOUNDS)
    growing = PolicyState(prefill_queue=((0.0, 10.0), (30.0, 130.0)))
    ahead, _ = run(o, policy, state=growing, bounds=MB_BOUNDS)
    assert ahead.prefill > calm.prefill


def test_a_prefill_pool_caught_out_by_returning_traffic_keeps_the_level_it_returned_to() -> None:
    # chat at 5 req/s of 2000-token prompts now; for most of the last hour code traffic brought 40k
    # prompt tokens/s, and once it came back it outran the pool. A pool caught out like that keeps what
    # the hour's busier level needs; one never caught out shrinks to today's need
    policy = spec(algorithm="model-based", **FREE)
    now = 3600.0
    o = obs(t=now, p=6, d=2, rate=5.0, prompt=2000.0, output=200.0, ttft=0.5)
    # code (40k tokens/s) until 10 minutes ago, chat (10k) since
    work = tuple((now - 30.0 * i, 40_000.0 if i > 20 else 10_000.0, 2_000.0) for i in range(110, 0, -1))
    calm = PolicyState(work_history=work, load_history=tuple((t, 5.0) for t, _, _ in work))
    shrunk, _ = run(o, policy, state=calm, bounds=MB_BOUNDS)
    caught = replace(calm, prefill_fell_behind=(now - 1800.0,))
    kept, state = run(o, policy, state=caught, bounds=MB_BOUNDS)
    assert shrunk.prefill < kept.prefill <= 6
    assert state.prefill_fell_behind == (now - 1800.0,)  # remembered for an hour
    _, later = run(replace(o, time=now + 1900.0), policy, state=state, bounds=MB_BOUNDS)
    assert later.prefill_fell_behind == ()


def test_decode_keeps_the_output_work_a_returning_regime_brings_back() -> None:
    # chat's long answers (40 req/s x 400 tokens: 16k output tokens/s) for most of the last hour, code's
    # short ones (2k tokens/s) for the last ten minutes. Where traffic has already switched regimes and
    # come back (prefill was caught out within the hour), decode keeps what the hour's busier output
    # work needs instead of shrinking to the code phase's need; otherwise it shrinks
    policy = spec(algorithm="model-based", **FREE)
    now = 3600.0
    o = obs(t=now, p=2, d=8, rate=40.0, prompt=1000.0, output=50.0, ttft=0.4, itl=0.02, running=20.0, kv=0.1)
    work = tuple((now - 30.0 * i, 40_000.0, 16_000.0 if i > 20 else 2_000.0) for i in range(110, 0, -1))
    calm = PolicyState(work_history=work, load_history=tuple((t, 40.0) for t, _, _ in work))
    shrunk, _ = run(o, policy, state=calm, bounds=MB_BOUNDS)
    kept, _ = run(o, policy, state=replace(calm, prefill_fell_behind=(now - 1800.0,)), bounds=MB_BOUNDS)
    assert shrunk.decode < kept.decode <= 8


def test_a_cold_start_drains_the_backlog_the_queue_will_hold_when_new_replicas_serve() -> None:
    # the first evaluation: no queue history, 60 requests queued at 2 prefill replicas that compute about
    # 21 req/s of 4000-token prompts while 60 arrive. The queue grows by the difference until replicas
    # asked for now are ready; that backlog, not today's 60, is what they must drain
    from disagg.policy.model_based import startup_horizon_s

    policy = spec(algorithm="model-based", **FREE)
    o = obs(t=30.0, p=2, d=2, rate=60.0, prompt=4000.0, output=200.0, ttft=5.0)
    o = replace(o, prefill=replace(o.prefill, queue_depth=Measured.of(60.0)))
    d, _ = run(o, policy, bounds=MB_BOUNDS)
    said = " ".join(r.message for r in d.reasons if r.role == "prefill")
    match = re.search(r"backlog of 60 \((\d+) once replicas asked for now serve\) drains at ([0-9.]+)", said)
    assert match is not None, said
    grown, rate = float(match.group(1)), float(match.group(2))
    lookahead = float(policy.model_based.lookahead_seconds)
    assert 60.0 + 30.0 * lookahead < grown < 60.0 + 60.0 * lookahead
    assert rate == pytest.approx(grown / startup_horizon_s(policy, MB_BOUNDS), rel=0.01)
    # arrivals the ready replicas keep up with grow nothing: the queue is all there is
    calm = replace(o, request_rate=Measured.of(10.0))
    d, _ = run(calm, policy, bounds=MB_BOUNDS)
    said = " ".join(r.message for r in d.reasons if r.role == "prefill")
    assert "backlog of 60 drains at" in said


def test_a_recurring_burst_is_measured_in_prompt_tokens_above_the_usual_level() -> None:
    from disagg.policy.model_based import PEAK_RECURRENCE, is_prefill_peak, recurring_burst

    now = 3600.0
    # an hour at 20k prompt tokens/s; bursts lift a 120 s window's average to 36k (1.92M tokens more)
    work = tuple((now - 30.0 * i, 20_000.0, 2_000.0) for i in range(110, 0, -1))
    usual = PolicyState(work_history=work)
    assert is_prefill_peak(usual, now, 36_000.0)
    assert not is_prefill_peak(usual, now, 22_000.0)  # noise around the usual level
    assert not is_prefill_peak(PolicyState(work_history=work[-5:]), now, 36_000.0)  # no baseline yet
    # each burst shows at two evaluations in a row (the window slides over it): one episode, its highest
    peaks = tuple(
        p
        for k in range(PEAK_RECURRENCE)
        for p in ((now - 900.0 * (k + 1), 34_000.0), (now - 900.0 * (k + 1) + 30.0, 36_000.0))
    )
    assert recurring_burst(replace(usual, prefill_peaks=peaks), now, 120.0, 150.0) == pytest.approx(
        16_000.0 * 120.0
    )
    # fewer episodes than PEAK_RECURRENCE within the hour are not a pattern yet
    assert recurring_burst(replace(usual, prefill_peaks=peaks[2:]), now, 120.0, 150.0) == 0.0
    # and episodes older than the hour are forgotten
    assert recurring_burst(replace(usual, prefill_peaks=peaks), now + 2000.0, 120.0, 150.0) < 16_000.0 * 120.0


def test_recurring_bursts_keep_the_prefill_pool_that_computes_them_between_bursts() -> None:
    # between bursts: 14 req/s of 1400-token prompts, latencies fine; the pool grew to 11 for the bursts.
    # Without memory of the bursts the model shrinks it; with three bursts of ~2M prompt tokens in the
    # hour it keeps the replicas that compute one within an evaluation interval, and says so
    from disagg.policy.model_based import PEAK_RECURRENCE

    policy = spec(algorithm="model-based", **FREE)
    now = 3600.0
    o = obs(t=now, p=11, d=4, rate=14.0, prompt=1400.0, output=200.0, ttft=0.6)
    work = tuple((now - 30.0 * i, 14.0 * 1400.0, 14.0 * 200.0) for i in range(110, 0, -1))
    calm = PolicyState(work_history=work, load_history=tuple((t, 14.0) for t, _, _ in work))
    shrunk, _ = run(o, policy, state=calm, bounds=MB_BOUNDS)
    peaks = tuple((now - 600.0 * (k + 1), 14.0 * 1400.0 + 2.0e6 / 120.0) for k in range(PEAK_RECURRENCE))
    bursty = replace(calm, prefill_peaks=peaks)
    kept, state = run(o, policy, state=bursty, bounds=MB_BOUNDS)
    assert shrunk.prefill < kept.prefill
    assert state.prefill_peaks == peaks  # remembered, not added to: no breach now
    said = " ".join(r.message for r in kept.reasons if r.role == "prefill")
    assert "recurring bursts of 2e+06 prompt tokens" in said


def test_a_prefill_breach_at_a_peak_is_remembered() -> None:
    policy = spec(algorithm="model-based", **FREE)
    now = 3600.0
    work = tuple((now - 30.0 * i, 14.0 * 1400.0, 14.0 * 200.0) for i in range(110, 0, -1))
    calm = PolicyState(work_history=work, load_history=tuple((t, 14.0) for t, _, _ in work))
    # a burst: the window's rate up to 26 req/s of longer prompts, 400 requests queued at prefill
    o = obs(t=now, p=6, d=4, rate=26.0, prompt=2600.0, output=200.0, ttft=9.0)
    o = replace(o, prefill=replace(o.prefill, queue_depth=Measured.of(400.0)))
    _, state = run(o, policy, state=calm, bounds=MB_BOUNDS)
    assert [t for t, _ in state.prefill_peaks] == [now]
    assert state.prefill_peaks[0][1] == pytest.approx(26.0 * 2600.0, rel=0.05)


def _shrinkable_decode(now: float) -> tuple[Observation, RatioPolicySpec, Bounds]:
    """2 decode replicas at 20% KV and ITL 26 ms with 20 sequences running: the 70B model proves one
    replica enough (see test_decode_shrinks_further_when_the_profile_gives_the_step_shape)."""
    o = obs(
        t=now,
        p=8,
        d=2,
        ttft=3.0,
        queue=0.0,
        prefill_time=1.5,
        rate=3.0,
        prompt=4000.0,
        itl=0.026,
        running=20.0,
    )
    o = replace(o, decode=replace(o.decode, kv_usage=Measured.of(0.2)))
    profiled = replace(BOUNDS, profile=ServingProfile("llama-3.1-70b", "h100", 2, 2, "fp8"))
    return o, spec(algorithm="model-based", **TEN_S, **FREE), profiled


def test_a_decode_shrink_is_proven_against_the_kv_peak_of_the_scale_down_window() -> None:
    # one scrape reads 20% KV, but a minute ago the pool held 80% of each cache with twice the sequences:
    # heavy-tailed contexts swing KV use between scrapes, and one replica would not have held that
    now = 5000.0
    o, policy, bounds = _shrinkable_decode(now)
    policy = policy.model_copy(
        update={"scale_down": policy.scale_down.model_copy(update={"stabilization_window_seconds": 300})}
    )
    # the window's earlier evaluations already wanted one replica
    wanted = PolicyState(recommendations=tuple(Recommendation(now - 30.0 * k, 8, 1) for k in range(1, 11)))
    shrunk, state = run(o, policy, wanted, bounds)
    held, _ = run(o, policy, replace(wanted, decode_load=((now - 60.0, 0.8 * 2, 40.0, 1.0),)), bounds)
    # outside the window: forgotten
    again, _ = run(o, policy, replace(wanted, decode_load=((now - 900.0, 0.8 * 2, 40.0, 1.0),)), bounds)
    assert held.decode == 2
    assert shrunk.decode == again.decode == 1
    assert state.decode_load == (
        (now, 0.2 * 2, 20.0, 200.0 * (4000.0 + 100.0)),
    )  # the pool's KV in replica caches, recorded


def test_a_decode_breach_grows_the_pool_only_once_its_last_growth_served_a_window() -> None:
    # ITL breached over the metric window; decode grew 30 s ago, so the window mostly describes the
    # smaller pool: no +1 on top. Grown long ago: the breach is the present pool's, +1
    policy = spec(algorithm="model-based", **FREE)
    now = 2000.0
    o = obs(t=now, d=3, itl=0.09, rate=4.0, kv=0.3, running=30.0)
    fresh, _ = run(o, policy, PolicyState(last_scale_up={"decode": now - 30.0}), MB_BOUNDS)
    settled, _ = run(o, policy, PolicyState(last_scale_up={"decode": now - 3000.0}), MB_BOUNDS)
    assert settled.decode == 4
    assert fresh.decode == 3


@pytest.mark.parametrize("example", ["deepseek-r1-wideep-vllm.yaml", "deepseek-r1-wideep-sglang.yaml"])
def test_model_based_sizes_a_wide_ep_deployment_with_its_own_layout(example: str) -> None:
    # a decode replica of 4 nodes x 8 GPUs (DP32, EP32): the latency model is the MoE one under that
    # layout, not a 32-way tensor-parallel dense model (which does not exist, and fell back to slo-feedback)
    from pathlib import Path

    import yaml

    from disagg.api.deployment import DisaggregatedDeployment
    from disagg.policy.bounds import bounds_for

    path = Path(__file__).parents[2] / "examples" / example
    doc = next(
        d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "DisaggregatedDeployment"
    )
    bounds = bounds_for(DisaggregatedDeployment.model_validate(doc))
    assert bounds.profile is not None and bounds.profile.layout_decode is not None
    assert bounds.profile.layout_decode.dp * bounds.profile.layout_decode.tp == bounds.decode.gpus_per_replica
    policy = spec(algorithm="model-based", **FREE)
    d, _ = run(obs(rate=20.0, prompt=2000.0, output=500.0), policy, bounds=bounds)
    assert "ModelUnavailable" not in codes(d)
    decode = [r for r in d.reasons if r.role == "decode"]
    assert decode and all(r.code != "MetricsMissing" for r in decode)


def test_a_prompt_longer_than_the_token_budget_shares_its_last_step_at_load() -> None:
    # 10k tokens over an 8192-token budget: one step full of its own tokens, and a last chunk of 1808
    # tokens that, under load, shares its step with the prompts that arrived meanwhile; a multiple of
    # the budget fills its steps alone whatever the load
    from disagg.policy.capacity import load_models, prefill_latency_at_load

    lm = load_models(ServingProfile("llama-3.1-70b", "h100", 2, 2, "fp8")).prefill
    alone = lm.prefill_time_s([10_000])
    assert prefill_latency_at_load(lm, 10_000, 8192, 0.0) == pytest.approx(alone)
    busy = prefill_latency_at_load(lm, 10_000, 8192, 20_000.0)
    assert alone < busy < alone + lm.prefill_time_s([8192])
    assert prefill_latency_at_load(lm, 16_384, 8192, 20_000.0) == pytest.approx(lm.prefill_time_s([16_384]))


def test_a_decode_shrink_fits_the_kv_a_rising_request_footprint_will_bring() -> None:
    # the window's requests held a third of the KV each one brings now (output x context): the mix is
    # moving toward longer answers or prompts. At 20% KV the survivor would hold 2 x 20% x 3: no shrink;
    # at 2% KV the same growth fits one replica easily (a blanket hold kept an idle pool at two)
    now = 5000.0
    o, policy, bounds = _shrinkable_decode(now)
    policy = policy.model_copy(
        update={"scale_down": policy.scale_down.model_copy(update={"stabilization_window_seconds": 300})}
    )
    footprint = 200.0 * (4000.0 + 100.0)
    wanted = PolicyState(recommendations=tuple(Recommendation(now - 30.0 * k, 8, 1) for k in range(1, 11)))
    rising = replace(wanted, decode_load=((now - 120.0, 0.1, 10.0, footprint / 3),))
    held, _ = run(o, policy, rising, bounds)
    idle = replace(o, decode=replace(o.decode, kv_usage=Measured.of(0.02)))
    shrunk, _ = run(idle, policy, rising, bounds)
    steady, _ = run(o, policy, replace(wanted, decode_load=((now - 120.0, 0.1, 10.0, footprint),)), bounds)
    assert held.decode == 2
    assert shrunk.decode == steady.decode == 1
