"""/metrics: Prometheus text that parses and reflects a known state; token and allow-list; alerts page."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
import redis
from django.conf import settings
from django.db import transaction
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from apps.billing import alerts, project_alerts, services, waste
from apps.billing.models import Account, PriceRule
from apps.clusters.backends import executor_for
from apps.clusters.models import Cluster, Device, GPUModel
from apps.control.scheduling import run_cycle
from apps.queues import stats
from apps.tasks.models import Task
from apps.tasks.services import record_event, submit_task
from tests.control import drive
from tests.factories import ClusterFactory, TaskFactory


def clear_stats() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(stats.KEY.format(vdc="*")):
        client.delete(key)


@pytest.fixture
def known_state(world):
    """One 2 x A100 task running for an hour (4 cores, 16 GiB), one waiting for two hours, one backend error."""
    PriceRule.objects.create(
        resource_type="gpu", gpu_model=GPUModel.objects.get(name="A100-80G"), price_per_hour=Decimal("10")
    )
    Account.objects.create(project=world.project, balance=Decimal("100"))
    running = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="run",
        gpu_spec="2(A100)",
        cpu=Decimal("4"),
        memory_gib=Decimal("16"),
        command="x",
    )
    run_cycle(world.vdc.pk)
    running.refresh_from_db()
    started = timezone.now() - timedelta(hours=1)
    Task.objects.filter(pk=running.pk).update(started_at=started, status="running")
    services.accrue_task(running.pk, now=started + timedelta(hours=1))
    waiting = submit_task(
        world.member,
        project=world.project,
        queue="medium",
        kind="training",
        name="wait",
        gpu_spec="8(A100)",
        expected_duration=timedelta(hours=1),
        command="x",
    )
    Task.objects.filter(pk=waiting.pk).update(submitted_at=timezone.now() - timedelta(hours=2))
    failed = submit_task(
        world.member, project=world.project, queue="high", kind="training", name="bad", gpu_spec="", command="x"
    )
    Task.objects.filter(pk=failed.pk).update(status="failed", cluster=world.cluster)
    record_event(failed, "backend_error", "slurmctld down")
    clear_stats()  # the scheduler's own cycle above counted too
    stats.record_cycle("main", 0.25, starts=1, preemptions=0, resizes=0, waiting=1)
    stats.record_cycle("main", 0.75, starts=0, preemptions=2, resizes=0, waiting=1)
    return world


SCRAPE_TOKEN = "scrape-token-for-tests"


@pytest.fixture(autouse=True)
def metrics_token(settings):
    settings.METRICS_TOKEN = SCRAPE_TOKEN


def scrape(client, **extra) -> dict[tuple[str, tuple], float]:
    extra.setdefault("HTTP_AUTHORIZATION", f"Bearer {SCRAPE_TOKEN}")
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_reflect_a_known_state(client, known_state):
    s = scrape(client)
    cl = {"vdc": "main", "cluster": "local-1"}
    assert value(s, "hcs_cluster_capacity", **cl, resource="gpu") == 8.0
    assert value(s, "hcs_cluster_capacity", **cl, resource="cpu") == 64.0
    assert value(s, "hcs_cluster_allocated", **cl, resource="gpu") == 2.0
    assert value(s, "hcs_cluster_allocated", **cl, resource="cpu") == 4.0
    assert value(s, "hcs_cluster_utilisation_ratio", **cl, resource="gpu") == 0.25
    assert value(s, "hcs_cluster_gpu_cards", **cl) == 8
    assert value(s, "hcs_cluster_status", **cl, status="healthy") == 1
    assert value(s, "hcs_cluster_status", **cl, status="unavailable") == 0
    assert value(s, "hcs_vdc_utilisation_ratio", vdc="main", resource="gpu") == 0.25
    assert value(s, "hcs_vdc_utilisation_ratio", vdc="main", resource="memory_gib") == 16 / 512
    assert value(s, "hcs_project_allocated", vdc="main", project="alpha", resource="gpu") == 2.0
    assert value(s, "hcs_queue_allocated", vdc="main", queue="high", resource="gpu") == 2.0
    assert value(s, "hcs_queue_waiting_tasks", vdc="main", queue="medium") == 1
    assert value(s, "hcs_queue_waiting_tasks", vdc="main", queue="high") == 0
    assert 7100 < value(s, "hcs_queue_oldest_wait_seconds", vdc="main", queue="medium") < 7300
    assert 7100 < value(s, "hcs_queue_average_wait_seconds", vdc="main", queue="medium") < 7300
    assert value(s, "hcs_scheduler_cycle_seconds_count", vdc="main") == 2
    assert value(s, "hcs_scheduler_cycle_seconds_sum", vdc="main") == 1.0
    assert value(s, "hcs_scheduler_last_cycle_seconds", vdc="main") == 0.75
    assert value(s, "hcs_scheduler_preemptions_total", vdc="main") == 2
    assert value(s, "hcs_backend_errors_total", vdc="main", cluster="local-1") == 1
    assert value(s, "hcs_cost_accrued_total", vdc="main", project="alpha", resource="gpu") == 20.0
    assert value(s, "hcs_usage_unit_hours_total", vdc="main", project="alpha", resource="cpu") == 4.0
    assert value(s, "hcs_account_balance", project="alpha", currency="CNY") == 80.0
    assert value(s, "hcs_scheduler_stats_up") == 1


def test_disabled_and_unavailable_clusters(client, known_state):
    ClusterFactory(vdc=known_state.vdc, name="down", status="unavailable")
    Cluster.objects.filter(name="local-1").update(enabled=False)
    s = scrape(client)
    assert value(s, "hcs_cluster_status", vdc="main", cluster="down", status="unavailable") == 1
    assert value(s, "hcs_cluster_capacity", vdc="main", cluster="local-1", resource="gpu") == 0


def test_metrics_are_closed_to_other_addresses(client, world):
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.9").status_code == 401


def test_loopback_is_not_trusted_by_default(client, world, settings):
    """A job on the portal's host (Slurm jobs share its network) must not read every project's costs."""
    settings.METRICS_TOKEN = ""
    assert settings.METRICS_ALLOWED_IPS == []
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 403


def test_platform_admins_read_metrics_in_their_browser(client, world, settings):
    settings.METRICS_TOKEN = ""
    client.force_login(world.member)
    assert client.get("/metrics").status_code == 403
    client.force_login(world.admin)
    assert client.get("/metrics").status_code == 200


@pytest.mark.parametrize("who", ["anonymous", "member", "viewer", "owner"])
def test_no_project_data_on_loopback_without_staff_or_token(client, known_state, settings, who):
    """On loopback, neither an anonymous client nor a project member reads names, costs or
    balances; only staff (and the token or an allowed address) do."""
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = []
    if who != "anonymous":
        client.force_login(known_state.user(who))
    for address in ("127.0.0.1", "::1"):
        response = client.get("/metrics", REMOTE_ADDR=address)
        assert response.status_code == 403
        assert b"alpha" not in response.content and b"hcs_account_balance" not in response.content
    client.force_login(known_state.admin)
    staff = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert staff.status_code == 200 and b'project="alpha"' in staff.content


def test_a_bearer_token_opens_metrics_from_anywhere(client, world, settings):
    settings.METRICS_TOKEN = "s3cret"
    settings.METRICS_ALLOWED_IPS = []
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    ok = client.get("/metrics", REMOTE_ADDR="203.0.113.9", HTTP_AUTHORIZATION="Bearer s3cret")
    assert ok.status_code == 200


def test_allow_list_takes_networks(client, world, settings):
    settings.METRICS_TOKEN = ""
    settings.METRICS_ALLOWED_IPS = ["10.0.0.0/8"]
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get("/metrics").status_code == 403


def test_portal_alerts_match_the_rules(known_state):
    fired = {(a.rule, a.subject) for a in alerts.evaluate()}
    assert ("LongQueueWait", "queue medium (main)") in fired
    assert ("LowUtilisation", "VDC main") in fired  # 2 of 8 GPU-equivalents
    assert not any(rule == "ClusterUnavailable" for rule, _ in fired)
    ClusterFactory(vdc=known_state.vdc, name="down", status="unavailable")
    assert ("ClusterUnavailable", "cluster down (main)") in {(a.rule, a.subject) for a in alerts.evaluate()}


def test_admin_alerts_page_lists_them(client, known_state):
    client.force_login(known_state.admin)
    index = client.get("/admin/")
    assert b"/admin/billing/vdcalerts/" in index.content
    page = client.get("/admin/billing/vdcalerts/")
    assert page.status_code == 200
    assert b"LongQueueWait" in page.content and b"LowUtilisation" in page.content
    own = client.get(f"/admin/billing/vdcalerts/{known_state.vdc.pk}/change/")
    assert own.status_code == 200 and b"LongQueueWait" in own.content
    client.force_login(known_state.member)
    assert client.get("/admin/billing/vdcalerts/").status_code == 302


def clear_latency_and_waste() -> None:
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(stats.LATENCY_KEY.format(metric="*", vdc="*", klass="*")):
        client.delete(key)
    client.delete(waste.TOTALS, waste.SEEN)


def test_success_ratio_finished_tasks_service_uptime_and_device_gauges(client, known_state):
    # No job success rate, uptime, waste or per-device gauges; only the cycle-latency histogram.
    world = known_state
    for status in ("completed", "completed", "completed"):
        TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status=status)
    TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        kind="inference",
        name="chat",
        status="running",
        started_at=timezone.now() - timedelta(minutes=30),
    )
    device = world.node.devices.get(index=3)
    Device.objects.filter(pk=device.pk).update(
        utilization=42, vram_used_gib=Decimal("12.5"), temperature_c=61, health_score=90
    )
    world.node.last_report = timezone.now()
    world.node.save()
    s = scrape(client)
    assert value(s, "hcs_tasks_finished_total", vdc="main", project="alpha", status="completed") == 3
    assert value(s, "hcs_tasks_finished_total", vdc="main", project="alpha", status="failed") == 1
    assert value(s, "hcs_task_success_ratio", vdc="main", project="alpha") == 0.75
    chat = Task.objects.get(name="chat")
    assert (
        1790 < value(s, "hcs_service_uptime_seconds", vdc="main", project="alpha", service=f"chat (#{chat.pk})") < 1900
    )
    card = {"vdc": "main", "cluster": "local-1", "node": "gpu-node-1", "index": "3", "model": device.gpu_model.name}
    assert value(s, "hcs_device_utilisation_ratio", **card) == 0.42
    assert value(s, "hcs_device_vram_used_gib", **card) == 12.5
    assert value(s, "hcs_device_temperature_celsius", **card) == 61
    assert value(s, "hcs_device_health_score", **card) == 90


def test_submit_to_running_and_queue_wait_histograms_per_class(client, world, django_capture_on_commit_callbacks):
    # A real run on the local cluster: submitted, placed by the scheduler, launched, seen running by the reconciler.
    clear_latency_and_waste()
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="quick",
        gpu_spec="1(A100)",
        command="sleep 5",
    )
    with transaction.atomic():
        Task.objects.filter(pk=task.pk).update(submitted_at=timezone.now() - timedelta(seconds=40))
        task.events.filter(kind="submitted").update(created_at=timezone.now() - timedelta(seconds=40))
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    drive.launch(task)
    with django_capture_on_commit_callbacks(execute=True):
        drive.wait_status(task, "running")
    s = scrape(client)
    labels = {"vdc": "main", "class": "high"}
    assert value(s, "hcs_task_submit_to_running_seconds_count", **labels) == 1
    assert 40 <= value(s, "hcs_task_submit_to_running_seconds_sum", **labels) < 60
    assert value(s, "hcs_task_submit_to_running_seconds_bucket", **labels, le="30.0") == 0
    assert value(s, "hcs_task_submit_to_running_seconds_bucket", **labels, le="60.0") == 1
    assert value(s, "hcs_task_queue_wait_seconds_count", **labels) == 1
    assert 40 <= value(s, "hcs_task_queue_wait_seconds_sum", **labels) < 60
    executor_for(task.cluster).kill(task.external_id)


def test_gpu_waste_counts_idle_time_of_running_tasks_with_fresh_agent_reports(client, world):
    clear_latency_and_waste()
    device = world.node.devices.get(index=0)
    placement = [{"node": world.node.pk, "devices": [{"id": device.pk}]}]
    TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        allocated_gpu=Decimal("2"),
        placement=placement,
    )
    now = timezone.now()
    world.node.last_report = now + timedelta(minutes=10)
    world.node.save()
    for minutes in (0, 1, 2, 3):
        project_alerts.refresh(now + timedelta(minutes=minutes))
    s = scrape(client)
    assert value(s, "hcs_gpu_idle_hours_total", vdc="main", project="alpha") == pytest.approx(2 * 3 / 60)
    Device.objects.filter(pk=device.pk).update(utilization=80)
    project_alerts.refresh(now + timedelta(minutes=4))
    Device.objects.filter(pk=device.pk).update(utilization=0)
    project_alerts.refresh(now + timedelta(minutes=5))  # idle again: a new spell, counted from here
    s = scrape(client)
    assert value(s, "hcs_gpu_idle_hours_total", vdc="main", project="alpha") == pytest.approx(2 * 3 / 60)
