"""Exactly-once accrual: retries, overlapping and concurrent runs, crashes, preemption, the final accrual."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from apps.billing import services
from apps.billing.models import Account, PriceRule, Transaction, UsageMeter, UsageRecord
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import requeue_task, stop_task, submit_task
from hcsportal import redis_guard
from tests.billing.conftest import T0, at, start_task

D = Decimal


def records_of(task) -> list[tuple]:
    rows = UsageRecord.objects.filter(task=task).order_by("resource_type", "period_start")
    return list(rows.values_list("resource_type", "gpu_model", "period_start", "period_end", "quantity", "cost"))


def test_intervals_are_contiguous_and_sum_to_the_run(world, prices, account):
    task = start_task(world, gpu_spec="1(A100)", cpu="2")
    for minute in (1, 2, 3, 5):
        services.accrue_task(task.pk, now=at(minutes=minute))
    cpu = UsageRecord.objects.filter(task=task, resource_type="cpu").order_by("period_start")
    bounds = [(r.period_start, r.period_end) for r in cpu]
    assert bounds[0][0] == T0 and bounds[-1][1] == at(minutes=5)
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    # Each record rounds to a millionth of a unit-hour; together they stay within a few millionths of 2 x 5 min.
    assert abs(sum(r.quantity for r in cpu) - D("2") * 5 / 60) < D("0.000005")


def test_retrying_an_accrual_writes_nothing_twice(world, prices, account):
    task = start_task(world)
    assert services.accrue_task(task.pk, now=at(minutes=1)) == 4
    before = records_of(task)
    assert services.accrue_task(task.pk, now=at(minutes=1)) == 0
    # A late retry with an older clock does not go back either.
    assert services.accrue_task(task.pk, now=at(seconds=30)) == 0
    assert records_of(task) == before
    account.refresh_from_db()
    assert account.balance == D("1000") - sum(r[5] for r in before)


def test_ledger_has_one_charge_per_priced_record_and_the_balance_follows(world, prices, account):
    task = start_task(world)
    services.accrue_task(task.pk, now=at(minutes=30))
    services.accrue_task(task.pk, now=at(minutes=60))
    charges = Transaction.objects.filter(account=account, kind="charge").order_by("id")
    priced = UsageRecord.objects.filter(task=task, cost__gt=0)
    assert charges.count() == priced.count() == 6  # cpu, memory, A100 twice; equivalents unpriced
    balance = D("1000")
    for charge in charges:
        balance += charge.amount
        assert charge.balance_after == balance
        assert charge.amount == -charge.usage_record.cost
    account.refresh_from_db()
    assert account.balance == balance


def test_a_crash_mid_accrual_leaves_nothing_half_written(world, prices, account, monkeypatch):
    task = start_task(world)
    real = services._ledger_entry

    def crash(*args, **kwargs):
        raise RuntimeError("worker died")

    monkeypatch.setattr(services, "_ledger_entry", crash)
    with pytest.raises(RuntimeError):
        services.accrue_task(task.pk, now=at(minutes=10))
    assert not UsageRecord.objects.filter(task=task).exists()
    assert not Transaction.objects.exists()
    account.refresh_from_db()
    assert account.balance == D("1000")
    assert UsageMeter.objects.get(task=task).metered_until is None

    monkeypatch.setattr(services, "_ledger_entry", real)
    services.accrue_task(task.pk, now=at(minutes=10))
    cpu = UsageRecord.objects.get(task=task, resource_type="cpu")
    assert (cpu.period_start, cpu.period_end) == (T0, at(minutes=10))  # the lost attempt's interval is not lost


def test_a_duplicate_interval_is_refused_whole_by_the_unique_constraint(world, prices, account):
    task = start_task(world)
    services.accrue_task(task.pk, now=at(minutes=1))
    # Another worker (with a watermark we did not see) already wrote the next cpu interval.
    UsageRecord.objects.create(
        task=task,
        project=world.project,
        vdc=world.vdc,
        resource_type="cpu",
        period_start=at(minutes=1),
        period_end=at(minutes=2),
        quantity=D("0.066667"),
    )
    balance = Account.objects.get(pk=account.pk).balance
    assert services.accrue_task(task.pk, now=at(minutes=2)) == 0
    assert UsageRecord.objects.filter(task=task, period_start=at(minutes=1)).count() == 1
    assert Account.objects.get(pk=account.pk).balance == balance
    assert UsageMeter.objects.get(task=task).metered_until == at(minutes=1)


def test_a_failing_task_does_not_stop_the_metering_pass(world, prices, account, monkeypatch):
    first = start_task(world, gpu_spec="1(A100)", name="first")
    second = start_task(world, gpu_spec="1(A100)", name="second")
    real = services.accrue_task

    def flaky(task_id, now=None):
        if task_id == first.pk:
            raise RuntimeError("boom")
        return real(task_id, now)

    monkeypatch.setattr(services, "accrue_task", flaky)
    result = services.meter_usage(now=at(minutes=1))
    assert (result.tasks, result.errors) == (2, 1)
    assert UsageRecord.objects.filter(task=second).exists()


def test_preempted_run_is_billed_up_to_the_preemption_with_what_it_held(world, prices, account):
    world.quota.limit_gpu = 16
    world.quota.save()
    low = start_task(world, gpu_spec="8(A100)", queue="low", name="batch")
    services.accrue_task(low.pk, now=at(minutes=1))
    submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="urgent",
        gpu_spec="4(A100)",
        command="sleep 1",
    )
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended" and low.placement == []
    suspended_at = low.events.get(kind="suspended").created_at
    services.accrue_task(low.pk)
    gpu = UsageRecord.objects.filter(task=low, resource_type="gpu").order_by("period_start")
    assert gpu.last().period_end == suspended_at
    assert all(r.quantity > 0 for r in gpu)
    assert UsageMeter.objects.get(task=low).closed
    # Waiting in the queue costs nothing.
    assert services.accrue_task(low.pk) == 0


def queued_accruals() -> list[str]:
    """The arguments of the accrual jobs waiting on the broker's queue (the real Redis of the tests)."""
    messages = (json.loads(raw) for raw in redis_guard.client().lrange("celery", 0, -1))
    return [m["headers"]["argsrepr"] for m in messages if m["headers"]["task"] == "apps.billing.jobs.accrue_task"]


