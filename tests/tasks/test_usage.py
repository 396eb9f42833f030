"""Utilisation history (a sample per running task and minute from the node agents' figures on Device rows), its
API and page, its retention, and idle autostop of dev environments decided on it (docs/monitoring.md
"Utilisation history", docs/rules.md#idle-autostop)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.billing import project_alerts
from apps.billing.models import ProjectAlert
from apps.clusters.models import Device
from apps.control import jobs
from apps.tasks import usage
from apps.tasks.models import Task, TaskEvent, TaskUsageSample
from tests.api.base import client_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def placed(world, kind="dev_env", cards=(0, 1), **fields) -> Task:
    devices = list(Device.objects.filter(node=world.node, index__in=cards).order_by("index"))
    placement = [
        {
            "node": world.node.pk,
            "node_name": world.node.name,
            "gpu_model": "A100-80G",
            "devices": [{"id": d.pk, "index": d.index, "milli": 1000} for d in devices],
        }
    ]
    defaults = {
        "project": world.project,
        "owner": world.member,
        "vdc": world.vdc,
        "queue": world.high,
        "ide_type": "jupyter" if kind == "dev_env" else "",
        "status": "running",
        "cluster": world.cluster,
        "external_id": f"hcs-{kind}",
        "started_at": timezone.now() - timedelta(hours=2),
    }
    return TaskFactory(kind=kind, placement=placement, **{**defaults, **fields})


def report(world, utilisation: dict[int, int], vram: dict[int, str] | None = None, at=None) -> None:
    """What a node agent's report leaves on the Device rows."""
    world.node.last_report = at or timezone.now()
    world.node.save(update_fields=["last_report"])
    for index, percent in utilisation.items():
        Device.objects.filter(node=world.node, index=index).update(
            utilization=percent, vram_used_gib=Decimal((vram or {}).get(index, "0"))
        )


def history(task: Task, now, minutes: int, gpu) -> None:
    """``minutes`` samples up to ``now``, one a minute, with the GPU utilisation ``gpu(i)`` (i = minutes ago)."""
    top = usage.minute_of(now)
    TaskUsageSample.objects.bulk_create(
        TaskUsageSample(task=task, at=top - timedelta(minutes=i), gpu_percent=gpu(i), vram_used_gib=1, vram_gib=80)
        for i in range(minutes)
    )


# --- recording ---------------------------------------------------------------------------------------------------


def test_a_sample_a_minute_per_running_task_with_cards_from_the_agents_figures(world):
    dev = placed(world)
    training = placed(world, kind="training", cards=(2,))
    waiting = placed(world, cards=(3,), status="queued")
    report(world, {0: 80, 1: 20, 2: 0, 3: 99}, {0: "30.5", 1: "10"})
    now = timezone.now()
    assert usage.record(now) == 2
    assert usage.record(now + timedelta(seconds=1)) == 2  # the same minute again: nothing new
    rows = {s.task_id: s for s in TaskUsageSample.objects.all()}
    assert set(rows) == {dev.pk, training.pk} and waiting.pk not in rows
    sample = rows[dev.pk]
    assert sample.at == usage.minute_of(now) and sample.cards == 2
    assert sample.gpu_percent == 50.0 and sample.vram_used_gib == 40.5 and sample.vram_gib == 160.0
    assert rows[training.pk].gpu_percent == 0.0


def test_cards_whose_agent_is_quiet_give_no_sample(world):
    placed(world)
    report(world, {0: 80, 1: 80}, at=timezone.now() - timedelta(minutes=10))
    assert usage.record() == 0 and not TaskUsageSample.objects.exists()


def test_retention_keeps_a_week_after_the_end_and_thirty_days_at_most(world):
    now = timezone.now()
    ended_long_ago = placed(world, status="stopped", finished_at=now - timedelta(days=8))
    ended_lately = placed(world, status="stopped", finished_at=now - timedelta(days=6))
    running = placed(world)
    for task in (ended_long_ago, ended_lately):
        history(task, task.finished_at, 3, lambda i: 10)
    TaskUsageSample.objects.create(task=running, at=now - timedelta(days=31), gpu_percent=1)
    TaskUsageSample.objects.create(task=running, at=now - timedelta(days=29), gpu_percent=1)
    assert usage.prune(now) == 4
    assert not TaskUsageSample.objects.filter(task=ended_long_ago).exists()
    assert TaskUsageSample.objects.filter(task=ended_lately).count() == 3
    assert list(TaskUsageSample.objects.filter(task=running).values_list("at", flat=True)) == [now - timedelta(days=29)]


# --- API --------------------------------------------------------------------------------------------------------


