"""Predictive scaling in the portal's autoscaler (apps/control/autoscaling.py): the load history it keeps, the
forecasts it writes, decisions ahead of the forecast, the switch, the load API and the monitoring page's chart."""

import math
import time
from datetime import timedelta

import pytest
from django.urls import reverse

from apps.control import autoscaling
from apps.tasks import request_rate
from apps.tasks.models import ServiceLoadSample, Task
from apps.tasks.services import update_autoscaling
from tests.control.test_autoscaling import load, service

pytestmark = pytest.mark.django_db


def daily_rate(start) -> float:
    """A daily cycle: 5 requests/s at night, 45 at the peak (06:00 UTC + 6 h)."""
    hour = start.hour + start.minute / 60
    return 25.0 + 20.0 * math.sin(2 * math.pi * (hour - 6.0) / 24.0)


def seed_history(task, now: float, days: float, rate=daily_rate):
    first = autoscaling.bucket_start(now) - timedelta(days=days)
    step = timedelta(seconds=autoscaling.BUCKET_S)
    rows, at = [], first
    while at < autoscaling.bucket_start(now):
        rows.append(ServiceLoadSample(task=task, start=at, rps=rate(at), samples=20))
        at += step
    ServiceLoadSample.objects.bulk_create(rows)


def seed_forecasts(task, now: float, days: float, rate, error: float = 0.0):
    """Forecasts for the buckets of the last ``days`` before ``now``: what ``rate`` gives, off by ``error``."""
    first = autoscaling.bucket_start(now) - timedelta(days=days)
    for row in ServiceLoadSample.objects.filter(task=task, start__gte=first, start__lt=autoscaling.bucket_start(now)):
        row.forecast_rps = rate(row.start) * (1 + error)
        row.forecast_method = "holt-winters"
        row.save(update_fields=["forecast_rps", "forecast_method"])


def varying(shape, factors=(0.8, 1.2, 0.9, 1.1)):
    """A load of the daily ``shape`` whose level changes from day to day (so "same time yesterday" misses)."""
    return lambda at: shape(at) * factors[at.toordinal() % len(factors)]


def morning(hour: float) -> float:
    """An epoch second at ``hour`` UTC today, rounded to a bucket start plus 20 s."""
    day = int(time.time()) // 86400 * 86400
    return day + hour * 3600 - (hour * 3600) % autoscaling.BUCKET_S + 20


def test_each_pass_averages_the_rate_into_the_current_bucket(world):
    svc = service(world)
    now = morning(10)
    load(svc, 20, now)
    autoscaling.run_autoscaler(now)
    request_rate.forget(svc.pk)
    load(svc, 10, now + 60)
    autoscaling.run_autoscaler(now + 60)
    [row] = ServiceLoadSample.objects.filter(task=svc)
    assert row.start == autoscaling.bucket_start(now)
    assert (row.rps, row.samples) == (15.0, 2)


def test_a_predictive_service_scales_ahead_of_the_forecast_with_the_reason(world):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    # Every morning the load jumps from 5 to 40 requests/s at 04:10; it is 04:00 and the service runs 1 replica.
    now = morning(4)
    rate = varying(lambda at: 40.0 if (4, 10) <= (at.hour, at.minute) < (6, 0) else 5.0)
    seed_history(svc, now, days=3, rate=rate)
    seed_forecasts(svc, now, days=1, rate=rate, error=0.02)  # its forecasts were right within 2 %
    load(svc, 5, now)
    [backtest] = autoscaling.refit_forecasts(now).values()
    assert backtest.earns_place, backtest.describe()
    [outcome] = autoscaling.run_autoscaler(now)
    ahead = ServiceLoadSample.objects.filter(task=svc, start__gt=autoscaling.bucket_start(now))
    assert ahead.count() == autoscaling.HORIZON_BUCKETS
    assert {r.forecast_method for r in ahead} == {"holt-winters"}
    assert all(r.rps is None for r in ahead)
    peak = max(r.forecast_rps for r in ahead if r.start.timestamp() <= now + autoscaling.LEAD_S)
    assert 25.0 < peak < 60.0
    assert outcome.desired == min(math.ceil(peak / 10 - 1e-9), 5)  # at most n + 4 in one decision
    assert f"forecast {peak:.1f} req/s" in outcome.reason
    event = svc.events.filter(kind="autoscaled").last()
    assert event.data["metric"] == "forecast"


def test_a_forecast_that_does_not_beat_the_naive_rules_is_not_used_and_the_page_says_so(world, client):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = morning(4)
    rate = varying(lambda at: 40.0 if (4, 10) <= (at.hour, at.minute) < (6, 0) else 5.0)
    seed_history(svc, now, days=3, rate=rate)
    seed_forecasts(svc, now, days=1, rate=rate, error=0.6)  # 60 % off: "last value" does better
    load(svc, 5, now)
    [backtest] = autoscaling.refit_forecasts(now).values()
    assert not backtest.earns_place
    assert backtest.forecast_error > backtest.last_value_error
    [outcome] = autoscaling.run_autoscaler(now)
    assert outcome.desired == 1  # reactive: 5 requests/s for a target of 10
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[svc.pk])).content.decode()
    assert "forecast not used (reactive)" in page


def test_a_fresh_service_has_no_backtest_and_scales_reactively(world):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = morning(4)
    seed_history(svc, now, days=3, rate=lambda at: 40.0 if (4, 10) <= (at.hour, at.minute) < (6, 0) else 5.0)
    load(svc, 5, now)
    [backtest] = autoscaling.refit_forecasts(now).values()
    assert backtest.buckets == 0 and not backtest.earns_place
    [outcome] = autoscaling.run_autoscaler(now)
    assert outcome.desired == 1


