"""Forecasts of a service's load for predictive autoscaling (SPEC §7, docs/tasks.md "Predictive scaling").

Pure functions over lists of floats, no Django: the autoscaler (:mod:`apps.control.autoscaling`) passes a
service's request rates per bucket (oldest first, one value per ``step`` of time, e.g. 5 minutes) and gets the
rates of the next buckets; the benchmark ``benchmarks/autoscale_day.py`` drives the same function.

The method is Holt-Winters (triple exponential smoothing: level, damped additive trend, additive seasonality
of one day) from ``statsmodels``: inference load is dominated by a daily cycle whose amplitude and level
drift slowly, which is exactly what it models, it fits in a fraction of a second on a week of 5-minute buckets,
and it needs no tuning by hand (the smoothing weights are fitted). With less than two seasons of history (the
fit cannot tell the season from the trend) or when the fit fails, the forecast is the **seasonal naive** one:
the value one season earlier (or the last value with less than one season). Forecasts are never negative, and
a flat history gives a flat forecast.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

HOLT_WINTERS = "holt-winters"
SEASONAL_NAIVE = "seasonal naive"
LAST_VALUE = "last value"
NO_HISTORY = "no history"


@dataclass(frozen=True, slots=True)
class Forecast:
    """The next ``len(values)`` buckets' values and the method that gave them."""

    values: tuple[float, ...]
    method: str

    def peak(self, buckets: int) -> float:
        """The highest value of the first ``buckets`` buckets (0 without any)."""
        return max(self.values[: max(buckets, 0)], default=0.0)


def seasonal_naive(history: list[float], season: int, horizon: int) -> Forecast:
    """Each future bucket repeats the bucket one season earlier; the last value with less than a season."""
    if not history:
        return Forecast((0.0,) * horizon, NO_HISTORY)
    if season < 1 or len(history) < season:
        return Forecast((max(float(history[-1]), 0.0),) * horizon, LAST_VALUE)
    n = len(history)
    return Forecast(tuple(max(float(history[n - season + (h % season)]), 0.0) for h in range(horizon)), SEASONAL_NAIVE)


def forecast(history: list[float], season: int, horizon: int) -> Forecast:
    """The values of the ``horizon`` buckets after ``history`` (oldest first; ``season`` buckets a day).

    Holt-Winters with additive daily seasonality once the history holds two seasons, the seasonal naive
    forecast before that or when the fit fails or gives non-finite values.
    """
    if horizon < 1:
        return Forecast((), NO_HISTORY)
    values = [float(v) for v in history if v is not None and math.isfinite(v)]
    if values and max(values) - min(values) < 1e-9:
        return Forecast((max(values[-1], 0.0),) * horizon, LAST_VALUE)
    if season < 2 or len(values) < 2 * season:
        return seasonal_naive(values, season, horizon)
    try:
        out = _holt_winters(values, season, horizon)
    except (ValueError, ArithmeticError, RuntimeError, ImportError, IndexError):
        return seasonal_naive(values, season, horizon)
    if len(out) != horizon or not all(math.isfinite(v) for v in out):
        return seasonal_naive(values, season, horizon)
    return Forecast(tuple(max(v, 0.0) for v in out), HOLT_WINTERS)


def _holt_winters(values: list[float], season: int, horizon: int) -> list[float]:
    import numpy as np  # noqa: PLC0415 (statsmodels is heavy: imported when a forecast is made)
    from statsmodels.tsa.holtwinters import ExponentialSmoothing  # noqa: PLC0415

    with warnings.catch_warnings():
        # Convergence and "optimisation failed" warnings still give a usable fit; non-finite output is caught.
        warnings.simplefilter("ignore")
        model = ExponentialSmoothing(
            np.asarray(values, dtype=float),
            trend="add",
            damped_trend=True,
            seasonal="add",
            seasonal_periods=season,
            initialization_method="heuristic",
        ).fit()
        return [float(v) for v in model.forecast(horizon)]
