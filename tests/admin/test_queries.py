"""Changelists cost a fixed number of queries, whatever the number of rows (no N+1)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from itertools import cycle

import pytest
from django.apps import apps
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.clusters.models import CapacityReservation, Device, GPUModel, Node
from apps.clusters.services import forget_catalog
from apps.tasks.choices import ACTIVE, TaskStatus
from apps.tasks.models import Task
from apps.vdc.models import VDC, Membership, Project, ProjectQuota
from tests.admin.conftest import admin_url
from tests.factories import ClusterFactory, TaskQueueFactory, UserFactory

# Measured on SQLite: session and user, the result counts, one per related-model filter, the page itself
# (and for queues the waiting demand: the catalog and one grouped query).
BOUNDS = {
    "tasks.Task": 8,
    "vdc.VDC": 5,
    "clusters.Cluster": 6,
    "queues.TaskQueue": 8,
    "vdc.Project": 6,
    "vdc.ProjectQuota": 7,
    "clusters.Node": 7,
    "clusters.Device": 7,
    "clusters.GPUModel": 5,
    "tasks.TaskEvent": 7,
    "billing.Account": 6,
    "billing.Invoice": 7,
    "billing.UsageRecord": 8,
    "clusters.CapacityReservation": 11,  # + the date hierarchy and the prefetched nodes and projects
}


def _tasks(world, count: int) -> None:
    """Bulk-create tasks in every status, spread over the world's projects, queues and cluster."""
    statuses = cycle(TaskStatus.values)
    queues = cycle([world.high, world.medium, world.low])
    projects = cycle([world.project, world.other_project])
    rows = []
    for n in range(count):
        status = next(statuses)
        rows.append(
            Task(
                name=f"bulk-{n}",
                project=next(projects),
                owner=world.member,
                vdc=world.vdc,
                queue=next(queues),
                kind="training",
                gpu_spec=["1(A100)", "2", "0.5(vgpu)", ""][n % 4],
                status=status,
                cluster=world.cluster if status in ACTIVE else None,
                allocated_gpu=Decimal("1") if status in ACTIVE else Decimal("0"),
                queue_position=n if status == TaskStatus.QUEUED else None,
            )
        )
    Task.objects.bulk_create(rows)


def _more_of_everything(world, count: int) -> None:
    """More VDCs (each with a cluster, a node, a card and a queue), projects, members and quotas."""
    a100 = GPUModel.objects.get(name="A100-80G")
    for n in range(count):
        vdc = VDC.objects.create(name=f"extra-{n}")
        cluster = ClusterFactory(vdc=vdc)
        node = Node.objects.create(cluster=cluster, name="n", cpu=8, memory_gib=64)
        Device.objects.create(node=node, index=0, gpu_model=a100, vram_gib=80)
        TaskQueueFactory(vdc=vdc)
        project = Project.objects.create(name=f"extra-{n}")
        Membership.objects.create(project=project, user=UserFactory())
        ProjectQuota.objects.create(project=project, vdc=world.vdc)
        now = timezone.now()
        window = CapacityReservation.objects.create(
            vdc=vdc, cluster=cluster, name=f"extra-{n}", starts_at=now, ends_at=now + timedelta(hours=1)
        )
        window.nodes.set([node])
        window.projects.set([project])


def _queries(client, url: str) -> int:
    forget_catalog()  # counted cold: a page that reads the GPU catalog pays for it once per process and few seconds
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url)
    assert response.status_code == 200
    return len(ctx.captured_queries)


@pytest.mark.parametrize("label", list(BOUNDS))
def test_changelist_queries_do_not_grow_with_rows(admin_web, every_model, label, django_assert_max_num_queries):
    url = admin_url(apps.get_model(label), "changelist")
    _tasks(every_model, 10)
    with django_assert_max_num_queries(BOUNDS[label]):
        few = admin_web.get(url)

    _tasks(every_model, 990)
    _more_of_everything(every_model, 30)
    assert Task.objects.count() == 1001
    with django_assert_max_num_queries(BOUNDS[label]):
        many = admin_web.get(url)
    assert many.status_code == few.status_code == 200
    assert many.context["cl"].result_count >= few.context["cl"].result_count > 0
    assert _queries(admin_web, url) == BOUNDS[label]


def test_task_changelist_shows_a_full_page_of_the_thousand(admin_web, world):
    _tasks(world, 1000)
    response = admin_web.get(admin_url(Task, "changelist"))
    assert response.context["cl"].result_count == 1000
    assert len(response.context["cl"].result_list) == 100
