"""Capacity reservations through the Django scheduling service: loaded by SnapshotLoader, obeyed by the cycle."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.models import CapacityReservation
from apps.control.scheduling import SnapshotLoader, run_cycle
from apps.tasks.services import submit_task


def submit(world, queue="high", user=None, project=None, **fields):
    fields.setdefault("kind", "training")
    fields.setdefault("name", "job")
    return submit_task(user or world.member, project=project or world.project, queue=queue, command="sleep 1", **fields)


def reserve(world, start=timedelta(minutes=-1), end=timedelta(hours=2), projects=(), **fields):
    now = timezone.now()
    r = CapacityReservation.objects.create(
        vdc=world.vdc, name=fields.pop("name", "firmware"), starts_at=now + start, ends_at=now + end, **fields
    )
    r.projects.set(projects)
    return r


def test_snapshot_carries_the_reservations_that_have_not_ended(world):
    reserve(world, cluster=world.cluster, cpu=8, projects=[world.project], preempt_at_start=True)
    reserve(world, start=timedelta(hours=-3), end=timedelta(hours=-1), name="over")
    snap = SnapshotLoader(world.vdc).load(timezone.now())
    assert [x.name for x in snap.reservations] == ["firmware"]
    (loaded,) = snap.reservations
    assert loaded.cluster_ids == (world.cluster.pk,) and loaded.cpu == 8.0
    assert loaded.projects == frozenset({world.project.pk}) and loaded.preempt_at_start
    assert loaded.end - loaded.start == pytest.approx(2 * 3600 + 60)


def test_a_task_waits_for_a_maintenance_window_with_a_clear_reason(world):
    r = reserve(world)  # no nodes, no amount: every node of the VDC
    task = submit(world, gpu_spec="1(A100)")
    assert run_cycle(world.vdc.pk).started == 0
    task.refresh_from_db()
    assert task.status == "queued" and task.pending_reason == "capacity_reserved"
    assert task.pending_message.startswith("capacity reserved for maintenance (“firmware”) until ")
    assert abs(task.estimated_start - r.ends_at) < timedelta(seconds=1)


def test_an_event_reservation_lets_only_its_project_in(world):
    r = reserve(world, name="hackathon", projects=[world.project])
    r.nodes.set([world.node])
    other = submit(world, user=world.outsider, project=world.other_project, gpu_spec="1(A100)", name="other")
    mine = submit(world, gpu_spec="1(A100)", name="mine")
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    mine.refresh_from_db()
    assert mine.status == "scheduled"
    assert other.status == "queued" and other.pending_reason == "capacity_reserved"
    assert "an event (“hackathon”)" in other.pending_message


def test_before_the_window_only_work_that_ends_in_time_is_placed(world):
    reserve(world, start=timedelta(minutes=30), end=timedelta(hours=3))
    long_ = submit(world, gpu_spec="1(A100)", name="long", expected_duration=timedelta(hours=2))
    short = submit(world, gpu_spec="1(A100)", name="short", expected_duration=timedelta(minutes=10))
    bounded = submit(
        world, gpu_spec="1(A100)", name="bounded", expected_duration=timedelta(hours=2), wall_time=timedelta(minutes=20)
    )
    run_cycle(world.vdc.pk)
    for t in (long_, short, bounded):
        t.refresh_from_db()
    assert short.status == bounded.status == "scheduled"
    assert long_.pending_reason == "capacity_reserved"
    assert "this task could still be running then" in long_.pending_message


def test_running_work_runs_on_unless_the_reservation_drains(world):
    low = submit(world, queue="low", gpu_spec="2(A100)", name="batch")
    run_cycle(world.vdc.pk)
    r = reserve(world)
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "scheduled"
    r.preempt_at_start = True
    r.save()
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.status == "suspended"
    assert low.status_message.startswith("Suspended: capacity reserved for maintenance (“firmware”) from ")
    assert low.events.get(kind="suspended").data["reason"] == "capacity_reservation"
