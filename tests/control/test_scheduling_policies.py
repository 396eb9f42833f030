"""Issue 13 D through the Django service: new queue policies, quota weights and attained service reach the engine."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.control.scheduling import SnapshotLoader, run_cycle
from apps.queues.services import set_queue_policy
from apps.tasks.services import submit_task
from apps.vdc.models import ProjectQuota


def submit(world, name, queue="low", gpu_spec="8(A100)"):
    return submit_task(world.member, project=world.project, queue=queue, kind="training", name=name,
                       command="sleep 1", gpu_spec=gpu_spec)  # fmt: skip


def _gpu_usage(world, task, hours):
    end = timezone.now() - timedelta(hours=1)
    UsageRecord.objects.create(
        task=task,
        project=world.project,
        vdc=world.vdc,
        resource_type="gpu",
        quantity=Decimal(hours),
        period_start=end - timedelta(hours=1),
        period_end=end,
    )


def test_las_queue_runs_the_task_with_least_attained_service_first(world):
    set_queue_policy(world.low, "las")
    veteran = submit(world, "veteran")
    _gpu_usage(world, veteran, "40")  # 40 GPU-hours in earlier runs
    newcomer = submit(world, "newcomer")
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    attained = {t.id: t.attained_gpu_s for t in snapshot.queued}
    assert attained == {veteran.pk: pytest.approx(40 * 3600), newcomer.pk: 0.0}
    run_cycle(world.vdc.pk)
    veteran.refresh_from_db()
    newcomer.refresh_from_db()
    assert (newcomer.status, veteran.status) == ("scheduled", "queued")


def test_fifo_queue_does_not_load_attained_service(world):
    task = submit(world, "t")
    _gpu_usage(world, task, "3")
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    assert [t.attained_gpu_s for t in snapshot.queued] == [0.0]


def test_quota_weight_reaches_the_engine_and_must_be_positive(world):
    ProjectQuota.objects.filter(project=world.project).update(weight=Decimal("2.5"))
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    weights = {q.project_id: q.weight for q in snapshot.quotas}
    assert weights[world.project.pk] == 2.5 and weights[world.other_project.pk] == 1.0
    quota = ProjectQuota.objects.get(project=world.project, vdc=world.vdc)
    quota.weight = Decimal("0")
    with pytest.raises(ValidationError, match="weight"):
        quota.full_clean()


@pytest.mark.parametrize("policy", ["nonstrict_fifo", "las", "sjf", "fair_share"])
def test_every_new_policy_is_selectable_and_schedules(world, policy):
    set_queue_policy(world.low, policy)
    task = submit(world, "t", gpu_spec="1(A100)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"


def test_an_unknown_policy_is_refused(world):
    with pytest.raises(ValidationError, match="Expected one of fifo, drf, backfill, nonstrict_fifo"):
        set_queue_policy(world.low, "lifo")


def test_preemption_count_reaches_the_engine(world):
    # A preempted low task is started again only when no high / medium task that could use its resources waits.
    fresh = submit(world, "fresh")
    again = submit(world, "again")
    type(again).objects.filter(pk=again.pk).update(preemption_count=3)
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    assert {t.id: t.preemptions for t in snapshot.queued} == {fresh.pk: 0, again.pk: 3}
