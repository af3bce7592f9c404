"""The baselines as their sources have them today: Dynamo's load-based and SLA load-based planners, and
AIBrix's APA with its released defaults (the throughput-based Dynamo planner: test_policy_baselines.py)."""

from __future__ import annotations

from dataclasses import replace

from disagg.policy.baselines import (
    SOURCES,
    ApaSettings,
    ApaState,
    DynamoLoadSettings,
    DynamoLoadState,
    DynamoSettings,
    DynamoSlaLoadSettings,
    DynamoSlaLoadState,
    apa_step,
    dynamo_load_step,
    dynamo_sla_load_step,
    estimate_next_ttft,
)
from disagg.policy.capacity import load_models
from disagg.policy.types import Measured, Observation, RoleObservation, ServingProfile

MODELS = load_models(ServingProfile("llama-3.1-8b", "h100"))
PROMPT = 1000.0


def pool(
    n: int, ready: int | None = None, waiting: float = 0.0, running: float = 0.0, kv: float = 0.8
) -> RoleObservation:
    return RoleObservation(
        n,
        n if ready is None else ready,
        queue_depth=Measured.of(waiting),
        running=Measured.of(running),
        kv_usage=Measured.of(kv),
    )


def obs(t: float, prefill: RoleObservation, decode: RoleObservation, rate: float = 5.0) -> Observation:
    return Observation(
        time=t,
        prefill=prefill,
        decode=decode,
        ttft=Measured.of(0.2),
        itl=Measured.of(0.02),
        request_rate=Measured.of(rate),
        prompt_tokens_mean=Measured.of(PROMPT),
        output_tokens_mean=Measured.of(200.0),
    )


# --- Dynamo, load-based (optimization_target: throughput, the default) ---------------------------------

# a context length and a KV capacity that make the thresholds easy to hit with round numbers
LOAD = DynamoLoadSettings(context_length_tokens=8000, kv_capacity_tokens=100_000)


def load_step(o: Observation, s: DynamoLoadSettings = LOAD) -> dict[str, int] | None:
    return dynamo_load_step(o, DynamoLoadState(), o.time, s)[0]


def test_load_prefill_adds_one_engine_at_a_context_length_of_queued_tokens() -> None:
    # 2 engines, 16 requests waiting of 1000 tokens: 8000 queued tokens each = the context length
    assert load_step(obs(0, pool(2, waiting=16), pool(2))) == {"prefill": 3}
    # 7500 each: under the scale-up threshold, over a tenth of it: no change
    assert load_step(obs(0, pool(2, waiting=15), pool(2))) is None
    # a queue of 100 contexts still adds one engine per adjustment
    assert load_step(obs(0, pool(2, waiting=1600), pool(2))) == {"prefill": 3}


def test_load_prefill_removes_one_engine_under_a_tenth_of_a_context() -> None:
    assert load_step(obs(0, pool(3, waiting=2), pool(2))) == {"prefill": 2}  # 667 < 800 tokens each
    assert load_step(obs(0, pool(3, waiting=3), pool(2))) is None  # 1000 >= 800
    assert load_step(obs(0, pool(1, waiting=0), pool(1))) is None  # never below one engine


def test_load_decode_counts_queued_kv_and_scales_over_full_and_under_60_percent() -> None:
    # KV 95% used: under 100%, over 60%: no change
    assert load_step(obs(0, pool(2, waiting=4), pool(2, kv=0.95))) is None
    # plus 10 requests of 1000 tokens waiting per engine: 105% of the cache: one more engine
    assert load_step(obs(0, pool(2, waiting=4), pool(2, waiting=20, kv=0.95))) == {"decode": 3}
    assert load_step(obs(0, pool(2, waiting=4), pool(3, kv=0.55))) == {"decode": 2}


def test_load_observes_only_while_a_pool_is_scaling() -> None:
    starting = obs(0, pool(3, ready=2, waiting=40), pool(2, waiting=20, kv=0.95))
    assert load_step(starting) is None
    draining = obs(0, pool(2, waiting=40), pool(3, ready=2, kv=0.1))
    assert load_step(draining) is None


