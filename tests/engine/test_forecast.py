"""Load forecasts for predictive autoscaling (apps/queues/engine/forecast.py) and their use in ``decide``."""

import math
import random

import pytest

from apps.queues.engine.autoscale import FORECAST, RPS, Metrics, Targets, decide
from apps.queues.engine.forecast import HOLT_WINTERS, LAST_VALUE, NO_HISTORY, SEASONAL_NAIVE, forecast

SEASON = 48  # half-hour buckets of a day


def daily(days: float, noise: float = 0.0, seed: int = 1, base: float = 50.0, amplitude: float = 40.0) -> list:
    rng = random.Random(seed)
    n = int(days * SEASON)
    return [max(0.0, base + amplitude * math.sin(2 * math.pi * i / SEASON) + rng.gauss(0, noise)) for i in range(n)]


def test_seasonal_pattern_is_predicted_ahead_with_holt_winters():
    history = daily(4, noise=2.0)
    f = forecast(history, SEASON, SEASON // 2)
    assert f.method == HOLT_WINTERS
    truth = [50.0 + 40.0 * math.sin(2 * math.pi * (len(history) + h) / SEASON) for h in range(SEASON // 2)]
    errors = [abs(a - b) for a, b in zip(f.values, truth, strict=True)]
    assert sum(errors) / len(errors) < 5.0
    # The rise of the next hours is seen before it comes: the peak is forecast where it is.
    assert f.values.index(max(f.values)) in range(SEASON // 4 - 2, SEASON // 4 + 3)


def test_short_history_falls_back_to_seasonal_naive():
    history = daily(1.5)
    f = forecast(history, SEASON, 6)
    assert f.method == SEASONAL_NAIVE
    assert f.values == tuple(history[len(history) - SEASON + h] for h in range(6))


def test_less_than_a_season_repeats_the_last_value_and_nothing_gives_zeros():
    assert forecast([3.0, 5.0, 7.0], SEASON, 3).values == (7.0, 7.0, 7.0)
    assert forecast([3.0, 5.0, 7.0], SEASON, 3).method == LAST_VALUE
    empty = forecast([], SEASON, 2)
    assert (empty.values, empty.method) == ((0.0, 0.0), NO_HISTORY)


def test_failed_fit_falls_back_to_seasonal_naive(monkeypatch):
    from apps.queues.engine import forecast as module

    def broken(*_):
        raise ValueError("optimisation failed")

    monkeypatch.setattr(module, "_holt_winters", broken)
    f = forecast(daily(3), SEASON, 4)
    assert f.method == SEASONAL_NAIVE


def test_non_finite_fit_falls_back_to_seasonal_naive(monkeypatch):
    from apps.queues.engine import forecast as module

    monkeypatch.setattr(module, "_holt_winters", lambda values, season, horizon: [math.nan] * horizon)
    assert forecast(daily(3), SEASON, 4).method == SEASONAL_NAIVE


def test_forecast_is_never_negative():
    # A steep fall at the end of the history would extrapolate below zero without the floor.
    history = daily(3, amplitude=50.0, base=10.0)
    history[-10:] = [max(0.0, 40.0 - 8.0 * i) for i in range(10)]
    for f in (forecast(history, SEASON, SEASON), forecast(history[:60], SEASON, SEASON)):
        assert min(f.values) >= 0.0


def test_flat_series_stays_flat():
    f = forecast([12.5] * (3 * SEASON), SEASON, 10)
    assert f.values == (12.5,) * 10


@pytest.mark.parametrize("history", [daily(3, noise=4.0, seed=s) for s in range(3)])
def test_forecast_has_the_horizon_asked_for(history):
    assert len(forecast(history, SEASON, 7).values) == 7
    assert forecast(history, SEASON, 0).values == ()


T = Targets(min_replicas=1, max_replicas=8, rps_per_replica=10)


def test_forecast_scales_ahead_and_says_so():
    d = decide(T, 2, Metrics(rps=18.0), (), 0.0, forecast_rps=52.0)
    assert d.desired == 6
    assert d.metric == FORECAST
    assert "forecast 52.0 req/s" in d.reason


def test_forecast_below_the_reactive_count_changes_nothing():
    reactive = decide(T, 2, Metrics(rps=45.0), (), 0.0)
    both = decide(T, 2, Metrics(rps=45.0), (), 0.0, forecast_rps=5.0)
    assert (both.desired, both.metric, both.reason) == (reactive.desired, RPS, reactive.reason)


def test_a_low_forecast_alone_never_scales_down():
    # No metric reading and a forecast of nothing: the count stays.
    assert decide(T, 5, Metrics(), (), 0.0, forecast_rps=0.0).desired == 5
    # A high reading and a low forecast: the reading wins.
    assert decide(T, 3, Metrics(rps=60.0), (), 0.0, forecast_rps=0.0).desired == 6


def test_forecast_stays_within_max_and_quota():
    assert decide(T, 4, Metrics(rps=10.0), (), 0.0, forecast_rps=1000.0).desired == 8
    assert decide(T, 4, Metrics(rps=10.0), (), 0.0, forecast_rps=1000.0, quota_room=1).desired == 5


def test_forecast_needs_a_request_rate_target():
    gpu_only = Targets(min_replicas=1, max_replicas=8, gpu_percent=70)
    assert decide(gpu_only, 2, Metrics(gpu_percent=70.0), (), 0.0, forecast_rps=500.0).desired == 2


def test_backtest_judges_the_forecasts_against_last_value_and_yesterday_on_the_same_buckets():
    from apps.queues.engine.forecast import MIN_BACKTEST, backtest

    season = 24
    # Two days; the second day runs 20 % above the first, with a step at bucket 10 each day.
    day1 = [10.0 if i < 10 else 30.0 for i in range(season)]
    day2 = [v * 1.2 for v in day1]
    measured = day1 + day2
    good = [None] * season + [v * 1.01 for v in day2]  # right within 1 %
    result = backtest(measured, good, season)
    assert result.buckets == season - 0  # every bucket of day two has all four values
    assert result.forecast_error == pytest.approx(0.01, rel=1e-6)
    assert result.yesterday_error == pytest.approx(0.2 / 1.2, rel=1e-6)
    assert result.last_value_error > 0  # the step at bucket 10 (and the day boundary)
    assert result.earns_place and "forecast used" in result.describe()
    flat = backtest(measured, [None] * season + [20.0] * season, season)
    assert not flat.earns_place and "reactive" in flat.describe()
    few = backtest(measured[: season + MIN_BACKTEST - 1], good[: season + MIN_BACKTEST - 1], season)
    assert few.buckets == MIN_BACKTEST - 1 and not few.earns_place
    assert "buckets backtested" in few.describe()
    with pytest.raises(ValueError, match="aligned"):
        backtest(measured, good[:-1], season)
