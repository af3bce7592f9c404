"""The request rate over the start-up horizon: a trend with a confidence band, trusted only when the
recent past was predictable. Pure.

A replica asked for now serves only after its start-up (model download or cache read, engine start),
and the rate the policy sees is a window average that lags the present by about half its window. Sizing
for the present therefore always arrives late on a ramp: a diurnal morning compressed into minutes, or a
long-context workload that creeps up. The forecaster fits a local linear trend to the recent rate samples
(least squares, newest samples weighted most) and extrapolates it ``horizon`` seconds ahead; the band is
the fit's residual spread, widened for the distance extrapolated. It is *trusted* when the relative
residual spread is small: for bursty arrivals (code completion: silence, then tens of requests a second)
a trend says nothing, and the policy falls back to the peak it has seen instead.

Nothing here is fitted to a trace: the only constants are the band's z (the SLO percentile's one-sided
normal quantile) and the trust limit on relative spread, chosen from what the fit means, not from a run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist

# a fit whose residuals spread more than this fraction of the level is noise, not a trend: the arrivals
# are bursty (a Poisson stream sampled over a 120 s window at >= 1 req/s spreads under 10%)
TRUST_RELATIVE_SPREAD = 0.35
MIN_SAMPLES = 4  # fewer points than this give no trend worth extrapolating
MAX_GROWTH = 3.0  # never plan for more than this multiple of the present rate, whatever the slope
SIGNIFICANT_SLOPE_SE = 2.0  # a trend counts when its slope is at least two standard errors from zero


@dataclass(frozen=True)
class Forecast:
    """The rate expected ``horizon_s`` ahead, its upper band, and whether the trend can be trusted."""

    now: float  # the fitted rate now (req/s)
    mean: float  # expected rate at now + horizon
    upper: float  # upper edge of the band at now + horizon
    slope: float  # req/s per second
    spread: float  # residual standard deviation of the fit (req/s)
    trusted: bool
    samples: int

    def describe(self, unit: str = "req/s") -> str:
        trust = "trusted" if self.trusted else "untrusted"
        return (
            f"forecast {self.mean:.4g} {unit} (band {self.upper:.4g}, {trust}, "
            f"trend {self.slope * 60:+.3g} {unit} per min over {self.samples} samples)"
        )


def forecast_rate(
    history: Sequence[tuple[float, float]],
    now: float,
    rate: float,
    horizon_s: float,
    fit_window_s: float,
    percentile: float = 90.0,
) -> Forecast:
    """Fit ``(time, rate)`` samples within ``fit_window_s`` of ``now`` (the present ``rate`` included)
    and extrapolate ``horizon_s`` ahead.

    Samples are weighted linearly by recency (the oldest in the window counts least), so a turn in the
    traffic shows within a fraction of the window. The band's upper edge is the forecast plus z standard
    errors of a new observation at the horizon (z for ``percentile``)."""
    points = [(t, r) for t, r in history if 0.0 <= now - t <= fit_window_s and t < now] + [(now, rate)]
    n = len(points)
    if n < MIN_SAMPLES or fit_window_s <= 0:
        return Forecast(rate, rate, rate, 0.0, 0.0, False, n)
    weights = [1.0 - (now - t) / (fit_window_s * 1.25) for t, _ in points]
    total = sum(weights)
    mt = sum(w * t for w, (t, _) in zip(weights, points, strict=True)) / total
    mr = sum(w * r for w, (_, r) in zip(weights, points, strict=True)) / total
    stt = sum(w * (t - mt) ** 2 for w, (t, _) in zip(weights, points, strict=True))
    if stt <= 0:
        return Forecast(rate, rate, rate, 0.0, 0.0, False, n)
    slope = sum(w * (t - mt) * (r - mr) for w, (t, r) in zip(weights, points, strict=True)) / stt
    level = mr + slope * (now - mt)
    residuals = [r - (mr + slope * (t - mt)) for t, r in points]
    dof = max(n - 2, 1)
    spread = math.sqrt(sum(w * e * e for w, e in zip(weights, residuals, strict=True)) / total * n / dof)
    z = NormalDist().inv_cdf(min(max(percentile / 100.0, 0.5), 0.999))
    ahead = now + horizon_s
    slope_se = spread * math.sqrt(total / (n * stt))
    if abs(slope) < SIGNIFICANT_SLOPE_SE * slope_se:
        # a slope within the noise of a flat rate is no trend: extrapolating it over minutes turns a
        # stationary Poisson stream into a phantom ramp (and its uncertainty into phantom headroom)
        slope, level = 0.0, mr
        se = spread * math.sqrt(1.0 + 1.0 / n)
    else:
        # standard error of a new observation at the horizon: residual spread plus the slope's
        se = spread * math.sqrt(1.0 + 1.0 / n + (ahead - mt) ** 2 * total / (n * stt))
    cap = max(rate, level) * MAX_GROWTH
    mean = min(max(level + slope * horizon_s, 0.0), cap)
    upper = min(max(mean + z * se, 0.0), cap)
    trusted = level > 0 and spread / max(level, 1e-9) <= TRUST_RELATIVE_SPREAD
    return Forecast(level, mean, upper, slope, spread, trusted, n)


def planning_horizon_s(startup_s: float, interval_s: float, metric_window_s: float) -> float:
    """How far ahead a decision must look: the replicas asked for now serve after ``startup_s``; the
    next chance to correct comes one evaluation later; and the observed rate is a window average that
    trails the present by half the window."""
    return max(startup_s, 0.0) + max(interval_s, 0.0) + max(metric_window_s, 0.0) / 2.0


__all__ = ["Forecast", "forecast_rate", "planning_horizon_s"]
