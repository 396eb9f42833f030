"""The rebalancer loop (apps.control.rebalance) through its beat job and the scheduling snapshot."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.billing.models import PriceRule, Transaction
from apps.control import jobs
from apps.control.rebalance import rebalance_vdc, return_loan
from apps.control.scheduling import SnapshotLoader, run_cycle
from apps.queues.models import TaskQueue
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from apps.vdc.models import CapacityLoan, Membership, Project, ProjectQuota, RebalancerSettings


def submit(user, project, gpu_spec, name):
    return submit_task(
        user,
        project=project,
        queue="medium",
        kind="training",
        name=name,
        command="sleep 1",
        gpu_spec=gpu_spec,
        expected_duration=timedelta(minutes=10),
    )


@pytest.fixture
def two_projects(world):
    """alpha and beta each guaranteed (and limited to) 4 of the VDC's 8 A100; the rebalancer on at 20 %, lending
    to work of any class (these tests submit medium work)."""
    ProjectQuota.objects.filter(vdc=world.vdc).update(guaranteed_gpu=Decimal(4), limit_gpu=Decimal(4))
    RebalancerSettings.objects.create(vdc=world.vdc, interval=timedelta(seconds=1), loans_low_class_only=False)
    return world


def age(*tasks, by=timedelta(hours=1)):
    """Run the tasks' guaranteed windows and the reclaim minimum out: they started an hour ago."""
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(started_at=timezone.now() - by)


def test_loan_starts_the_borrowers_waiting_task_and_the_lender_reclaims_when_its_work_arrives(two_projects):
    w = two_projects
    first = submit(w.member, w.project, "4(A100)", "first")
    second = submit(w.member, w.project, "2(A100)", "second")
    run_cycle(w.vdc.pk)
    second.refresh_from_db()
    assert second.status == "queued" and second.pending_reason == "quota_exceeded"

    jobs.rebalance_capacity()
    loan = CapacityLoan.objects.get()
    assert (loan.lender, loan.borrower, loan.gpu) == (w.other_project, w.project, Decimal("2.00"))
    assert loan.active and loan.expires_at - loan.started_at == timedelta(hours=4)
    assert "alpha uses 100% of its guarantee" in loan.reason and "beta uses 0%" in loan.reason
    assert loan.figures["borrower_blocked"]["gpu"] == 2.0

    quotas = {q.project_id: q for q in SnapshotLoader(w.vdc).load(timezone.now()).quotas}
    assert (quotas[w.project.pk].guaranteed.gpu, quotas[w.project.pk].limit.gpu) == (6.0, 6.0)
    assert (quotas[w.other_project.pk].guaranteed.gpu, quotas[w.other_project.pk].limit.gpu) == (2.0, 4.0)

    run_cycle(w.vdc.pk)
    second.refresh_from_db()
    assert second.status == "scheduled"

    # The lender's own work comes back: the loan is returned, and its task reclaims the loaned cards.
    age(first, second)
    back = submit(w.outsider, w.other_project, "4(A100)", "lender-work")
    run_cycle(w.vdc.pk)
    back.refresh_from_db()
    assert back.status == "queued"  # its guarantee is lent out: nothing to reclaim yet
    jobs.rebalance_capacity()
    loan.refresh_from_db()
    assert loan.return_reason == "lender_demand" and loan.returned_at is not None
    assert loan.return_message.startswith("beta has 4 GPU-eq")
    run_cycle(w.vdc.pk)
    second.refresh_from_db()
    first.refresh_from_db()
    back.refresh_from_db()
    assert second.status == "preempted" and second.preemption_count == 1
    assert second.events.filter(kind="preempted", data__reason="quota_reclaim").exists()
    assert first.status == "scheduled"  # minimal victims: only the loaned work goes
    assert back.status == "scheduled"


def test_no_loan_below_the_threshold_or_when_disabled(two_projects):
    w = two_projects
    submit(w.member, w.project, "4(A100)", "first")
    submit(w.member, w.project, "2(A100)", "second")
    submit(w.outsider, w.other_project, "3(A100)", "lender-busy")  # lender at 75 %: gap 25 % > 20 %
    run_cycle(w.vdc.pk)
    RebalancerSettings.objects.update(threshold_percent=30)
    jobs.rebalance_capacity()
    assert not CapacityLoan.objects.exists()
    RebalancerSettings.objects.update(threshold_percent=20, enabled=False)
    jobs.rebalance_capacity()
    assert not CapacityLoan.objects.exists()
    RebalancerSettings.objects.update(enabled=True, last_run_at=None)
    jobs.rebalance_capacity()
    assert CapacityLoan.objects.get().gpu == Decimal("1.00")  # the lender's unused guarantee


def test_new_loans_wait_for_the_interval_but_returns_do_not(two_projects):
    w = two_projects
    RebalancerSettings.objects.update(interval=timedelta(hours=1), last_run_at=timezone.now())
    submit(w.member, w.project, "4(A100)", "first")
    submit(w.member, w.project, "2(A100)", "second")
    run_cycle(w.vdc.pk)
    assert rebalance_vdc(w.vdc.pk).considered is False
    assert not CapacityLoan.objects.exists()
    later = timezone.now() + timedelta(hours=1)
    result = rebalance_vdc(w.vdc.pk, now=later)
    assert result.considered and result.opened == 1
    # Past its end the loan goes back at the next tick, interval or not.
    end = later + timedelta(hours=4, seconds=1)
    RebalancerSettings.objects.update(last_run_at=end - timedelta(minutes=1))
    result = rebalance_vdc(w.vdc.pk, now=end)
    assert result.returned == 1 and not result.considered
    assert CapacityLoan.objects.get().return_reason == "expired"