def test_stop_queues_the_final_accrual(world, prices, account, django_capture_on_commit_callbacks):
    task = start_task(world)
    services.accrue_task(task.pk, now=at(minutes=1))
    before = queued_accruals().count(f"({task.pk},)")
    with django_capture_on_commit_callbacks(execute=True):
        stop_task(task, world.member)
    assert queued_accruals().count(f"({task.pk},)") == before + 1
    task.refresh_from_db()
    services.accrue_task(task.pk)
    last = UsageRecord.objects.filter(task=task, resource_type="cpu").order_by("period_start").last()
    assert last.period_end == task.finished_at
    assert UsageMeter.objects.get(task=task).closed
    # Once metered to its end, further changes of the task queue nothing.
    with django_capture_on_commit_callbacks(execute=True):
        from apps.tasks.signals import task_changed

        task_changed.send(sender=Task, task_ids=[task.pk])
    assert queued_accruals().count(f"({task.pk},)") == before + 1


def test_a_run_the_meter_never_saw_is_billed_from_the_timeline(world, prices, account):
    world.quota.limit_gpu = 16
    world.quota.save()
    low = start_task(world, gpu_spec="8(A100)", queue="low", name="batch")
    submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="urgent",
        gpu_spec="4(A100)",
        command="sleep 1",
    )
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended"
    assert not UsageMeter.objects.filter(task=low).exists()
    assert low.pk in services.tasks_to_meter(low.updated_at)
    services.meter_usage()
    gpu = UsageRecord.objects.filter(task=low, resource_type="gpu")
    assert sum(r.quantity for r in gpu) > 0
    assert gpu.get().gpu_model.name == "A100-80G"


