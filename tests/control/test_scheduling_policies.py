"""Queue policies through the Django service: new queue policies, quota weights and attained service reach the
engine."""

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
from tests.factories import TaskFactory


def submit(world, name, queue="low", gpu_spec="8(A100)"):
    return submit_task(
        world.member,
        project=world.project,
        queue=queue,
        kind="training",
        name=name,
        command="sleep 1",
        gpu_spec=gpu_spec,
    )


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


def test_a_queues_las_thresholds_and_a_tasks_speed_up_curve_reach_the_engine(world):
    world.low.las_thresholds_gpu_s = [600, 7200]
    world.low.full_clean()
    world.low.save()
    # Made directly: the world's local cluster runs no elastic task, and admission is not the question here.
    task = TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.low,
        status="queued",
        gpu_spec="1(A100)",
        elastic_min=1,
        elastic_max=4,
        scaling=0.6,
    )
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    [queue] = [q for q in snapshot.queues if q.id == world.low.pk]
    assert queue.las_thresholds_gpu_s == (600.0, 7200.0)
    [engine_task] = [t for t in snapshot.queued if t.id == task.pk]
    assert engine_task.scaling == 0.6


@pytest.mark.parametrize("thresholds", [[7200, 600], [0, 10], ["1h"], [], [True, 5], 3600])
def test_las_thresholds_must_be_ascending_positive_numbers(world, thresholds):
    world.low.las_thresholds_gpu_s = thresholds
    with pytest.raises(ValidationError, match="ascending positive GPU-second thresholds"):
        world.low.full_clean()


def test_a_speed_up_curve_needs_an_elastic_task_and_a_fraction(world):
    with pytest.raises(ValidationError, match="applies to elastic tasks"):
        submit_task(
            world.member,
            project=world.project,
            queue="low",
            kind="training",
            name="fixed",
            command="sleep 1",
            gpu_spec="1(A100)",
            scaling=0.9,
        )
    with pytest.raises(ValidationError, match="from 0 to 1"):
        submit_task(
            world.member,
            project=world.project,
            queue="low",
            kind="training",
            name="odd",
            command="sleep 1",
            gpu_spec="1(A100)",
            elastic_min=1,
            elastic_max=2,
            scaling=1.5,
        )
