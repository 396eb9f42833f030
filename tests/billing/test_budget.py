"""Budget admission end to end: an exhausted project starts nothing new, and its running tasks keep running."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from apps.billing import services
from apps.billing.models import Account
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task


def submit(world, name, gpu_spec="1(A100)"):
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name=name,
        gpu_spec=gpu_spec,
        command="sleep 1",
    )


def test_exhausted_budget_blocks_new_starts_but_keeps_running_tasks(world, prices):
    account = Account.objects.create(project=world.project, balance=Decimal("5"), enforce_budget=True)
    running = submit(world, "running")
    run_cycle(world.vdc.pk)
    running.refresh_from_db()
    assert running.status == "scheduled"
    Task.objects.filter(pk=running.pk).update(status="running")  # billed once it runs
    running.refresh_from_db()

    # An hour on an A100 costs more than the balance: the account goes below zero.
    services.accrue_task(running.pk, now=running.started_at + timedelta(hours=1))
    account.refresh_from_db()
    assert account.exhausted

    waiting = submit(world, "waiting")
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    running.refresh_from_db()
    assert waiting.status == "queued"
    assert waiting.pending_reason == "budget_exhausted"
    assert "budget" in waiting.pending_message
    assert running.status == "running"  # never killed for money

    # Another project in the same VDC is not affected.
    other = submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        kind="training",
        name="other",
        gpu_spec="1(A100)",
        command="sleep 1",
    )
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "scheduled"

    services.add_credit(account, Decimal("100"))
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "scheduled"


def test_credit_limit_counts_as_budget(world, prices):
    Account.objects.create(
        project=world.project, balance=Decimal("-10"), credit_limit=Decimal("20"), enforce_budget=True
    )
    task = submit(world, "on-credit")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"


def test_advisory_budget_never_blocks(world, prices):
    Account.objects.create(project=world.project, balance=Decimal("-1000"), enforce_budget=False)
    task = submit(world, "advisory")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"
