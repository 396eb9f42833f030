"""Request counting at the Connect proxy (apps/tasks/request_rate.py): per-second buckets, outages cost a reading."""

import pytest
import redis

from apps.tasks import request_rate


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


def test_a_redis_outage_costs_the_reading_never_the_request(monkeypatch):
    task_id = 987655

    class Down:
        def pipeline(self, **kwargs):
            raise redis.ConnectionError("connection refused")

        def mget(self, keys):
            raise redis.ConnectionError("connection refused")

    monkeypatch.setattr(request_rate, "_client", lambda url: Down())
    assert request_rate.count(task_id) is None
    assert request_rate.rates([task_id]) == {task_id: None}
