"""The policy's memory across an operator restart: round trip, ageing, garbled input, size."""

from __future__ import annotations

import json
from typing import Any

import pytest

from disagg.api.deployment import AutoscalingStatus
from disagg.policy.memory import MAX_SAMPLES, from_memory, memory_patch, to_memory
from disagg.policy.types import PolicyState, Recommendation

NOW = 1_800_000_000.0


def _state(now: float = NOW) -> PolicyState:
    return PolicyState(
        recommendations=(Recommendation(now - 30, 3, 5),),
        last_scale_up={"decode": now - 120.4},
        last_scale_down={"prefill": now - 600.0},
        limited={"decode": 4},
        limited_since={"decode": now - 60},
        correction={"prefill": 1.25, "decode": 0.8, "prefill-wait": 1.1},
        load_history=tuple((now - 15.0 * i, 10.0 + i / 7) for i in range(40, -1, -1)),
        work_history=tuple((now - 15.0 * i, 20_000.0 + 37 * i, 3_000.0 - i) for i in range(40, -1, -1)),
        flaps={"decode": (now - 900.0, now - 300.0)},
        reversals={"prefill": (now - 3000.0, now - 600.0), "decode": (now - 300.0,)},
        prefill_fell_behind=(now - 1200.0,),
        prefill_peaks=((now - 900.0, 61_000.0), (now - 600.0, 58_500.0)),
        decode_load=tuple((now - 30.0 * i, 1.5 + i / 10, 40.0 + i, 5e5 + i) for i in range(10, -1, -1)),
        slo_spend=0.125,
    )


def test_round_trip_keeps_history_corrections_spend_and_moves() -> None:
    state = _state()
    later = NOW + 20.0  # the operator restarts 20 s after the last write
    restored = from_memory(json.loads(json.dumps(to_memory(state, NOW))), later)
    assert restored.correction == state.correction
    assert restored.slo_spend == 0.125
    assert len(restored.load_history) == len(state.load_history)
    for (t0, r0), (t1, r1) in zip(state.load_history, restored.load_history, strict=True):
        assert abs(t0 - t1) <= 0.5 and abs(r0 - r1) <= 0.0005
    assert len(restored.work_history) == len(state.work_history)
    for w0, w1 in zip(state.work_history, restored.work_history, strict=True):
        assert abs(w0[0] - w1[0]) <= 0.5
        assert w1[1] == pytest.approx(w0[1], rel=5e-3) and w1[2] == pytest.approx(w0[2], rel=5e-3)
    assert restored.last_scale_up == {"decode": round(NOW - 120.4)}
    assert restored.last_scale_down == {"prefill": NOW - 600.0}
    assert restored.flaps == {"decode": (NOW - 900.0, NOW - 300.0)}
    assert restored.reversals == {"prefill": (NOW - 3000.0, NOW - 600.0), "decode": (NOW - 300.0,)}
    assert restored.prefill_fell_behind == (NOW - 1200.0,)
    assert restored.prefill_peaks == ((NOW - 900.0, 61_000.0), (NOW - 600.0, 58_500.0))
    assert len(restored.decode_load) == len(state.decode_load)
    for d0, d1 in zip(state.decode_load, restored.decode_load, strict=True):
        assert abs(d0[0] - d1[0]) <= 0.5
        assert all(d1[k] == pytest.approx(d0[k], rel=5e-3) for k in (1, 2, 3))


def test_the_stabilisation_window_and_ceilings_start_fresh() -> None:
    restored = from_memory(to_memory(_state(), NOW), NOW)
    assert restored.recommendations == ()
    assert restored.limited == {} and restored.limited_since == {}


def test_entries_older_than_an_hour_are_dropped_on_restore() -> None:
    state = PolicyState(
        last_scale_up={"decode": NOW - 100.0},
        last_scale_down={"decode": NOW - 1000.0},
        load_history=((NOW - 2000.0, 1.0), (NOW - 100.0, 2.0)),
        flaps={"decode": (NOW - 1500.0, NOW - 200.0), "prefill": (NOW - 1000.0,)},
        correction={"decode": 1.5},
    )
    memory = to_memory(state, NOW)
    restored = from_memory(memory, NOW + 3000.0)  # a long outage: 3000 s later
    assert restored.load_history == ((NOW - 100.0, 2.0),)
    assert restored.last_scale_up == {"decode": NOW - 100.0}
    assert restored.last_scale_down == {}
    assert restored.flaps == {"decode": (NOW - 200.0,)}
    assert restored.correction == {"decode": 1.5}  # learned once, no time attached: kept
    gone = from_memory(memory, NOW + 7200.0)
    assert gone.load_history == () and gone.last_scale_up == {} and gone.flaps == {}


def test_times_from_the_future_never_hold_a_cooldown_forever() -> None:
    memory = to_memory(PolicyState(last_scale_up={"decode": NOW + 30.0, "prefill": NOW + 10_000.0}), NOW)
    assert from_memory(memory, NOW).last_scale_up == {"decode": NOW}


