"""Autoscaling end to end on the local cluster: real processes, requests through Connect's proxy (the service's
app host).

A service whose request rate rises gets a replica that really starts and serves; when the load goes, the
replica stops after the stabilisation window. A high service that needs a replica shrinks a low one, and
both recover when the pressure goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import threading
import time

import pytest
from asgiref.sync import async_to_sync
from django.test import Client

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import Endpoint, ExecutorError
from apps.clusters.executors.local import LocalExecutor
from apps.control import autoscaling
from apps.control.scheduling import run_cycle
from apps.tasks import request_rate
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from tests.control.drive import intent, reconcile_all, run_until_running, wait_status
from tests.portal.apps_host import HostClient, app_clients

pytestmark = pytest.mark.django_db(transaction=True)

PORT = 8000
# Answers every GET with the cards its replica was given, so a test sees which replica served it; /slow sends
# its headers at once and streams its body over SLOW_S seconds (a completion streamed token by token).
SLOW_S = 1.5
SERVICE = r"""
cat > serve.py <<'PY'
import http.server, os, time
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("cards=" + os.environ.get("CUDA_VISIBLE_DEVICES", "")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body) + (3 if self.path.startswith("/slow") else 0)))
        self.end_headers()
        self.wfile.flush()
        if self.path.startswith("/slow"):
            for _ in range(3):
                time.sleep(SLOW_S / 3)
                self.wfile.write(b".")
                self.wfile.flush()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", PORT_NUMBER), Handler).serve_forever()
PY
exec python3 serve.py
""".replace("PORT_NUMBER", str(PORT)).replace("SLOW_S", str(SLOW_S))


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


@pytest.fixture
def three_cards(world):
    """The local node keeps 3 of its 8 cards, so two services contend for them."""
    world.node.devices.filter(index__gte=3).delete()
    return world


def start(world, name, queue, **fields):
    fields = {"autoscale_min": 1, "autoscale_max": 3, "autoscale_rps": 5, **fields}
    task = submit_task(
        world.member,
        project=world.project,
        queue=queue,
        name=name,
        kind="inference",
        command=SERVICE,
        gpu_spec="1(A100)",
        port=PORT,
        **fields,
    )
    task = run_until_running(task)
    request_rate.forget(task.pk)
    return task


async def _read(response) -> bytes:
    return b"".join([chunk async for chunk in response.streaming_content])


def get(client, path="") -> tuple[int, str]:
    response = client.get("/" + path)
    content = async_to_sync(_read)(response) if response.streaming else response.content
    return response.status_code, content.decode(errors="replace")


def get_when_up(client, task, tries=100) -> str:
    for _ in range(tries):
        status, body = get(client)
        if status == 200:
            return body
        time.sleep(0.1)
    raise AssertionError(f"the service of task {task.pk} never answered: {status} {body}")


def serving(world, svc) -> tuple[HostClient, Client]:
    """An async and a plain client of the service's app host, as the member, once the service answers; its request
    counters are then cleared, so what a test reads is its own load."""
    sync, client = app_clients(world.member, svc, PORT)
    assert get_when_up(sync, svc).startswith("cards=")
    request_rate.forget(svc.pk)
    return client, sync


def replicas_running(task) -> int | None:
    task.refresh_from_db()
    return executor_for(task.cluster).status(task.external_id).replicas


def wait_replicas(task, n, timeout=30.0):
    """Reconcile (what beat does) until the backend runs ``n`` instances and the portal settled its placement."""
    deadline = time.monotonic() + timeout
    while True:
        reconcile_all()
        task.refresh_from_db()
        if replicas_running(task) == n and len(task.placement) == n and len(intent(task).device_ids) == n:
            return task
        if time.monotonic() > deadline:
            events = list(task.events.values_list("kind", "message"))
            raise AssertionError(
                f"task {task.pk}: {replicas_running(task)} running, placement {task.placement}; events {events}"
            )
        time.sleep(0.2)


def page_instances(world, task) -> tuple[int, list[str]]:
    """What the task's page shows its member: the instances listed, and the instances it offers a terminal for."""
    client = Client()
    client.force_login(world.member)
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    listed = page.count('<tr data-instance="')
    return listed, re.findall(r'data-terminal-instance="(\d+)"', page)


def settle_down(task, now):
    """No load for a stabilisation window: the autoscaler's passes (beat, every INTERVAL_S) until it asks for less."""
    request_rate.forget(task.pk)
    for step in range(1, 40):
        for outcome in autoscaling.run_autoscaler(now + 15 * step):
            if outcome.task_id == task.pk and outcome.changed:
                return outcome
    raise AssertionError("the autoscaler never scaled down")


