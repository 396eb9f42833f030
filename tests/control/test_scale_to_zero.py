"""Scale to zero on the local cluster: real processes, requests through Connect's proxy (the service's app host).

An idle service that scales to zero releases its card (its job is cancelled, the card is free for others, billing
stops); a request through Connect wakes it, is held while the scheduler places it again and its program starts,
and is answered; the wait is the service's cold start, kept on the task. A request in flight keeps a service
awake; without the proxy's readings (Redis down) nothing scales to zero.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from django.test import Client

from apps.clusters.backends import executor_for
from apps.control import autoscaling
from apps.control.models import BackendObject, ObjectState
from apps.control.scheduling import run_cycle
from apps.tasks import access, request_rate
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task, update_autoscaling
from tests.control.drive import reconcile_all, run_until_running, wait_objects_ended, wait_status
from tests.control.test_autoscaling_local import PORT, SERVICE, get, get_when_up
from tests.portal.apps_host import app_clients

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_S = 30


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def start(world, name="svc", **fields):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name=name,
        kind="inference",
        command=SERVICE,
        gpu_spec="1(A100)",
        port=PORT,
        scale_to_zero_after_s=IDLE_S,
        **fields,
    )
    task = run_until_running(task)
    request_rate.forget(task.pk)
    return task


def held_request(sync, svc) -> dict:
    """A GET through the app host in a thread of its own, while this thread does what the worker would for the
    service it wakes (the cycle, the launch, the reconciliation); its status and body once it was answered."""
    answer: dict = {}
    held = threading.Thread(target=lambda: answer.update(zip(("status", "body"), get(sync), strict=True)))
    held.start()
    run_until_running(wait_status(svc, ("queued", "scheduled", "starting", "running"), timeout=30))
    held.join(timeout=120)
    assert not held.is_alive(), "the held request was never answered"
    return answer


def idle_pass(seconds_later: float) -> list[int]:
    """One autoscaler pass ``seconds_later`` from now (what beat runs every few seconds)."""
    return autoscaling.scale_idle_to_zero(time.time() + seconds_later)


def test_an_idle_service_releases_its_card_and_a_request_wakes_it_with_its_cold_start_kept(world):
    svc = start(world)
    sync, _ = app_clients(world.member, svc, PORT)
    assert get_when_up(sync, svc).startswith("cards=")
    first_job = svc.external_id

    assert idle_pass(IDLE_S - 5) == []  # answered a moment ago: not idle yet
    assert idle_pass(IDLE_S + 5) == [svc.pk]
    svc.refresh_from_db()
    assert svc.status == "scaled_to_zero"
    assert (svc.placement, svc.allocated_gpu, svc.cluster_id, svc.external_id) == ([], 0, None, "")
    slept = svc.events.get(kind="scaled_to_zero")
    assert slept.data["after_s"] == IDLE_S and "no request for" in slept.message
    # The control plane cancels its job; until the backend confirms it gone the card stays held.
    wait_objects_ended(world.cluster)
    assert executor_for(world.cluster).status(first_job) is None or not executor_for(world.cluster).status(
        first_job
    ).phase.value.startswith("run")
    assert not BackendObject.objects.filter(task=svc).exclude(state=ObjectState.ENDED).exists()
    # Asleep, it is nobody's to place: a cycle leaves it as it is.
    run_cycle(world.vdc.pk)
    svc.refresh_from_db()
    assert svc.status == "scaled_to_zero"

    # A request wakes it and is held until the woken service answers.
    answer = held_request(sync, svc)
    assert answer["status"] == 200 and answer["body"].startswith("cards="), answer
    svc.refresh_from_db()
    assert svc.status == "running" and svc.external_id and svc.external_id != first_job
    assert svc.last_cold_start_s is not None and 0 < svc.last_cold_start_s < 120
    kinds = list(svc.events.order_by("pk").values_list("kind", flat=True))
    assert kinds.index("scaled_to_zero") < kinds.index("woken") < kinds.index("cold_start")
    page = Client()
    page.force_login(world.member)
    html = page.get(f"/task-monitoring/{svc.pk}/").content.decode()
    assert 'data-field="cold-start"' in html and f"{svc.last_cold_start_s:.1f} s" in html


def test_the_card_of_a_service_scaled_to_zero_goes_to_waiting_work(world):
    world.node.devices.filter(index__gte=1).delete()  # one card for two tasks
    svc = start(world)
    other = submit_task(
        world.member,
        project=world.project,
        queue="low",
        name="batch",
        kind="training",
        command="sleep 600",
        gpu_spec="1(A100)",
    )
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "queued"
    assert idle_pass(IDLE_S + 5) == [svc.pk]
    wait_objects_ended(world.cluster)
    other = run_until_running(other)  # the one card, freed
    svc.refresh_from_db()
    assert svc.status == "scaled_to_zero"
    stop_task(other, world.member)


def test_a_request_in_flight_keeps_a_service_awake_and_its_end_starts_the_idle_time(world):
    svc = start(world)
    request_rate.count(svc.pk, time.time(), "long-stream")
    assert idle_pass(IDLE_S + 60) == []  # a stream still open
    now = time.time()
    request_rate.busy(svc.pk, now - 1, now, "long-stream")
    assert idle_pass(IDLE_S - 5) == []  # idle only since it ended
    assert idle_pass(IDLE_S + 5) == [svc.pk]
    assert idle_pass(IDLE_S + 10) == []  # a second pass releases nothing


def test_without_the_proxys_readings_nothing_scales_to_zero(world, monkeypatch):
    svc = start(world)

    class Down:
        def pipeline(self, *args, **kwargs):
            raise redis.ConnectionError("Redis is down")

    monkeypatch.setattr(request_rate.redis_guard, "client", lambda: Down())
    assert idle_pass(IDLE_S * 10) == []
    svc.refresh_from_db()
    assert svc.status == "running"


def test_a_service_asleep_can_be_stopped_and_turning_scale_to_zero_off_wakes_it(world):
    svc = start(world)
    assert idle_pass(IDLE_S + 5) == [svc.pk]
    svc.refresh_from_db()
    update_autoscaling(svc, world.member, scale_to_zero_after_s=None)
    svc.refresh_from_db()
    assert svc.status == "queued"
    assert svc.events.filter(kind="woken", message__contains="turned off").exists()
    svc = run_until_running(svc)
    update_autoscaling(svc, world.member, scale_to_zero_after_s=60)
    svc.refresh_from_db()
    assert autoscaling.scale_idle_to_zero(time.time() + 65) == [svc.pk]
    svc.refresh_from_db()
    stop_task(svc, world.member)
    svc.refresh_from_db()
    assert svc.status == "stopped"
    reconcile_all()


def test_connect_refuses_a_service_that_does_not_scale_to_zero_when_it_is_not_running(world):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="plain",
        kind="inference",
        command=SERVICE,
        gpu_spec="1(A100)",
        port=PORT,
    )
    sync, _ = app_clients(world.member, task, PORT)
    status, body = get(sync)
    assert status == 409 and "not running" in body
    assert Task.objects.get(pk=task.pk).status == "queued"


def test_a_request_that_raced_the_scale_down_is_held_and_answered(world, monkeypatch):
    """The proxy checked the service running, then it fell asleep before the request reached its replica: the
    request finds the job gone, and is held and answered like one that found the service asleep."""
    svc = start(world)
    sync, _ = app_clients(world.member, svc, PORT)
    assert get_when_up(sync, svc).startswith("cards=")
    stale = access.connect_target(world.member, svc.pk, PORT)
    assert idle_pass(IDLE_S + 5) == [svc.pk]
    wait_objects_ended(world.cluster)
    real, calls = access.connect_target, []

    def first_stale(user, task_id, port):
        calls.append(task_id)
        return stale if len(calls) == 1 else real(user, task_id, port)

    monkeypatch.setattr(access, "connect_target", first_stale)
    answer = held_request(sync, svc)
    assert answer["status"] == 200 and answer["body"].startswith("cards="), answer
    assert len(calls) > 1