@pytest.mark.parametrize(
    "data",
    [
        None,
        {},
        [],
        "garbage",
        42,
        {"version": 99, "loadHistory": [[NOW, 1.0]]},
        {"version": "1", "correction": {"decode": 2.0}},
    ],
)
def test_unknown_input_restores_a_fresh_state(data: Any) -> None:
    assert from_memory(data, NOW) == PolicyState()


def test_garbled_entries_are_skipped_and_lose_nothing_else() -> None:
    memory: dict[str, Any] = to_memory(_state(), NOW)
    memory["loadHistory"] = [
        *memory["loadHistory"][-3:],
        "x",
        [NOW],
        [NOW, "fast"],
        [True, 1.0],
        [NOW, -1.0],
        [None, None],
        {"t": NOW},
    ]
    memory["correction"] = {**memory["correction"], "nan": float("nan"), "neg": -1.0, "s": "1.0", "": 1.0}
    memory["flaps"] = {"decode": [NOW - 10.0, "soon"], "prefill": "often", "gpu": None}
    memory["reversals"] = {"prefill": [NOW - 20.0, None, NOW + 1e6], "decode": {"t": NOW}}
    memory["lastScaleUp"] = {"decode": "yesterday", "prefill": NOW - 50.0}
    memory["lastScaleDown"] = ["decode", NOW]
    memory["sloSpend"] = "lots"
    memory["decodeLoad"] = [
        *memory["decodeLoad"][-2:],
        [NOW, 1.0, 2.0],
        [NOW, "full", 3.0, 1.0],
        [NOW, -1.0, 2.0, 1.0],
    ]
    restored = from_memory(memory, NOW)
    assert len(restored.load_history) == 3
    assert len(restored.decode_load) == 2
    assert restored.correction == {"prefill": 1.25, "decode": 0.8, "prefill-wait": 1.1}
    assert restored.flaps == {"decode": (NOW - 10.0,)}
    assert restored.reversals == {"prefill": (NOW - 20.0,)}
    assert restored.last_scale_up == {"prefill": NOW - 50.0}
    assert restored.last_scale_down == {}
    assert restored.slo_spend is None


def test_a_restart_keeps_as_many_reversals_as_the_largest_budget_counts() -> None:
    from disagg.api.ratiopolicy import MAX_REVERSALS_PER_HOUR

    # a pool that reversed at every evaluation for an hour: a budget up to the API's largest must still
    # read it as spent after a restart (the flap memory's 16 would read 120 reversals as 16)
    times = tuple(NOW - 30.0 * i for i in range(MAX_REVERSALS_PER_HOUR + 5, 0, -1))
    restored = from_memory(to_memory(PolicyState(reversals={"prefill": times}), NOW), NOW)
    assert restored.reversals["prefill"] == times[-MAX_REVERSALS_PER_HOUR:]


def test_size_is_bounded_and_the_newest_samples_are_kept() -> None:
    state = PolicyState(
        load_history=tuple((NOW - 3599.0 + i * 3.0, 1234.56789 + i) for i in range(1200)),
        work_history=tuple((NOW - 3599.0 + i * 3.0, 123456.789 + i, 9876.54321 + i) for i in range(1200)),
        flaps={"decode": tuple(NOW - i for i in range(500))},
        correction={f"role-{i}": 1.0 for i in range(200)},
        last_scale_up={f"role-{i}": NOW for i in range(200)},
    )
    memory = to_memory(state, NOW)
    assert len(memory["loadHistory"]) == MAX_SAMPLES
    newest_t, newest_rate = state.load_history[-1]
    assert memory["loadHistory"][-1] == [round(newest_t), round(newest_rate, 3)]
    assert len(memory["workHistory"]) == MAX_SAMPLES
    newest_work = state.work_history[-1]  # (t, 124655.789, 11075.54321): three significant digits kept
    assert memory["workHistory"][-1] == [round(newest_work[0]), 125000.0, 11100.0]
    assert len(json.dumps(memory)) < 10_000
    restored = from_memory(memory, NOW)
    assert restored.load_history[-1][0] == round(state.load_history[-1][0])
    assert len(restored.load_history) == MAX_SAMPLES


def test_the_memory_is_rounded_json() -> None:
    memory = to_memory(PolicyState(load_history=((NOW + 0.4, 1.23456),)), NOW + 1.0)
    assert memory["loadHistory"] == [[round(NOW), 1.235]]
    assert json.loads(json.dumps(memory)) == memory


def test_a_merge_patch_removes_what_the_memory_forgot() -> None:
    before = to_memory(_state(), NOW)
    after = to_memory(PolicyState(correction={"decode": 0.9}), NOW + 15.0)
    patch = memory_patch(before, after)
    assert patch["correction"] == {"decode": 0.9, "prefill": None, "prefill-wait": None}
    assert patch["flaps"] == {"decode": None}
    assert patch["loadHistory"] == []  # lists are replaced whole by a merge patch
    assert memory_patch(None, after) == after


def test_the_status_model_keeps_the_memory() -> None:
    memory = to_memory(_state(), NOW)
    status = AutoscalingStatus.model_validate({"policyMemory": memory})
    assert status.policy_memory == memory
    assert status.model_dump(by_alias=True, exclude_none=True)["policyMemory"] == memory
