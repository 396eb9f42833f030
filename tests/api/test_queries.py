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
    "vdcs/",
    "clusters/",
    "nodes/",
    "devices/",
    "gpu-models/",
    "queues/",
    "projects/",
    "memberships/",
    "vdc-quotas/",
    "tasks/",
    "billing/prices/",
    "billing/accounts/",
    "billing/usage/",
    "billing/transactions/",
    "billing/invoices/",
    "vdcs/{vdc}/quotas/",
    "vdcs/{vdc}/clusters/",
    "vdcs/{vdc}/stats/",
    "vdcs/{vdc}/resources/",
    "projects/{project}/vdc-quotas/",
    "clusters/{cluster}/jobs/",
    "clusters/{cluster}/stats/",
    "tasks/{task}/",
    "tasks/{task}/events/",
]


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
        job = TaskFactory(
            project=project,
            owner=world.member,
            vdc=world.vdc,
            queue=world.high,
            cluster=cluster,
            status="running",
            allocated_gpu=Decimal(1),
        )
        job.preferred_clusters.set([cluster, world.cluster])
        TaskEvent.objects.create(task=task, kind="status", actor=world.member, message="tick")
        model = GPUModel.objects.create(
            name=f"M{job.pk}",
            vendor="amd",
            vram_gib=Decimal(64),
            exchange_rate=Decimal("0.5"),
            resource_name="amd.com/gpu",
            visible_devices_env="ROCR_VISIBLE_DEVICES",
        )
        PriceRule.objects.create(resource_type="gpu", gpu_model=model, price_per_hour=Decimal(2))
        account = Account.objects.create(project=project)
        usage = UsageRecord.objects.create(
            task=job,
            project=project,
            vdc=world.vdc,
            resource_type="gpu",
            gpu_model=model,
            quantity=Decimal(1),
            period_start=now - timedelta(hours=1),
            period_end=now,
            cost=Decimal(2),
        )
        Transaction.objects.create(
            account=account,
            kind="charge",
            amount=Decimal(-2),
            balance_after=Decimal(-2),
            usage_record=usage,
            created_by=world.admin,
        )
        invoice = Invoice.objects.create(account=account, period_start=now - timedelta(days=1), period_end=now)
        for resource in ("cpu", "gpu"):
            InvoiceLine.objects.create(
                invoice=invoice,
                resource_type=resource,
                quantity=Decimal(1),
                amount=Decimal(1),
                gpu_model=model if resource == "gpu" else None,
            )


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
            )
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


SUBMIT = {
    "project": "alpha",
    "queue": "high",
    "name": "job",
    "kind": "training",
    "gpu_spec": "1(A100)",
    "command": "echo hi",
    "env": {"EPOCHS": "3"},
}


# Statements of one submit through the API (the client is authenticated without a token; the test's
# transaction makes the submission's BEGIN and COMMIT a SAVEPOINT and its RELEASE): project with the submitter's
# role, queue with its (default) VDC, quota (read without a lock), the VDC's clusters with their nodes and cards
# (admission); SAVEPOINT, the task, its event, RELEASE; the answer's notice: the count of tasks waiting ahead, the
# A100 cards of the VDC, what active tasks hold of them. The GPU catalog and the models' reserved env names come
# from the process's copy, read in an earlier request.
SUBMIT_QUERIES = 11


def submit_queries(client, body: dict) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.data
    assert response.data["events"][0]["kind"] == "submitted"
    assert response.data["preferred_clusters"] == body.get("preferred_clusters", [])
    return len(queries)


@pytest.mark.parametrize(
    ("extra", "more"),
    [
        ({}, 0),
        # + the preferred cluster's lookup and the link row (Django's set() reads the current links first).
        ({"preferred_clusters": "cluster"}, 3),
    ],
)
def test_submit_runs_a_fixed_small_number_of_queries(world, extra, more):
    body = {**SUBMIT, **{key: [world.cluster.pk] for key in extra}}
    client = client_for(world.member)
    TaskFactory.create_batch(20, project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    client.post("/api/v1/tasks/", SUBMIT, format="json")  # the process's GPU catalog copy
    assert submit_queries(client, body) == SUBMIT_QUERIES + more


def test_submit_queries_do_not_grow_with_tasks_clusters_models_members_or_env(world):
    client = client_for(world.member)
    client.post("/api/v1/tasks/", SUBMIT, format="json")
    for i in range(5):
        cluster = ClusterFactory(vdc=world.vdc, cluster_type="local")
        for _n in range(3):
            node = NodeFactory(cluster=cluster)
            DeviceFactory(node=node, index=0)
            DeviceFactory(node=node, index=1)
        GPUModel.objects.create(
            name=f"X{i}",
            vendor="amd",
            vram_gib=Decimal(64),
            exchange_rate=Decimal("0.5"),
            resource_name="amd.com/gpu",
            visible_devices_env=f"X{i}_VISIBLE_DEVICES",
        )
        MembershipFactory(project=world.project, user=UserFactory(), role="member")
        TaskQueueFactory(vdc=world.vdc)
    TaskFactory.create_batch(30, project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    TaskFactory.create_batch(
        10,
        project=world.project,
        vdc=world.vdc,
        queue=world.high,
        status="running",
        cluster=world.cluster,
        allocated_gpu=Decimal(1),
    )
    client.post("/api/v1/tasks/", SUBMIT, format="json")  # the catalog changed: this process reads it again
    env = {f"VAR_{i}": str(i) for i in range(40)}
    assert submit_queries(client, {**SUBMIT, "env": env}) == SUBMIT_QUERIES


def test_a_per_kind_limit_adds_the_quota_lock_and_one_count(world):
    world.quota.max_training_tasks = 100
    world.quota.save()
    client = client_for(world.member)
    client.post("/api/v1/tasks/", SUBMIT, format="json")
    TaskFactory.create_batch(20, project=world.project, vdc=world.vdc, queue=world.high, status="queued")
    assert submit_queries(client, SUBMIT) == SUBMIT_QUERIES + 2