def test_the_api_returns_the_range_asked_and_the_mean(world):
    task = placed(world)
    now = timezone.now()
    history(task, now, 120, lambda i: 90 if i < 60 else 30)
    url = f"/api/v1/tasks/{task.pk}/utilisation/"
    body = client_for(world.viewer).get(url).json()
    assert body["interval_seconds"] == 60 and len(body["samples"]) == 120 and body["mean_gpu_percent"] == 60.0
    assert body["samples"][0]["at"] < body["samples"][-1]["at"]
    since = (usage.minute_of(now) - timedelta(minutes=9)).isoformat()
    body = client_for(world.member).get(url, {"since": since}).json()
    assert len(body["samples"]) == 10 and {s["gpu_percent"] for s in body["samples"]} == {90.0}
    assert set(body["samples"][0]) == {"at", "gpu_percent", "vram_used_gib", "vram_gib", "cards"}


def test_the_api_refuses_a_bad_range_saying_what_it_expected(world):
    task = placed(world)
    url = f"/api/v1/tasks/{task.pk}/utilisation/"
    bad = client_for(world.member).get(url, {"since": "yesterday"})
    assert bad.status_code == 400 and "since" in bad.json()
    backwards = client_for(world.member).get(url, {"since": "2026-11-02T00:00:00Z", "until": "2026-11-01T00:00:00Z"})
    assert backwards.status_code == 400 and "Expected a time before until" in str(backwards.json())
    too_long = client_for(world.member).get(url, {"since": "2026-01-01T00:00:00Z", "until": "2026-11-01T00:00:00Z"})
    assert too_long.status_code == 400 and "at most 31 days" in str(too_long.json())


def test_the_api_keeps_the_task_permissions(world):
    task = placed(world)
    url = f"/api/v1/tasks/{task.pk}/utilisation/"
    assert client_for(world.outsider).get(url).status_code == 404
    assert client_for(None).get(url).status_code in (401, 403)
    assert client_for(world.admin).get(url).status_code == 200


# --- the page ----------------------------------------------------------------------------------------------------


def test_the_page_charts_the_history_and_shows_the_mean(client, world, monkeypatch):
    task = placed(world, kind="training")
    history(task, timezone.now(), 30, lambda i: 40 if i % 2 else 20)
    client.force_login(world.viewer)
    html = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert 'data-field="usage-chart"' in html and 'class="series running"' in html
    assert "GPU utilisation %" in html and "GPU memory used %" in html
    assert "Mean GPU utilisation <strong>30%</strong> over 30 min recorded" in html
    client.force_login(world.outsider)
    assert client.get(f"/task-monitoring/{task.pk}/").status_code == 404


def test_a_task_without_history_says_so(client, world):
    task = placed(world)
    client.force_login(world.member)
    html = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert "No utilisation recorded yet" in html and 'data-field="usage-chart"' not in html
    assert "Idle autostop: off." in html  # the project's default


# --- idle autostop -----------------------------------------------------------------------------------------------


def idle_project(world, percent=10, minutes=30) -> None:
    world.project.idle_stop_percent, world.project.idle_stop_minutes = percent, minutes
    world.project.save()


def test_idle_for_less_than_the_set_time_warns_then_the_stop_comes(client, world):
    idle_project(world)
    task = placed(world)
    now = timezone.now()
    # Busy an hour ago, idle (under 10 %) for the last 25 minutes: warned (10 minutes ahead), not stopped.
    history(task, now, 60, lambda i: 3 if i < 25 else 70)
    assert usage.stop_idle(now) == []
    [state] = usage.idle_states(now)
    assert state.warn and not state.due and state.idle_minutes == 25
    project_alerts.refresh(now)
    alert = ProjectAlert.objects.get(key=f"idle-stop:{task.pk}", resolved_at=None)
    assert alert.fired_at is not None and alert.rule == "idle_stop" and alert.task_id == task.pk
    assert "idle for 25 min under 10% GPU" in alert.message
    client.force_login(world.member)
    html = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    assert 'data-field="idle-warning"' in html and "will be stopped at" in html

    # Five minutes on, still idle: stopped, with the reason on its timeline; a second pass stops nothing.
    later = now + timedelta(minutes=5)
    history(task, later, 5, lambda i: 1)
    assert usage.stop_idle(later) == [task.pk]
    assert usage.stop_idle(later) == []
    task.refresh_from_db()
    assert task.status == "stopped" and task.finished_at is not None
    [event] = TaskEvent.objects.filter(task=task, kind="stopped")
    assert event.message == "Stopped by idle autostop: idle for 30 min under 10% GPU"
    assert event.data["idle_stop"]["minutes"] == 30 and event.actor is None
    project_alerts.refresh(later)
    assert ProjectAlert.objects.get(key=f"idle-stop:{task.pk}").resolved_at == later


def test_a_busy_environment_is_not_stopped(world):
    idle_project(world)
    task = placed(world)
    now = timezone.now()
    history(task, now, 60, lambda i: 3 if i else 50)  # idle for an hour, but busy this minute
    assert usage.idle_states(now) == [] and usage.stop_idle(now) == []
    project_alerts.refresh(now)
    assert not ProjectAlert.objects.filter(key=f"idle-stop:{task.pk}").exists()
    task.refresh_from_db()
    assert task.status == "running"


