"""Schemathesis over the whole OpenAPI schema, in-process: no 5xx, and every answer matches the schema.

Every operation gets a bounded number of generated requests that fit the schema (positive) and that do
not (negative), from a fixed seed, sent through the WSGI app as a project member who has tasks, events
and billing records (the node agent report as a cluster's agent, addressed to its node), then again as a
platform admin (a superuser), for whom every operation goes past the permission checks to its validation
and queries, with fewer examples. Detail operations address a real object the user can see. Each request
runs in a transaction that is rolled back, so every request meets the same data, with the same ids in every
run. Failures are collected per operation and reported together; the summary line says what ran.
"""

from __future__ import annotations

import collections
import contextlib
from datetime import timedelta
from decimal import Decimal

import hypothesis
import pytest
import schemathesis
from django.apps import apps as django_apps
from django.core.management.color import no_style
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, connection, transaction
from django.utils import timezone
from hypothesis import HealthCheck, Phase
from rest_framework.authtoken.models import Token
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from apps.billing.models import Account, Invoice, PriceRule, ProjectAlert, Transaction, UsageRecord
from apps.clusters.models import CapacityReservation, GPUModel
from apps.clusters.services import issue_agent_token
from apps.control.models import BackendObject
from apps.tasks.models import Sweep, Task, TaskEvent, TaskTemplate
from apps.vdc.models import CapacityLoan, RebalancerSettings
from apps.vdc.services import create_secret
from tests.factories import TaskFactory

MEMBER_EXAMPLES = 6  # per operation and mode
ADMIN_EXAMPLES = 3
SEED = 20261121
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
AGENT_REPORT = "/api/v1/agent/report/"
AGENT_NODE = "fuzz-node"  # the node the agent token reports for; generated reports are addressed to it


