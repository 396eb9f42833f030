"""Request rates and concurrency of tasks' services, as the portal's Connect proxy measures them (the
autoscaler's RPS and concurrency metrics), and their last activity (scale to zero).

Per task per second, one Redis counter of requests and one of busy milliseconds (``INCRBY`` + ``EXPIRE`` in one
round trip, expiring after ``KEEP_S``), so measuring costs a request one round trip at its start and one at its
end, and reading a metric one ``MGET``. Concurrency follows Little's law: the requests in flight on average over
a window are the busy time of all requests in it divided by its length. A request's time is written when it
ends (its response relayed to the end or cut off), spread over the seconds it spanned, so a long stream counts
as one request in flight for as long as it lasts; no counter goes up at a start and down at an end, so a worker
that dies mid-request leaks nothing. The same round trips note the service's last request and the requests in
flight (a sorted set by start, whose members older than ``IN_FLIGHT_KEEP_S`` no longer count, so a dead proxy's
request keeps a service awake a day at most): scale to zero waits until both say idle. Measuring never fails a
request: a Redis outage costs the autoscaler its readings (it then keeps the count as it is, and nothing scales
to zero), never a response. The autoscaler reads the same counters over a stable window (``WINDOW_S``) and over
its last seconds, the panic window (``PANIC_WINDOW_S``). The latency target reads, per second a request ended,
its whole time and the count of requests that ended (two more counters in the same round trip).
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass

import redis

from hcsportal import redis_guard

log = logging.getLogger(__name__)

KEY = "hcs:rps:{task_id}:{second}"
BUSY_KEY = "hcs:busy:{task_id}:{second}"
# Per second a request ended: its whole time (ms) and how many ended (the latency target's mean).
TOOK_KEY = "hcs:took:{task_id}:{second}"
ENDED_KEY = "hcs:ended:{task_id}:{second}"
KEEP_S = 120
# A metric is read over this many whole seconds before the current one.
WINDOW_S = 15
# A service's last request (start or end) is kept this long: longer than the longest scale-to-zero idle time.
LAST_KEY = "hcs:rps:last:{task_id}"
LAST_KEEP_S = 8 * 86400
# Requests in flight (sorted by their start): one still open after this long is taken for a proxy that died.
IN_FLIGHT_KEY = "hcs:rps:in-flight:{task_id}"
IN_FLIGHT_KEEP_S = 86400
# The panic window (docs/tasks.md "Autoscaling"): the last seconds of the same per-second counters, a fifth of the
# stable window (a tenth would be under two seconds, and one second alone is noise).
PANIC_WINDOW_S = 3


def count(task_id: int, now: float | None = None, request_id: str = "") -> int | None:
    """Count one request to the task's service; returns the count of this second (None when Redis fails).

    The same round trip notes the request as the service's last activity and, given its ``request_id``, as in
    flight until :func:`busy` ends it (scale to zero waits for both)."""
    now = time.time() if now is None else now
    key = KEY.format(task_id=task_id, second=int(now))
    try:
        pipe = redis_guard.client().pipeline(transaction=False)
        pipe.incrby(key, 1)
        pipe.expire(key, KEEP_S)
        pipe.set(LAST_KEY.format(task_id=task_id), repr(now), ex=LAST_KEEP_S)
        if request_id:
            flying = IN_FLIGHT_KEY.format(task_id=task_id)
            pipe.zadd(flying, {request_id: now})
            pipe.expire(flying, IN_FLIGHT_KEEP_S)
        return int(pipe.execute()[0])
    except redis.RedisError as exc:
        log.warning("cannot measure a request: %s", exc)
        return None


def busy(task_id: int, started: float, ended: float, request_id: str = "") -> None:
    """Add a finished request's time (epoch seconds from its start to its end) to each second it spanned, in
    milliseconds; seconds older than ``KEEP_S`` before its end are no longer read and are skipped. Its end is the
    service's last activity, and it is no longer in flight."""
    amounts = {}
    for second in range(max(int(started), int(ended) - KEEP_S), int(ended) + 1):
        ms = round(1000 * (min(ended, second + 1) - max(started, second)))
        if ms > 0:
            amounts[BUSY_KEY.format(task_id=task_id, second=second)] = ms
    # Its whole time, in the second it ended, with the count of requests that ended then (the mean latency).
    amounts[TOOK_KEY.format(task_id=task_id, second=int(ended))] = max(round(1000 * (ended - started)), 0)
    amounts[ENDED_KEY.format(task_id=task_id, second=int(ended))] = 1
    try:
        pipe = redis_guard.client().pipeline(transaction=False)
        for key, amount in amounts.items():
            pipe.incrby(key, amount)
            pipe.expire(key, KEEP_S)
        pipe.set(LAST_KEY.format(task_id=task_id), repr(ended), ex=LAST_KEEP_S)
        if request_id:
            pipe.zrem(IN_FLIGHT_KEY.format(task_id=task_id), request_id)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("cannot measure a request: %s", exc)


