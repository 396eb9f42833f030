"""The Django scheduling service: snapshot loading, decisions applied atomically, bounded queries."""

from datetime import timedelta

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.tasks.models import Task
from apps.tasks.scheduling import SnapshotLoader, run_cycle
from apps.tasks.services import submit_task
from tests.factories import TaskFactory


def submit(world, queue="high", **fields):
    fields.setdefault("kind", "training")
    fields.setdefault("name", "job")
    return submit_task(world.member, project=world.project, queue=queue, command="sleep 1", **fields)


def test_cycle_places_a_queued_task_on_devices_and_writes_a_scheduled_event(world):
    task = submit(world, gpu_spec="2(A100)")
    result = run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert result.started == 1
    assert task.status == "scheduled"
    assert task.cluster == world.cluster
    assert task.attempt == 1
    assert len(task.placement) == 1 and len(task.placement[0]["devices"]) == 2
    assert task.placement[0]["node_name"] == "gpu-node-1"
    assert float(task.allocated_gpu) == 2.0
    assert task.events.filter(kind="scheduled").exists()


def test_task_that_does_not_fit_gets_a_position_and_a_reason(world):
    submit(world, gpu_spec="8(A100)", name="big")
    waiting = submit(world, gpu_spec="1(A100)", name="small", queue="medium", expected_duration=timedelta(hours=1))
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "queued"
    assert waiting.queue_position == 1
    assert waiting.pending_reason
    assert waiting.pending_message


def test_high_task_preempts_low_task_and_low_is_suspended(world):
    world.quota.limit_gpu = 16
    world.quota.save()
    low = submit(world, gpu_spec="8(A100)", queue="low", name="batch")
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "scheduled"
    high = submit(world, gpu_spec="4(A100)", name="urgent")
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    high.refresh_from_db()
    assert low.status == "suspended"
    event = low.events.get(kind="suspended")
    assert event.data["by_task"] == high.pk
    run_cycle(world.vdc.pk)
    high.refresh_from_db()
    assert high.status == "scheduled"


def test_snapshot_queries_do_not_grow_with_tasks(world):
    def queries_for(n):
        Task.objects.all().delete()
        TaskFactory.create_batch(n, project=world.project, owner=world.member, vdc=world.vdc, queue=world.low,
                                 gpu_spec="8(A100)")  # fmt: skip
        with CaptureQueriesContext(connection) as load:
            SnapshotLoader(world.vdc).load(timezone.now())
        with CaptureQueriesContext(connection) as cycle:
            run_cycle(world.vdc.pk)
        return len(load.captured_queries), len(cycle.captured_queries)

    (load_small, cycle_small), (load_large, cycle_large) = queries_for(5), queries_for(300)
    assert load_large == load_small
    # Writes are bulk statements in batches, so 60 times the tasks costs at most a few more statements.
    assert cycle_large <= cycle_small + 3, (cycle_small, cycle_large)


def test_cycle_of_a_disabled_vdc_is_skipped(world):
    world.vdc.enabled = False
    world.vdc.save()
    assert run_cycle(world.vdc.pk).skipped
