"""The inter-project rebalancer's rules (apps.queues.engine.rebalance): when loans open, how big, when they end."""

from __future__ import annotations

from dataclasses import replace

import pytest

from apps.queues.engine.model import Resources
from apps.queues.engine.rebalance import (
    Loan,
    PastLoan,
    Policy,
    ProjectState,
    ReturnReason,
    apply_adjustment,
    loans_in_use,
    plan,
    quota_adjustments,
)

POLICY = Policy(threshold=0.20, max_duration_s=3600, min_lifetime_s=300, cooldown_s=900)


def gpu(n: float) -> Resources:
    return Resources(gpu=n)


def starved(used=4.0, blocked=2.0, guaranteed=4.0, limit=4.0, waiting=None) -> ProjectState:
    return ProjectState(
        "b",
        gpu(guaranteed),
        gpu(limit),
        gpu(used),
        gpu(blocked if waiting is None else waiting),
        gpu(blocked),
        name="borrower",
    )


def idle(used=0.0, guaranteed=4.0, waiting=0.0) -> ProjectState:
    return ProjectState("l", gpu(guaranteed), gpu(guaranteed), gpu(used), gpu(waiting), name="lender")


def loan(amount=2.0, started=0.0, expires=3600.0, lender="l", borrower="b", id=1) -> Loan:
    return Loan(id, lender, borrower, gpu(amount), started, expires)


def test_loan_opens_when_gap_exceeds_threshold():
    result = plan([starved(), idle(used=1.0)], [], [], now=0.0, policy=POLICY)
    assert len(result.opened) == 1
    new = result.opened[0]
    assert (new.lender_id, new.borrower_id, new.amount.gpu) == ("l", "b", 2.0)
    assert new.expires_at == 3600.0
    assert "borrower uses 100%" in new.reason and "lender uses 25%" in new.reason
    assert new.figures["utilisation"]["gpu"] == {"borrower": 1.0, "lender": 0.25}


def test_no_loan_at_or_below_threshold():
    # Borrower at 100 %, lender at 80 %: a gap of exactly 20 % is not more than the threshold.
    assert plan([starved(), idle(used=3.2)], [], [], now=0.0, policy=POLICY).opened == ()
    assert plan([starved(), idle(used=3.4)], [], [], now=0.0, policy=POLICY).opened == ()
    assert len(plan([starved(), idle(used=3.1)], [], [], now=0.0, policy=POLICY).opened) == 1


def test_no_loan_without_demand_blocked_by_the_limit():
    # Waiting work that is not blocked by the borrower's limit (it waits for free capacity): nothing to lend.
    b = ProjectState("b", gpu(4), gpu(8), gpu(4), gpu(2), gpu(0))
    assert plan([b, idle()], [], [], now=0.0, policy=POLICY).opened == ()
    # Blocked work that fits under its limit after all (the limit rose since the last cycle): nothing either.
    b = ProjectState("b", gpu(4), gpu(8), gpu(4), gpu(2), gpu(2))
    assert plan([b, idle()], [], [], now=0.0, policy=POLICY).opened == ()


def test_lender_with_waiting_work_does_not_lend():
    assert plan([starved(), idle(waiting=1.0)], [], [], now=0.0, policy=POLICY).opened == ()


def test_amount_is_bounded_by_lenders_unused_guarantee():
    result = plan([starved(blocked=8.0), idle(used=3.0)], [], [], now=0.0, policy=POLICY)
    assert [x.amount.gpu for x in result.opened] == [1.0]


def test_amount_is_bounded_by_borrowers_blocked_demand():
    # Used 3 of limit 4 with a 3-GPU task blocked: it needs 2 beyond its limit, not 3.
    result = plan([starved(used=3.0, blocked=3.0), idle(guaranteed=8.0)], [], [], now=0.0, policy=POLICY)
    assert [x.amount.gpu for x in result.opened] == [2.0]


def test_existing_loans_count_against_both_bounds():
    # The borrower already holds 2 of the 2 it needs: no second loan, and the lender's unused guarantee shrank.
    active = [loan(amount=2.0)]
    assert plan([starved(blocked=2.0), idle(guaranteed=8.0)], active, [], now=60.0, policy=POLICY).opened == ()
    result = plan([starved(blocked=5.0), idle(guaranteed=4.0)], active, [], now=60.0, policy=POLICY)
    assert [x.amount.gpu for x in result.opened] == [2.0]  # 4 guaranteed - 2 lent


def test_most_idle_lender_lends_first_and_several_lenders_cover_a_large_demand():
    b = starved(blocked=5.0)
    l1 = ProjectState("l1", gpu(4), gpu(4), gpu(1), name="l1")
    l2 = ProjectState("l2", gpu(4), gpu(4), gpu(0), name="l2")
    result = plan([b, l1, l2], [], [], now=0.0, policy=POLICY)
    assert [(x.lender_id, x.amount.gpu) for x in result.opened] == [("l2", 4.0), ("l1", 1.0)]


