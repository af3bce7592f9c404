"""The rate forecaster: a trend it can trust is extrapolated with a band; noise is not trusted."""

from __future__ import annotations

import numpy as np

from disagg.policy.forecast import forecast_rate, planning_horizon_s


def samples(rates: list[float], step: float = 30.0) -> list[tuple[float, float]]:
    return [(i * step, r) for i, r in enumerate(rates)]


def test_a_steady_ramp_is_extrapolated_over_the_horizon_and_trusted() -> None:
    history = samples([10.0 + 0.5 * i for i in range(20)])  # +1 req/s per minute
    now, rate = history[-1]
    fc = forecast_rate(history[:-1], now, rate, horizon_s=210.0, fit_window_s=600.0)
    assert fc.trusted
    assert abs(fc.slope * 60 - 1.0) < 0.05
    assert abs(fc.mean - (rate + 3.5)) < 0.3  # 210 s ahead at 1 req/s per minute
    assert fc.upper >= fc.mean


def test_bursty_arrivals_are_not_trusted() -> None:
    rng = np.random.default_rng(3)
    rates = [float(x) for x in np.where(rng.uniform(size=20) < 0.2, 30.0, 1.0)]
    history = samples(rates)
    now, rate = history[-1]
    fc = forecast_rate(history[:-1], now, rate, horizon_s=210.0, fit_window_s=600.0)
    assert not fc.trusted


def test_too_little_history_falls_back_to_the_present() -> None:
    fc = forecast_rate([(0.0, 4.0)], 30.0, 5.0, horizon_s=210.0, fit_window_s=600.0)
    assert not fc.trusted and fc.mean == fc.upper == 5.0


def test_the_forecast_never_plans_past_three_times_the_present() -> None:
    history = samples([1.0 * 2**i for i in range(8)])
    now, rate = history[-1]
    fc = forecast_rate(history[:-1], now, rate, horizon_s=3600.0, fit_window_s=600.0)
    assert fc.upper <= 3.0 * max(rate, fc.now) + 1e-9


def test_samples_outside_the_fit_window_do_not_count() -> None:
    old_spike = [(0.0, 500.0), (30.0, 500.0)]
    flat = [(600.0 + 30 * i, 5.0 + 0.01 * i) for i in range(10)]
    now, rate = flat[-1]
    fc = forecast_rate(old_spike + flat[:-1], now, rate, horizon_s=120.0, fit_window_s=300.0)
    assert fc.trusted and fc.mean < 6.0


def test_the_horizon_is_start_up_plus_one_evaluation_plus_half_the_window() -> None:
    assert planning_horizon_s(120.0, 30.0, 120.0) == 210.0