def test_load_latency_target_scales_earlier() -> None:
    latency = replace(LOAD, target="latency")
    o = obs(0, pool(2, waiting=4), pool(2, kv=0.65))  # 2000 queued tokens = 0.25 contexts; KV 65%
    assert load_step(o) is None
    assert load_step(o, latency) == {"prefill": 3, "decode": 3}
    # latency shrinks prefill only with empty queues, decode under 10% KV
    assert load_step(obs(0, pool(3, waiting=1), pool(3, kv=0.05)), latency) == {"decode": 2}
    assert load_step(obs(0, pool(3, waiting=0), pool(3, kv=0.05)), latency) == {"prefill": 2, "decode": 2}


def test_load_target_uses_the_users_absolute_thresholds() -> None:
    user = replace(
        LOAD,
        target="load",
        prefill_scale_up_queue_tokens=4000,
        prefill_scale_down_queue_tokens=1000,
        decode_scale_up_kv_rate=80.0,
        decode_scale_down_kv_rate=40.0,
    )
    assert load_step(obs(0, pool(2, waiting=8), pool(2, kv=0.8)), user) == {"prefill": 3, "decode": 3}
    assert load_step(obs(0, pool(3, waiting=3), pool(3, kv=0.4)), user) == {"prefill": 2, "decode": 2}
    assert load_step(obs(0, pool(2, waiting=4), pool(2, kv=0.6)), user) is None
    # without its thresholds the "load" target does not scale at all
    assert load_step(obs(0, pool(2, waiting=80), pool(2, kv=0.99)), replace(LOAD, target="load")) is None


def test_load_adjusts_once_per_interval_and_keeps_the_gpu_budget() -> None:
    s = replace(LOAD, adjustment_interval_s=60.0)
    busy = obs(0, pool(2, waiting=40), pool(2, waiting=20, kv=0.95))
    first, state = dynamo_load_step(busy, DynamoLoadState(), 0.0, s)
    assert first == {"prefill": 3, "decode": 3}
    again, state = dynamo_load_step(busy, state, 30.0, s)
    assert again is None
    later, _ = dynamo_load_step(busy, state, 60.0, s)
    assert later == {"prefill": 3, "decode": 3}
    budget = replace(LOAD, max_gpu_budget=8, prefill_gpus_per_engine=2, decode_gpus_per_engine=2)
    assert load_step(busy, budget) is None  # 2 + 2 engines x 2 GPUs: the budget is full


def test_load_takes_the_kv_capacity_from_the_latency_model() -> None:
    s = replace(LOAD, kv_capacity_tokens=None)
    waiting = MODELS.decode.kv_capacity_tokens // 1000  # a whole cache of 1000-token requests per engine
    o = obs(0, pool(1), pool(1, waiting=waiting, kv=0.5))
    assert dynamo_load_step(o, DynamoLoadState(), 0.0, s, MODELS)[0] == {"decode": 2}
    assert dynamo_load_step(o, DynamoLoadState(), 0.0, s)[0] is None  # no capacity: KV usage alone


# --- Dynamo, SLA load-based (optimization_target: sla, enable_load_scaling) ----------------------------

SLA = DynamoSlaLoadSettings(ttft_target_s=0.5, itl_target_s=0.01)
CALM = pool(1, running=4, kv=0.01)  # one decode engine, 4 short sequences: within the ITL SLA


def sla_step(o: Observation, s: DynamoSlaLoadSettings = SLA) -> dict[str, int] | None:
    return dynamo_sla_load_step(o, DynamoSlaLoadState(), o.time, s, MODELS)[0]


def test_ttft_estimate_chunks_the_queue_and_grows_with_it() -> None:
    own = estimate_next_ttft(MODELS.prefill, 0, PROMPT, 8192)
    assert own == MODELS.prefill.prefill_time_s([1000])
    times = [estimate_next_ttft(MODELS.prefill, q, PROMPT, 8192) for q in (0, 8000, 16000, 32000)]
    assert times == sorted(times) and times[-1] > 3 * times[1]


def test_sla_prefill_adds_an_engine_when_the_estimated_ttft_misses() -> None:
    queued = 30_000  # tokens per engine
    assert estimate_next_ttft(MODELS.prefill, queued, PROMPT, 8192) > SLA.ttft_target_s
    assert sla_step(obs(0, pool(2, waiting=2 * queued / PROMPT), CALM)) == {"prefill": 3}


