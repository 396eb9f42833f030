"""Admin fixtures: one row of every registered model, a logged-in platform admin, and form data helpers."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.contrib.auth.models import Group
from django.forms import CheckboxInput, MultiWidget
from django.urls import reverse
from django.utils import timezone
from rest_framework.authtoken.models import Token

from apps.billing.models import (
    Account,
    AlertSettings,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    PriceRule,
    ProjectAlert,
    Transaction,
    UsageRecord,
)
from apps.clusters.models import CapacityReservation, GPUModel
from apps.control.models import BackendObject, CheckpointStore, Installation
from apps.tasks.models import ServiceLoadSample, Sweep, TaskEvent, TaskTemplate, TaskUsageSample
from apps.vdc.models import CapacityLoan, RebalancerSettings
from apps.vdc.services import create_secret
from tests.factories import TaskFactory


@pytest.fixture
def admin_web(client, world):
    """A test client logged in as the platform admin of the world."""
    client.force_login(world.admin)
    return client


@pytest.fixture
def every_model(world):
    """At least one row of every model the admin registers, so every change page can be opened."""
    a100 = GPUModel.objects.get(name="A100-80G")
    task = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.high,
        cluster=world.cluster,
        status="running",
        allocated_gpu=Decimal("2"),
        placement=[
            {
                "node": world.node.pk,
                "node_name": "gpu-node-1",
                "gpu_model": "A100-80G",
                "devices": [{"id": d.pk, "index": d.index, "milli": 1000} for d in world.node.devices.all()[:2]],
            }
        ],
        env={"EPOCHS": "3"},
    )
    TaskEvent.objects.create(task=task, kind="started", from_status="starting", to_status="running")
    TaskUsageSample.objects.create(
        task=task, at=timezone.now().replace(second=0, microsecond=0), gpu_percent=42.0, vram_used_gib=10, vram_gib=80
    )
    task.sweep = Sweep.objects.create(
        project=world.project, name="grid", created_by=world.member, parameters=[{"a": 1}]
    )
    task.sweep_values = {"a": "1"}
    task.save(update_fields=["sweep", "sweep_values"])
    TaskTemplate.objects.create(
        project=world.project, name="resnet", created_by=world.member, task_file={"kind": "training", "epochs": 3}
    )
    ServiceLoadSample.objects.create(
        task=task,
        start=timezone.now().replace(second=0, microsecond=0),
        rps=12.5,
        gpu_percent=60.0,
        samples=20,
        forecast_rps=14.0,
        forecast_method="holt-winters",
    )
    PriceRule.objects.create(
        resource_type="gpu",
        gpu_model=a100,
        price_per_hour=Decimal("12.5"),
        discount_tiers=[{"from_hours": 100, "percent": 10}],
    )
    account = Account.objects.create(project=world.project, balance=Decimal("100"), credit_limit=Decimal("50"))
    start = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
    end = start + timedelta(hours=1)
    invoice = Invoice.objects.create(account=account, period_start=start - timedelta(days=30), period_end=end)
    record = UsageRecord.objects.create(
        task=task,
        project=world.project,
        vdc=world.vdc,
        resource_type="gpu",
        gpu_model=a100,
        quantity=Decimal("2"),
        period_start=start,
        period_end=end,
        unit_price=Decimal("12.5"),
        cost=Decimal("25"),
        invoice=invoice,
    )
    Transaction.objects.create(
        account=account, kind="charge", amount=Decimal("-25"), balance_after=Decimal("75"), usage_record=record
    )
    InvoiceLine.objects.create(
        invoice=invoice, resource_type="gpu", gpu_model=a100, quantity=Decimal("2"), amount=Decimal("25")
    )
    InvoiceRun.objects.create(period_start=start, period_end=end, accounts=[account.pk], created_by=world.admin)
    AlertSettings.objects.create(vdc=world.vdc, quota_warn_percent=75)
    ProjectAlert.objects.create(
        project=world.project,
        vdc=world.vdc,
        rule="quota_high",
        key=f"quota:{world.vdc.pk}",
        message="GPU quota 88% used",
        since=end,
        fired_at=end,
    )
    window = CapacityReservation.objects.create(
        vdc=world.vdc, cluster=world.cluster, name="firmware", starts_at=end, ends_at=end + timedelta(hours=4)
    )
    window.nodes.set([world.node])
    window.projects.set([world.project])
    create_secret(world.admin, world.project, "HF_TOKEN", "hf_admin_s3cret", "the hub")
    RebalancerSettings.objects.create(vdc=world.vdc, threshold_percent=25)
    CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(2),
        reason="gpu: alpha uses 100% of its guarantee, beta uses 0%",
        started_at=start,
        expires_at=end,
        figures={"threshold": 0.2},
    )
    Group.objects.create(name="operators")
    Token.objects.create(user=world.admin)
    Installation.current()
    CheckpointStore.objects.create(cluster=world.cluster, task=task, task_uid=task.uid, project=task.project.name)
    BackendObject.objects.create(
        cluster=world.cluster,
        task=task,
        task_uid=task.uid,
        attempt=1,
        name="hcs-job-1",
        state="active",
        external_id="hcs-job-1",
        shares=[{"id": 1, "milli": 1000}, {"id": 2, "milli": 1000}],
    )
    login = {"ip_address": "203.0.113.7", "user_agent": "curl", "http_accept": "*/*", "path_info": "/accounts/login/"}
    AccessAttempt.objects.create(username="max", get_data="", post_data="", failures_since_start=2, **login)
    AccessFailureLog.objects.create(username="max", locked_out=False, **login)
    AccessLog.objects.create(username="max", **login)
    return world


def admin_url(obj_or_model, view: str = "change") -> str:
    opts = obj_or_model._meta
    args = [obj_or_model.pk] if view in ("change", "delete", "history") else []
    return reverse(f"admin:{opts.app_label}_{opts.model_name}_{view}", args=args)


def form_data(response) -> dict:
    """The POST data of an admin add / change page as rendered: the main form and every inline formset.

    Posting it back unchanged must save; tests change a few keys to exercise a form.
    """
    data: dict = {}
    forms = [response.context["adminform"].form]
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for bound in formset.management_form:
            data[bound.html_name] = bound.value()
        forms.extend(formset.forms)
    for form in forms:
        for bound in form:
            value = bound.value()
            widget = bound.field.widget
            if isinstance(widget, CheckboxInput):
                if value:
                    data[bound.html_name] = "on"
            elif isinstance(widget, MultiWidget):
                parts = value if isinstance(value, list | tuple) else widget.decompress(value)
                for index, part in enumerate(parts):
                    if part is not None:
                        data[f"{bound.html_name}_{index}"] = part
            elif value is not None:
                data[bound.html_name] = value
    return data
