"""The inter-project rebalancer (docs/rules.md#rebalancing): per VDC, open and return capacity loans by the pure rules.

One run per VDC holds the VDC row lock (the one a scheduling cycle takes), so loans never change under a cycle
and two runs of the same VDC never overlap (a second one skips). Returns are checked on every beat tick;
new loans only once the VDC's ``interval`` has passed since its last run that considered them. The loan rows
are the audit trail (what was lent, why, with the figures; when and why it came back); a change requests a
scheduling cycle on commit so the engine applies it at once.

Billing (``RebalancerSettings.loan_billing``): usage is always metered to the project that runs it, so the
borrower pays by default. Each run adds the GPU-equivalent hours the borrower ran on each loan (its usage
above its own limit, given to its loans oldest first) to ``used_gpu_hours``; at the return, "lender credited"
credits the lender's account with their value at the VDC's GPU-equivalent price, and "neither" refunds the
borrower that value. Fair share (drf, fair_share queues) follows the same mode in the engine
(``Scheduler.loan_credit``). With ``loans_low_class_only`` only low-class waiting work asks for loans.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_DOWN, Decimal

from django.db import transaction
from django.utils import timezone

from apps.billing.choices import ResourceType
from apps.billing.services import account_of, add_credit, price_book
from apps.control import triggers
from apps.control.scheduling import SnapshotLoader
from apps.queues.engine import model as em
from apps.queues.engine import rebalance as rules
from apps.queues.engine.resources import RequestError, demand_of
from apps.vdc.choices import LoanBilling, LoanReturnReason
from apps.vdc.models import VDC, CapacityLoan, ProjectQuota, RebalancerSettings

log = logging.getLogger(__name__)

ZERO = Decimal("0")
# Waiting work that cannot run whatever the quota (set aside, out of money): no reason to lend or to take back.
NOT_DEMAND = frozenset({em.Reason.INVALID_REQUEST, em.Reason.BUDGET_EXHAUSTED, em.Reason.NO_MATCHING_GPU_MODEL})


@dataclass
class RebalanceResult:
    """What one run did in one VDC."""

    vdc: str
    skipped: bool = False
    considered: bool = False
    opened: int = 0
    returned: int = 0


def policy_of(settings: RebalancerSettings) -> rules.Policy:
    """The pure rules' policy from a VDC's settings."""
    return rules.Policy(
        threshold=settings.threshold_percent / 100,
        max_duration_s=settings.max_loan_duration.total_seconds(),
        min_lifetime_s=settings.min_loan_duration.total_seconds(),
        cooldown_s=settings.cooldown.total_seconds(),
    )


def engine_loan(loan: CapacityLoan) -> rules.Loan:
    """An active loan row as the pure rules see it."""
    return rules.Loan(
        id=loan.pk,
        lender_id=loan.lender_id,
        borrower_id=loan.borrower_id,
        amount=em.Resources(cpu=float(loan.cpu), memory_gib=float(loan.memory_gib), gpu=float(loan.gpu)),
        started_at=loan.started_at.timestamp(),
        expires_at=loan.expires_at.timestamp(),
    )


def project_states(vdc: VDC, now: datetime, low_class_only: bool = False) -> dict[int, rules.ProjectState]:
    """Each project's own quota, running usage and waiting demand in the VDC (the snapshot the scheduler loads).

    ``low_class_only`` (loans for low-class work only): only low-class waiting work counts as what a loan is for.
    """
    loader = SnapshotLoader(vdc)
    snapshot = loader.load(now)
    catalog = {m.name: m for m in snapshot.gpu_models}
    low_queues = {q.id for q in snapshot.queues if q.priority_class == em.LOW}
    used: dict[int, list[float]] = {}
    for run in snapshot.running:
        held = loader.tasks[run.task.id]
        row = used.setdefault(run.task.project_id, [0.0, 0.0, 0.0])
        row[0] += float(held.held_cpu)
        row[1] += float(held.held_memory_gib)
        row[2] += float(held.allocated_gpu)
    waiting: dict[int, list[float]] = {}
    blocked: dict[int, list[float]] = {}
    loanable: dict[int, list[float]] = {}
    for task in snapshot.queued:
        reason = loader.tasks[task.id].pending_reason
        if reason in NOT_DEMAND:
            continue
        instances = max(1, task.min_replicas) if task.min_replicas is not None else task.instances
        try:
            demand = demand_of(task, catalog, instances)
        except RequestError:
            continue
        vec = demand.vector(min(demand.alternatives, key=lambda a: a[3]))
        targets = [waiting]
        if not low_class_only or task.queue_id in low_queues:
            targets += [loanable, blocked] if reason == em.Reason.QUOTA_EXCEEDED else [loanable]
        for target in targets:
            row = target.setdefault(task.project_id, [0.0, 0.0, 0.0])
            row[0], row[1], row[2] = row[0] + vec.cpu, row[1] + vec.memory_gib, row[2] + vec.gpu

    def res(values: list[float] | None) -> em.Resources:
        return em.Resources(*values) if values else em.Resources()

    out = {}
    for q in ProjectQuota.objects.filter(vdc=vdc).select_related("project"):
        out[q.project_id] = rules.ProjectState(
            project_id=q.project_id,
            guaranteed=em.Resources(float(q.guaranteed_cpu), float(q.guaranteed_memory_gib), float(q.guaranteed_gpu)),
            limit=em.Resources(float(q.limit_cpu), float(q.limit_memory_gib), float(q.limit_gpu)),
            used=res(used.get(q.project_id)),
            waiting=res(waiting.get(q.project_id)),
            blocked=res(blocked.get(q.project_id)),
            enforce=q.enforce,
            name=q.project.name,
            loanable=res(loanable.get(q.project_id)),
        )
    return out


def rebalance_vdc(vdc_id: int, now: datetime | None = None) -> RebalanceResult:
    """One rebalancer run in one VDC: return what the rules return, and open new loans when the interval is due.

    Skipped when another run or a scheduling cycle holds the VDC; a VDC whose settings are gone or disabled
    only has its loans returned (expired, or taken back by the lender).
    """
    now = now or timezone.now()
    with transaction.atomic():
        vdc = VDC.objects.select_for_update(skip_locked=True).filter(pk=vdc_id).first()
        if vdc is None:
            return RebalanceResult(vdc=str(vdc_id), skipped=True)
        result = RebalanceResult(vdc=vdc.name)
        settings = RebalancerSettings.objects.filter(vdc=vdc).first()
        active = list(CapacityLoan.objects.select_for_update().filter(vdc=vdc, returned_at__isnull=True))
        on = settings is not None and settings.enabled and vdc.enabled
        if not on and not active:
            return result
        policy = policy_of(settings) if settings is not None else rules.Policy(cooldown_s=0)
        due = on and (settings.last_run_at is None or now - settings.last_run_at >= settings.interval)
        states = project_states(vdc, now, settings is not None and settings.loans_low_class_only)
        loans = [engine_loan(x) for x in active]
        recent = CapacityLoan.objects.filter(vdc=vdc, returned_at__gte=now - settings.cooldown) if on else []
        past = [rules.PastLoan(x.lender_id, x.borrower_id, x.returned_at.timestamp()) for x in recent]
        decided = rules.plan(states.values(), loans, past, now.timestamp(), policy, open_new=due)
        _accrue(active, rules.loans_in_use(states, loans), now)

        by_id = {x.pk: x for x in active}
        billing = settings.loan_billing if settings is not None else LoanBilling.BORROWER_PAYS
        for r in decided.returned:
            loan = by_id[r.loan_id]
            loan.returned_at, loan.return_reason, loan.return_message = now, r.reason, r.message
            loan.figures = {**loan.figures, "return": dict(r.figures)}
            loan.settlement = _settle(loan, billing)
            loan.save(update_fields=["returned_at", "return_reason", "return_message", "figures", "settlement"])
            log.info("rebalancer %s: returned %s (%s: %s)", vdc.name, loan, r.reason, r.message)
        for new in decided.opened:
            if not any(_quantity(v) > 0 for v in (new.amount.gpu, new.amount.cpu, new.amount.memory_gib)):
                continue  # less than the smallest amount a loan records: not worth one
            loan = CapacityLoan.objects.create(
                vdc=vdc,
                lender_id=new.lender_id,
                borrower_id=new.borrower_id,
                gpu=_quantity(new.amount.gpu),
                cpu=_quantity(new.amount.cpu),
                memory_gib=_quantity(new.amount.memory_gib),
                reason=new.reason,
                figures=dict(new.figures),
                started_at=now,
                expires_at=now + settings.max_loan_duration,
                accounted_until=now,
            )
            log.info("rebalancer %s: opened %s: %s", vdc.name, loan, new.reason)
            result.opened += 1
        if due:
            settings.last_run_at = now
            settings.save(update_fields=["last_run_at"])
        result.considered, result.returned = due, len(decided.returned)
        if result.opened or result.returned:
            transaction.on_commit(triggers.request_cycle)
    return result


def return_loan(loan_id: int, user=None, now: datetime | None = None) -> CapacityLoan:
    """An admin returns a loan now (settled like any return); a loan already returned is left as it is."""
    now = now or timezone.now()
    with transaction.atomic():
        loan = CapacityLoan.objects.select_for_update().get(pk=loan_id)
        if loan.returned_at is not None:
            return loan
        settings = RebalancerSettings.objects.filter(vdc_id=loan.vdc_id).first()
        billing = settings.loan_billing if settings is not None else LoanBilling.BORROWER_PAYS
        loan.returned_at, loan.return_reason = now, LoanReturnReason.ADMIN
        loan.return_message = f"returned by {user}" if user is not None else "returned by an admin"
        loan.settlement = _settle(loan, billing)
        loan.save(update_fields=["returned_at", "return_reason", "return_message", "settlement"])
        transaction.on_commit(triggers.request_cycle)
    return loan


def run_all(now: datetime | None = None) -> list[RebalanceResult]:
    """A run for every VDC whose rebalancer is on or that still has loans out; one VDC's failure is logged."""
    ids = set(RebalancerSettings.objects.filter(enabled=True, vdc__enabled=True).values_list("vdc_id", flat=True))
    ids |= set(CapacityLoan.objects.active().values_list("vdc_id", flat=True))
    results = []
    for pk in sorted(ids):
        try:
            results.append(rebalance_vdc(pk, now))
        except Exception:  # one VDC's failure must not stop the others
            log.exception("rebalancer run of VDC %s failed", pk)
            results.append(RebalanceResult(vdc=str(pk), skipped=True))
    return results


