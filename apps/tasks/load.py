"""A service's load, measured and forecast, for its monitoring page and ``GET /api/v1/tasks/{id}/load/``.

The autoscaler writes the buckets (:class:`~apps.tasks.models.ServiceLoadSample`, see
``apps.control.autoscaling``); this reads the last day of them and the next hour's forecasts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from apps.queues.engine import forecast as forecasting
from apps.tasks.models import ServiceLoadSample, Task

# The autoscaler averages a service's load into buckets of this length (apps.control.autoscaling).
BUCKET = timedelta(minutes=5)
PAST = timedelta(days=1)
AHEAD = timedelta(hours=1)


def load_series(task: Task, now: datetime | None = None) -> list[ServiceLoadSample]:
    """The service's buckets from a day ago to an hour ahead, oldest first (future ones hold only a forecast)."""
    now = now or timezone.now()
    return list(
        ServiceLoadSample.objects.filter(task=task, start__gte=now - PAST, start__lte=now + AHEAD).order_by("start")
    )


def backtest_of(task_id: int, until: datetime, bucket_s: int, season: int) -> forecasting.Backtest:
    """The forecasts the service was given for its closed buckets of the last day before ``until``, against what
    was measured and against the naive rules (the day before that serves as "same time yesterday"). ``until``
    is a bucket start; the buckets are ``bucket_s`` long, ``season`` of them a day."""
    first = until - timedelta(seconds=2 * season * bucket_s)
    rows = {
        start: (rps, fc)
        for start, rps, fc in ServiceLoadSample.objects.filter(task_id=task_id, start__gte=first, start__lt=until)
        .order_by("start")
        .values_list("start", "rps", "forecast_rps")
    }
    measured, forecast = [], []
    at = first
    while at < until:
        rps, fc = rows.get(at, (None, None))
        measured.append(rps)
        forecast.append(fc)
        at += timedelta(seconds=bucket_s)
    return forecasting.backtest(measured, forecast, season)
