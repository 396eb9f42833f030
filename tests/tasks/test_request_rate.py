"""Request counting and timing at the Connect proxy (apps/tasks/request_rate.py): per-second buckets read back
as a rate and, by Little's law, as requests in flight; outages cost a reading."""

import time

import pytest

from apps.tasks import request_rate
from hcsportal import redis_guard


@pytest.fixture
def task_id():
    request_rate.forget(987654)
    yield 987654
    request_rate.forget(987654)


def test_requests_counted_per_second_read_back_as_a_rate_over_the_window(task_id):
    now = 1_800_000_000.0
    for second in range(30):
        for _ in range(second % 3):  # 0, 1, 2 requests a second: 30 requests in 30 s
            request_rate.count(task_id, now=now - 30 + second)
    request_rate.count(task_id, now=now)  # the current second is not read yet: it is not over
    assert request_rate.rates([task_id], now=now) == {task_id: 1.0}
    assert request_rate.rates([task_id], window_s=10, now=now) == {task_id: 1.1}  # seconds 20-29: 11 requests


def test_busy_time_read_back_as_requests_in_flight_over_the_window(task_id):
    now = 1_800_000_000.0
    for second in range(15):  # two 1 s requests a second, back to back, over the 15 s window: 2 in flight
        request_rate.busy(task_id, now - 15 + second, now - 14 + second)
        request_rate.busy(task_id, now - 15 + second + 0.5, now - 14 + second + 0.5)
    assert request_rate.concurrency([task_id], now=now) == {task_id: pytest.approx(2.0 - 0.5 / 15)}
    assert request_rate.rates([task_id], now=now) == {task_id: 0.0}  # timing is not counting


def test_the_mean_time_of_the_requests_that_ended_in_the_window_is_their_latency(task_id):
    now = 1_800_000_000.0
    request_rate.busy(task_id, now - 10.5, now - 10.0)  # 500 ms
    request_rate.busy(task_id, now - 6.5, now - 5.0)  # 1,500 ms
    request_rate.busy(task_id, now - 60.0, now - 30.0)  # ended before the window: not read
    assert request_rate.latencies([task_id], now=now) == {task_id: 1000.0}
    assert request_rate.latencies([task_id], window_s=3, now=now) == {task_id: None}  # none ended then


def test_a_long_request_is_spread_over_the_seconds_it_spanned(task_id):
    now = 1_800_000_000.0
    request_rate.busy(task_id, now - 299.5, now + 0.5)  # a 5-minute stream that ends half a second into now
    # One request in flight all along: each whole second of the window holds 1000 ms, not 300 s at its end.
    assert request_rate.concurrency([task_id], now=now) == {task_id: 1.0}
    assert request_rate.concurrency([task_id], window_s=5, now=now + 1) == {task_id: 0.9}  # ended half a second in
    client = redis_guard.client()
    kept = list(client.scan_iter(request_rate.BUSY_KEY.format(task_id=task_id, second="*")))
    assert len(kept) == request_rate.KEEP_S + 1  # seconds older than are ever read are not written


def test_a_redis_outage_costs_the_reading_never_the_request(settings):
    task_id = 987655
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there: every call is refused, as with Redis down
    assert request_rate.count(task_id) is None
    assert request_rate.rates([task_id]) == {task_id: None}
    request_rate.busy(task_id, time.time() - 1, time.time())  # no exception
    assert request_rate.concurrency([task_id]) == {task_id: None}