def test_sla_prefill_removes_an_engine_only_if_the_survivors_keep_the_ttft() -> None:
    assert sla_step(obs(0, pool(3, waiting=0), CALM)) == {"prefill": 2}
    # 10k tokens queued on each of 2 engines: fine now (TTFT about 0.25 s), but one engine would hold
    # 20k: queue-induced TTFT about 0.43 s > (0.5 s - own prefill) x 0.8
    assert estimate_next_ttft(MODELS.prefill, 10_000, PROMPT, 8192) < SLA.ttft_target_s
    assert sla_step(obs(0, pool(2, waiting=20), CALM)) is None
    # a less sensitive planner scales down anyway
    relaxed = replace(SLA, scale_down_sensitivity=1.0)
    assert sla_step(obs(0, pool(2, waiting=20), CALM), relaxed) == {"prefill": 1}


def test_sla_decode_follows_the_estimated_itl() -> None:
    cap = MODELS.decode.kv_capacity_tokens
    # 20 sequences of 1600 tokens per engine: a step over the 10 ms target
    heavy = pool(2, running=40, kv=20 * 1600 / cap)
    assert MODELS.decode.decode_step_time_s(21, 21 * 1600) > SLA.itl_target_s
    assert sla_step(obs(0, pool(1), heavy)) == {"decode": 3}
    light = pool(3, running=6, kv=2 * 1200 / cap)  # 2 sequences per engine
    assert sla_step(obs(0, pool(1), light)) is None  # 4 per engine would take over 80% of 10 ms
    assert sla_step(obs(0, pool(1), light), replace(SLA, itl_target_s=0.02)) == {"decode": 2}
    # the survivors' KV would not fit the cache: no scale-down, however fast the step
    full = pool(2, running=4, kv=0.6)
    assert sla_step(obs(0, pool(1), full), replace(SLA, itl_target_s=10.0)) is None


def test_sla_throughput_floor_lifts_the_load_decision() -> None:
    both = replace(SLA, throughput=DynamoSettings(1.0, 0.05))
    state = DynamoSlaLoadState()
    out: list[tuple[float, dict[str, int]]] = []
    for t in range(0, 211, 30):
        o = obs(float(t), pool(1, running=1), CALM, rate=60.0)
        targets, state = dynamo_sla_load_step(o, state, float(t), both, MODELS)
        if targets is not None:
            out.append((float(t), targets))
    # load-based alone sees idle engines; at 180 s the throughput-based floor sizes the pools for 60 req/s
    assert out and out[0][0] == 180.0 and out[0][1]["prefill"] > 1 and state.floor[0] > 1


def test_sla_observes_only_while_a_pool_is_scaling() -> None:
    assert sla_step(obs(0, pool(2, ready=1, waiting=60), CALM)) is None


# --- AIBrix APA, released defaults ---------------------------------------------------------------------

INSTANT = ApaSettings(window_s=1.0)  # no averaging: isolates the other rules


def decode_only(t: float, d: int, kv: float, ready: int | None = None) -> Observation:
    return obs(t, pool(1, waiting=0, running=4), pool(d, ready=ready, kv=kv))


def test_apa_defaults_are_aibrixs() -> None:
    s = ApaSettings()
    assert (s.window_s, s.up_tolerance, s.down_tolerance) == (180.0, 0.1, 0.1)
    assert (s.max_scale_up_rate, s.max_scale_down_rate) == (2.0, 2.0)
    assert (s.scale_up_cooldown_s, s.scale_down_cooldown_s, s.scale_down_pick) == (0.0, 300.0, "min")
    assert set(SOURCES) == {"dynamo-throughput", "dynamo-load", "dynamo-sla-load", "aibrix-apa"}


def test_apa_scales_up_at_once_and_at_most_doubles() -> None:
    targets, _ = apa_step(decode_only(0, 2, kv=0.9), ApaState(), 0.0, ApaSettings())
    assert targets == {"decode": 3}  # ceil(2 x 0.9 / 0.6), on the first evaluation
    targets, _ = apa_step(decode_only(0, 3, kv=6.0), ApaState(), 0.0, ApaSettings())
    assert targets == {"decode": 6}  # x10 asked, x2 allowed


