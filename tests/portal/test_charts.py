"""Charts come from the event timeline: peak running / waiting tasks and GPUs held per bucket."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.core.charts import svg_chart
from apps.tasks.models import Task, TaskEvent
from apps.tasks.views import activity
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def event(task, kind, from_status, to_status, at, data=None):
    e = TaskEvent.objects.create(task=task, kind=kind, from_status=from_status, to_status=to_status, data=data or {})
    TaskEvent.objects.filter(pk=e.pk).update(created_at=at)


def test_activity_is_exact_from_the_timeline(world):
    now = timezone.now()
    hours = lambda h: now - timedelta(hours=h)  # noqa: E731
    placement = [{"node_name": "gpu-node-1", "devices": [{"id": 1, "milli": 1000}, {"id": 2, "milli": 1000}]}]
    done = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="stopped")
    event(done, "submitted", "", "queued", hours(5.5))
    event(done, "scheduled", "queued", "scheduled", hours(4.5), {"placement": placement})
    event(done, "stopped", "scheduled", "stopped", hours(3.5))
    TaskFactory(
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        placement=[{"devices": [{"id": 3, "milli": 1000}]}],
    )
    TaskEvent.objects.filter(task__status="running").delete()

    series = activity(Task.objects.all(), hours=24, buckets=24).of()

    assert series.waiting[17:22] == [0, 1, 1, 0, 0]
    assert series.running[17:22] == [1, 1, 2, 2, 1]
    assert series.gpus[17:22] == [1, 1, 3, 3, 1]
    assert series.now == {"running": 1, "waiting": 0, "gpus": 1}


def test_grouped_activity_keeps_queues_apart(world):
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    TaskFactory(project=world.project, vdc=world.vdc, queue=world.low, status="running")
    data = activity(Task.objects.all(), group="queue_id")
    assert data.of(world.high.pk).now["waiting"] == 1 and data.of(world.high.pk).now["running"] == 0
    assert data.of(world.low.pk).now["running"] == 1
    assert data.of(world.medium.pk).now == {"running": 0, "waiting": 0, "gpus": 0}


def test_svg_chart_scales_to_the_peak():
    times = [timezone.now() - timedelta(minutes=30 * (3 - i)) for i in range(4)]
    chart = svg_chart(times, [("Running", "running", [0, 2, 4, 1], 1)])
    points = chart["lines"][0]["points"].split()
    assert len(points) == 4 and chart["ymax"] == 4
    assert float(points[2].split(",")[1]) == chart["y_top"] and float(points[0].split(",")[1]) == chart["y_zero"]
