"""What a run stopped by an administrator costs: nothing before it ran, only the metered time after."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.billing import services
from apps.billing.models import PriceRule, Transaction, UsageRecord
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from tests.admin.conftest import admin_url
from tests.api.base import API, client_for
from tests.billing.conftest import start_task
from tests.factories import MembershipFactory, staff_user

MINIMUM = 5


def queued(world, name: str) -> Task:
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name=name,
        command="sleep 1",
        gpu_spec="1(A100)",
    )


def tasks_in_each_state(world) -> dict[str, Task]:
    """A queued task, one scheduled, one starting and one that ran for a few seconds (after its placement)."""
    PriceRule.objects.update(min_billing_minutes=MINIMUM)
    scheduled = start_task(world, gpu_spec="1(A100)", name="scheduled")
    Task.objects.filter(pk=scheduled.pk).update(status="scheduled", started_at=timezone.now())
    starting = start_task(world, gpu_spec="1(A100)", name="starting")
    Task.objects.filter(pk=starting.pk).update(status="starting", started_at=timezone.now())
    running = start_task(world, gpu_spec="1(A100)", name="running")
    Task.objects.filter(pk=running.pk).update(started_at=timezone.now() - timedelta(seconds=5))
    # Left in the queue: the cluster's eight cards are not all taken, so the scheduler is not run again.
    waiting = queued(world, "queued")
    tasks = {"queued": waiting, "scheduled": scheduled, "starting": starting, "running": running}
    # Metered while they ran, as the beat job does every minute.
    services.meter_usage()
    return {status: Task.objects.get(pk=task.pk) for status, task in tasks.items()}


def check_ledger(tasks: dict[str, Task]) -> None:
    services.meter_usage()  # the beat job's pass: the final accrual of every ended run
    for status in ("queued", "scheduled", "starting"):
        task = tasks[status]
        task.refresh_from_db()
        assert task.status == "stopped", status
        assert not UsageRecord.objects.filter(task=task).exists(), status
        assert not Transaction.objects.filter(usage_record__task=task).exists(), status
    running = Task.objects.get(pk=tasks["running"].pk)
    assert running.status == "stopped"
    cpu = UsageRecord.objects.filter(task=running, resource_type="cpu").order_by("period_start")
    assert cpu, "the seconds it ran are billed"
    assert cpu.first().period_start == running.started_at
    # Only the time it held: an administrator's stop owes no minimum billing period.
    assert cpu.last().period_end == running.finished_at
    assert running.finished_at - running.started_at < timedelta(minutes=1)


@pytest.mark.django_db
def test_an_admin_cancel_in_the_admin_charges_only_what_ran(client, world, prices, account):
    tasks = tasks_in_each_state(world)
    client.force_login(world.admin)
    response = client.post(
        admin_url(Task, "changelist"),
        {"action": "cancel", "_selected_action": [t.pk for t in tasks.values()], "confirm": "yes"},
    )
    assert response.status_code == 302
    check_ledger(tasks)


@pytest.mark.django_db
def test_a_stop_through_the_api_by_a_staff_user_charges_only_what_ran(world, prices, account):
    tasks = tasks_in_each_state(world)
    client = client_for(staff_user("ops-stopper", "tasks.view_task", "tasks.change_task"))
    for task in tasks.values():
        response = client.post(f"{API}tasks/{task.pk}/stop/", {"reason": "maintenance"}, format="json")
        assert response.status_code == 200, response.data
    check_ledger(tasks)


@pytest.mark.django_db
def test_an_administrator_who_is_a_member_stopping_a_task_of_the_project_pays_the_minimum(world, prices, account):
    PriceRule.objects.update(min_billing_minutes=MINIMUM)
    MembershipFactory(project=world.project, user=world.admin, role="member")
    task = start_task(world, gpu_spec="1(A100)")
    Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(seconds=5))
    stop_task(Task.objects.get(pk=task.pk), world.admin)
    services.meter_usage()
    task.refresh_from_db()
    cpu = UsageRecord.objects.filter(task=task, resource_type="cpu").order_by("period_start")
    assert cpu.last().period_end == task.started_at + timedelta(minutes=MINIMUM)


@pytest.mark.django_db
def test_a_run_a_service_scaled_to_zero_ended_owes_no_minimum_and_nothing_accrues_while_asleep(world, prices, account):
    from apps.tasks.services import scale_to_zero, wake

    PriceRule.objects.update(min_billing_minutes=MINIMUM)
    task = start_task(world, gpu_spec="1(A100)", kind="inference", port=8000, scale_to_zero_after_s=60, name="svc")
    Task.objects.filter(pk=task.pk).update(started_at=timezone.now() - timedelta(seconds=5))
    assert scale_to_zero(task.pk, "idle (test)", {})
    services.meter_usage()
    task.refresh_from_db()
    cpu = UsageRecord.objects.filter(task=task, resource_type="cpu").order_by("period_start")
    assert cpu, "the seconds it ran are billed"
    ended = task.events.get(kind="scaled_to_zero").created_at
    assert cpu.last().period_end == ended  # the platform ended the run: only the time it held
    billed = cpu.count()
    services.meter_usage()  # asleep: nothing more
    assert UsageRecord.objects.filter(task=task, resource_type="cpu").count() == billed
    assert wake(task.pk) and not wake(task.pk)  # a second request finds it woken already
