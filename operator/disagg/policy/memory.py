"""What the ratio policy remembers across an operator restart (``status.autoscaling.policyMemory``).

Between evaluations the PolicyState lives in the operator's memory only; a restarted operator would
start blind: no request-rate history for the forecast and the shrink window, no learned corrections, no
error-budget spend, no record of recent moves for the cooldowns and flap damping. :func:`to_memory`
writes the part worth keeping as a small JSON object the controller stores in status after every
evaluation; :func:`from_memory` reads it back when the operator has no state of its own.

Not kept: the stabilisation window's recommendations and the Pending-pod ceilings (``limited``,
``limited_since``). The window starts fresh, the present allocation standing for the past, as
:func:`disagg.policy.decide` does for a new deployment, and ceilings are learned again from the pods.

Times are absolute (the live operator's clock is wall-clock epoch seconds), rounded to the second;
entries older than :data:`MAX_AGE_S` are dropped on restore, as are entries from the future beyond a
small clock skew (a cooldown that would otherwise never end). Anything garbled restores to a fresh
PolicyState, never an error: losing the memory only costs a blind start, which is what happens anyway
without it.

Pure: no I/O, no kopf, no Kubernetes client.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from disagg.api.ratiopolicy import MAX_REVERSALS_PER_HOUR
from disagg.policy.types import PolicyState

VERSION = 1
MAX_AGE_S = 3600.0  # the API's longest stabilisation window: nothing older still matters
MAX_SAMPLES = 120  # load_history and work_history samples kept (newest)
MAX_FLAPS = 16  # flap times kept per role (newest)
# reversal times kept per role (newest): as many as RatioPolicy.maxReversalsPerHour may allow, so a
# restart never reads a spent budget as a fresh one
MAX_REVERSALS = MAX_REVERSALS_PER_HOUR
MAX_KEYS = 16  # entries kept in each per-role/per-name dict (roles, correction names)
MAX_KEY_LENGTH = 63
CLOCK_SKEW_S = 60.0  # times up to this far ahead of now are read as now, beyond it they are dropped


def _time(t: float) -> int:
    return round(t)


def _rate(r: float) -> float:
    return round(r, 3)


def _work(w: float) -> float:
    """Tokens/s to three significant digits: plenty for planning, and short in status."""
    return float(f"{w:.3g}")


def _finite(value: Any) -> float | None:
    """A finite float from a JSON number (bools are not numbers here), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def _keys(d: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in d if isinstance(k, str) and 0 < len(k) <= MAX_KEY_LENGTH)[:MAX_KEYS]


def to_memory(state: PolicyState, now: float) -> dict[str, Any]:
    """The compact, JSON-able memory of ``state`` at ``now`` (wall-clock seconds)."""
    history = [
        [_time(t), _rate(r)]
        for t, r in state.load_history
        if _finite(t) is not None and _finite(r) is not None and now - t <= MAX_AGE_S
    ][-MAX_SAMPLES:]
    work = _samples(state.work_history, now)[-MAX_SAMPLES:]
    correction = {k: v for k in _keys(state.correction) if (v := _finite(state.correction[k])) is not None}
    return {
        "version": VERSION,
        "savedAt": _time(now),
        "loadHistory": history,
        "workHistory": work,
        "correction": correction,
        "sloSpend": _finite(state.slo_spend),
        "flaps": _role_times(state.flaps, now, MAX_FLAPS),
        "reversals": _role_times(state.reversals, now, MAX_REVERSALS),
        "prefillFellBehind": _recent(state.prefill_fell_behind, now)[-MAX_FLAPS:],
        "decodeLoad": _samples(state.decode_load, now)[-MAX_SAMPLES:],
        "prefillPeaks": _samples(state.prefill_peaks, now)[-MAX_SAMPLES:],
        "lastScaleUp": _times(state.last_scale_up, now),
        "lastScaleDown": _times(state.last_scale_down, now),
    }


def _role_times(times: Mapping[str, tuple[float, ...]], now: float, keep: int) -> dict[str, list[int]]:
    """Per role, the newest ``keep`` times still within MAX_AGE_S."""
    return {k: kept for k in _keys(times) if (kept := _recent(times[k], now)[-keep:])}


def _samples(samples: Any, now: float) -> list[list[float]]:
    """Timed samples (time, value, ...) still within MAX_AGE_S, values to three significant digits."""
    return [
        [_time(x[0]), *(_work(v) for v in x[1:])]
        for x in samples
        if all(_finite(v) is not None for v in x) and now - x[0] <= MAX_AGE_S
    ]


