"""List endpoints run a fixed number of queries however many rows there are (no N+1)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.billing.models import Account, Invoice, InvoiceLine, PriceRule, Transaction, UsageRecord
from apps.clusters.models import GPUModel
from apps.tasks.models import Task, TaskEvent
from tests.api.base import client_for
from tests.factories import (
    ClusterFactory,
    DeviceFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    ProjectQuotaFactory,
    TaskFactory,
    TaskQueueFactory,
    UserFactory,
    VDCFactory,
)

LISTS = [
    "vdcs/", "clusters/", "nodes/", "devices/", "gpu-models/", "queues/", "projects/", "memberships/", "vdc-quotas/",
    "tasks/", "billing/prices/", "billing/accounts/", "billing/usage/", "billing/transactions/", "billing/invoices/",
    "vdcs/{vdc}/quotas/", "vdcs/{vdc}/clusters/", "vdcs/{vdc}/stats/", "vdcs/{vdc}/resources/",
    "projects/{project}/vdc-quotas/", "clusters/{cluster}/jobs/", "clusters/{cluster}/stats/", "tasks/{task}/",
    "tasks/{task}/events/",
]  # fmt: skip


def seed(world, n: int, task: Task) -> None:
    """``n`` more rows of every kind, all visible to the project alpha's members."""
    now = timezone.now()
    for _ in range(n):
        vdc = VDCFactory()
        ProjectQuotaFactory(project=world.project, vdc=vdc)
        cluster = ClusterFactory(vdc=world.vdc)
        node = NodeFactory(cluster=cluster)
        DeviceFactory(node=node, index=0)
        DeviceFactory(node=node, index=1)
        TaskQueueFactory(vdc=world.vdc)
        project = ProjectFactory()
        ProjectQuotaFactory(project=project, vdc=world.vdc)
        MembershipFactory(project=project, user=world.member, role="member")
        MembershipFactory(project=world.project, user=UserFactory(), role="viewer")
        job = TaskFactory(project=project, owner=world.member, vdc=world.vdc, queue=world.high, cluster=cluster,
                          status="running", allocated_gpu=Decimal(1))  # fmt: skip
        job.preferred_clusters.set([cluster, world.cluster])
        TaskEvent.objects.create(task=task, kind="status", actor=world.member, message="tick")
        model = GPUModel.objects.create(name=f"M{job.pk}", vendor="amd", vram_gib=Decimal(64),
                                        exchange_rate=Decimal("0.5"), resource_name="amd.com/gpu",
                                        visible_devices_env="ROCR_VISIBLE_DEVICES")  # fmt: skip
        PriceRule.objects.create(resource_type="gpu", gpu_model=model, price_per_hour=Decimal(2))
        account = Account.objects.create(project=project)
        usage = UsageRecord.objects.create(task=job, project=project, vdc=world.vdc, resource_type="gpu",
                                           gpu_model=model, quantity=Decimal(1), period_start=now - timedelta(hours=1),
                                           period_end=now, cost=Decimal(2))  # fmt: skip
        Transaction.objects.create(account=account, kind="charge", amount=Decimal(-2), balance_after=Decimal(-2),
                                   usage_record=usage, created_by=world.admin)  # fmt: skip
        invoice = Invoice.objects.create(account=account, period_start=now - timedelta(days=1), period_end=now)
        for resource in ("cpu", "gpu"):
            InvoiceLine.objects.create(invoice=invoice, resource_type=resource, quantity=Decimal(1), amount=Decimal(1),
                                       gpu_model=model if resource == "gpu" else None)  # fmt: skip


def count_queries(client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, response.data
    return len(queries)


@pytest.mark.parametrize("role", ["admin", "member"])
@pytest.mark.parametrize("path", LISTS)
def test_query_count_does_not_grow_with_rows(world, path, role):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, cluster=world.cluster)
    url = "/api/v1/" + path.format(vdc=world.vdc.pk, project=world.project.pk, cluster=world.cluster.pk, task=task.pk)
    client = client_for(world.user(role))
    seed(world, 2, task)
    few = count_queries(client, url)
    seed(world, 15, task)
    assert count_queries(client, url) == few


def test_task_list_query_count_is_the_same_for_10_and_1000_tasks(world):
    def add(n: int) -> None:
        Task.objects.bulk_create(
            Task(
                name=f"bulk-{i}",
                project=world.project,
                owner=world.member,
                vdc=world.vdc,
                queue=world.high,
                kind="training",
                cluster=world.cluster,
                status="running",
            )  # fmt: skip
            for i in range(n)
        )

    client = client_for(world.member)
    urls = ["/api/v1/tasks/", f"/api/v1/clusters/{world.cluster.pk}/jobs/", "/api/v1/tasks/?status=running"]
    add(10)
    ten = [count_queries(client, url) for url in urls]
    add(990)
    assert Task.objects.count() == 1000
    assert [count_queries(client, url) for url in urls] == ten
    assert count_queries(client, "/api/v1/tasks/?page=20") == ten[0]


SUBMIT = {"project": "alpha", "queue": "high", "name": "job", "kind": "training", "gpu_spec": "1(A100)",
          "command": "echo hi", "env": {"EPOCHS": "3"}}  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "most"),
    [
        # project, role, default VDC, queue, GPU catalog (read once, then reused by the process for a few
        # seconds), reserved env names; in the transaction (a savepoint here) the quota row lock, the
        # unfinished-task count, the VDC's clusters with their nodes and cards (admission, one query), the task
        # and its event. The answer is built from these rows, not loaded back. (The on-commit live push and
        # cycle trigger are bounded on their own.) After the commit, the answer's notice (issue 11: "it can
        # start only after others leave"): the count of tasks waiting ahead, cards per model and what active
        # tasks hold of them, all aggregates.
        ({}, 16),
        # + the preferred cluster's lookup and the link row (Django's set() reads the current links first).
        ({"preferred_clusters": "cluster"}, 19),
    ],
)
def test_submit_runs_a_fixed_small_number_of_queries(world, django_assert_max_num_queries, extra, most):
    body = {**SUBMIT, **{key: [world.cluster.pk] for key in extra}}
    client = client_for(world.member)
    TaskFactory.create_batch(20, project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    with django_assert_max_num_queries(most):
        response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["events"][0]["kind"] == "submitted"
    assert response.data["preferred_clusters"] == body.get("preferred_clusters", [])