def test_the_decision_loop_never_fits_a_forecast(world, monkeypatch):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = morning(4)
    seed_history(svc, now, days=3)

    def fit(*args):
        raise AssertionError("a forecast was fitted inside the decision loop")

    monkeypatch.setattr(autoscaling, "refresh_forecast", fit)
    monkeypatch.setattr(autoscaling.forecasting, "forecast", fit)
    load(svc, 15, now)
    [outcome] = autoscaling.run_autoscaler(now)
    assert outcome.desired == 2


def test_without_the_switch_the_same_history_changes_nothing(world):
    svc = service(world, autoscale_max=8)
    now = morning(4)
    seed_history(svc, now, days=3, rate=lambda at: 60.0 if at.hour == 4 else 5.0)
    load(svc, 9, now)
    [outcome] = autoscaling.run_autoscaler(now)
    assert outcome.desired == 1
    assert not ServiceLoadSample.objects.filter(task=svc, forecast_rps__isnull=False).exists()


def test_a_low_forecast_never_scales_a_busy_service_down(world):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = morning(4)
    seed_history(svc, now, days=3, rate=lambda at: 1.0)
    load(svc, 30, now)
    autoscaling.refit_forecasts(now)
    [outcome] = autoscaling.run_autoscaler(now)
    assert outcome.desired == 3
    assert "30.0 requests/s" in outcome.reason


def test_short_history_forecasts_with_seasonal_naive(world):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = morning(4)
    seed_history(svc, now, days=1.5)
    load(svc, 15, now)
    autoscaling.refit_forecasts(now)
    methods = set(
        ServiceLoadSample.objects.filter(task=svc).exclude(forecast_method="").values_list("forecast_method", flat=True)
    )
    assert methods == {"seasonal naive"}


def test_the_forecast_is_refitted_once_per_bucket(world, monkeypatch):
    service(world, autoscale_predictive=True)
    now = morning(4)
    calls = []
    real = autoscaling.refresh_forecast
    monkeypatch.setattr(autoscaling, "refresh_forecast", lambda task, at: calls.append(at) or real(task, at))
    for step in range(0, autoscaling.BUCKET_S + 1, 15):
        autoscaling.run_autoscaler(now + step)
        autoscaling.refit_forecasts(now + step)
    assert len(calls) == 2  # the bucket of ``now`` and the next one


def test_gaps_repeat_the_day_before_and_old_buckets_are_pruned(world):
    svc = service(world)
    now = morning(4)
    seed_history(svc, now, days=2)
    start = autoscaling.bucket_start(now)
    hole = start - timedelta(hours=3)
    ServiceLoadSample.objects.filter(task=svc, start=hole).delete()
    history = autoscaling.load_history(svc.pk, start)
    assert len(history) == 2 * autoscaling.SEASON
    index = autoscaling.SEASON * 2 - 36
    assert history[index] == pytest.approx(daily_rate(hole - timedelta(days=1)))
    old = ServiceLoadSample.objects.create(
        task=svc, start=start - timedelta(days=autoscaling.LOAD_KEEP_DAYS, minutes=5), rps=1.0, samples=1
    )
    autoscaling.run_autoscaler(now)
    assert not ServiceLoadSample.objects.filter(pk=old.pk).exists()


def test_the_switch_is_edited_like_the_other_settings(world, api):
    svc = service(world)
    update_autoscaling(svc, world.member, autoscale_predictive=True)
    svc.refresh_from_db()
    assert svc.autoscale_predictive
    assert "predictive False → True" in svc.events.filter(kind="autoscaled").last().message
    api.force_authenticate(world.member)
    r = api.patch(f"/api/v1/tasks/{svc.pk}/", {"autoscale_predictive": False}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["autoscale_predictive"] is False


def test_load_api_and_page_show_measured_and_forecast(world, api, client):
    svc = service(world, autoscale_max=8, autoscale_predictive=True)
    now = time.time()
    seed_history(svc, now, days=3)
    load(svc, 15, now)
    autoscaling.refit_forecasts(now)
    api.force_authenticate(world.member)
    points = api.get(f"/api/v1/tasks/{svc.pk}/load/").json()
    assert len(points) >= 24 * 12
    assert points[0]["rps"] is not None
    assert points[-1]["rps"] is None and points[-1]["forecast_rps"] is not None
    assert points[-1]["forecast_method"] == "holt-winters"
    api.force_authenticate(world.outsider)
    assert api.get(f"/api/v1/tasks/{svc.pk}/load/").status_code == 404
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[svc.pk])).content.decode()
    assert 'data-field="load-chart"' in page
    assert "Forecast" in page and "forecast: holt-winters" in page
    assert 'data-field="backtest"' in page and "buckets backtested" in page


def test_the_page_form_turns_the_switch_on_and_off(world, client):
    svc = service(world)
    client.force_login(world.member)
    url = reverse("portal:task-autoscaling", args=[svc.pk])
    client.post(url, {"autoscale_min": "1", "autoscale_max": "3", "autoscale_rps": "10", "autoscale_predictive": "on"})
    assert Task.objects.get(pk=svc.pk).autoscale_predictive
    client.post(url, {"autoscale_min": "1", "autoscale_max": "3", "autoscale_rps": "10"})
    assert not Task.objects.get(pk=svc.pk).autoscale_predictive


@pytest.fixture
def api():
    from rest_framework.test import APIClient

    return APIClient()
