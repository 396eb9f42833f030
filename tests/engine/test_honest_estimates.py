"""Estimated starts of tasks the pooled estimate cannot see blocked: a task of several instances that needs room on
several nodes, and a task held back by its project's quota (docs/engine.md, "Estimated start")."""

from __future__ import annotations

from apps.queues.engine import ProjectQuota, Reason, Resources, schedule

from .builders import node, running, snap, task, waiting


def _gang_behind(*runs):
    # Two 4-card nodes and a 2-card one: 9 cards free in all, but no two nodes with 4 each.
    nodes = [node("n1"), node("n2", cards=4), node("n3", cards=2)]
    return waiting(schedule(snap(nodes, [task("gang", gpu=4, instances=2)], list(runs), now=100)))["gang"]


def test_gang_blocked_by_a_small_service_of_unknown_end_has_no_estimate():
    w = _gang_behind(running(task("svc", gpu=1), [("n1", [0])], started_at=0))
    assert w.reason == Reason.INSUFFICIENT_CAPACITY
    assert w.estimated_start is None and w.blocked_by is None


def test_gang_waits_for_the_small_service_that_holds_a_node():
    w = _gang_behind(running(task("svc", gpu=1, expected_duration_s=900), [("n1", [0])], started_at=0))
    assert (w.estimated_start, w.blocked_by) == (900, "svc")


def test_gang_waits_for_the_latest_release_it_needs():
    w = _gang_behind(
        running(task("a", gpu=1, expected_duration_s=400), [("n1", [0])], started_at=0),
        running(task("b", gpu=1, expected_duration_s=700), [("n2", [0])], started_at=0),
    )
    assert (w.estimated_start, w.blocked_by) == (700, "b")
    # Had the pooled estimate decided, the first release (4 + 3 + 2 cards) would have looked like enough.


def test_gang_that_fits_now_is_not_held_back():
    d = schedule(snap([node("n1"), node("n2")], [task("gang", gpu=4, instances=2)], now=100))
    assert waiting(d) == {}


def _quota_wait(*runs):
    q = ProjectQuota("p1", limit=Resources(100, 1000, 2.0))
    d = schedule(snap([node("n1"), node("n2")], [task("next", gpu=1, submit_time=5)], list(runs), quotas=[q], now=100))
    return waiting(d)["next"]


def test_quota_wait_is_estimated_from_the_projects_own_ends():
    w = _quota_wait(
        running(task("r1", expected_duration_s=600), [("n1", [0])], started_at=0),
        running(task("r2", expected_duration_s=300), [("n1", [1])], started_at=0),
    )
    assert w.reason == Reason.QUOTA_EXCEEDED
    # The cluster has free cards now; the quota frees one GPU when r2 ends.
    assert (w.estimated_start, w.blocked_by) == (300, "r2")


def test_quota_wait_without_a_known_end_says_so():
    w = _quota_wait(
        running(task("r1"), [("n1", [0])], started_at=0),
        running(task("r2"), [("n1", [1])], started_at=0),
    )
    assert w.reason == Reason.QUOTA_EXCEEDED
    assert w.estimated_start is None
    assert w.message == "no estimate: waits for your project's quota (2 of 2 GPUs in use)"


def test_quota_wait_ignores_other_projects_ends():
    w = _quota_wait(
        running(task("r1"), [("n1", [0])], started_at=0),
        running(task("r2"), [("n1", [1])], started_at=0),
        running(task("other", project="p2", expected_duration_s=200), [("n2", [0])], started_at=0),
    )
    assert w.estimated_start is None
