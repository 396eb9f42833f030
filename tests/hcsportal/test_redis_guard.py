"""Redis from a request's path (hcsportal/redis_guard.py), against a real redis-server that the tests hang
(SIGSTOP) and kill: every use a request makes of Redis, the broker included, costs one short timeout in all, then
nothing while the breaker is open, and works again once Redis answers."""

from __future__ import annotations

import contextlib
import time

import pytest
import redis

from apps.control import jobs, triggers
from apps.queues import stats
from apps.tasks import request_rate
from hcsportal import redis_guard
from tests.control.portal_processes import RedisServer


@pytest.fixture
def server(tmp_path, settings):
    """A private Redis that REDIS_URL and the broker URL point at."""
    redis_server = RedisServer(tmp_path)
    redis_server.start()
    settings.REDIS_URL = redis_server.url
    settings.CELERY_BROKER_URL = redis_server.url
    yield redis_server
    redis_server.kill()


def every_use_a_request_makes() -> None:
    """What a submit or a stop does with Redis: triggers, a live-update note, a queued job; and what /metrics and the
    Connect proxy do."""
    triggers.request_cycle()
    triggers.request_reconcile(7)
    triggers.request_live_push([1, 2])
    triggers.enqueue(triggers.RECONCILE_CLUSTER, 7)
    request_rate.count(42)
    stats.record_cycle("main", 0.1, 1, 0, 0, 3)
    with contextlib.suppress(redis.RedisError):  # /metrics says "unavailable" for these counters
        stats.read_all()


def timed(action) -> float:
    began = time.monotonic()
    action()
    return time.monotonic() - began


@pytest.mark.parametrize("outage", ["hung", "killed"])
def test_a_dead_or_hung_redis_costs_one_short_timeout_then_nothing(server, outage):
    every_use_a_request_makes()  # the connections exist: the outage finds them open
    if outage == "hung":
        server.hang()
    else:
        server.kill()
    first = timed(every_use_a_request_makes)
    again = timed(every_use_a_request_makes)
    if outage == "hung":
        server.resume()
    assert first < redis_guard.TIMEOUT_S + 1.0, f"the first request waited {first:.2f} s"
    assert again < 0.2, f"with the breaker open a request still waited {again:.2f} s"


def test_queueing_a_job_on_a_hung_broker_returns_at_once(server):
    server.hang()
    try:
        began = time.monotonic()
        assert redis_guard.enqueue(jobs.reconcile_cluster, 7) is False
        assert time.monotonic() - began < redis_guard.TIMEOUT_S + 1.0
    finally:
        server.resume()


def test_redis_is_tried_again_once_the_breaker_closes_and_then_works(server, monkeypatch):
    monkeypatch.setattr(redis_guard, "OPEN_S", 1.0)
    client = server.client()
    server.kill()
    assert redis_guard.enqueue(jobs.reconcile_cluster, 7) is False
    server.start()
    with pytest.raises(redis_guard.Unavailable, match="not tried again"):
        redis_guard.client().ping()  # still open: not even tried
    time.sleep(1.1)
    assert redis_guard.client().ping()
    assert redis_guard.enqueue(jobs.reconcile_cluster, 7) is True
    assert client.llen("celery") == 1  # the job is on the broker's queue


def test_a_command_redis_refuses_is_no_outage(server):
    redis_guard.client().set("hcs:test:string", "x")
    with pytest.raises(redis.ResponseError):
        redis_guard.client().hincrby("hcs:test:string", "field", 1)  # WRONGTYPE: Redis answered
    assert redis_guard.client().get("hcs:test:string") == b"x"