def test_borrower_without_guarantee_counts_as_fully_used():
    b = ProjectState("b", gpu(0), gpu(1), gpu(1), gpu(1), gpu(1))
    result = plan([b, idle(used=3.0)], [], [], now=0.0, policy=POLICY)
    assert [x.amount.gpu for x in result.opened] == [1.0]
    assert result.opened[0].figures["utilisation"]["gpu"]["borrower"] is None


def test_advisory_quota_never_borrows():
    b = ProjectState("b", gpu(4), gpu(4), gpu(4), gpu(2), gpu(2), enforce=False)
    assert plan([b, idle()], [], [], now=0.0, policy=POLICY).opened == ()


def test_cpu_loan_for_cpu_work_and_no_cpu_only_loan_for_gpu_work():
    b = ProjectState("b", Resources(cpu=8), Resources(cpu=8), Resources(cpu=8), Resources(cpu=4), Resources(cpu=4))
    lender = ProjectState("l", Resources(cpu=16), Resources(cpu=16), Resources(cpu=2))
    assert [x.amount.cpu for x in plan([b, lender], [], [], now=0.0, policy=POLICY).opened] == [4.0]
    # A GPU task blocked on GPUs and cpu, lender with cpu but no unused GPU guarantee: no loan.
    b = ProjectState(
        "b",
        Resources(cpu=8, gpu=2),
        Resources(cpu=8, gpu=2),
        Resources(cpu=8, gpu=2),
        Resources(cpu=4, gpu=1),
        Resources(cpu=4, gpu=1),
    )
    lender = ProjectState("l", Resources(cpu=16, gpu=2), Resources(cpu=16, gpu=2), Resources(cpu=2, gpu=2))
    assert plan([b, lender], [], [], now=0.0, policy=POLICY).opened == ()


def test_loan_returned_when_lender_demand_returns():
    # Guarantee 4, 2 lent, 3 waiting: its unlent 2 do not hold the work, so the loan comes back.
    result = plan([starved(used=6.0, blocked=0.0), idle(waiting=3.0)], [loan()], [], now=10.0, policy=POLICY)
    assert [(r.loan_id, r.reason) for r in result.returned] == [(1, ReturnReason.LENDER_DEMAND)]
    assert result.opened == ()


def test_lender_demand_returns_only_what_it_needs_newest_first():
    lender = ProjectState("l", gpu(8), gpu(8), gpu(0), gpu(3), name="lender")
    b1 = ProjectState("b1", gpu(2), gpu(2), gpu(5), name="b1")
    b2 = ProjectState("b2", gpu(2), gpu(2), gpu(5), name="b2")
    active = [loan(3.0, started=0.0, borrower="b1", id=1), loan(3.0, started=50.0, borrower="b2", id=2)]
    # Unlent guarantee 8 - 6 = 2 holds 2 of the 3 waiting: the newest loan goes back, the older stays.
    result = plan([lender, b1, b2], active, [], now=100.0, policy=POLICY)
    assert [(r.loan_id, r.reason) for r in result.returned] == [(2, ReturnReason.LENDER_DEMAND)]
    # Waiting work its unlent guarantee holds takes no loan back.
    lender = ProjectState("l", gpu(8), gpu(8), gpu(0), gpu(2), name="lender")
    assert plan([lender, b1, b2], active, [], now=100.0, policy=POLICY).returned == ()


def test_lender_demand_returns_a_loan_younger_than_the_minimum_lifetime():
    result = plan([starved(used=6.0, blocked=0.0), idle(waiting=4.0)], [loan(started=0.0)], [], now=1.0, policy=POLICY)
    assert [r.reason for r in result.returned] == [ReturnReason.LENDER_DEMAND]


def test_loan_returned_when_it_expires():
    result = plan([starved(used=6.0, blocked=0.0), idle()], [loan(expires=3600.0)], [], now=3600.0, policy=POLICY)
    assert [r.reason for r in result.returned] == [ReturnReason.EXPIRED]
    assert plan([starved(used=6.0, blocked=0.0), idle()], [loan()], [], now=3599.0, policy=POLICY).returned == ()


def test_expired_loan_is_not_renewed_before_the_cool_down():
    states = [starved(used=6.0, blocked=2.0), idle()]
    result = plan(states, [loan(expires=3600.0)], [], now=3600.0, policy=POLICY)
    assert [r.reason for r in result.returned] == [ReturnReason.EXPIRED] and result.opened == ()


def test_unused_loan_returned_as_borrower_idle_only_after_minimum_lifetime():
    quiet = starved(used=3.0, blocked=0.0, waiting=0.0)
    assert plan([quiet, idle()], [loan(started=0.0)], [], now=299.0, policy=POLICY).returned == ()
    result = plan([quiet, idle()], [loan(started=0.0)], [], now=300.0, policy=POLICY)
    assert [r.reason for r in result.returned] == [ReturnReason.BORROWER_IDLE]