@dataclass(frozen=True)
class Activity:
    """When a service last saw a request start or end through Connect (None: not in the last ``LAST_KEEP_S``),
    and how many requests are in flight now."""

    last: float | None
    in_flight: int


def activity(task_ids: list[int], now: float | None = None) -> dict[int, Activity] | None:
    """Each service's :class:`Activity`, in one round trip; None when Redis fails (no reading: nothing is idle).
    A request noted in flight longer than ``IN_FLIGHT_KEEP_S`` counts no more (its proxy died without ending it)."""
    now = time.time() if now is None else now
    if not task_ids:
        return {}
    try:
        pipe = redis_guard.client().pipeline(transaction=False)
        for pk in task_ids:
            pipe.get(LAST_KEY.format(task_id=pk))
            pipe.zcount(IN_FLIGHT_KEY.format(task_id=pk), now - IN_FLIGHT_KEEP_S, "+inf")
        values = pipe.execute()
    except redis.RedisError as exc:
        log.warning("cannot read request activity: %s", exc)
        return None
    return {
        pk: Activity(float(values[2 * i]) if values[2 * i] is not None else None, int(values[2 * i + 1]))
        for i, pk in enumerate(task_ids)
    }


def _sums(key: str, task_ids: list[int], window_s: int, now: float | None) -> dict[int, int | None]:
    """Each task's counters of ``key`` summed over the last ``window_s`` whole seconds (None when Redis fails)."""
    last = int(time.time() if now is None else now) - 1
    keys = [key.format(task_id=pk, second=s) for pk in task_ids for s in range(last - window_s + 1, last + 1)]
    try:
        values = redis_guard.client().mget(keys) if keys else []
    except redis.RedisError as exc:
        log.warning("cannot read request metrics: %s", exc)
        return dict.fromkeys(task_ids)
    return {
        pk: sum(int(v) for v in values[i * window_s : (i + 1) * window_s] if v is not None)
        for i, pk in enumerate(task_ids)
    }


def rates(task_ids: list[int], window_s: int = WINDOW_S, now: float | None = None) -> dict[int, float | None]:
    """Requests per second of each task over the last ``window_s`` whole seconds (None when Redis fails)."""
    return {pk: None if n is None else n / window_s for pk, n in _sums(KEY, task_ids, window_s, now).items()}


def rates_with_panic(
    task_ids: list[int], now: float | None = None
) -> tuple[dict[int, float | None], dict[int, float | None]]:
    """Requests per second of each task over the stable window (``WINDOW_S``) and over the panic window (its last
    ``PANIC_WINDOW_S`` seconds), from one read of the per-second counters (None when Redis fails)."""
    last = int(time.time() if now is None else now) - 1
    seconds = range(last - WINDOW_S + 1, last + 1)
    keys = [KEY.format(task_id=pk, second=s) for pk in task_ids for s in seconds]
    try:
        values = redis_guard.client().mget(keys) if keys else []
    except redis.RedisError as exc:
        log.warning("cannot read request metrics: %s", exc)
        return dict.fromkeys(task_ids), dict.fromkeys(task_ids)
    stable, panic = {}, {}
    for i, pk in enumerate(task_ids):
        counts = [int(v) if v is not None else 0 for v in values[i * WINDOW_S : (i + 1) * WINDOW_S]]
        stable[pk] = sum(counts) / WINDOW_S
        panic[pk] = sum(counts[-PANIC_WINDOW_S:]) / PANIC_WINDOW_S
    return stable, panic


def concurrency(task_ids: list[int], window_s: int = WINDOW_S, now: float | None = None) -> dict[int, float | None]:
    """Mean requests in flight to each task over the last ``window_s`` whole seconds, of requests that ended
    (None when Redis fails)."""
    sums = _sums(BUSY_KEY, task_ids, window_s, now)
    return {pk: None if ms is None else ms / (1000 * window_s) for pk, ms in sums.items()}


def latencies(task_ids: list[int], window_s: int = WINDOW_S, now: float | None = None) -> dict[int, float | None]:
    """Mean time (ms) of each task's requests that ended in the last ``window_s`` whole seconds, from the proxy's
    relay start to its end (None when none ended or Redis fails)."""
    took = _sums(TOOK_KEY, task_ids, window_s, now)
    ended = _sums(ENDED_KEY, task_ids, window_s, now)
    return {pk: took[pk] / ended[pk] if took[pk] is not None and ended[pk] else None for pk in task_ids}


def forget(task_id: int) -> None:
    """Drop a task's counters (they expire by themselves; this is for tests and deleted tasks)."""
    with contextlib.suppress(redis.RedisError):
        client = redis_guard.client()
        patterns = [key.format(task_id=task_id, second="*") for key in (KEY, BUSY_KEY, TOOK_KEY, ENDED_KEY)]
        keys = [k for pattern in patterns for k in client.scan_iter(pattern, count=500)]
        keys += [LAST_KEY.format(task_id=task_id), IN_FLIGHT_KEY.format(task_id=task_id)]
        if keys:
            client.delete(*keys)
