"""The computed columns add up what they claim to: capacity, allocation, utilisation, counts, demand."""

from __future__ import annotations

from decimal import Decimal

from django.contrib import admin

from apps.clusters.models import Cluster, Device, Node
from apps.queues.models import TaskQueue
from apps.vdc.models import VDC, Project, ProjectQuota
from tests.admin.conftest import admin_url
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory, TaskFactory


def _row(client, model, obj):
    """The changelist row object of ``obj`` and the model's admin, to call its column methods."""
    response = client.get(admin_url(model, "changelist"))
    assert response.status_code == 200
    return next(row for row in response.context["cl"].result_list if row.pk == obj.pk), admin.site._registry[model]


def _running(world, gpu: str, **fields):
    fields.setdefault("project", world.project)
    return TaskFactory(
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        cluster=world.cluster,
        status="running",
        allocated_gpu=Decimal(gpu),
        **fields,
    )


def test_vdc_columns_sum_enabled_clusters_and_running_allocations(admin_web, world):
    disabled = ClusterFactory(vdc=world.vdc, enabled=False)
    DeviceFactory(node=NodeFactory(cluster=disabled), index=0)
    _running(world, "2")
    _running(world, "1.5")
    TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="queued")
    TaskFactory(project=world.project, owner=world.member, vdc=world.vdc, queue=world.high, status="completed")

    row, vdc_admin = _row(admin_web, VDC, world.vdc)
    assert vdc_admin.capacity_cpu(row) == "64"
    assert vdc_admin.capacity_memory(row) == "512"
    assert vdc_admin.capacity_gpu(row) == "8.00"
    assert vdc_admin.allocated_gpu(row) == "3.50"
    assert vdc_admin.utilisation(row) == "44%"
    assert vdc_admin.cluster_count(row) == 2
    assert vdc_admin.queued_tasks(row) == 1
    assert world.vdc.capacity()["gpu"] == Decimal("8")


def test_vdc_caps_override_the_cluster_sum(admin_web, world):
    world.vdc.total_gpu = Decimal("4")
    world.vdc.save()
    _running(world, "1")
    row, vdc_admin = _row(admin_web, VDC, world.vdc)
    assert (vdc_admin.capacity_gpu(row), vdc_admin.utilisation(row)) == ("4.00", "25%")


def test_cluster_columns_count_nodes_cards_and_running_tasks(admin_web, world):
    _running(world, "2")
    Device.objects.filter(node=world.node, index__lt=2).update(utilization=90)
    row, cluster_admin = _row(admin_web, Cluster, world.cluster)
    assert (cluster_admin.node_count(row), cluster_admin.gpu_count(row)) == (1, 8)
    assert (cluster_admin.allocated_gpu(row), cluster_admin.running_tasks(row)) == ("2.00", 1)
    assert cluster_admin.card_utilisation(row) == "22%"
    assert "Healthy" in cluster_admin.status_badge(row)

    row, node_admin = _row(admin_web, Node, world.node)
    assert (node_admin.device_count(row), node_admin.card_utilisation(row)) == (8, "22%")


def test_queue_columns_count_waiting_demand_from_gpu_specs(admin_web, world):
    for spec, instances in (("2(A100)", 1), ("1(A100)", 3), ("", 1)):
        TaskFactory(
            project=world.project,
            owner=world.member,
            vdc=world.vdc,
            queue=world.high,
            status="queued",
            gpu_spec=spec,
            instances=instances,
        )
    _running(world, "1")
    row, queue_admin = _row(admin_web, TaskQueue, world.high)
    assert (queue_admin.waiting_tasks(row), queue_admin.running_tasks(row)) == (3, 1)
    assert queue_admin.gpu_in_use(row) == "1.00"
    assert queue_admin.gpu_waiting(row) == "5.00"


def test_project_and_quota_columns_show_usage(admin_web, world):
    _running(world, "3", cpu=Decimal("4"), instances=2)
    _running(world, "1", project=world.other_project)
    row, project_admin = _row(admin_web, Project, world.project)
    assert (project_admin.member_count(row), project_admin.active_tasks(row)) == (3, 1)
    assert project_admin.gpu_in_use(row) == "3.00"

    row, quota_admin = _row(admin_web, ProjectQuota, world.quota)
    assert quota_admin.gpu_usage(row) == "3.00 / 2.00 / 8.00"
    assert quota_admin.cpu_usage(row) == "8.00 / 16.00 / 64.00"
    assert quota_admin.tasks_usage(row) == "1 / ∞"