def test_apa_never_more_than_halves() -> None:
    targets, _ = apa_step(decode_only(0, 9, kv=0.0), ApaState(), 0.0, ApaSettings())
    assert targets == {"decode": 4}  # floor(9 / 2)


def test_apa_averages_the_metric_over_180_s() -> None:
    s = ApaSettings()
    state = ApaState()
    # five evaluations at the target, then a spike to 0.9: the 180 s mean is 0.65, inside the +10% band
    for t in range(0, 121, 30):
        targets, state = apa_step(decode_only(t, 4, kv=0.6), state, float(t), s)
        assert targets is None
    targets, state = apa_step(decode_only(150, 4, kv=0.9), state, 150.0, s)
    assert targets is None
    assert apa_step(decode_only(150, 4, kv=0.9), ApaState(), 150.0, s)[0] == {"decode": 6}  # no history
    # a spike 180 s old has left the window
    state = ApaState()
    _, state = apa_step(decode_only(0, 4, kv=3.0), state, 0.0, replace(s, max_replicas=4))
    for t in range(30, 151, 30):
        _, state = apa_step(decode_only(t, 4, kv=0.6), state, float(t), s)
    assert [t for t, _ in state.samples["decode"]] == [0.0, 30.0, 60.0, 90.0, 120.0, 150.0]
    targets, state = apa_step(decode_only(180, 4, kv=0.6), state, 180.0, s)
    assert targets is None and state.samples["decode"][0][0] == 30.0


def test_apa_scale_down_window_takes_the_lowest_recent_recommendation() -> None:
    # AIBrix's stabilizeRecommendation: scale-down picks the minimum within 300 s, so a scale-down is
    # not delayed; it can even undercut the present recommendation
    state = ApaState()
    first, state = apa_step(decode_only(0, 8, kv=0.0), state, 0.0, INSTANT)
    assert first == {"decode": 4}
    up, state = apa_step(decode_only(30, 4, kv=0.9), state, 30.0, INSTANT)
    assert up == {"decode": 6}  # scale-up window 0 s: at once
    down, state = apa_step(decode_only(60, 6, kv=0.45), state, 60.0, INSTANT)
    assert down == {"decode": 4}  # recommended ceil(6 x 0.75) = 5; the 4 of 60 s ago wins


def test_apa_hpa_style_scale_down_waits_out_the_300_s_window() -> None:
    hpa = replace(INSTANT, scale_down_pick="max")
    state = ApaState()
    for t in range(0, 271, 30):
        targets, state = apa_step(decode_only(t, 4, kv=0.6), state, float(t), hpa)
        assert targets is None
    downs = []
    for t in range(300, 601, 30):
        targets, state = apa_step(decode_only(t, 4, kv=0.25), state, float(t), hpa)
        downs.append((t, targets))
    # the last recommendation of 4 was at 270 s: held until it is 300 s old
    assert all(targets is None for t, targets in downs if t < 570)
    assert dict(downs)[570] == {"decode": 2}
    released, _ = apa_step(decode_only(300, 4, kv=0.25), ApaState(), 300.0, INSTANT)
    assert released == {"decode": 2}


def test_apa_scales_each_role_on_its_own_metric() -> None:
    s = ApaSettings(window_s=1.0)
    busy_prefill = obs(0, pool(2, waiting=10, running=6), pool(3, kv=0.6))  # 8 per replica vs 4
    targets, _ = apa_step(busy_prefill, ApaState(), 0.0, s)
    assert targets == {"prefill": 4}
    # AIBrix's P/D sample metric: waiting only, target 10; 5 per replica is half of it
    waiting_only = replace(s, prefill_metric="waiting", prefill_target_per_replica=10.0)
    assert apa_step(busy_prefill, ApaState(), 0.0, waiting_only)[0] == {"prefill": 1}
    assert apa_step(busy_prefill, ApaState(), 0.0, replace(waiting_only, down_tolerance=0.6))[0] is None


def test_apa_pending_guard_counts_starting_pods_as_missing() -> None:
    starting = decode_only(0, 4, kv=0.9, ready=2)
    assert apa_step(starting, ApaState(), 0.0, INSTANT)[0] == {"decode": 6}
    assert apa_step(starting, ApaState(), 0.0, replace(INSTANT, pending_guard=True))[0] is None