def _restore_samples(value: Any, now: float, width: int) -> list[tuple[float, ...]]:
    """Timed samples of ``width`` numbers (time first, the rest >= 0), oldest first; garbled ones
    dropped."""
    out: list[tuple[float, ...]] = []
    for sample in value if isinstance(value, list) else ():
        if not isinstance(sample, list | tuple) or len(sample) != width:
            continue
        t, rest = _restore_time(sample[0], now), [_finite(v) for v in sample[1:]]
        if t is not None and all(v is not None and v >= 0 for v in rest):
            out.append((t, *(v for v in rest if v is not None)))
    return sorted(out, key=lambda x: x[0])


def _recent(times: Any, now: float) -> list[int]:
    return [_time(t) for t in times if _finite(t) is not None and now - t <= MAX_AGE_S]


def _times(d: Mapping[str, float], now: float) -> dict[str, int]:
    return {k: _time(d[k]) for k in _keys(d) if _finite(d[k]) is not None and now - d[k] <= MAX_AGE_S}


def _restore_time(value: Any, now: float) -> float | None:
    """A stored time that still matters at ``now``: None when garbled, too old or too far ahead."""
    t = _finite(value)
    if t is None or now - t > MAX_AGE_S or t - now > CLOCK_SKEW_S:
        return None
    return min(t, now)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def from_memory(data: Mapping[str, Any] | None, now: float) -> PolicyState:
    """The PolicyState a restarted operator starts from; a fresh one when ``data`` is unusable."""
    try:
        return _from_memory(data, now)
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError):
        return PolicyState()


def _from_memory(data: Mapping[str, Any] | None, now: float) -> PolicyState:
    if not isinstance(data, Mapping) or data.get("version") != VERSION:
        return PolicyState()
    history = [(t, r) for t, r in _restore_samples(data.get("loadHistory"), now, 2)]
    work = [(t, p, d) for t, p, d in _restore_samples(data.get("workHistory"), now, 3)]
    correction_in = _mapping(data.get("correction"))
    correction = {
        k: v for k in _keys(correction_in) if (v := _finite(correction_in[k])) is not None and v > 0
    }
    spend = _finite(data.get("sloSpend"))
    episodes = _restore_time_list(data.get("prefillFellBehind"), now)[-MAX_FLAPS:]
    decode_load = [(t, kv, run, fp) for t, kv, run, fp in _restore_samples(data.get("decodeLoad"), now, 4)]
    peaks = [(t, w) for t, w in _restore_samples(data.get("prefillPeaks"), now, 2)]
    return PolicyState(
        prefill_fell_behind=tuple(episodes),
        prefill_peaks=tuple(peaks[-MAX_SAMPLES:]),
        decode_load=tuple(decode_load[-MAX_SAMPLES:]),
        load_history=tuple(history[-MAX_SAMPLES:]),
        work_history=tuple(work[-MAX_SAMPLES:]),
        correction=correction,
        slo_spend=min(max(spend, 0.0), 1.0) if spend is not None else None,
        flaps=_restore_role_times(data.get("flaps"), now, MAX_FLAPS),
        reversals=_restore_role_times(data.get("reversals"), now, MAX_REVERSALS),
        last_scale_up=_restore_times(data.get("lastScaleUp"), now),
        last_scale_down=_restore_times(data.get("lastScaleDown"), now),
    )


def _restore_time_list(value: Any, now: float) -> list[float]:
    """A stored list of times, oldest first; garbled, too old or future ones dropped."""
    restored = (_restore_time(v, now) for v in (value if isinstance(value, list) else ()))
    return sorted(t for t in restored if t is not None)


def _restore_role_times(value: Any, now: float, keep: int) -> dict[str, tuple[float, ...]]:
    """Per role, the newest ``keep`` times restored (oldest first); garbled ones dropped."""
    d = _mapping(value)
    return {k: tuple(times[-keep:]) for k in _keys(d) if (times := _restore_time_list(d[k], now))}


def _restore_times(value: Any, now: float) -> dict[str, float]:
    d = _mapping(value)
    return {k: t for k in _keys(d) if (t := _restore_time(d[k], now)) is not None}


def memory_patch(previous: Any, memory: Mapping[str, Any]) -> dict[str, Any]:
    """``memory`` as a JSON merge patch over ``previous``: keys it no longer has are set to None.

    A merge patch merges nested objects key by key, so a correction or a role dropped from the memory
    would otherwise survive in status from an earlier write."""
    old = _mapping(previous)
    patch: dict[str, Any] = {k: None for k in old if k not in memory}
    for k, v in memory.items():
        patch[k] = memory_patch(old.get(k), v) if isinstance(v, Mapping) else v
    return patch
