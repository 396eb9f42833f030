"""The live socket on a real server (uvicorn on loopback, the real Redis channel layer) stays up for minutes,
and pushing to it never holds up a request for long when Redis is dead or hung.

redis-py's default 5 s socket timeout once equalled channels_redis's 5 s blocking read: every idle
connection was closed by the server after about 5 s.
"""

from __future__ import annotations

import copy
import json
import socket as sockets
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from apps.tasks import live
from apps.tasks.services import stop_task
from tests.portal.test_live import session_cookie, submit

pytestmark = pytest.mark.django_db(transaction=True)

HOLD_S = 60


def receive(socket, timeout: float = 10) -> dict:
    return json.loads(socket.recv(timeout=timeout))


@pytest.mark.slow
def test_live_socket_stays_open_a_minute_and_receives_a_push_at_the_end(uvicorn_url, live_world):
    task = submit(live_world)
    headers = {"Cookie": session_cookie(live_world.member).decode(), "Origin": f"http://{uvicorn_url}"}
    with connect(f"ws://{uvicorn_url}/ws/live/", additional_headers=headers, open_timeout=10) as socket:
        socket.send(json.dumps({"subscribe": "task", "id": task.pk}))
        assert receive(socket) == {"type": "subscribed", "subscribe": "task", "id": task.pk}
        assert receive(socket)["status"] == "queued"

        opened = time.monotonic()
        while (left := HOLD_S - (time.monotonic() - opened)) > 0:
            try:
                message = socket.recv(timeout=min(left, 5))
            except TimeoutError:
                continue  # idle, as it should be
            except ConnectionClosed as closed:
                pytest.fail(f"the server closed the live socket after {time.monotonic() - opened:.1f} s: {closed}")
            pytest.fail(f"unexpected message while idle: {message}")

        stop_task(task, live_world.member)
        pushed = receive(socket)
        assert pushed["type"] == "task" and pushed["id"] == task.pk and pushed["status"] == "stopped"


@pytest.fixture
def hung_redis():
    """A loopback port that accepts connections (the kernel's backlog) and never answers."""
    with sockets.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        yield f"redis://127.0.0.1:{server.getsockname()[1]}/0"


@pytest.mark.parametrize("where", ["unroutable", "hung"])
def test_a_dead_or_hung_redis_costs_a_push_about_a_second_and_raises_nothing(live_world, settings, hung_redis, where):
    task = submit(live_world)
    layers = copy.deepcopy(settings.CHANNEL_LAYERS)
    layers["default"]["CONFIG"]["hosts"][0]["address"] = {
        "unroutable": "redis://10.255.255.1:6379/0",  # connects time out
        "hung": hung_redis,
    }[where]
    settings.CHANNEL_LAYERS = layers  # channels drops its cached layers when this setting changes
    began = time.monotonic()
    live.push_task_changed(task_ids=[task.pk])
    assert time.monotonic() - began < settings.HCS_LIVE_PUSH_TIMEOUT_S + 0.5
