"""Capacity loans in the engine (docs/engine.md, Rebalancer): fair share follows the loan billing setting, and
``loans_low_class_only`` keeps work above the low class off borrowed capacity."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.queues.engine import ProjectQuota, Queue, Resources, schedule
from apps.queues.engine.engine import Scheduler
from apps.queues.engine.model import Loan, Reason, VdcSettings

from .builders import node, running, snap, started, task, waiting

DRF_QUEUES = (Queue("high", "high", policy="drf"), Queue("medium", "medium"), Queue("low", "low"))


def gpu(n: float, cpu: float = 64.0, mem: float = 256.0) -> Resources:
    return Resources(cpu, mem, n)


def quota(pid, guaranteed, limit) -> ProjectQuota:
    return ProjectQuota(pid, gpu(guaranteed), gpu(limit))


def on(nid, first, n):
    """One running instance holding ``n`` cards of node ``nid`` from index ``first``."""
    return [(nid, list(range(first, first + n)))]


def loan_snapshot(billing: str, queued=()):
    """16 A100s. Lender "l" (own guarantee 6) lent 3 GPUs to "b" (own guarantee and limit 2, so 5 / 5 with the
    loan); "b" runs 4, 2 of them on the loan; "l" runs 3, "c" 3 and a filler 5: one card is free."""
    rts = [
        running(task("b-run", gpu=4, project="b"), on("n1", 0, 4)),
        running(task("l-run", gpu=3, project="l"), on("n1", 4, 3)),
        running(task("c-run", gpu=3, project="c"), on("n2", 0, 3)),
        running(task("filler", gpu=5, project="f"), on("n2", 3, 5)),
    ]
    quotas = [quota("b", 5, 5), quota("l", 3, 8), quota("c", 3, 8)]
    s = snap([node("n1", cards=8), node("n2", cards=8)], queued, rts, quotas, qs=DRF_QUEUES, loan_billing=billing)
    return replace(s, loans=(Loan(1, "l", "b", gpu(3, 0, 0), 0.0, 3600.0),))


def test_borrower_pays_counts_loaned_usage_in_the_borrowers_share():
    sched = Scheduler(loan_snapshot("borrower_pays"))
    assert sched.share_of("b") == pytest.approx(4 / 16)
    assert sched.share_of("l") == pytest.approx(3 / 16)


def test_neither_leaves_usage_on_a_loan_out_of_the_borrowers_share():
    sched = Scheduler(loan_snapshot("neither"))
    assert sched.loan_credit("b") == Resources(0, 0, 2)  # 4 running, own limit 2: 2 on the loan
    assert sched.share_of("b") == pytest.approx(2 / 16)
    assert sched.share_of("l") == pytest.approx(3 / 16)  # the lender is not credited


def test_lender_credited_takes_what_its_borrower_uses_off_the_lenders_share():
    sched = Scheduler(loan_snapshot("lender_credited"))
    assert sched.share_of("b") == pytest.approx(4 / 16)  # the borrower's usage counts as usual
    assert sched.share_of("l") == pytest.approx(1 / 16)  # 3 running less the 2 its borrower uses
    assert sched.share_of("c") == pytest.approx(3 / 16)


def test_usage_within_the_borrowers_own_limit_is_not_on_a_loan():
    s = loan_snapshot("neither")
    one = replace(s, running=tuple(r for r in s.running if r.task.id != "b-run"))
    one = replace(one, running=(*one.running, running(task("b-run", gpu=2, project="b"), on("n1", 0, 2))))
    assert Scheduler(one).loan_credit("b") == Resources()


@pytest.mark.parametrize(
    ("billing", "first"),
    [("borrower_pays", "c-new"), ("neither", "b-new"), ("lender_credited", "c-new")],
)
def test_drf_order_of_borrower_and_a_third_project_follows_the_loan_billing(billing, first):
    # One free card; "c" (share 3/16) asked first. The borrower (4/16 with its loaned usage) goes first only when
    # its usage on the loan does not count.
    queued = [task("c-new", project="c", submit_time=1), task("b-new", project="b", submit_time=2)]
    s = loan_snapshot(billing, queued)
    s = replace(s, quotas=(quota("b", 6, 6), *s.quotas[1:]))  # room for one more under b's raised limit
    s = replace(s, loans=(Loan(1, "l", "b", gpu(4, 0, 0), 0.0, 3600.0),))  # own limit still 2: 2 on the loan
    assert started(schedule(s)) == [first]


@pytest.mark.parametrize(("billing", "first"), [("borrower_pays", "c-new"), ("lender_credited", "l-new")])
def test_drf_order_of_lender_and_a_third_project_follows_the_loan_billing(billing, first):
    # "l" and "c" both run 3; "c" asked first. Credited with the 2 its borrower uses, the lender goes first.
    queued = [task("c-new", project="c", submit_time=1), task("l-new", project="l", submit_time=2)]
    assert started(schedule(loan_snapshot(billing, queued))) == [first]


def test_unknown_loan_billing_is_refused():
    with pytest.raises(ValueError, match="unknown loan billing 'lender'"):
        VdcSettings(loan_billing="lender")


def low_only_snapshot(low_only: bool, queued):
    """ "b" (own guarantee and limit 2) borrowed 2 GPUs: 4 / 4 in the snapshot; it runs 2; 6 cards are free."""
    rts = [running(task("b-run", gpu=2, project="b"), on("n1", 0, 2))]
    s = snap([node("n1", cards=8)], queued, rts, [quota("b", 4, 4), quota("l", 2, 8)], loans_low_class_only=low_only)
    return replace(s, loans=(Loan(1, "l", "b", gpu(2, 0, 0), 0.0, 3600.0),))


def test_loans_low_class_only_keeps_medium_work_off_borrowed_capacity():
    queued = [
        task("b-medium", "medium", project="b", expected_duration_s=600, submit_time=1),
        task("b-low", "low", project="b", submit_time=2),
    ]
    d = schedule(low_only_snapshot(True, queued))
    assert started(d) == ["b-low"]
    w = waiting(d)["b-medium"]
    assert w.reason == Reason.QUOTA_EXCEEDED and "borrowed capacity takes low-class work only" in w.message
    # Without the option the medium task runs on the loan too.
    assert sorted(started(schedule(low_only_snapshot(False, queued)))) == ["b-low", "b-medium"]


def test_loans_low_class_only_still_lets_medium_work_use_the_borrowers_own_limit():
    rts_free = low_only_snapshot(True, [task("b-medium", "medium", project="b", expected_duration_s=600)])
    own = replace(rts_free, running=())  # nothing running: the medium task fits under b's own limit of 2
    assert started(schedule(own)) == ["b-medium"]


def test_loans_low_class_only_keeps_a_medium_service_from_growing_onto_the_loan():
    svc = task(
        "svc",
        "medium",
        project="b",
        kind="inference",
        min_replicas=1,
        max_replicas=4,
        autoscaled=True,
        expected_duration_s=3600,
    )
    s = low_only_snapshot(True, [])
    s = replace(s, running=(running(svc, [("n1", [0]), ("n1", [1])]),))
    assert not schedule(s).resizes  # 2 replicas = b's own limit
    grown = next(r for r in schedule(replace(s, settings=VdcSettings())).resizes if r.task_id == "svc")
    assert grown.replicas == 4


def test_loans_low_class_only_does_not_hold_medium_work_back_for_the_projects_own_low_work():
    # "b" runs 3 low-class cards (one of them on the loan). Its own limit of 2 is measured without its low work,
    # so a medium task of 1 card still starts: the raised limit (4) holds, and the loan stays low work's.
    s = low_only_snapshot(True, [task("b-medium", "medium", project="b", expected_duration_s=600)])
    s = replace(s, running=(running(task("b-low", "low", gpu=3, project="b"), on("n1", 0, 3)),))
    assert started(schedule(s)) == ["b-medium"]
    # Two medium cards would take the project past its raised limit: they wait.
    two = replace(
        s, queued=(task("b-medium", "medium", gpu=2, models=["A100-80G"], project="b", expected_duration_s=600),)
    )
    assert waiting(schedule(two))["b-medium"].reason == Reason.QUOTA_EXCEEDED


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    loan_gpu=st.integers(1, 4),
    own_limit=st.integers(1, 4),
    low_running=st.integers(0, 4),
    queued=st.lists(st.tuples(st.sampled_from(["high", "medium", "low"]), st.integers(1, 3)), max_size=6),
)
def test_with_loans_for_low_class_only_other_work_never_starts_onto_borrowed_capacity(
    loan_gpu, own_limit, low_running, queued
):
    # Whatever low work runs and whatever waits: after a cycle the borrower's work above the low class fits under
    # its own limit, and all its work under the limit the loan raised.
    limit = own_limit + loan_gpu
    low_running = min(low_running, limit)
    rts = [running(task("b-low", "low", gpu=low_running, project="b"), on("n1", 0, low_running))] if low_running else []
    tasks = [
        task(f"q{i}", cls, gpu=n, models=["A100-80G"], project="b", submit_time=i, expected_duration_s=600)
        for i, (cls, n) in enumerate(queued)
    ]
    s = snap(
        [node("n1", cards=8), node("n2", cards=8)], tasks, rts, [quota("b", limit, limit)], loans_low_class_only=True
    )
    s = replace(s, loans=(Loan(1, "l", "b", gpu(loan_gpu, 0, 0), 0.0, 3600.0),))
    d = schedule(s)
    sizes = {f"q{i}": (cls, n) for i, (cls, n) in enumerate(queued)}
    new_other = sum(sizes[x.task_id][1] for x in d.starts if sizes[x.task_id][0] != "low")
    new_low = sum(sizes[x.task_id][1] for x in d.starts if sizes[x.task_id][0] == "low")
    assert new_other <= own_limit
    assert low_running + new_low + new_other <= limit
