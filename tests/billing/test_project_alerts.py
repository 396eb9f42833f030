"""Alerts for project members (docs/rules.md#monitoring-and-alerts): each rule with its threshold and hold time,
escalation, resolution, the
push to members' live pages over the real channel layer, the API and the dashboard."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from decimal import Decimal

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.utils import timezone

from apps.billing import project_alerts
from apps.billing.models import Account, AlertSettings, ProjectAlert
from apps.tasks.live import user_group
from apps.tasks.models import TaskEvent
from tests.api.base import client_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def running(world, gpu: str, **fields) -> object:
    """A task holding ``gpu`` GPU-equivalents of the world's project (made directly, as the scheduler leaves it)."""
    fields.setdefault("status", "running")
    return TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        allocated_gpu=Decimal(gpu),
        replicas=1,
        **fields,
    )


def open_alert(world, key: str) -> ProjectAlert | None:
    return ProjectAlert.objects.filter(project=world.project, key=key, resolved_at=None).first()


def test_quota_warns_at_the_vdc_threshold_escalates_when_used_up_and_resolves(world):
    key = f"quota:{world.vdc.pk}"  # the world's quota: 8 GPU-equivalents
    running(world, "6")
    project_alerts.refresh()
    assert open_alert(world, key) is None  # 75 % < 80 %
    task = running(world, "1")
    assert project_alerts.refresh()["fired"] == 1 and task.pk
    alert = open_alert(world, key)
    assert (alert.rule, alert.severity) == ("quota_high", "warning")
    assert alert.message == "GPU quota 88% used: 7 of 8 GPU-equivalents in VDC main (alert at 80%)."
    running(world, "1")
    assert project_alerts.refresh() == {"fired": 0, "changed": 1, "resolved": 0}
    escalated = open_alert(world, key)
    assert escalated.pk == alert.pk and (escalated.rule, escalated.severity) == ("quota_full", "critical")
    type(task).objects.filter(project=world.project).update(status="completed")
    assert project_alerts.refresh()["resolved"] == 1
    assert open_alert(world, key) is None and ProjectAlert.objects.get(pk=alert.pk).resolved_at is not None


def test_a_vdcs_own_threshold_applies(world):
    AlertSettings.objects.create(vdc=world.vdc, quota_warn_percent=50)
    running(world, "4")
    project_alerts.refresh()
    assert open_alert(world, f"quota:{world.vdc.pk}").message.endswith("(alert at 50%).")


def test_budget_low_then_exhausted(world):
    account = Account.objects.create(project=world.project, balance=Decimal("40"), enforce_budget=True)
    project_alerts.refresh()
    alert = open_alert(world, "budget")
    assert alert.severity == "warning" and alert.message == "Budget low: 40.00 CNY available (alert below 100)."
    account.balance = Decimal("-5")
    account.save()
    project_alerts.refresh()
    alert = open_alert(world, "budget")
    assert alert.severity == "critical" and "New tasks do not start until it is topped up." in alert.message
    account.balance = Decimal("500")
    account.save()
    project_alerts.refresh()
    assert open_alert(world, "budget") is None


def test_idle_cards_fire_only_after_the_hold_time_and_only_with_fresh_agent_reports(world):
    device = world.node.devices.get(index=0)
    device.utilization = 1
    device.save()
    task = running(world, "1", placement=[{"node": world.node.pk, "devices": [{"id": device.pk}]}])
    key, now = f"idle:{task.pk}", timezone.now()
    project_alerts.refresh(now)
    assert open_alert(world, key) is None  # no agent report: the 0-1 % figure says nothing
    world.node.last_report = now
    world.node.save()
    project_alerts.refresh(now)
    pending = open_alert(world, key)
    assert pending.fired_at is None  # held for less than the 60 minutes
    assert client_for(world.member).get("/api/v1/alerts/").data["count"] == 0
    world.node.last_report = now + timedelta(minutes=61)
    world.node.save()
    assert project_alerts.refresh(now + timedelta(minutes=61))["fired"] == 1
    assert open_alert(world, key).task_id == task.pk
    device.utilization = 70
    device.save()
    assert project_alerts.refresh(now + timedelta(minutes=62))["resolved"] == 1


def test_a_condition_that_clears_before_its_hold_time_leaves_nothing(world):
    task = running(world, "1", kind="inference", autoscale_min=2)  # 1 of 2 replicas
    project_alerts.refresh()
    assert open_alert(world, f"service:{task.pk}").fired_at is None
    task.replicas = 2
    task.save()
    project_alerts.refresh()
    assert not ProjectAlert.objects.filter(key=f"service:{task.pk}").exists()


