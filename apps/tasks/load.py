"""A service's load, measured and forecast, for its monitoring page and ``GET /api/v1/tasks/{id}/load/``.

The autoscaler writes the buckets (:class:`~apps.tasks.models.ServiceLoadSample`, see
``apps.control.autoscaling``); this reads the last day of them and the next hour's forecasts.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from apps.tasks.models import ServiceLoadSample, Task

PAST = timedelta(days=1)
AHEAD = timedelta(hours=1)


def load_series(task: Task, now: datetime | None = None) -> list[ServiceLoadSample]:
    """The service's buckets from a day ago to an hour ahead, oldest first (future ones hold only a forecast)."""
    now = now or timezone.now()
    return list(
        ServiceLoadSample.objects.filter(task=task, start__gte=now - PAST, start__lte=now + AHEAD).order_by("start")
    )
