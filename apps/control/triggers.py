"""Asking the control loops to run soon, coalesced: a burst of submits makes one cycle, not hundreds.

These are accelerators only. Every loop also runs on beat's schedule and acts on what the database says,
so a trigger lost to a Redis or broker outage delays the work; it never loses it. That is also why a
trigger never waits: a hung Redis costs a request at most the short timeouts below.
"""

from __future__ import annotations

import contextlib
import functools
import logging

import redis
from django.conf import settings

log = logging.getLogger(__name__)

CYCLE_REQUESTED_KEY = "hcs:scheduler:cycle-requested"
CYCLE_AGAIN_KEY = "hcs:scheduler:cycle-again"
# Triggered cycles run at least this far apart: a burst of submits makes a few cycles, not one per submit.
CYCLE_SPACING_S = 0.3
RECONCILE_REQUESTED_KEY = "hcs:reconcile:requested:{cluster_id}"
# Tasks whose state live pages should see, and whether a job to push them is queued.
LIVE_PENDING_KEY = "hcs:live:pending"
LIVE_REQUESTED_KEY = "hcs:live:requested"
LIVE_BATCH = 1000
FOLLOW_REQUESTED_KEY = "hcs:follow:active:{cluster_id}"
# A follow chain refreshes its key at every step; a chain that died lets a new one start after this long.
_FOLLOW_TTL_S = 2
_TIMEOUTS = {"socket_connect_timeout": 0.5, "socket_timeout": 0.5}


@functools.cache
def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, **_TIMEOUTS)


def _redis() -> redis.Redis:
    """The process's client of ``REDIS_URL``: its connection pool outlives a request, so a trigger costs a
    round trip, not a new connection."""
    return _client(settings.REDIS_URL)


def _first_request(key: str, ttl_s: int) -> bool:
    """True when no request for ``key`` is pending yet (this one then queues the work)."""
    try:
        return bool(_redis().set(key, "1", nx=True, ex=ttl_s))
    except redis.RedisError as exc:
        log.warning("cannot coalesce %s (the periodic loop will do the work): %s", key, exc)
        return False


def clear_request(key: str) -> None:
    """Forget a pending request once its work starts, so later changes ask again."""
    with contextlib.suppress(redis.RedisError):  # the key expires by itself
        _redis().delete(key)


def enqueue(job, *args, countdown: float = 0.0, expires: float = 30.0) -> None:
    """Queue a Celery job without waiting on a broken broker (the periodic loops cover what is lost)."""
    try:
        job.apply_async(args, countdown=countdown, expires=expires, retry=False)
    except Exception as exc:  # noqa: BLE001 - any broker failure: the periodic loop covers it
        log.warning("cannot queue %s (the periodic loop will do the work): %s", job.name, exc)


def request_live_push(task_ids) -> None:
    """Live pages should see these tasks' state: one round trip here; the push itself (queries and channel
    layer sends) runs in a worker job, for every task noted meanwhile at once. Pages reload their state on
    reconnect, so an update lost to a Redis outage costs them freshness, never data."""
    from apps.control import jobs  # noqa: PLC0415 - the jobs module imports this one

    if not task_ids:
        return
    try:
        pipe = _redis().pipeline(transaction=False)
        pipe.sadd(LIVE_PENDING_KEY, *task_ids)
        pipe.set(LIVE_REQUESTED_KEY, "1", nx=True, ex=10)
        _added, first = pipe.execute()
    except redis.RedisError as exc:
        log.warning("live update of tasks %s not noted: %s", list(task_ids)[:10], exc)
        return
    if first:
        enqueue(jobs.push_live_updates)


def take_live_pending() -> list[int]:
    """The tasks noted for a live push so far (at most ``LIVE_BATCH``), taken off the set.

    The job clears its request first, so a task noted after this call queues another job.
    """
    clear_request(LIVE_REQUESTED_KEY)
    try:
        return [int(task_id) for task_id in _redis().spop(LIVE_PENDING_KEY, LIVE_BATCH) or ()]
    except redis.RedisError as exc:
        log.warning("cannot take the pending live updates: %s", exc)
        return []


def on_task_changed(sender=None, task_ids=None, **kwargs) -> None:
    """Receiver of ``task_changed``: live pages get the tasks' state soon, off the request's path."""
    request_live_push(task_ids or ())


def request_cycle() -> None:
    """A scheduling cycle soon. Requests while one is queued or running coalesce: that cycle's job runs one
    more cycle after it (at most one chain, cycles at least ``CYCLE_SPACING_S`` apart)."""
    from apps.control import jobs  # noqa: PLC0415 - the jobs module imports this one

    if _first_request(CYCLE_REQUESTED_KEY, 10):
        enqueue(jobs.run_scheduler, countdown=0.05)
    else:
        _set(CYCLE_AGAIN_KEY, 10)


def cycle_started() -> None:
    """A cycle begins: changes from now on need another one."""
    clear_request(CYCLE_AGAIN_KEY)


def cycle_finished() -> None:
    """A cycle ended: run one more if demand changed meanwhile, else let the next request start a chain."""
    from apps.control import jobs  # noqa: PLC0415

    try:
        again = _redis().get(CYCLE_AGAIN_KEY)
    except redis.RedisError:
        again = None  # beat runs the next cycle
    if again:
        _set(CYCLE_REQUESTED_KEY, 10)
        enqueue(jobs.run_scheduler, countdown=CYCLE_SPACING_S)
    else:
        clear_request(CYCLE_REQUESTED_KEY)


def _set(key: str, ttl_s: int) -> None:
    with contextlib.suppress(redis.RedisError):
        _redis().set(key, "1", ex=ttl_s)


def request_reconcile(cluster_id: int) -> None:
    """Reconcile one cluster with its backend soon (a stop or a preemption to carry out)."""
    from apps.control import jobs  # noqa: PLC0415

    if _first_request(RECONCILE_REQUESTED_KEY.format(cluster_id=cluster_id), 10):
        enqueue(jobs.reconcile_cluster, cluster_id)


def request_follow(cluster_id: int) -> None:
    """Follow a cluster's just-launched jobs closely, unless a follow chain already runs for it."""
    from apps.control import jobs  # noqa: PLC0415

    if _first_request(FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id), _FOLLOW_TTL_S):
        enqueue(jobs.follow_launches, cluster_id, countdown=jobs.FOLLOW_INTERVAL_S)


def keep_following(cluster_id: int) -> None:
    """A follow chain is still at work: keep new launches from starting a second one."""
    _set(FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id), _FOLLOW_TTL_S)


def on_demand_changed(sender, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.demand_changed``."""
    request_cycle()


def on_cluster_work(sender, cluster_id: int, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.cluster_work``."""
    request_reconcile(cluster_id)


def on_autoscaling_changed(sender, task_id: int, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.autoscaling_changed``: the backend's own autoscaler gets the new settings."""
    from apps.control import jobs  # noqa: PLC0415 - the jobs module imports this one

    enqueue(jobs.apply_autoscaling, task_id, expires=300.0)
