"""Request rates and concurrency of tasks' services, as the portal's Connect proxy measures them (the
autoscaler's RPS and concurrency metrics).

Per task per second, one Redis counter of requests and one of busy milliseconds (``INCRBY`` + ``EXPIRE`` in one
round trip, expiring after ``KEEP_S``), so measuring costs a request one round trip at its start and one at its
end, and reading a metric one ``MGET``. Concurrency follows Little's law: the requests in flight on average over
a window are the busy time of all requests in it divided by its length. A request's time is written when it
ends (its response relayed to the end or cut off), spread over the seconds it spanned, so a long stream counts
as one request in flight for as long as it lasts; no counter goes up at a start and down at an end, so a worker
that dies mid-request leaks nothing. Measuring never fails a request: a Redis outage costs the autoscaler its
readings (it then keeps the count as it is), never a response. The autoscaler reads the same counters over a
stable window (``WINDOW_S``) and over its last seconds, the panic window (``PANIC_WINDOW_S``).
"""

from __future__ import annotations

import contextlib
import logging
import time

import redis

from hcsportal import redis_guard

log = logging.getLogger(__name__)

KEY = "hcs:rps:{task_id}:{second}"
BUSY_KEY = "hcs:busy:{task_id}:{second}"
KEEP_S = 120
# A metric is read over this many whole seconds before the current one.
WINDOW_S = 15
# The panic window (docs/tasks.md "Autoscaling"): the last seconds of the same per-second counters, a fifth of the
# stable window (a tenth would be under two seconds, and one second alone is noise).
PANIC_WINDOW_S = 3


def _add(amounts: dict[str, int]) -> list[int] | None:
    """Add to counters in one round trip; their new values, or None when Redis fails."""
    try:
        pipe = redis_guard.client().pipeline(transaction=False)
        for key, amount in amounts.items():
            pipe.incrby(key, amount)
            pipe.expire(key, KEEP_S)
        return pipe.execute()[::2]
    except redis.RedisError as exc:
        log.warning("cannot measure a request: %s", exc)
        return None


def count(task_id: int, now: float | None = None) -> int | None:
    """Count one request to the task's service; returns the count of this second (None when Redis fails)."""
    values = _add({KEY.format(task_id=task_id, second=int(time.time() if now is None else now)): 1})
    return None if values is None else int(values[0])


def busy(task_id: int, started: float, ended: float) -> None:
    """Add a finished request's time (epoch seconds from its start to its end) to each second it spanned, in
    milliseconds; seconds older than ``KEEP_S`` before its end are no longer read and are skipped."""
    amounts = {}
    for second in range(max(int(started), int(ended) - KEEP_S), int(ended) + 1):
        ms = round(1000 * (min(ended, second + 1) - max(started, second)))
        if ms > 0:
            amounts[BUSY_KEY.format(task_id=task_id, second=second)] = ms
    if amounts:
        _add(amounts)


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


def forget(task_id: int) -> None:
    """Drop a task's counters (they expire by themselves; this is for tests and deleted tasks)."""
    with contextlib.suppress(redis.RedisError):
        client = redis_guard.client()
        patterns = [key.format(task_id=task_id, second="*") for key in (KEY, BUSY_KEY)]
        keys = [k for pattern in patterns for k in client.scan_iter(pattern, count=500)]
        if keys:
            client.delete(*keys)