def test_a_gap_in_the_history_starts_the_idle_time_again(world):
    idle_project(world)
    task = placed(world)
    now = timezone.now()
    history(task, now, 60, lambda i: None if i == 20 else 2)  # one minute without a figure
    [state] = usage.idle_states(now)
    assert state.idle_minutes == 20 and not state.due


def test_stale_history_stops_nothing(world):
    idle_project(world)
    task = placed(world)
    history(task, timezone.now() - timedelta(minutes=10), 60, lambda i: 0)
    assert usage.stop_idle() == []


def test_only_dev_environments_and_only_when_on(world):
    idle_project(world)
    training = placed(world, kind="training", cards=(2,))
    inference = placed(world, kind="inference", cards=(3,))
    opted_out = placed(world, cards=(4,), idle_stop_minutes=0)
    off_project = placed(world, cards=(5,), project=world.other_project)
    now = timezone.now()
    for task in (training, inference, opted_out, off_project):
        history(task, now, 90, lambda i: 0)
    assert usage.stop_idle(now) == []
    assert set(Task.objects.values_list("status", flat=True)) == {"running"}


def test_a_task_setting_wins_over_the_project_default(world):
    # The project leaves autostop off; the task asks for 15 minutes under 50 %.
    task = placed(world, idle_stop_minutes=15, idle_stop_percent=50)
    now = timezone.now()
    history(task, now, 20, lambda i: 40)
    assert usage.stop_idle(now) == [task.pk]
    assert TaskEvent.objects.get(task=task, kind="stopped").message.endswith("idle for 15 min under 50% GPU")


def test_the_beat_job_records_then_stops(world):
    idle_project(world, minutes=5)
    task = placed(world)
    now = timezone.now()
    history(task, now - timedelta(minutes=1), 6, lambda i: 0)
    report(world, {0: 0, 1: 1})
    jobs.record_task_usage()
    task.refresh_from_db()
    assert task.status == "stopped"
    assert TaskUsageSample.objects.filter(task=task, at=usage.minute_of(timezone.now())).exists()


# --- settings: submit, project -----------------------------------------------------------------------------------


def test_submit_takes_the_setting_for_dev_environments_only(world):
    base = {
        "project": world.project.pk,
        "queue": "high",
        "gpu_spec": "1",
        "cpu": "1",
        "memory_gib": "1",
        "image": "jupyter/base-notebook",
    }
    client = client_for(world.member)
    dev = client.post(
        "/api/v1/tasks/",
        {**base, "name": "nb", "kind": "dev_env", "ide_type": "jupyter", "idle_stop_minutes": 45},
        format="json",
    )
    assert dev.status_code == 201, dev.content
    assert dev.json()["idle_stop_minutes"] == 45 and dev.json()["idle_stop_percent"] is None
    training = client.post(
        "/api/v1/tasks/",
        {**base, "name": "tr", "kind": "training", "command": "true", "idle_stop_minutes": 45},
        format="json",
    )
    assert training.status_code == 400 and "dev environments only" in str(training.json()["idle_stop_minutes"])
    too_long = client.post(
        "/api/v1/tasks/",
        {**base, "name": "nb2", "kind": "dev_env", "ide_type": "jupyter", "idle_stop_minutes": 99999},
        format="json",
    )
    assert too_long.status_code == 400 and "idle_stop_minutes" in too_long.json()


def test_project_owners_set_the_default_members_may_not(world):
    url = f"/api/v1/projects/{world.project.pk}/"
    body = {"idle_stop_percent": 15, "idle_stop_minutes": 120}
    assert client_for(world.member).patch(url, body, format="json").status_code == 403
    answer = client_for(world.owner).patch(url, body, format="json")
    assert answer.status_code == 200 and answer.json()["idle_stop_minutes"] == 120
    world.project.refresh_from_db()
    assert (world.project.idle_stop_percent, world.project.idle_stop_minutes) == (15, 120)
    bad = client_for(world.owner).patch(url, {"idle_stop_percent": 0}, format="json")
    assert bad.status_code == 400 and "idle_stop_percent" in bad.json()


def test_the_dev_environment_form_takes_the_setting(client, world):
    client.force_login(world.member)
    form = {
        "project": world.project.pk,
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "gpu_spec": "1(A100)",
        "cpu": "2",
        "memory_gib": "8",
        "instances": "1",
        "preemptible": "on",
        "ide_type": "jupyter",
        "image": "jupyter/pytorch-notebook:latest",
    }
    page = client.get(reverse("portal:instances-new")).content.decode()
    assert 'name="idle_stop_minutes"' in page and 'name="idle_stop_percent"' in page
    answer = client.post(reverse("portal:instances-new"), {**form, "name": "nb", "idle_stop_minutes": "90"})
    assert answer.status_code == 302
    task = Task.objects.get(name="nb")
    assert (task.idle_stop_minutes, task.idle_stop_percent) == (90, None)
    refused = client.post(reverse("portal:instances-new"), {**form, "name": "nb2", "idle_stop_percent": "0"})
    assert refused.status_code == 200 and "idle_stop_percent" in refused.context["form"].errors
