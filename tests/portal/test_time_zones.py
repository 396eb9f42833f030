"""Every time the pages and the admin show names its zone, in the portal's time zone."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from apps.billing.models import Account, Transaction
from apps.core.templatetags.moments import format_moment
from apps.tasks.models import Task, TaskEvent
from apps.vdc.models import CapacityLoan
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

AT = datetime(2026, 11, 29, 7, 30, 5, tzinfo=UTC)


@pytest.fixture
def berlin(settings):
    settings.TIME_ZONE = "Europe/Berlin"


@pytest.fixture
def task(world):
    task = TaskFactory(project=world.project, vdc=world.vdc, queue=world.high, owner=world.member, status="queued")
    Task.objects.filter(pk=task.pk).update(submitted_at=AT)
    TaskEvent.objects.create(task=task, kind="submitted", to_status="queued")
    TaskEvent.objects.filter(task=task).update(created_at=AT)
    return Task.objects.get(pk=task.pk)


def test_one_helper_names_the_zone_to_the_minute_or_the_second(berlin):
    assert format_moment(AT) == "2026-11-29 08:30 CET"
    assert format_moment(AT, "seconds") == "2026-11-29 08:30:05 CET"
    assert format_moment(None) == ""


def test_task_pages_show_times_with_their_zone(client, world, task, berlin):
    client.force_login(world.member)
    listing = client.get(reverse("portal:compute-tasks")).content.decode()
    assert "2026-11-29 08:30 CET" in listing
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert "<dd>2026-11-29 08:30:05 CET</dd>" in page  # submitted
    assert ">2026-11-29 08:30:05 CET</time>" in page  # the timeline


def test_the_dashboard_shows_a_loans_times_with_their_zone(client, world, berlin):
    CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(2),
        reason="alpha waits",
        started_at=AT,
        expires_at=datetime(2026, 11, 29, 10, 0, tzinfo=UTC),
    )
    client.force_login(world.member)
    page = client.get(reverse("portal:dashboard")).content.decode()
    assert "2026-11-29 08:30 CET" in page and "2026-11-29 11:00 CET" in page


def test_the_billing_ledger_shows_times_with_their_zone(client, world, berlin):
    account = Account.objects.create(project=world.project, balance=Decimal("10"))
    entry = Transaction.objects.create(account=account, kind="credit", amount=Decimal("10"), balance_after=10)
    Transaction.objects.filter(pk=entry.pk).update(created_at=AT)
    client.force_login(world.owner)
    page = client.get(reverse("billing:project", args=[world.project.pk])).content.decode()
    assert "<td>2026-11-29 08:30 CET</td>" in page


def test_admin_changelists_show_times_with_their_zone(client, world, task, berlin):
    client.force_login(world.admin)
    tasks = client.get(reverse("admin:tasks_task_changelist")).content.decode()
    assert "2026-11-29 08:30 CET" in tasks
    events = client.get(reverse("admin:tasks_taskevent_changelist")).content.decode()
    assert "2026-11-29 08:30 CET" in events