def test_a_rising_request_rate_starts_a_replica_that_serves_then_it_goes_with_the_load(world):
    svc = start(world, "svc", "high", autoscale_max=2)
    client, _ = app_clients(world.member, svc, PORT)
    assert get_when_up(client, svc).startswith("cards=")
    # Load until the autoscaler reads more than one replica's 5 requests/s over its window (on a busy machine the
    # requests come slower: the test keeps sending rather than counting on a rate).
    deadline = time.monotonic() + 120
    while True:
        for _ in range(50):
            assert get(client)[0] == 200
        time.sleep(1.0)  # the rate is read over whole seconds that are over
        now, t0 = time.time(), time.monotonic()
        [outcome] = autoscaling.run_autoscaler(now)
        if outcome.desired == 2 or time.monotonic() > deadline:
            break
    assert (outcome.running, outcome.desired) == (1, 2), outcome.reason
    run_cycle(world.vdc.pk)
    svc = wait_replicas(svc, 2)
    bodies: set[str] = set()
    for _ in range(100):  # the proxy spreads requests over both replicas once the new one listens
        status, body = get(client)
        if status == 200:
            bodies.add(body)
        if len(bodies) == 2:
            break
        time.sleep(0.05)
    reaction_s = time.monotonic() - t0
    assert len(bodies) == 2, bodies
    assert page_instances(world, svc) == (2, ["0", "1"])  # both replicas listed, a terminal for each
    kinds = list(svc.events.values_list("kind", flat=True))
    assert "autoscaled" in kinds and "resized" in kinds
    print(f"\nautoscaler decision to a second replica serving: {reaction_s:.1f} s")

    # A replica process that dies is started again by the reconciler (the placement still holds its card).
    replica_dir = next((executor_for(svc.cluster).base_dir / svc.external_id / "replicas").glob("gpu-*"))
    dead = json.loads((replica_dir / "job.json").read_text())["pid"]
    os.killpg(dead, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while replicas_running(svc) != 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert replicas_running(svc) == 1
    svc = wait_replicas(svc, 2)
    assert json.loads((replica_dir / "job.json").read_text())["pid"] != dead

    outcome = settle_down(svc, now)
    assert outcome.desired == 1
    run_cycle(world.vdc.pk)
    svc.refresh_from_db()
    assert len(svc.placement) == 1 and len(intent(svc).device_ids) == 2  # the job holds both until confirmed
    svc = wait_replicas(svc, 1)
    assert get_when_up(client, svc).startswith("cards=")
    assert page_instances(world, svc) == (1, ["0"])  # no terminal left for the replica that went
    stop_task(svc, world.member)
    wait_status(svc, {"stopped"})


async def _slow_load(client, workers: int, seconds: float) -> list[float]:
    """``workers`` clients each asking for /slow again as soon as its whole body came, for ``seconds``; returns
    how long each request took (headers to last byte)."""
    loop = asyncio.get_running_loop()
    deadline, took = loop.time() + seconds, []

    async def worker():
        while loop.time() < deadline:
            t0 = loop.time()
            response = await client.get("/slow")
            assert response.status_code == 200
            assert (await _read(response)).startswith(b"...cards=")
            took.append(loop.time() - t0)

    await asyncio.gather(*(worker() for _ in range(workers)))
    return took


def test_slow_requests_start_a_replica_on_concurrency_while_their_rate_is_under_its_target(world):
    # 6 clients keep a streamed 1.5 s request each in flight for 10 s: about 40 requests, 2.7 requests/s over the
    # 15 s window (under the target of 5 for one replica), 60 s of busy time: 4 in flight (twice the target of 2).
    svc = start(world, "svc", "high", autoscale_max=2, autoscale_rps=5, autoscale_concurrency=2)
    client, sync = serving(world, svc)
    time.sleep(max(0.0, 1.0 - time.time() % 1.0))  # start on a whole second, as the counters count
    took = async_to_sync(_slow_load)(client, workers=6, seconds=10.0)
    assert min(took) >= SLOW_S * 0.9  # each request lasted as long as its stream
    time.sleep(1.0)  # the last request's second is over
    now = time.time()
    rate = request_rate.rates([svc.pk], now=now)[svc.pk]
    in_flight = request_rate.concurrency([svc.pk], now=now)[svc.pk]
    assert rate < 5 and in_flight > 2 * 1.1, (rate, in_flight)
    print(f"\n{len(took)} slow requests: {rate:.1f} requests/s, {in_flight:.2f} in flight over the window")
    [outcome] = autoscaling.run_autoscaler(now)
    assert (outcome.running, outcome.desired, outcome.changed) == (1, 2, True), outcome.reason
    event = svc.events.get(kind="autoscaled")
    assert "requests in flight for a target of 2 per replica" in event.message
    assert event.data["metric"] == "concurrency"
    run_cycle(world.vdc.pk)
    svc = wait_replicas(svc, 2)
    bodies = {get_when_up(sync, svc) for _ in range(4)}  # the proxy spreads requests over both replicas
    assert len(bodies) == 2, bodies
    stop_task(svc, world.member)
    wait_status(svc, {"stopped"})


async def _cut_off(client, after: float) -> None:
    """Ask for /slow and read its stream until ``after`` seconds, then go (as a browser's closed tab does: the
    ASGI server cancels the response)."""
    response = await client.get("/slow")
    assert response.status_code == 200

    async def read():
        async for _ in response.streaming_content:
            pass

    reading = asyncio.ensure_future(read())
    await asyncio.sleep(after)
    reading.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await reading


def test_a_request_cut_off_mid_stream_counts_for_the_time_it_was_relayed(world):
    svc = start(world, "svc", "high", autoscale_max=2, autoscale_concurrency=2)
    client, sync = serving(world, svc)
    t0 = time.time()
    async_to_sync(_cut_off)(client, after=SLOW_S / 2)
    busy_s = request_rate.concurrency([svc.pk], window_s=5, now=time.time() + 2)[svc.pk] * 5
    assert SLOW_S / 2 <= busy_s < min(time.time() - t0, SLOW_S), busy_s
    stop_task(svc, world.member)
    wait_status(svc, {"stopped"})


def test_a_high_service_under_pressure_shrinks_a_low_one_and_both_recover(three_cards):
    world = three_cards
    low = start(world, "batch-svc", "low")
    high = start(world, "prod-svc", "high")
    # Their autoscalers ask: the low service for 2 replicas (it gets the third card), then the high one for 2.
    Task.objects.filter(pk=low.pk).update(autoscale_desired=2)
    run_cycle(world.vdc.pk)
    low = wait_replicas(low, 2)
    Task.objects.filter(pk=high.pk).update(autoscale_desired=2)
    run_cycle(world.vdc.pk)
    high = wait_replicas(high, 2)
    low = wait_replicas(low, 1)
    why = f"gives replicas back to service {high.pk} (high"
    assert low.events.filter(kind="resized", message__contains=why).exists()
    assert not low.events.filter(kind__in=("preempted", "suspended")).exists()

    Task.objects.filter(pk=high.pk).update(autoscale_desired=1)  # the pressure went
    run_cycle(world.vdc.pk)
    high = wait_replicas(high, 1)
    run_cycle(world.vdc.pk)  # the released card is free once the backend confirmed it
    low = wait_replicas(low, 2)
    for task in (low, high):
        stop_task(task, world.member)
        wait_status(task, {"stopped"})


@pytest.fixture
def closing_socket(tmp_path):
    """A unix socket that accepts every connection and closes it at once, as a job's port forwarder does while
    nothing listens inside the job."""
    path = tmp_path / "closing.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(16)

    def serve():
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield path
    server.close()


@pytest.mark.parametrize("second", ["job not up", "nothing listens", "forwarder closes"])
def test_a_replica_that_cannot_be_reached_yet_passes_its_requests_to_one_that_serves(
    world, monkeypatch, tmp_path, closing_socket, second
):
    svc = start(world, "svc", "high", autoscale_max=2)
    client, _ = app_clients(world.member, svc, PORT)
    first = get_when_up(client, svc)
    # The resize put a second replica in the placement; the proxy spreads requests over both from then on.
    Task.objects.filter(pk=svc.pk).update(placement=svc.placement * 2, autoscale_desired=2)
    real = LocalExecutor.port_endpoint

    def port_endpoint(self, external_id, instance, port):
        if instance == 0:
            return real(self, external_id, instance, port)
        if second == "job not up":
            raise ExecutorError("the job has no instance 1", retryable=False)
        sock = closing_socket if second == "forwarder closes" else tmp_path / "nobody.sock"
        return Endpoint("127.0.0.1", port, uds=str(sock))

    monkeypatch.setattr(LocalExecutor, "port_endpoint", port_endpoint)
    try:
        assert [get(client) for _ in range(6)] == [(200, first)] * 6
        # A request that may change something is sent once: when the connection ended without an answer, it may
        # have reached the service, so it is not sent again (the service itself answers POST with 501).
        # (The proxy alternates by the count of the second, so a few requests reach both replicas.)
        statuses = {client.post("/", data=b"x", content_type="text/plain").status_code for _ in range(8)}
        assert statuses == ({501, 502} if second == "forwarder closes" else {501})
    finally:
        stop_task(svc, world.member)
        wait_status(svc, {"stopped"})
