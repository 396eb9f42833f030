"""Shares of one card start together when the card has room for both, whatever backend runs them; a job being
cancelled keeps its share of the card from anyone else until its backend confirms it gone."""

import uuid

import pytest

from apps.clusters.models import Device
from apps.control import reconcile
from apps.control.models import BackendObject
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from tests.control.drive import intent, launch, wait_objects_ended, wait_status


@pytest.fixture
def one_card(world, settings, tmp_path):
    """The world's node with a single A100 (shares have nowhere else to go)."""
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    Device.objects.filter(node=world.node).exclude(index=0).delete()
    return Device.objects.get(node=world.node, index=0)


def share(world, name: str, spec: str = "0.5(A100)") -> Task:
    return submit_task(
        world.member, project=world.project, queue="high", kind="training", name=name, command="sleep 30", gpu_spec=spec
    )


def devices(task: Task) -> list[int]:
    task.refresh_from_db()
    return [d["id"] for p in task.placement for d in p["devices"]]


def test_two_shares_placed_on_one_card_both_launch(world, one_card):
    first, second = share(world, "first"), share(world, "second")
    run_cycle(world.vdc.pk)
    assert devices(first) == devices(second) == [one_card.pk]
    assert launch(first) == world.cluster.pk
    assert launch(second) == world.cluster.pk
    assert intent(first).shares == intent(second).shares == [{"id": one_card.pk, "milli": 500}]
    for task in (first, second):
        task.refresh_from_db()
        assert task.status in ("starting", "running") and task.external_id, (task.status, task.status_message)
    for task in (first, second):
        wait_status(task, "running")
        stop_task(task, world.member)
    wait_objects_ended(world.cluster)


def test_a_share_next_to_a_running_share_starts_at_once(world, one_card):
    first = share(world, "first")
    run_cycle(world.vdc.pk)
    launch(first)
    wait_status(first, "running")
    second = share(world, "second")
    run_cycle(world.vdc.pk)
    assert devices(second) == [one_card.pk]
    assert launch(second) == world.cluster.pk
    wait_status(second, "running")
    for task in (first, second):
        stop_task(task, world.member)
    wait_objects_ended(world.cluster)


def test_a_stopped_jobs_share_is_not_given_out_until_its_job_is_gone(world, one_card):
    first = share(world, "first", "1(A100)")
    run_cycle(world.vdc.pk)
    launch(first)
    wait_status(first, "running")
    stop_task(first, world.member)
    # Its job is still being cancelled: the card is not offered to the next task yet.
    second = share(world, "second", "1(A100)")
    run_cycle(world.vdc.pk)
    second.refresh_from_db()
    assert second.status == "queued", second.placement
    wait_objects_ended(world.cluster)
    run_cycle(world.vdc.pk)
    assert devices(second) == [one_card.pk]
    assert launch(second) == world.cluster.pk
    stop_task(second, world.member)
    wait_objects_ended(world.cluster)


def test_a_launch_waits_only_for_a_job_whose_share_leaves_no_room(world, one_card):
    # A job no live attempt wants still holds three quarters of the card on the backend: a half share must wait
    # for it, a quarter share fits beside it.
    leftover = BackendObject.objects.create(
        cluster=world.cluster,
        task=None,
        task_uid=uuid.uuid4(),
        attempt=1,
        name="leftover",
        state="active",
        shares=[{"id": one_card.pk, "milli": 750}],
    )
    half = BackendObject(cluster=world.cluster, shares=[{"id": one_card.pk, "milli": 500}])
    quarter = BackendObject(cluster=world.cluster, shares=[{"id": one_card.pk, "milli": 250}])
    assert reconcile.device_conflicts(half) == [leftover]
    assert reconcile.device_conflicts(quarter) == []