def test_a_service_short_of_replicas_fires_after_its_hold_time(world):
    task = running(world, "1", kind="inference", autoscale_min=2)
    now = timezone.now()
    project_alerts.refresh(now)
    project_alerts.refresh(now + timedelta(minutes=11))
    alert = open_alert(world, f"service:{task.pk}")
    assert alert.fired_at is not None and "serves with 1 of 2 replicas" in alert.message


def test_replicas_its_autoscaler_asks_for_and_cannot_get_alert_the_project_after_the_hold_time(world):
    task = running(world, "2", kind="inference", autoscale_min=1, autoscale_max=6, autoscale_desired=5)
    task.replicas = 2
    task.save()
    now = timezone.now()
    project_alerts.refresh(now)
    assert open_alert(world, f"service-grant:{task.pk}").fired_at is None  # not before it held
    project_alerts.refresh(now + timedelta(minutes=11))
    alert = open_alert(world, f"service-grant:{task.pk}")
    assert alert.fired_at is not None and "runs 2 of the 5 replicas its autoscaler asks for" in alert.message
    task.replicas = 5
    task.save()
    project_alerts.refresh(now + timedelta(minutes=12))
    assert open_alert(world, f"service-grant:{task.pk}") is None  # granted: resolved


def test_repeated_failures_in_the_last_hour(world):
    for _ in range(2):
        TaskEvent.objects.create(task=running(world, "0", status="failed"), kind="failed", message="exit 1")
    project_alerts.refresh()
    key = f"failures:{world.vdc.pk}"
    assert open_alert(world, key) is None
    retried = running(world, "0", status="queued")
    TaskEvent.objects.create(task=retried, kind="requeued", message="retry", data={"retry": 1})
    project_alerts.refresh()
    assert open_alert(world, key).message == "3 runs failed in the last hour (alert at 3)."


def test_fired_and_resolved_alerts_are_pushed_to_every_member_over_the_channel_layer(
    world, django_capture_on_commit_callbacks
):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(user_group(world.viewer.pk), channel)
    stranger = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(user_group(world.outsider.pk), stranger)

    async def receive(name, timeout=5.0):
        return await asyncio.wait_for(layer.receive(name), timeout)

    try:
        running(world, "8")
        with django_capture_on_commit_callbacks(execute=True):
            project_alerts.refresh()
        pushed = async_to_sync(receive)(channel)["payload"]
        assert pushed["type"] == "alert" and pushed["rule"] == "quota_full" and pushed["resolved"] is False
        type(world.project).objects.get(pk=world.project.pk).tasks.update(status="completed")
        with django_capture_on_commit_callbacks(execute=True):
            project_alerts.refresh()
        assert async_to_sync(receive)(channel)["payload"]["resolved"] is True
        with pytest.raises(TimeoutError):
            async_to_sync(receive)(stranger, 0.5)  # a member of another project hears nothing
    finally:
        async_to_sync(layer.group_discard)(user_group(world.viewer.pk), channel)
        async_to_sync(layer.group_discard)(user_group(world.outsider.pk), stranger)


def test_the_api_lists_alerts_of_your_projects_only(world):
    running(world, "8")
    project_alerts.refresh()
    body = client_for(world.viewer).get("/api/v1/alerts/", {"rule": "quota_full"}).data
    assert body["count"] == 1 and body["results"][0]["title"] == "Quota used up"
    assert client_for(world.outsider).get("/api/v1/alerts/").data["count"] == 0
    assert client_for(world.viewer).get("/api/v1/alerts/", {"rule": "nonsense"}).status_code == 400


def test_the_dashboard_lists_open_alerts(world, client):
    running(world, "8")
    project_alerts.refresh()
    client.force_login(world.member)
    page = client.get("/").content.decode()
    assert "Quota used up" in page and "GPU quota used up: 8 of 8 GPU-equivalents in VDC main." in page
    client.force_login(world.outsider)
    assert "Quota used up" not in client.get("/").content.decode()


def test_a_redis_outage_costs_only_the_push_never_the_alert(world, django_capture_on_commit_callbacks, monkeypatch):
    from redis.exceptions import ConnectionError as RedisConnectionError

    def down(_messages):
        raise RedisConnectionError("Connection refused")

    monkeypatch.setattr(project_alerts, "send_all", down)
    running(world, "8")
    with django_capture_on_commit_callbacks(execute=True):
        assert project_alerts.refresh()["fired"] == 1
    alert = open_alert(world, f"quota:{world.vdc.pk}")
    assert alert.fired_at is not None and alert.rule == "quota_full"
    with django_capture_on_commit_callbacks(execute=True):
        assert project_alerts.refresh() == {"fired": 0, "changed": 0, "resolved": 0}  # held once, not fired twice
