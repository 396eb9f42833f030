"""Anti-churn (docs/rules.md#scheduling-quality) on the Django side: queue rules reach the engine; preemptions are
counted with the work they lose."""

from __future__ import annotations

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from apps.control.scheduling import SnapshotLoader, run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.api.base import client_for


def submit(world, queue="high", project=None, user=None, **fields):
    fields.setdefault("kind", "training")
    fields.setdefault("name", "job")
    return submit_task(user or world.member, project=project or world.project, queue=queue, command="sleep 1", **fields)


def test_queue_reservation_threshold_and_minimum_run_reach_the_engine(world):
    world.medium.reserve_after = None
    world.medium.min_run_before_reclaim = timedelta(minutes=12)
    world.medium.save()
    snapshot = SnapshotLoader(world.vdc).load(timezone.now())
    queues = {q.id: q for q in snapshot.queues}
    assert (queues[world.medium.pk].reserve_after_s, queues[world.medium.pk].min_run_before_reclaim_s) == (None, 720)
    # The defaults: a medium task reserves after an hour; no reclaim within 5 minutes of a start.
    assert (queues[world.low.pk].reserve_after_s, queues[world.low.pk].min_run_before_reclaim_s) == (3600, 300)


def test_a_preempted_task_counts_its_preemptions_and_the_work_it_lost(client, world):
    world.quota.limit_gpu = 16
    world.quota.save()
    low = submit(world, gpu_spec="8(A100)", queue="low", name="batch")
    run_cycle(world.vdc.pk)
    # It has run for an hour on 8 A100 (1 GPU-equivalent each) when a high task needs the node.
    Task.objects.filter(pk=low.pk).update(started_at=timezone.now() - timedelta(hours=1))
    submit(world, gpu_spec="4(A100)", name="urgent")
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended"
    assert low.preemption_count == 1
    assert abs(float(low.lost_gpu_seconds) - 8 * 3600) < 60
    assert abs(low.events.get(kind="suspended").data["lost_gpu_seconds"] - 8 * 3600) < 60
    body = client_for(world.member).get(f"/api/v1/tasks/{low.pk}/").json()
    assert body["preemption_count"] == 1 and abs(float(body["lost_gpu_seconds"]) - 8 * 3600) < 60
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[low.pk])).content.decode()
    assert "1 time; 8.00 GPU-hours of work lost" in page


def test_a_borrower_is_not_reclaimed_before_its_queues_minimum_run(world):
    # "beta" borrows the whole node; "alpha" is guaranteed 4 GPUs and asks for 4 in the same class.
    world.quota.guaranteed_gpu = 4
    world.quota.limit_gpu = 8
    world.quota.save()
    borrower = submit(world, gpu_spec="8(A100)", queue="low", project=world.other_project, user=world.outsider)
    run_cycle(world.vdc.pk)
    mine = submit(world, gpu_spec="4(A100)", queue="low", name="mine")
    run_cycle(world.vdc.pk)
    borrower.refresh_from_db()
    mine.refresh_from_db()
    assert borrower.status == "scheduled" and mine.status == "queued"
    Task.objects.filter(pk=borrower.pk).update(started_at=timezone.now() - timedelta(minutes=6))
    run_cycle(world.vdc.pk)
    borrower.refresh_from_db()
    assert borrower.status == "suspended" and borrower.preemption_count == 1
    assert borrower.events.get(kind="suspended").data["reason"] == "quota_reclaim"