def test_loan_in_use_or_wanted_is_kept():
    # Running 6 of limit 4 with a 2-GPU loan: in use.
    assert (
        plan([starved(used=6.0, blocked=0.0, waiting=0.0), idle()], [loan()], [], now=1000.0, policy=POLICY).returned
        == ()
    )
    # Running 4 with 2 waiting: about to be used.
    assert plan([starved(used=4.0, blocked=2.0), idle()], [loan()], [], now=1000.0, policy=POLICY).returned == ()


def test_loan_wanted_only_by_work_that_may_not_run_on_it_is_returned():
    # Loans for low-class work only: the borrower's 2 waiting GPUs are medium work (not loanable), so the loan is
    # idle for what may use it; counted as plain waiting work it would be kept.
    medium_waiting = replace(starved(used=4.0, blocked=0.0, waiting=2.0), loanable=gpu(0))
    result = plan([medium_waiting, idle()], [loan()], [], now=1000.0, policy=POLICY)
    assert [r.reason for r in result.returned] == [ReturnReason.BORROWER_IDLE]
    assert (
        plan([replace(medium_waiting, loanable=None), idle()], [loan()], [], now=1000.0, policy=POLICY).returned == ()
    )


def test_cool_down_before_lending_to_the_same_pair_again():
    past = [PastLoan("l", "b", returned_at=100.0)]
    assert plan([starved(), idle()], [], past, now=999.0, policy=POLICY).opened == ()
    assert len(plan([starved(), idle()], [], past, now=1000.0, policy=POLICY).opened) == 1
    # Another lender is not held back by that pair's cool-down.
    other = ProjectState("l2", gpu(4), gpu(4), gpu(0), name="l2")
    assert [x.lender_id for x in plan([starved(), idle(), other], [], past, now=999.0, policy=POLICY).opened] == ["l2"]


def test_no_flapping_under_alternating_lender_demand():
    """Lender demand on and off every minute for an hour: loans open at most once per cool-down."""
    active: list[Loan] = []
    past: list[PastLoan] = []
    opens = returns = 0
    for minute in range(60):
        now = minute * 60.0
        lender = idle(waiting=1.0 if minute % 2 else 0.0)
        borrower = starved(used=4.0 + sum(x.amount.gpu for x in active), blocked=2.0)
        result = plan([borrower, lender], active, past, now=now, policy=POLICY)
        gone = {r.loan_id for r in result.returned}
        past += [PastLoan(x.lender_id, x.borrower_id, now) for x in active if x.id in gone]
        active = [x for x in active if x.id not in gone]
        active += [
            Loan(f"{minute}", x.lender_id, x.borrower_id, x.amount, x.started_at, x.expires_at) for x in result.opened
        ]
        opens += len(result.opened)
        returns += len(gone)
    assert opens <= 60 * 60 / POLICY.cooldown_s + 1
    assert returns <= opens


def test_no_flapping_under_alternating_borrower_demand():
    """Borrower work that comes and goes every minute keeps one loan for the minimum lifetime, not one a minute."""
    active = [loan(started=0.0)]
    returns = 0
    for minute in range(1, 5):
        b = starved(used=6.0 if minute % 2 else 4.0, blocked=0.0, waiting=0.0)
        result = plan([b, idle()], active, [], now=minute * 60.0, policy=POLICY)
        returns += len(result.returned)
    assert returns == 0


def test_plan_is_deterministic():
    states = [starved(blocked=5.0), ProjectState("l1", gpu(4), gpu(4), gpu(0)), ProjectState("l2", gpu(4), gpu(4))]
    assert plan(states, [], [], 0.0, POLICY) == plan(list(reversed(states)), [], [], 0.0, POLICY)


def test_quota_adjustments_raise_borrower_and_lower_lender():
    adj = quota_adjustments([loan(2.0), loan(1.0, lender="l2", id=2)])
    g, lim = adj["b"]
    assert (g.gpu, lim.gpu) == (3.0, 3.0)
    g, lim = adj["l"]
    assert (g.gpu, lim.gpu) == (-2.0, 0.0)
    assert apply_adjustment(gpu(1.0), adj["l"][0]).gpu == 0.0  # never below zero


def test_loans_in_use_counts_usage_above_the_own_limit_oldest_first():
    states = {"b": starved(used=5.0, blocked=0.0)}
    use = loans_in_use(states, [loan(2.0, started=0.0, id=1), loan(2.0, started=5.0, id=2)])
    assert (use[1].gpu, use[2].gpu) == (1.0, 0.0)


def test_open_new_false_only_returns():
    assert plan([starved(), idle()], [], [], now=0.0, policy=POLICY, open_new=False).opened == ()


@pytest.mark.parametrize("bad", [{"threshold": 1.5}, {"max_duration_s": 0}, {"cooldown_s": -1}])
def test_policy_rejects_bad_settings(bad):
    with pytest.raises(ValueError):
        Policy(**bad)
