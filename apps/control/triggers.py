"""Asking the control loops to run soon, coalesced: a burst of submits makes one cycle, not hundreds.

These are accelerators only. Every loop also runs on beat's schedule and acts on what the database says,
so a trigger lost to a Redis or broker outage delays the work; it never loses it. That is also why a
trigger never waits: Redis is reached through :mod:`hcsportal.redis_guard`, so a dead or hung Redis costs a
request one short timeout, and nothing at all while its breaker is open.

Jobs are queued by their Celery names: :mod:`apps.control.jobs` imports this module and registers its jobs under
the names below, and nothing here imports it back.
"""

from __future__ import annotations

import contextlib
import logging

import redis
from celery import current_app
from django.db import transaction

from apps.clusters.isolation import clusters_to_sync
from apps.clusters.volcano import clusters_of
from hcsportal import redis_guard

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
# A follow chain looks at a cluster's fresh jobs this often (less often when it needs a listing of many).
FOLLOW_INTERVAL_S = 0.15
FOLLOW_LISTING_INTERVAL_S = 1.0

# The Celery names of the jobs queued from here: apps.control.jobs declares each job under its name, which is the
# job function's own dotted path, the name Celery would give it and the one the beat schedule and the queue routes
# (celery_app/app.py) use; tests/hcsportal/test_deploy_files.py checks that every name there is a registered job.
RUN_SCHEDULER = "apps.control.jobs.run_scheduler"
RECONCILE_CLUSTER = "apps.control.jobs.reconcile_cluster"
LAUNCH = "apps.control.jobs.launch"
FOLLOW_LAUNCHES = "apps.control.jobs.follow_launches"
PUSH_LIVE_UPDATES = "apps.control.jobs.push_live_updates"
SYNC_PROJECT_ISOLATION = "apps.control.jobs.sync_project_isolation"
SYNC_VOLCANO_QUEUE = "apps.control.jobs.sync_volcano_queue"
APPLY_AUTOSCALING = "apps.control.jobs.apply_autoscaling"


def _redis() -> redis.Redis:
    return redis_guard.client()


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


def enqueue(name: str, *args, countdown: float = 0.0, expires: float = 30.0) -> None:
    """Queue the Celery job registered as ``name`` without waiting on a broken broker (the periodic loops cover
    what is lost)."""
    redis_guard.enqueue(current_app.tasks[name], *args, countdown=countdown, expires=expires)


def request_live_push(task_ids) -> None:
    """Live pages should see these tasks' state: one round trip here; the push itself (queries and channel
    layer sends) runs in a worker job, for every task noted meanwhile at once. Pages reload their state on
    reconnect, so an update lost to a Redis outage costs them freshness, never data."""
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
        enqueue(PUSH_LIVE_UPDATES)


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

    if _first_request(CYCLE_REQUESTED_KEY, 10):
        enqueue(RUN_SCHEDULER, countdown=0.05)
    else:
        _set(CYCLE_AGAIN_KEY, 10)


def cycle_started() -> None:
    """A cycle begins: changes from now on need another one."""
    clear_request(CYCLE_AGAIN_KEY)


def cycle_finished() -> None:
    """A cycle ended: run one more if demand changed meanwhile, else let the next request start a chain."""

    try:
        again = _redis().get(CYCLE_AGAIN_KEY)
    except redis.RedisError:
        again = None  # beat runs the next cycle
    if again:
        _set(CYCLE_REQUESTED_KEY, 10)
        enqueue(RUN_SCHEDULER, countdown=CYCLE_SPACING_S)
    else:
        clear_request(CYCLE_REQUESTED_KEY)


def _set(key: str, ttl_s: int) -> None:
    with contextlib.suppress(redis.RedisError):
        _redis().set(key, "1", ex=ttl_s)


def request_reconcile(cluster_id: int) -> None:
    """Reconcile one cluster with its backend soon (a stop or a preemption to carry out)."""

    if _first_request(RECONCILE_REQUESTED_KEY.format(cluster_id=cluster_id), 10):
        enqueue(RECONCILE_CLUSTER, cluster_id)


def request_follow(cluster_id: int) -> None:
    """Follow a cluster's just-launched jobs closely, unless a follow chain already runs for it."""

    if _first_request(FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id), _FOLLOW_TTL_S):
        enqueue(FOLLOW_LAUNCHES, cluster_id, countdown=FOLLOW_INTERVAL_S)


def keep_following(cluster_id: int) -> None:
    """A follow chain is still at work: keep new launches from starting a second one."""
    _set(FOLLOW_REQUESTED_KEY.format(cluster_id=cluster_id), _FOLLOW_TTL_S)


def job_expired(name: str, args) -> None:
    """A queued job expired before a worker took it (every worker was busy): the loop it belongs to is asked to
    run again, coalesced like any request, so a busy worker delays the work but never drops it. The pending
    request the expired job stood for is forgotten first, or it would swallow the new one until its key expires."""
    if name == RUN_SCHEDULER:
        clear_request(CYCLE_REQUESTED_KEY)
        request_cycle()
    elif name == RECONCILE_CLUSTER and args:
        clear_request(RECONCILE_REQUESTED_KEY.format(cluster_id=args[0]))
        request_reconcile(args[0])
    elif name == FOLLOW_LAUNCHES and args:
        clear_request(FOLLOW_REQUESTED_KEY.format(cluster_id=args[0]))
        request_follow(args[0])


def on_demand_changed(sender, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.demand_changed``."""
    request_cycle()


def on_cluster_work(sender, cluster_id: int, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.cluster_work``."""
    request_reconcile(cluster_id)


def on_autoscaling_changed(sender, task_id: int, **kwargs) -> None:
    """Receiver of ``apps.tasks.signals.autoscaling_changed``: the backend's own autoscaler gets the new settings."""

    enqueue(APPLY_AUTOSCALING, task_id, expires=300.0)


def on_quota_changed(sender, instance, **kwargs) -> None:
    """A project quota was saved or deleted: mirror it on the VDC's per-project clusters after the commit."""
    if not clusters_to_sync(instance.vdc_id):
        return
    project_id, vdc_id = instance.project_id, instance.vdc_id
    # Lost with a broken broker: the project's next submit on each cluster ensures its limits again.
    transaction.on_commit(lambda: enqueue(SYNC_PROJECT_ISOLATION, project_id, vdc_id, expires=3600))


def on_queue_saved(sender, instance, **kwargs) -> None:
    """A Volcano-flavoured queue was saved: its Volcano Queues follow after the commit."""
    if instance.backend_flavour != "volcano" or not clusters_of(instance):
        return
    queue_id = instance.pk
    # Lost with a broken broker: the queue's next Volcano Job on each cluster ensures it again.
    transaction.on_commit(lambda: enqueue(SYNC_VOLCANO_QUEUE, queue_id, expires=3600))