@pytest.fixture
def wsgi_app():
    """The portal's WSGI app, called in the test's thread and transaction (so it sees the test's data).

    Django closes the connection at the end of each request; here it must stay open in the test transaction.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def fuzz_world(world):
    """The world with tasks in several states, their timelines and billing records.

    Returns auth headers (the member's and the admin's tokens; an agent token for the node agent report)
    and, per resource path, the id of one object of it the member may see, so detail operations reach
    real objects.
    """
    a100 = GPUModel.objects.get(name="A100-80G")
    queued = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        status="queued",
        env={"EPOCHS": "3"},
        volumes=[{"name": "data", "mount_path": "/data", "claim_name": "d"}],
    )
    running = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.medium,
        status="running",
        cluster=world.cluster,
        allocated_gpu=Decimal("1"),
        replicas=1,
        started_at=timezone.now() - timedelta(hours=2),
        placement=[{"node_name": "gpu-node-1", "devices": [{"id": 1, "index": 0}]}],
    )
    TaskFactory(
        project=world.project,
        owner=world.owner,
        vdc=world.vdc,
        queue=world.low,
        status="completed",
        finished_at=timezone.now(),
    )
    TaskEvent.objects.create(task=running, kind="submitted", to_status="queued", actor=world.member)
    TaskEvent.objects.create(task=running, kind="started", from_status="starting", to_status="running")
    price = PriceRule.objects.create(resource_type="gpu", gpu_model=a100, price_per_hour=Decimal("12.5"))
    account = Account.objects.create(project=world.project, balance=Decimal("100"), credit_limit=Decimal("50"))
    end = timezone.now().replace(minute=0, second=0, microsecond=0)
    invoice = Invoice.objects.create(account=account, period_start=end - timedelta(days=30), period_end=end)
    usage = UsageRecord.objects.create(
        task=running,
        project=world.project,
        vdc=world.vdc,
        resource_type="gpu",
        gpu_model=a100,
        quantity=Decimal("1"),
        period_start=end - timedelta(hours=1),
        period_end=end,
        unit_price=Decimal("12.5"),
        cost=Decimal("12.5"),
        invoice=invoice,
    )
    charge = Transaction.objects.create(
        account=account, kind="charge", amount=Decimal("-12.5"), balance_after=Decimal("87.5"), usage_record=usage
    )
    alert = ProjectAlert.objects.create(
        project=world.project,
        vdc=world.vdc,
        rule="quota_high",
        key="quota:fuzz",
        message="GPU quota 88% used",
        since=end,
        fired_at=end,
    )
    backend_object = BackendObject.objects.create(
        cluster=world.cluster,
        task=running,
        task_uid=running.uid,
        attempt=1,
        name=f"hcs-{running.pk}-1",
        external_id="fuzz-1",
        state="active",
        shares=[{"id": 1, "milli": 1000}],
    )
    sweep = Sweep.objects.create(project=world.project, name="fuzz", created_by=world.member, parameters={"a": [1]})
    Task.objects.filter(pk=queued.pk).update(sweep=sweep, sweep_values={"a": "1"})
    objects = {
        "tasks": queued,
        "sweeps": sweep,
        "task-templates": TaskTemplate.objects.create(
            project=world.project, name="fuzz", created_by=world.owner, task_file={"kind": "training"}
        ),
        "backend-objects": backend_object,
        "vdcs": world.vdc,
        "clusters": world.cluster,
        "nodes": world.node,
        "devices": world.node.devices.first(),
        "gpu-models": a100,
        "queues": world.high,
        "projects": world.project,
        "memberships": world.member.memberships.get(),
        "vdc-quotas": world.quota,
        "project-secrets": create_secret(world.admin, world.project, "HF_TOKEN", "hf_fuzz"),
        "billing/accounts": account,
        "billing/invoices": invoice,
        "billing/prices": price,
        "billing/transactions": charge,
        "billing/usage": usage,
        "alerts": alert,
        "capacity-loans": CapacityLoan.objects.create(
            vdc=world.vdc,
            lender=world.other_project,
            borrower=world.project,
            gpu=Decimal(2),
            reason="fuzz",
            figures={"threshold": 0.2},
            started_at=end,
            expires_at=end + timedelta(hours=4),
        ),
        "rebalancer-settings": RebalancerSettings.objects.create(vdc=world.vdc),
        "capacity-reservations": CapacityReservation.objects.create(
            vdc=world.vdc, name="fuzz-window", starts_at=timezone.now(), ends_at=timezone.now() + timedelta(hours=1)
        ),
    }
    # Sequences restart at 1 (reset_sequences) under rows the migrations seeded (the GPU catalog): move each past
    # its table's largest id, or the first create of such a row collides on PostgreSQL.
    with connection.cursor() as cursor:
        for statement in connection.ops.sequence_reset_sql(no_style(), django_apps.get_models()):
            cursor.execute(statement)
    return {
        "member": {"Authorization": f"Token {Token.objects.create(user=world.member).key}"},
        "admin": {"Authorization": f"Token {Token.objects.create(user=world.admin).key}"},
        "agent": {"Authorization": f"Agent {issue_agent_token(world.cluster, AGENT_NODE)}"},
        "ids": {f"/api/v1/{path}/": obj.pk for path, obj in objects.items()},
    }


# Sequences restart, so the same generated ids meet the same objects whatever ran before: reproducible.
@pytest.mark.django_db(transaction=True, reset_sequences=True)
# Every operation of the schema, twice: minutes on a quiet machine, several times that when the machine is busy.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("user", "examples"), [("member", MEMBER_EXAMPLES), ("admin", ADMIN_EXAMPLES)])
def test_no_operation_answers_5xx_or_outside_its_schema(wsgi_app, fuzz_world, settings, capsys, user, examples):
    settings.ALLOWED_HOSTS = ["localhost"]
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", wsgi_app)
    statuses: collections.Counter = collections.Counter()
    failures: dict[str, str] = {}
    operations = 0

    for result in schema.get_all_operations():
        operation = result.ok()
        operations += 1
        headers = fuzz_world["agent" if operation.path == AGENT_REPORT else user]
        resource = operation.path.split("{id}")[0]
        path_parameters = {"id": fuzz_world["ids"][resource]} if "{id}" in operation.path else None
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            run = _fuzz(operation, mode, examples, headers, path_parameters, statuses, failures)
            # A mode may have nothing to generate for an operation (e.g. nothing to negate).
            with contextlib.suppress(hypothesis.errors.Unsatisfiable):
                run()

    with capsys.disabled():
        print(
            f"\nschemathesis ({user}): {operations} operations, up to {examples} examples per mode (positive, "
            f"negative), {sum(statuses.values())} requests, seed {SEED}; statuses {dict(sorted(statuses.items()))}; "
            f"5xx: {sum(n for code, n in statuses.items() if code >= 500)}; failing operations: {len(failures)}"
        )
    assert not failures, "\n\n".join(f"{label}:\n{message}" for label, message in sorted(failures.items()))


def _fuzz(operation, mode, examples, headers, path_parameters, statuses, failures):
    """A Hypothesis test that sends generated requests for one operation and records what the checks say."""

    @hypothesis.seed(SEED)
    @hypothesis.settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @hypothesis.given(case=operation.as_strategy(mode, path_parameters=path_parameters))
    def run(case):
        if operation.path == AGENT_REPORT and isinstance(case.body, dict) and isinstance(case.body.get("node"), str):
            case.body["node"] = AGENT_NODE
        with transaction.atomic():
            response = case.call(headers=headers)
            transaction.set_rollback(True)
        statuses[response.status_code] += 1
        try:
            case.validate_response(response, checks=CHECKS)
        except BaseExceptionGroup as exc:
            failures.setdefault(f"{operation.label} ({mode})", str(exc))

    return run
