"""Request rates of tasks' services, as the portal's Connect proxy counts them (the autoscaler's RPS metric).

One Redis counter per task per second (``INCR`` + ``EXPIRE`` in one round trip, expiring after ``KEEP_S``), so
counting costs a request one round trip and reading a rate one ``MGET``. Counting never fails a request:
a Redis outage costs the autoscaler its RPS reading (it then keeps the count as it is), never a response.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time

import redis
from django.conf import settings

log = logging.getLogger(__name__)

KEY = "hcs:rps:{task_id}:{second}"
KEEP_S = 120
# A rate is read over this many whole seconds before the current one.
WINDOW_S = 15
_TIMEOUTS = {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, **_TIMEOUTS)


def count(task_id: int, now: float | None = None) -> int | None:
    """Count one request to the task's service; returns the count of this second (None when Redis fails)."""
    key = KEY.format(task_id=task_id, second=int(time.time() if now is None else now))
    try:
        pipe = _client(settings.REDIS_URL).pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, KEEP_S)
        value, _ = pipe.execute()
    except redis.RedisError as exc:
        log.warning("cannot count a request to task %s: %s", task_id, exc)
        return None
    return int(value)


def rates(task_ids: list[int], window_s: int = WINDOW_S, now: float | None = None) -> dict[int, float | None]:
    """Requests per second of each task over the last ``window_s`` whole seconds (None when Redis fails)."""
    if not task_ids:
        return {}
    last = int(time.time() if now is None else now) - 1
    keys = [KEY.format(task_id=pk, second=s) for pk in task_ids for s in range(last - window_s + 1, last + 1)]
    try:
        values = _client(settings.REDIS_URL).mget(keys)
    except redis.RedisError as exc:
        log.warning("cannot read request rates: %s", exc)
        return dict.fromkeys(task_ids)
    out = {}
    for i, pk in enumerate(task_ids):
        chunk = values[i * window_s : (i + 1) * window_s]
        out[pk] = sum(int(v) for v in chunk if v is not None) / window_s
    return out


def forget(task_id: int) -> None:
    """Drop a task's counters (they expire by themselves; this is for tests and deleted tasks)."""
    with contextlib.suppress(redis.RedisError):
        client = _client(settings.REDIS_URL)
        keys = list(client.scan_iter(KEY.format(task_id=task_id, second="*"), count=500))
        if keys:
            client.delete(*keys)
