"""Forecasts of a service's load for predictive autoscaling (docs/rules.md#autoscaling, docs/tasks.md "Predictive
scaling").

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

A forecast must earn its place (:func:`backtest`): the autoscaler uses a service's forecast only while, over
its own recent history, the forecasts it made were closer to what came than the two naive rules were — "last
value" (the next bucket is like the last one) and "same time yesterday" (like the bucket one season earlier).
A service whose load is flat, or moves in steps no history foretells, is then scaled reactively, and says so.
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


# A backtest needs this many buckets with a forecast, a measurement and both naive predictions to judge.
MIN_BACKTEST = 12


@dataclass(frozen=True, slots=True)
class Backtest:
    """How the forecasts a service was given did against the naive rules over the same buckets.

    Errors are the mean absolute error relative to the mean measured value (0.05: off by 5 % on average),
    ``None`` where nothing could be compared."""

    buckets: int
    forecast_error: float | None
    last_value_error: float | None
    yesterday_error: float | None

    @property
    def earns_place(self) -> bool:
        """Whether the forecast beat both naive rules (on at least ``MIN_BACKTEST`` buckets)."""
        if self.buckets < MIN_BACKTEST or self.forecast_error is None:
            return False
        return all(
            other is not None and self.forecast_error < other for other in (self.last_value_error, self.yesterday_error)
        )

    def describe(self) -> str:
        """One line for the service page and the autoscaler's reasons."""
        if self.buckets < MIN_BACKTEST:
            return f"forecast not used yet: {self.buckets} of {MIN_BACKTEST} buckets backtested"
        verdict = "forecast used" if self.earns_place else "forecast not used (reactive)"
        return (
            f"{verdict}: error {_percent(self.forecast_error)} against {_percent(self.last_value_error)} for "
            f"last value and {_percent(self.yesterday_error)} for same time yesterday over {self.buckets} buckets"
        )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def backtest(measured: list[float | None], forecast: list[float | None], season: int) -> Backtest:
    """Judge the forecasts of the buckets in ``forecast`` against what was ``measured`` (both oldest first, one
    value per bucket, ``None`` where there is none) and against the two naive rules over the same buckets:
    the previous bucket's measurement and the measurement one ``season`` earlier. Only buckets where all four
    values exist are compared, so every rule is judged on the same buckets."""
    if len(measured) != len(forecast):
        raise ValueError(f"measured and forecast must be aligned, got {len(measured)} and {len(forecast)} buckets")
    errors = [0.0, 0.0, 0.0]
    total, n = 0.0, 0
    for i in range(max(season, 1), len(measured)):
        actual, predicted, last, yesterday = measured[i], forecast[i], measured[i - 1], measured[i - season]
        if actual is None or predicted is None or last is None or yesterday is None:
            continue
        for k, guess in enumerate((predicted, last, yesterday)):
            errors[k] += abs(guess - actual)
        total += abs(actual)
        n += 1
    if not n:
        return Backtest(0, None, None, None)
    scale = max(total / n, 1e-9)
    return Backtest(n, *(e / n / scale for e in errors))


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
    import numpy as np  # (statsmodels is heavy: imported when a forecast is made)
    from statsmodels.tsa.holtwinters import ExponentialSmoothing

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
        ).fit(use_brute=False)  # the brute-force start grid costs 3.5x the fit and gave the same forecasts
        return [float(v) for v in model.forecast(horizon)]
