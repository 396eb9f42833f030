"""The portal as separate processes (web, Celery worker, beat) on a Redis of its own that the tests kill, restart
and hang: the worker keeps scheduling through any number of Redis restarts, and requests never wait on Redis.

The worker used to exit ("Unrecoverable error: AttributeError: 'NoneType' object has no attribute 'hostname'")
when Redis died while a job was running or reserved (celery_app/broker.py says why); a stop during a hung Redis
waited for it without end (its final accrual was queued with no socket timeout).
"""

from __future__ import annotations

import time

import pytest

from .portal_processes import Portal, portal_on_its_own_redis

pytestmark = pytest.mark.processes

STARTED = ("scheduled", "starting", "running", "completed", "failed")


@pytest.fixture
def portal(request):
    """Redis on a port of its own, and web, worker and beat on a database of their own; their logs are kept when
    the test fails."""
    failed_before = request.session.testsfailed
    with portal_on_its_own_redis(keep_files=lambda: request.session.testsfailed > failed_before) as started:
        yield started


def worker_trouble(deployment: Portal) -> str:
    """The worker's log from just before its fatal error, else its end."""
    log = deployment.log("worker")
    return log[max(0, log.find("Unrecoverable") - 200) :][:3000] if "Unrecoverable" in log else log[-3000:]


@pytest.mark.slow
def test_the_worker_keeps_scheduling_through_ten_redis_restarts(portal):
    deployment, server = portal
    first = deployment.submit("before").json()["id"]
    deployment.wait_for(first, ("running",), 90)
    outages = [
        ("killed", 0.3),
        ("killed", 2.0),
        ("hung, then resumed", 3.0),
        ("killed", 0.1),
        ("hung, then killed", 2.0),
        ("killed", 1.0),
        ("hung, then resumed", 15.0),
        ("killed", 0.5),
        ("killed", 3.0),
        ("hung, then killed", 1.0),
    ]
    for n, (outage, seconds) in enumerate(outages, 1):
        if outage == "killed":
            server.kill()
            time.sleep(seconds)
            server.start()
        else:
            server.hang()
            time.sleep(seconds)
            if outage.endswith("resumed"):
                server.resume()
            else:
                server.kill()
                server.start()
        # A job is held by a running sleep on each restart: the worker is busy while Redis goes.
        task_id = deployment.submit(f"after-{n}", command="sleep 3").json()["id"]
        try:
            deployment.wait_for(task_id, STARTED, 90)
        except AssertionError as exc:
            pytest.fail(
                f"restart {n} (Redis {outage} after {seconds} s): {exc}; worker log:\n{worker_trouble(deployment)}"
            )
        assert deployment.alive("worker") and deployment.alive("beat"), worker_trouble(deployment)
    assert "Unrecoverable error" not in deployment.log("worker")


def test_submit_and_stop_answer_at_once_while_redis_hangs_and_the_stop_is_carried_out_after(portal):
    deployment, server = portal
    running = deployment.wait_for(deployment.submit("running").json()["id"], ("running",), 90)
    assert deployment.job_alive(running["external_id"])

    server.hang()
    began = time.monotonic()
    submitted = deployment.submit("while-hung", timeout=20)
    submit_s = time.monotonic() - began
    began = time.monotonic()
    stopped = deployment.api("post", f"tasks/{running['id']}/stop/", timeout=20)
    stop_s = time.monotonic() - began
    assert (submitted.status_code, stopped.status_code) == (201, 200)
    assert stopped.json()["status"] == "stopped"  # durable in the database at once
    assert submit_s < 3 and stop_s < 3, f"submit took {submit_s:.2f} s, stop {stop_s:.2f} s with Redis hung"

    time.sleep(3)  # what a request left undone stays undone while Redis hangs; it is not lost
    server.resume()
    deadline = time.monotonic() + 60
    while deployment.job_alive(running["external_id"]):
        assert time.monotonic() < deadline, "the stopped task's job still runs 60 s after Redis came back"
        time.sleep(0.3)
    deployment.wait_for(submitted.json()["id"], STARTED, 60)
    assert deployment.alive("worker"), worker_trouble(deployment)