def _quantity(value: float) -> Decimal:
    """An amount as stored (2 decimals), rounded down so a loan never exceeds the rules' bounds."""
    return Decimal(str(max(0.0, value))).quantize(Decimal("0.01"), rounding=ROUND_DOWN)


def _accrue(active: list[CapacityLoan], in_use: dict[int, em.Resources], now: datetime) -> None:
    """Add the GPU-equivalent hours each loan was used since the last run (sampled at the run)."""
    for loan in active:
        since = loan.accounted_until or loan.started_at
        hours = Decimal(str(max(0.0, (now - since).total_seconds()) / 3600))
        used = Decimal(f"{in_use.get(loan.pk, em.Resources()).gpu:.6f}")
        loan.used_gpu_hours = (loan.used_gpu_hours + used * hours).quantize(Decimal("0.000001"))
        loan.accounted_until = now
        loan.save(update_fields=["used_gpu_hours", "accounted_until"])


def _settle(loan: CapacityLoan, billing: str) -> str:
    """Apply the loan billing mode at the return; what was done, in words (kept on the loan)."""
    hours = loan.used_gpu_hours
    if billing == LoanBilling.BORROWER_PAYS:
        return f"borrower paid its metered usage ({hours.normalize():f} GPU-eq hours on the loan)"
    rule = price_book(loan.vdc_id).rule(ResourceType.GPU_EQUIVALENT)
    if rule is None or hours <= 0:
        why = "no GPU-equivalent price in this VDC" if rule is None else "the loan was not used"
        return f"nothing settled: {why}"
    value = (hours * rule.price_per_hour).quantize(Decimal("0.01"))
    if value <= 0:
        return "nothing settled: worth less than 0.01"
    target = loan.lender if billing == LoanBilling.LENDER_CREDITED else loan.borrower
    what = "lent to" if billing == LoanBilling.LENDER_CREDITED else "borrowed from"
    other = loan.borrower if billing == LoanBilling.LENDER_CREDITED else loan.lender
    add_credit(
        account_of(target),
        value,
        description=f"Capacity loan #{loan.pk}: {hours.normalize():f} GPU-eq hours {what} {other}",
    )
    verb = "lender credited" if billing == LoanBilling.LENDER_CREDITED else "borrower refunded"
    return f"{verb} {value} {rule.currency} for {hours.normalize():f} GPU-eq hours"