def test_rebalancer_run_is_idempotent(two_projects):
    w = two_projects
    submit(w.member, w.project, "4(A100)", "first")
    submit(w.member, w.project, "2(A100)", "second")
    run_cycle(w.vdc.pk)
    now = timezone.now()
    rebalance_vdc(w.vdc.pk, now=now)
    rebalance_vdc(w.vdc.pk, now=now + timedelta(seconds=5))
    assert CapacityLoan.objects.count() == 1


def test_admin_return_settles_by_billing_mode(two_projects):
    w = two_projects
    PriceRule.objects.create(resource_type="gpu_eq", price_per_hour=Decimal("10"))
    RebalancerSettings.objects.update(loan_billing="lender_credited")
    loan = CapacityLoan.objects.create(
        vdc=w.vdc,
        lender=w.other_project,
        borrower=w.project,
        gpu=Decimal(2),
        reason="test",
        started_at=timezone.now() - timedelta(hours=1),
        expires_at=timezone.now() + timedelta(hours=1),
        used_gpu_hours=Decimal("1.5"),
    )
    loan = return_loan(loan.pk, user=w.admin)
    assert loan.return_reason == "admin" and loan.settlement.startswith("lender credited 15.00")
    credit = Transaction.objects.get()
    assert credit.account.project == w.other_project and credit.amount == Decimal("15.00")
    assert return_loan(loan.pk).returned_at == loan.returned_at  # a second return changes nothing


def test_with_loans_for_low_class_work_only_medium_work_gets_no_loan_and_low_work_does(two_projects):
    w = two_projects
    RebalancerSettings.objects.update(loans_low_class_only=True)
    first = submit(w.member, w.project, "4(A100)", "first")
    medium = submit(w.member, w.project, "2(A100)", "medium-blocked")
    run_cycle(w.vdc.pk)
    jobs.rebalance_capacity()
    assert not CapacityLoan.objects.exists()  # only medium work waits: a loan would not help it

    low = submit_task(
        w.member, project=w.project, queue="low", kind="training", name="low", command="sleep 1", gpu_spec="2(A100)"
    )
    run_cycle(w.vdc.pk)
    RebalancerSettings.objects.update(last_run_at=None)
    jobs.rebalance_capacity()
    loan = CapacityLoan.objects.get()
    assert loan.gpu == Decimal("2.00")  # the low work's need, not the medium task's as well
    snapshot = SnapshotLoader(w.vdc).load(timezone.now())
    assert snapshot.settings.loans_low_class_only and [x.id for x in snapshot.loans] == [loan.pk]
    run_cycle(w.vdc.pk)
    for t in (first, medium, low):
        t.refresh_from_db()
    assert first.status == "scheduled" and low.status == "scheduled"
    assert medium.status == "queued" and medium.pending_reason == "quota_exceeded"
    assert "borrowed capacity takes low-class work only" in medium.pending_message


@pytest.mark.parametrize(("billing", "first"), [("borrower_pays", "gamma"), ("neither", "alpha")])
def test_fair_share_follows_the_loan_billing_through_the_scheduling_service(two_projects, billing, first):
    # alpha (own limit 4) borrowed beta's whole guarantee and runs 7 of the 8 cards, 3 of them on the loan; gamma
    # runs a CPU task holding 40 of 64 cores (share 0.625). One card is free, asked for by both in a drf queue:
    # alpha's share is 7/8 when it pays for its loaned usage, 4/8 when that usage counts for nobody.
    w = two_projects
    RebalancerSettings.objects.update(enabled=False, loan_billing=billing)
    now = timezone.now()
    CapacityLoan.objects.create(
        vdc=w.vdc,
        lender=w.other_project,
        borrower=w.project,
        gpu=Decimal(4),
        reason="test",
        started_at=now,
        expires_at=now + timedelta(hours=1),
    )
    gamma = ProjectQuota.objects.create(
        project=Project.objects.create(name="gamma"),
        vdc=w.vdc,
        limit_cpu=Decimal(64),
        limit_memory_gib=Decimal(512),
        limit_gpu=Decimal(8),
    ).project
    Membership.objects.create(project=gamma, user=w.outsider, role="owner")
    for spec in ("4(A100)", "3(A100)"):
        submit_task(
            w.member, project=w.project, queue="high", kind="training", name=spec, command="sleep 1", gpu_spec=spec
        )
    submit_task(w.outsider, project=gamma, queue="high", kind="training", name="cpu", command="sleep 1", cpu=40)
    run_cycle(w.vdc.pk)
    assert Task.objects.filter(status="scheduled").count() == 3
    fair = TaskQueue.objects.create(vdc=w.vdc, name="fair", priority_class="high", policy="drf")
    wants = {
        p: submit_task(
            u, project=p, queue=fair, kind="training", name=f"{p.name}-more", command="sleep 1", gpu_spec="1(A100)"
        )
        for p, u in ((w.project, w.member), (gamma, w.outsider))
    }
    run_cycle(w.vdc.pk)
    ran = {p.name for p, t in wants.items() if Task.objects.get(pk=t.pk).status == "scheduled"}
    assert ran == {first}
