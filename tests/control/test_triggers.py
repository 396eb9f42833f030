"""Triggers coalesce on the real Redis: a burst of requests makes one chain of spaced cycles; a dead Redis costs
a request under a second and loses nothing (the periodic loops do the work)."""

from __future__ import annotations

import time

import pytest
import redis
from django.conf import settings

from apps.control import jobs, triggers


@pytest.fixture
def queued(monkeypatch):
    calls = []
    monkeypatch.setattr(triggers, "enqueue", lambda job, *args, **kw: calls.append((job, args, kw)))
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [
        triggers.CYCLE_REQUESTED_KEY,
        triggers.CYCLE_AGAIN_KEY,
        triggers.RECONCILE_REQUESTED_KEY.format(cluster_id=7),
        triggers.FOLLOW_REQUESTED_KEY.format(cluster_id=7),
        triggers.LIVE_PENDING_KEY,
        triggers.LIVE_REQUESTED_KEY,
    ]
    client.delete(*keys)
    yield calls
    client.delete(*keys)


def test_a_burst_of_cycle_requests_makes_one_chain_of_spaced_cycles(queued):
    for _ in range(50):
        triggers.request_cycle()
    assert [name for name, _, _ in queued] == [jobs.run_scheduler.name]

    triggers.cycle_started()
    triggers.request_cycle()  # demand changed while the cycle runs
    triggers.cycle_finished()
    assert len(queued) == 2 and queued[1][2]["countdown"] == triggers.CYCLE_SPACING_S

    triggers.cycle_started()
    triggers.cycle_finished()  # nothing changed meanwhile: the chain ends
    assert len(queued) == 2
    triggers.request_cycle()  # and the next change starts a new one
    assert len(queued) == 3


def test_reconcile_and_follow_requests_coalesce_per_cluster(queued):
    for _ in range(5):
        triggers.request_reconcile(7)
        triggers.request_follow(7)
    assert [name for name, _, _ in queued] == [jobs.reconcile_cluster.name, jobs.follow_launches.name]


def test_a_job_that_expired_unrun_is_counted_and_its_loop_asked_again(queued, monkeypatch):
    from types import SimpleNamespace

    from apps.queues import stats

    counted = []
    monkeypatch.setattr(stats, "record_expired", counted.append)
    triggers.request_cycle()
    triggers.request_reconcile(7)
    assert len(queued) == 2
    # Both queued jobs expire in the queue: without a new request the pending keys would swallow every later one.
    jobs.on_revoked(sender=jobs.run_scheduler, request=SimpleNamespace(args=[]), expired=True)
    jobs.on_revoked(sender=jobs.reconcile_cluster, request=SimpleNamespace(args=[7]), expired=True)
    assert [(name, args) for name, args, _ in queued[2:]] == [
        (jobs.run_scheduler.name, ()),
        (jobs.reconcile_cluster.name, (7,)),
    ]
    assert counted == [jobs.run_scheduler.name, jobs.reconcile_cluster.name]
    jobs.on_revoked(sender=jobs.run_scheduler, request=SimpleNamespace(args=[]), expired=False)  # revoked by hand
    assert len(queued) == 4 and len(counted) == 2


def test_task_changes_are_noted_and_one_job_pushes_them_all(queued, monkeypatch):
    pushed = []
    monkeypatch.setattr("apps.tasks.live.push_task_changed", lambda task_ids: pushed.append(sorted(task_ids)))
    for task_id in range(1, 201):
        triggers.on_task_changed(task_ids=[task_id])
    triggers.on_task_changed(task_ids=[5, 6])  # again: noted once
    assert [name for name, _, _ in queued] == [jobs.push_live_updates.name]

    jobs.push_live_updates()
    assert pushed == [list(range(1, 201))]
    triggers.on_task_changed(task_ids=[7])  # after the job took its batch: a new job
    assert len(queued) == 2


def test_a_dead_redis_costs_a_request_under_a_second_and_raises_nothing(settings, monkeypatch):
    settings.REDIS_URL = "redis://10.255.255.1:6379/0"  # unroutable: connects time out
    began = time.monotonic()
    triggers.request_cycle()
    triggers.request_reconcile(7)
    triggers.request_live_push([1])
    assert time.monotonic() - began < 3
