"""The baselines behave as their public descriptions say."""

from __future__ import annotations

import itertools

from disagg.policy.baselines import (
    ApaSettings,
    ApaState,
    DynamoSettings,
    DynamoState,
    apa_desired,
    apa_step,
    dynamo_throughput_step,
)
from disagg.policy.capacity import load_models
from disagg.policy.types import Measured, Observation, RoleObservation, ServingProfile

MODELS = load_models(ServingProfile("llama-3.1-8b", "h100"))


def obs(
    t: float,
    rate: float,
    prompt: float = 1000.0,
    output: float = 200.0,
    p: int = 1,
    d: int = 1,
    running: float = 20.0,
    prefill_running: float = 4.0,
    kv: float = 0.5,
    waiting: float = 0.0,
) -> Observation:
    return Observation(
        time=t,
        prefill=RoleObservation(p, p, running=Measured.of(prefill_running), queue_depth=Measured.of(waiting)),
        decode=RoleObservation(d, d, running=Measured.of(running), kv_usage=Measured.of(kv)),
        ttft=Measured.of(0.2),
        itl=Measured.of(0.02),
        request_rate=Measured.of(rate),
        prompt_tokens_mean=Measured.of(prompt),
        output_tokens_mean=Measured.of(output),
    )


def run_dynamo(
    rate: float, settings: DynamoSettings, prompt: float = 1000.0
) -> list[tuple[float, dict[str, int]]]:
    state = DynamoState()
    out = []
    for t in range(0, 600, 30):
        targets, state = dynamo_throughput_step(
            obs(float(t), rate, prompt), state, float(t), settings, MODELS
        )
        if targets is not None:
            out.append((float(t), targets))
    return out


def test_dynamo_adjusts_every_adjustment_interval_only() -> None:
    decisions = run_dynamo(20.0, DynamoSettings(1.0, 0.05))
    times = [t for t, _ in decisions]
    assert len(times) >= 2 and all(b - a >= 180.0 for a, b in itertools.pairwise(times))


def test_dynamo_replicas_follow_load_and_prompt_length() -> None:
    s = DynamoSettings(1.0, 0.05)
    low = run_dynamo(5.0, s)[-1][1]
    high = run_dynamo(80.0, s)[-1][1]
    longer = run_dynamo(80.0, s, prompt=8000.0)[-1][1]
    assert high["prefill"] >= low["prefill"] and high["decode"] >= low["decode"]
    assert longer["prefill"] > high["prefill"]


def test_dynamo_budget_scales_both_down() -> None:
    s = DynamoSettings(1.0, 0.05, max_gpu_budget=4)
    for _, targets in run_dynamo(200.0, s, prompt=8000.0):
        assert targets["prefill"] + targets["decode"] <= 4


def test_apa_band_and_ratio() -> None:
    s = ApaSettings()
    assert apa_desired(4, 0.65, 0.6, s) == 4  # within +10%
    assert apa_desired(4, 0.9, 0.6, s) == 6  # ceil(4 x 1.5)
    assert apa_desired(4, 0.3, 0.6, s) == 2


def test_apa_scales_each_role_alone_up_at_once() -> None:
    # AIBrix's defaults: no scale-up cooldown; metric averaged over 180 s (see test_baselines.py)
    s = ApaSettings(decode_kv_target=0.5, window_s=1.0)
    targets, state = apa_step(obs(0.0, 5.0, d=2, kv=0.9), ApaState(), 0.0, s)
    assert targets == {"decode": 4}
    again, state = apa_step(obs(30.0, 5.0, d=4, kv=0.9), state, 30.0, s)
    assert again == {"decode": 8}
