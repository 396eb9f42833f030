"""The operator dashboard at /admin/: who sees it, that its figures are right, and its query count."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import factory
import pytest
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.clusters.models import Device, GPUModel
from apps.tasks.models import Task, TaskEvent
from hcsportal.dashboard import human_duration, operator_dashboard
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory, TaskFactory

pytestmark = pytest.mark.django_db


def _placement(world, cards: int) -> list[dict]:
    devices = list(world.node.devices.order_by("index")[:cards])
    return [
        {
            "node": world.node.pk,
            "node_name": world.node.name,
            "gpu_model": "A100-80G",
            "devices": [{"id": d.pk, "index": d.index, "milli": 1000} for d in devices],
        }
    ]


@pytest.fixture
def busy_world(world):
    """2 of the 8 A100s held by a running task of alpha, 4 cards at 50%; beta waits 2 h; a cluster never checked."""
    now = timezone.now()
    Device.objects.filter(node=world.node, index__lt=4).update(utilization=50)
    running = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        cluster=world.cluster,
        status="running",
        allocated_gpu=Decimal("2"),
        gpu_spec="2(A100)",
        placement=_placement(world, 2),
    )
    TaskEvent.objects.filter(task=running).delete()
    submitted = TaskEvent.objects.create(task=running, kind="submitted", to_status="queued")
    scheduled = TaskEvent.objects.create(task=running, kind="scheduled", from_status="queued", to_status="scheduled")
    TaskEvent.objects.filter(pk=submitted.pk).update(created_at=now - timedelta(minutes=50))
    TaskEvent.objects.filter(pk=scheduled.pk).update(created_at=now - timedelta(minutes=30))
    waiting = TaskFactory(
        project=world.other_project,
        owner=world.outsider,
        vdc=world.vdc,
        queue=world.low,
        status="queued",
        gpu_spec="1(A100)",
    )
    Task.objects.filter(pk=waiting.pk).update(submitted_at=now - timedelta(hours=2))
    fresh = ClusterFactory(vdc=world.vdc, name="new-k8s", cluster_type="kubernetes", status="unknown")
    DeviceFactory(node=NodeFactory(cluster=fresh, name="k8s-node-1"), index=0)
    UsageRecord.objects.create(
        task=running,
        project=world.project,
        vdc=world.vdc,
        resource_type="gpu_eq",
        quantity=Decimal("3.5"),
        period_start=now - timedelta(minutes=20),
        period_end=now - timedelta(minutes=10),
    )
    return world


def test_figures_per_vdc_cluster_and_model(busy_world):
    d = operator_dashboard()
    [vdc] = d.vdcs
    clusters = {c.name: c for c in vdc.clusters}
    local = clusters["local-1"]
    assert (local.capacity, local.allocated, local.used) == (Decimal("8"), Decimal("2"), Decimal("2"))
    assert local.status_label == "Healthy" and local.tasks == 1
    [a100] = local.models
    assert (a100.model, a100.cards, a100.held, a100.utilisation) == ("A100-80G", 8, Decimal("2"), 25.0)
    fresh = clusters["new-k8s"]
    assert fresh.status_label == "Not checked yet" and not fresh.checked
    # The VDC sums its enabled clusters (the unchecked one is enabled and has one A100 more).
    assert vdc.capacity == Decimal("9") and vdc.allocated == Decimal("2")
    assert [(m.model, m.cards, m.held) for m in vdc.models] == [("A100-80G", 9, Decimal("2"))]


def test_queue_backlog_per_vdc(busy_world):
    [vdc] = operator_dashboard().vdcs
    queues = {q.name: q for q in vdc.queues}
    assert (queues["high"].running, queues["high"].waiting, queues["high"].allocated) == (1, 0, Decimal("2"))
    low = queues["low"]
    assert low.waiting == 1 and low.oldest_wait == "2 h 00 min" and queues["medium"].oldest_wait == "-"


def test_top_projects_by_use_and_by_wait(busy_world):
    d = operator_dashboard()
    assert [(p.name, p.held, p.eq_hours_month) for p in d.top_use] == [("alpha", Decimal("2"), Decimal("3.5"))]
    [beta] = d.top_wait
    assert beta.name == "beta" and beta.waiting == 1
    assert 7190 < beta.longest_wait_s < 7300 and beta.longest_wait == "2 h 00 min"


def test_wait_trend_counts_the_wait_before_each_placement(busy_world):
    waits = operator_dashboard().waits
    assert sum(waits.started) == 1
    assert max(waits.longest_s) == pytest.approx(20 * 60, abs=1)
    assert waits.started.index(1) in (len(waits.started) - 2, len(waits.started) - 1)


def test_alerts_fire_with_advice(busy_world):
    rules = {a.rule: a for a in operator_dashboard().alerts}
    assert "LongQueueWait" in rules and "Add capacity" in rules["LongQueueWait"].action
    assert "LowUtilisation" in rules


def test_staff_sees_the_dashboard_above_the_app_list(client, busy_world):
    client.force_login(busy_world.admin)
    response = client.get("/admin/")
    assert response.status_code == 200
    html = response.content.decode()
    for text in (
        "Operator dashboard",
        "Alerts firing",
        "LongQueueWait",
        "Add capacity or adjust quotas",
        "Not checked yet",
        "A100-80G: 2 / 8, 25%",
        "Top projects by use",
        "Top projects by wait",
        "2 h 00 min",
        "Waits of the tasks placed, minutes, per half hour",
        "<svg",
    ):
        assert text in html, text
    # The default app list stays, below the dashboard.
    assert html.index("Top projects by wait") < html.index('class="app-tasks module')


def test_non_staff_is_sent_to_the_admin_login(client, busy_world):
    client.force_login(busy_world.member)
    response = client.get("/admin/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    client.logout()
    assert client.get("/admin/")["Location"].startswith("/admin/login/")


def test_portal_menu_links_staff_to_the_dashboard(client, busy_world):
    client.force_login(busy_world.admin)
    assert 'href="/admin/"' in client.get("/").content.decode()
    client.force_login(busy_world.member)
    assert 'href="/admin/"' not in client.get("/").content.decode()


def test_human_duration():
    assert [human_duration(s) for s in (5, 125, 3 * 3600 + 5 * 60)] == ["5 s", "2 min", "3 h 05 min"]


def _grow(world, tasks: int, clusters: int) -> None:
    """Tasks in every status with timeline events, and extra clusters with devices, in bulk."""
    a100 = GPUModel.objects.get(name="A100-80G")
    for i in range(clusters):
        node = NodeFactory(cluster=ClusterFactory(vdc=world.vdc, name=f"extra-{i}"), name=f"n-{i}")
        Device.objects.bulk_create(
            Device(node=node, index=j, gpu_model=a100, vram_gib=a100.vram_gib, utilization=30) for j in range(4)
        )
    made = TaskFactory.create_batch(
        tasks,
        project=factory.Iterator([world.project, world.other_project]),
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status=factory.Iterator(["queued", "running", "stopped", "preempted"]),
        cluster=world.cluster,
        allocated_gpu=Decimal("1"),
        placement=_placement(world, 1),
    )
    TaskEvent.objects.bulk_create(
        event
        for t in made
        for event in (
            TaskEvent(task=t, kind="submitted", to_status="queued"),
            TaskEvent(task=t, kind="scheduled", from_status="queued", to_status="scheduled"),
        )
    )


# Session, user, then the dashboard: monitoring state (7, missing cards included), models and held cards (2), used
# equivalents (1), usage records and waiting tasks (2), activity (3), waits (1), plus the app list and the admin log
# (19 at both sizes).
MAX_QUERIES = 19


@pytest.mark.parametrize(("tasks", "clusters"), [(10, 2), (400, 20)])
def test_dashboard_query_count_is_bounded(client, world, django_assert_max_num_queries, tasks, clusters):
    _grow(world, tasks, clusters)
    client.force_login(world.admin)
    with django_assert_max_num_queries(MAX_QUERIES):
        response = client.get("/admin/")
    assert response.status_code == 200
    assert f"extra-{clusters - 1}" in response.content.decode()