def test_a_restarted_task_meters_each_run_separately(world, prices, account):
    task = start_task(world, gpu_spec="1(A100)")
    services.accrue_task(task.pk, now=at(minutes=5))
    Task.objects.filter(pk=task.pk).update(status="preempted", placement=[], updated_at=at(minutes=6))
    task.events.create(kind="preempted", from_status="running", to_status="preempted")
    task.events.filter(kind="preempted").update(created_at=at(minutes=6))
    services.accrue_task(task.pk, now=at(minutes=7))
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.attempt == 2
    Task.objects.filter(pk=task.pk).update(started_at=at(minutes=20), status="running")
    services.accrue_task(task.pk, now=at(minutes=30))
    cpu = UsageRecord.objects.filter(task=task, resource_type="cpu").order_by("period_start")
    assert [(r.period_start, r.period_end) for r in cpu] == [
        (T0, at(minutes=5)),
        (at(minutes=5), at(minutes=6)),
        (at(minutes=20), at(minutes=30)),
    ]


def test_a_run_that_never_reached_running_costs_nothing(world, prices, account):
    task = start_task(world, gpu_spec="1(A100)")
    Task.objects.filter(pk=task.pk).update(status="starting")  # e.g. pulling its image
    assert services.accrue_task(task.pk, now=at(minutes=3)) == 0  # nothing is due before it runs
    task.refresh_from_db()
    stop_task(task, world.member)
    services.accrue_task(task.pk)
    assert not UsageRecord.objects.filter(task=task).exists()
    assert not Transaction.objects.filter(usage_record__task=task).exists()
    assert UsageMeter.objects.get(task=task).closed


def test_a_short_run_stopped_by_its_user_pays_the_minimum_and_a_preempted_one_does_not(world, prices, account):
    PriceRule.objects.update(min_billing_minutes=5)
    minimum = 5
    stopped = start_task(world, gpu_spec="1(A100)", started=at(minutes=0), name="stopped")
    Task.objects.filter(pk=stopped.pk).update(started_at=timezone.now() - timedelta(minutes=1))
    stopped.refresh_from_db()
    stop_task(stopped, world.member)
    services.accrue_task(stopped.pk)
    cpu = UsageRecord.objects.get(task=stopped, resource_type="cpu")
    assert cpu.period_end - cpu.period_start == timedelta(minutes=minimum)

    preempted = start_task(world, gpu_spec="1(A100)", name="preempted")
    began = timezone.now() - timedelta(minutes=1)
    Task.objects.filter(pk=preempted.pk).update(started_at=began)
    requeue_task(Task.objects.get(pk=preempted.pk), "node hcs-node-1 went down")
    services.accrue_task(preempted.pk)
    cpu = UsageRecord.objects.get(task=preempted, resource_type="cpu")
    assert cpu.period_start == began and cpu.period_end - began < timedelta(minutes=minimum)


def test_accounts_are_opened_on_first_charge(world, prices):
    task = start_task(world, gpu_spec="1(A100)")
    services.accrue_task(task.pk, now=at(hours=1))
    assert Account.objects.get(project=world.project).balance == -D("10.56")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_metering_runs_write_what_one_would(world, prices):
    Account.objects.create(project=world.project, balance=D("1000"))
    world.quota.limit_gpu = 16
    world.quota.save()
    tasks = [start_task(world, gpu_spec="1(A100)", name=f"job-{i}") for i in range(6)]
    rounds = [at(minutes=m) for m in (1, 2, 3)]
    barrier = threading.Barrier(2)
    errors = []

    def meter():
        try:
            for now in rounds:
                barrier.wait()
                result = services.meter_usage(now=now)
                assert result.errors == 0
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=meter) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    concurrent = {t.pk: records_of(t) for t in tasks}
    cost = sum(r[5] for rows in concurrent.values() for r in rows)

    # Exactly what one pass per round writes: four resources per task per round, contiguous from T0.
    for t in tasks:
        assert len(concurrent[t.pk]) == 4 * len(rounds)
        assert [r[2] for r in concurrent[t.pk] if r[0] == "cpu"] == [T0, *rounds[:-1]]
    account = Account.objects.get(project=world.project)
    assert account.balance == D("1000") - cost
    assert Transaction.objects.filter(kind="charge").count() == 3 * len(rounds) * len(tasks)
    # And a third, late pass over the same rounds changes nothing.
    for now in rounds:
        services.meter_usage(now=now)
    assert {t.pk: records_of(t) for t in tasks} == concurrent
