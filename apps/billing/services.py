"""Billing services: exactly-once metering, prices, credits and invoices. Every write goes through here.

Metering accrues contiguous intervals per task run: ``[metered_until, now)`` while a task runs, and a
final interval up to the run's end (finish, stop, failure or preemption), topped up to the price's
minimum billing period. One database transaction per task accrual writes the usage records, their
ledger entries, the account balance and the meter together; the meter row is locked for the
duration, and the unique constraint on (task, resource, model, period start) turns any concurrent
duplicate into an error that rolls the duplicate back.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.db.models import F, Q, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from apps.billing.choices import UNITS, InvoiceStatus, ResourceType, TransactionKind
from apps.billing.models import (
    Account,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    PriceRule,
    Transaction,
    UsageMeter,
    UsageRecord,
)
from apps.billing.pricing import ZERO, format_totals, money, quantity, tiered_cost
from apps.clusters import services as cluster_services
from apps.clusters.gpuspec import candidate_models, equivalents
from apps.clusters.models import Device, GPUModel
from apps.tasks.choices import ACTIVE, FINAL, EventKind, TaskStatus
from apps.tasks.ledger import REFERENCE_RATE
from apps.tasks.models import Task, TaskEvent
from apps.vdc.models import VDC, Membership, Project

log = logging.getLogger(__name__)

# Tasks that left the active states this recently are checked for a run the meter never saw.
CATCH_UP = timedelta(days=7)


# --- Prices ------------------------------------------------------------------------------------


class PriceBook:
    """The active prices that apply in one VDC: its own rules, else the global ones."""

    def __init__(self, rules: list[PriceRule], vdc_id: int | None):
        self.rules: dict[tuple[str, int | None], PriceRule] = {}
        # Global rules first, so a VDC's own rule replaces the global one for the same resource.
        self.model_ids: dict[str, int] = {}  # GPU models with a price of their own, by name
        for rule in sorted(rules, key=lambda r: r.vdc_id is not None):
            if rule.vdc_id in (None, vdc_id):
                self.rules[(rule.resource_type, rule.gpu_model_id)] = rule
                if rule.gpu_model_id is not None:
                    self.model_ids[rule.gpu_model.name] = rule.gpu_model_id

    def __bool__(self) -> bool:
        return bool(self.rules)

    @property
    def currency(self) -> str | None:
        """The currency its prices are in; None when it has no price or (misconfigured) several currencies."""
        currencies = {rule.currency for rule in self.rules.values()}
        return currencies.pop() if len(currencies) == 1 else None

    @property
    def minimum_minutes(self) -> int:
        """The longest minimum billing period of its rules: a run shorter than it is billed as this long."""
        return max((rule.min_billing_minutes for rule in self.rules.values()), default=0)

    def rule(self, resource_type: str, gpu_model_id: int | None = None) -> PriceRule | None:
        """The rule that prices a usage record: a GPU model's own price wins over the equivalents price.

        GPU usage is metered twice, per model and in equivalents; only one of the two is charged.
        """
        if resource_type == ResourceType.GPU:
            return self.rules.get((ResourceType.GPU, gpu_model_id))
        if resource_type == ResourceType.GPU_EQUIVALENT:
            if (ResourceType.GPU, gpu_model_id) in self.rules:
                return None
            return self.rules.get((ResourceType.GPU_EQUIVALENT, None))
        return self.rules.get((resource_type, None))

    def card_price(self, model: str, exchange_rate: Decimal) -> Decimal | None:
        """List price of one card-hour of a model: its own price, else its equivalents times the equivalents
        price; None when neither applies."""
        per_card = self.rule(ResourceType.GPU, self.model_ids.get(model))
        if per_card is not None:
            return per_card.price_per_hour
        per_eq = self.rule(ResourceType.GPU_EQUIVALENT, self.model_ids.get(model))
        return None if per_eq is None else per_eq.price_per_hour * exchange_rate


def price_book(vdc: VDC | int | None) -> PriceBook:
    """The prices in force in a VDC (one query)."""
    vdc_id = vdc.pk if isinstance(vdc, VDC) else vdc
    rules = PriceRule.objects.filter(active=True).filter(Q(vdc__isnull=True) | Q(vdc_id=vdc_id))
    return PriceBook(list(rules.select_related("gpu_model")), vdc_id)


def card_prices(book: PriceBook, gpu_catalog) -> dict[str, Decimal]:
    """List price of one whole card-hour per GPU model of the catalog, by the same rule a request is priced."""
    out = {}
    for name in gpu_catalog.names:
        price = book.card_price(name, gpu_catalog.entry(name).exchange_rate)
        if price is not None:
            out[name] = money(price)
    return out


def hourly_price_of_request(
    vdc: VDC, cpu, memory_gib, gpu_spec: str, instances: int, *, book: PriceBook | None = None, gpu_catalog=None
) -> Decimal | None:
    """List price per hour of a request (before discounts), or None when no price applies to any part of it.

    Resources without a price cost nothing. A request several GPU models can satisfy ("any model",
    ``1(A100|H100)``, vendor-neutral) is priced on its cheapest candidate. Raises ValidationError for a
    GPU spec that does not parse. Pages pricing many requests pass the VDC's ``book`` and the ``gpu_catalog``.
    """
    book = price_book(vdc) if book is None else book
    if not book:
        return None
    gpu_catalog = cluster_services.catalog() if gpu_catalog is None else gpu_catalog
    request = cluster_services.validate_gpu_spec(gpu_spec, gpu_catalog)
    total, priced = ZERO, False
    for resource_type, amount in ((ResourceType.CPU, cpu), (ResourceType.MEMORY, memory_gib)):
        rule = book.rule(resource_type)
        if rule is not None:
            total += rule.price_per_hour * Decimal(str(amount))
            priced = True
    candidates = candidate_models(request, gpu_catalog)
    if candidates:
        options = []
        for name, _count in candidates:
            rate = gpu_catalog.entry(name).exchange_rate
            cards = equivalents(request, gpu_catalog, name) / rate
            per_card = book.card_price(name, rate)
            options.append(None if per_card is None else per_card * cards)
        if any(option is not None for option in options):
            priced = True
            total += min(option or ZERO for option in options)
    if not priced:
        return None
    return money(total * instances)


def billed_task_ids(task_ids) -> set[int]:
    """Those of the tasks with metered usage on record (kept for billing: they cannot be deleted), one query."""
    return set(UsageRecord.objects.filter(task_id__in=list(task_ids)).values_list("task_id", flat=True).distinct())


def task_costs(task_ids) -> dict[int, Decimal]:
    """Cost accrued so far by each task (zero for tasks without usage), in one query."""
    ids = list(task_ids)
    costs = dict.fromkeys(ids, ZERO)
    rows = UsageRecord.objects.filter(task_id__in=ids).values("task_id").annotate(total=Sum("cost")).order_by()
    for row in rows:
        costs[row["task_id"]] = money(row["total"] or ZERO)
    return costs


# --- Metering ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """What a run holds of one resource: cores, GiB, cards of one model, or their equivalents."""

    resource_type: str
    gpu_model_id: int | None
    units: Decimal


@dataclass(frozen=True)
class Run:
    """One attempt of a task on a cluster, as far as it needs metering."""

    attempt: int
    start: datetime
    end: datetime
    final: bool
    placement: list
    charged: bool = True  # False: the run never reached running (stopped, failed or preempted before it ran)
    minimum: bool = True  # False: the platform or an administrator ended it: no minimum billing period


def holdings(task: Task, placement: list, models: dict[str, GPUModel]) -> list[Holding]:
    """The resources a placement holds: cpu and memory per instance, card shares per GPU model."""
    instances = Decimal(len(placement) or task.replicas or task.instances)
    out = [
        Holding(ResourceType.CPU, None, task.cpu * instances),
        Holding(ResourceType.MEMORY, None, task.memory_gib * instances),
    ]
    cards: dict[str, Decimal] = defaultdict(Decimal)
    for instance in placement:
        for device in instance.get("devices", ()):
            cards[instance.get("gpu_model") or ""] += Decimal(device.get("milli", 1000)) / 1000
    for name, count in sorted(cards.items()):
        model = models.get(name)
        # A card whose model is gone or unrated counts as the reference card (docs/rules.md, "Exchange rates").
        if model is None:
            log.warning("task %s holds cards of unknown model %r: metered as reference cards", task.pk, name)
            out.append(Holding(ResourceType.GPU_EQUIVALENT, None, count * REFERENCE_RATE))
            continue
        rate = model.exchange_rate if model.exchange_rate is not None else REFERENCE_RATE
        out.append(Holding(ResourceType.GPU, model.pk, count))
        out.append(Holding(ResourceType.GPU_EQUIVALENT, model.pk, count * rate))
    return [h for h in out if h.units > 0]


def _models_for(placements: list[list]) -> dict[str, GPUModel]:
    """GPU models by name for the placements; instances stored without a model name are filled in from devices."""
    missing = [
        d["id"] for p in placements for i in p for d in i.get("devices", ()) if not i.get("gpu_model") and "id" in d
    ]
    if missing:
        by_device = dict(Device.objects.filter(pk__in=missing).values_list("pk", "gpu_model__name"))
        for placement in placements:
            for instance in placement:
                if not instance.get("gpu_model") and instance.get("devices"):
                    instance["gpu_model"] = by_device.get(instance["devices"][0].get("id"))
    names = {i.get("gpu_model") for p in placements for i in p if i.get("gpu_model")}
    return {m.name: m for m in GPUModel.objects.filter(name__in=names)} if names else {}


def _runs(task: Task, meter: UsageMeter, now: datetime) -> list[Run]:
    """The runs with usage not yet metered, oldest first; ended runs come from the task's timeline."""
    first = meter.attempt if not meter.closed else meter.attempt + 1
    if task.attempt == 0 or first > task.attempt:
        return []
    active = task.status in ACTIVE
    finished_in_place = task.status in FINAL and bool(task.placement) and task.finished_at is not None
    starts: dict[int, TaskEvent] = {}
    ends: list[TaskEvent] = []
    if first < task.attempt or not active:
        events = task.events.filter(
            Q(kind=EventKind.SCHEDULED) | (Q(from_status__in=ACTIVE) & ~Q(to_status__in=ACTIVE) & ~Q(to_status=""))
        ).order_by("created_at", "id")
        for event in events:
            if event.kind == EventKind.SCHEDULED and isinstance(event.data.get("attempt"), int):
                starts[event.data["attempt"]] = event
            else:
                ends.append(event)
    runs = []
    for attempt in range(max(first, 1), task.attempt + 1):
        current = attempt == task.attempt
        if current and task.started_at:
            start = task.started_at
        elif attempt == meter.attempt and meter.run_started_at:
            start = meter.run_started_at
        elif attempt in starts:
            start = starts[attempt].created_at
        else:
            log.warning("task %s run %s has no start on record: not metered", task.pk, attempt)
            continue
        if current and active:
            # Until it runs, nothing is due (a run that never does is free); an unknown task ran and holds its cards
            # (docs/rules.md, "Billing").
            if task.status in (TaskStatus.RUNNING, TaskStatus.UNKNOWN):
                runs.append(Run(attempt, start, now, False, list(task.placement or [])))
            continue
        if current and finished_in_place:
            ended = next((e for e in reversed(ends) if e.created_at >= start), None)
            runs.append(Run(attempt, start, task.finished_at, True, list(task.placement), *_how_it_ended(task, ended)))
            continue
        next_start = starts[attempt + 1].created_at if attempt + 1 in starts else None
        ended = next(
            (e for e in ends if e.created_at >= start and (next_start is None or e.created_at <= next_start)), None
        )
        end = ended.created_at if ended is not None else next_start or task.finished_at or task.updated_at
        if attempt == meter.attempt and meter.placement:
            placement = meter.placement
        elif current and task.placement:
            placement = task.placement
        else:
            placement = starts[attempt].data.get("placement", []) if attempt in starts else []
        runs.append(Run(attempt, start, end, True, list(placement), *_how_it_ended(task, ended)))
    return runs


# The platform ended these runs (preemption, suspension, a requeue after a node or backend loss, scale to zero).
_PLATFORM_ENDS = (EventKind.PREEMPTED, EventKind.SUSPENDED, EventKind.REQUEUED, EventKind.SCALED_TO_ZERO)


def _how_it_ended(task: Task, event: TaskEvent | None) -> tuple[bool, bool]:
    """(charged, minimum) of a run from the event that ended it: a run that never reached running is not
    charged; one the platform or an administrator ended owes no minimum billing period (docs/rules.md#billing).
    Without an event: charged, minimum."""
    if event is None:
        return True, True
    ran = event.from_status in (TaskStatus.RUNNING, TaskStatus.UNKNOWN)
    if event.kind in _PLATFORM_ENDS:
        return ran, False
    if event.kind == EventKind.STOPPED:
        return ran, _stopped_by_its_users(task, event.actor_id)
    return ran, True


def _stopped_by_its_users(task: Task, actor_id: int | None) -> bool:
    """Whether the one who stopped the task is its owner or a member of its project: a stop without one (idle
    autostop) is the platform's, and a staff user's who is neither is an administrator's."""
    if actor_id is None:
        return False
    return actor_id == task.owner_id or Membership.objects.filter(project_id=task.project_id, user_id=actor_id).exists()


def _accumulated(project_id: int) -> dict[tuple[str, int | None], Decimal]:
    """Unit-hours the project used so far per priced resource (GPU per model; equivalents across models)."""
    totals: dict[tuple[str, int | None], Decimal] = defaultdict(Decimal)
    rows = UsageRecord.objects.filter(project_id=project_id).values("resource_type", "gpu_model").order_by()
    for row in rows.annotate(total=Sum("quantity")):
        model = row["gpu_model"] if row["resource_type"] == ResourceType.GPU else None
        totals[(row["resource_type"], model)] += row["total"] or ZERO
    return totals


def _ledger_entry(account: Account, record: UsageRecord, balance: Decimal) -> Transaction:
    """The charge of one usage record on the account's ledger."""
    what = record.get_resource_type_display()
    return Transaction.objects.create(
        account=account,
        kind=TransactionKind.CHARGE,
        amount=-record.cost,
        balance_after=balance,
        usage_record=record,
        description=f"Task #{record.task_id} {what} {record.period_start:%Y-%m-%d %H:%M:%S}"[:255],
    )


def ended_runs_to_accrue(task_ids) -> list[int]:
    """Of these tasks, those no longer running whose last run is not metered to its end (one query)."""
    behind = Q(meter__isnull=True) | Q(meter__closed=False) | Q(meter__attempt__lt=F("attempt"))
    tasks = Task.objects.filter(pk__in=task_ids, attempt__gt=0).exclude(status__in=ACTIVE).filter(behind)
    return list(tasks.values_list("pk", flat=True))


def accrue_task(task_id: int, now: datetime | None = None) -> int:
    """Meter one task up to now (or to the end of its ended runs) and charge its project; returns records written.

    Safe to call any number of times, from any number of workers at once: each interval is written
    exactly once. Returns 0 when there was nothing to meter or another worker metered it first.
    """
    now = now or timezone.now()
    task = Task.objects.filter(pk=task_id).only("project_id", "attempt").first()
    if task is None or task.attempt == 0:
        return 0
    UsageMeter.objects.get_or_create(task_id=task_id)
    Account.objects.get_or_create(project_id=task.project_id)
    try:
        with transaction.atomic():
            return _accrue_locked(task_id, now)
    except IntegrityError as exc:
        # A concurrent accrual wrote the same interval first; ours was rolled back whole.
        log.info("task %s: interval already metered by another worker (%s)", task_id, exc)
        return 0


def _accrue_locked(task_id: int, now: datetime) -> int:
    meter = UsageMeter.objects.select_for_update().get(task_id=task_id)
    task = Task.objects.select_related("project").get(pk=task_id)
    runs = _runs(task, meter, now)
    if not runs:
        return 0
    account = Account.objects.select_for_update().get(project_id=task.project_id)
    book = price_book(task.vdc_id)
    models = _models_for([run.placement for run in runs])
    accumulated = _accumulated(task.project_id) if book else {}
    balance = account.balance
    written = 0
    for run in runs:
        if run.attempt != meter.attempt:
            meter.attempt, meter.run_started_at, meter.metered_until = run.attempt, run.start, run.start
        start = max(meter.metered_until or run.start, run.start)
        end = max(run.end, start)
        for holding in holdings(task, run.placement, models) if run.charged else ():
            rule = book.rule(holding.resource_type, holding.gpu_model_id)
            period_end = end
            if run.final and run.minimum and rule is not None:
                # Shorter runs are billed as long as the minimum billing period, unless the platform or an
                # administrator ended them.
                period_end = max(end, run.start + timedelta(minutes=rule.min_billing_minutes))
            if period_end <= start:
                continue
            record = UsageRecord(
                task=task,
                project_id=task.project_id,
                vdc_id=task.vdc_id,
                resource_type=holding.resource_type,
                gpu_model_id=holding.gpu_model_id,
                period_start=start,
                period_end=period_end,
                quantity=quantity(holding.units, period_end - start),
            )
            if rule is not None:
                per_model = holding.resource_type == ResourceType.GPU
                key = (holding.resource_type, holding.gpu_model_id if per_model else None)
                record.unit_price = rule.price_per_hour
                record.cost = tiered_cost(rule.price_per_hour, record.quantity, accumulated[key], rule.discount_tiers)
                accumulated[key] += record.quantity
            record.save(force_insert=True)
            written += 1
            if record.cost > 0:
                balance -= record.cost
                _ledger_entry(account, record, balance)
        meter.metered_until = end
        meter.placement = run.placement
        meter.closed = run.final
    meter.save()
    if balance != account.balance:
        account.balance = balance
        account.save(update_fields=["balance", "updated_at"])
    return written


@dataclass
class MeterResult:
    """What one metering pass did."""

    tasks: int = 0
    records: int = 0
    errors: int = 0


def tasks_to_meter(now: datetime) -> list[int]:
    """Running tasks, runs whose final accrual is pending, and recently ended runs the meter never saw."""
    running = Task.objects.filter(status__in=ACTIVE).values_list("pk", flat=True)
    pending = UsageMeter.objects.filter(closed=False).values_list("task_id", flat=True)
    unseen = (
        Task.objects.exclude(status__in=ACTIVE)
        .filter(attempt__gt=0, updated_at__gte=now - CATCH_UP)
        .filter(Q(meter__isnull=True) | Q(meter__attempt__lt=F("attempt")))
        .values_list("pk", flat=True)
    )
    return sorted({*running, *pending, *unseen})


def meter_usage(now: datetime | None = None) -> MeterResult:
    """One metering pass over every task with usage to accrue; one task's failure never stops the others."""
    now = now or timezone.now()
    result = MeterResult()
    for task_id in tasks_to_meter(now):
        result.tasks += 1
        try:
            result.records += accrue_task(task_id, now)
        except Exception:  # logged; the next pass accrues from the task's watermark
            result.errors += 1
            log.exception("metering task %s failed", task_id)
    return result


# --- Accounts and invoices ---------------------------------------------------------------------


def account_of(project: Project) -> Account:
    """The project's account, opened with a zero balance when it has none."""
    account, _ = Account.objects.get_or_create(project=project)
    return account


def add_credit(account: Account, amount: Decimal, user=None, description: str = "") -> Transaction:
    """Add money to an account (a positive amount) and write it on the ledger."""
    amount = Decimal(amount)
    if amount <= 0:
        raise ValueError(f"Expected a positive amount of credit, got {amount}.")
    with transaction.atomic():
        account = Account.objects.select_for_update().get(pk=account.pk)
        account.balance += amount
        account.save(update_fields=["balance", "updated_at"])
        return Transaction.objects.create(
            account=account,
            kind=TransactionKind.CREDIT,
            amount=money(amount),
            balance_after=account.balance,
            description=(description or "Credit added")[:255],
            created_by=user if user is not None and user.is_authenticated else None,
        )


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) that contains ``moment``: [first day, first day of the next month)."""
    start = moment.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (start + timedelta(days=32)).replace(day=1)
    return start, end


def generate_invoice(account: Account, start: datetime, end: datetime) -> Invoice:
    """Issue the invoice of an account for [start, end): every not yet invoiced record that starts before ``end``.

    Usage of an earlier period that was metered after that period's invoice (a late final accrual) is
    carried into this one, so nothing goes unbilled. Lines sum the records per resource (GPU per model);
    the total is the sum of the lines. Asking again for the same period returns the invoice already issued.
    """
    if end <= start:
        raise ValueError("Expected the period to end after it starts.")
    with transaction.atomic():
        account = Account.objects.select_for_update().get(pk=account.pk)
        existing = Invoice.objects.filter(account=account, period_start=start, period_end=end).first()
        if existing is not None:
            return existing
        records = UsageRecord.objects.filter(project_id=account.project_id, invoice__isnull=True, period_start__lt=end)
        invoice = Invoice.objects.create(account=account, period_start=start, period_end=end, currency=account.currency)
        records.update(invoice=invoice)
        rows = (
            UsageRecord.objects.filter(invoice=invoice)
            .values("resource_type", "gpu_model")
            .annotate(quantity=Sum("quantity"), amount=Sum("cost"))
            .order_by("resource_type", "gpu_model")
        )
        lines = [
            InvoiceLine(
                invoice=invoice,
                resource_type=r["resource_type"],
                gpu_model_id=r["gpu_model"],
                quantity=r["quantity"],
                amount=r["amount"],
            )
            for r in charged_rows(rows, "gpu_model", "amount")
        ]
        InvoiceLine.objects.bulk_create(lines)
        invoice.total = sum((line.amount for line in lines), ZERO)
        invoice.status = InvoiceStatus.ISSUED
        invoice.issued_at = timezone.now()
        invoice.save()
    return invoice


def generate_invoices(start: datetime, end: datetime, accounts=None) -> list[Invoice]:
    """Invoices for [start, end) of the given accounts (default: every account with uninvoiced usage before end)."""
    if accounts is None:
        with_usage = UsageRecord.objects.filter(invoice__isnull=True, period_start__lt=end).values("project_id")
        accounts = Account.objects.filter(project_id__in=with_usage)
    return [generate_invoice(account, start, end) for account in accounts]


def run_invoice_run(run_id: int) -> InvoiceRun:
    """Issue the invoices of an :class:`InvoiceRun`, account by account, recording progress as it goes.

    An account that fails is named in the run's message and the others still get theirs; running it again
    (a retried job) issues only what is missing, as each invoice is idempotent per period.
    """
    run = InvoiceRun.objects.get(pk=run_id)
    InvoiceRun.objects.filter(pk=run_id).update(status=InvoiceRun.Status.RUNNING)
    accounts = {a.pk: a for a in Account.objects.filter(pk__in=run.accounts).select_related("project")}
    failures: list[str] = []
    totals: list[tuple[Decimal, str]] = []
    for done, account_id in enumerate(run.accounts, start=1):
        account = accounts.get(account_id)
        try:
            if account is None:
                raise ValueError("the account no longer exists")
            invoice = generate_invoice(account, run.period_start, run.period_end)
            totals.append((invoice.total, invoice.currency))
        except Exception as exc:  # one account's failure is reported, the others still invoiced
            log.exception("invoice run %s: account %s failed", run_id, account_id)
            failures.append(f"{account.project if account else f'account {account_id}'}: {exc}")
        InvoiceRun.objects.filter(pk=run_id).update(done=done, issued=len(totals))
    run.refresh_from_db()
    run.status = InvoiceRun.Status.FAILED if failures else InvoiceRun.Status.DONE
    run.message = f"{len(totals)} invoice(s) issued, {format_totals(totals)} in all." + (
        f" Not invoiced: {'; '.join(failures)}." if failures else ""
    )
    run.finished_at = timezone.now()
    run.save(update_fields=["status", "message", "finished_at"])
    return run


def close_invoice(invoice: Invoice) -> Invoice:
    """Mark an issued invoice closed (settled); its period stays immutable."""
    if invoice.status != InvoiceStatus.ISSUED:
        raise ValueError(f"Expected an issued invoice, this one is {invoice.status}.")
    invoice.status = InvoiceStatus.CLOSED
    invoice.save(update_fields=["status"])
    return invoice


# --- Reports for pages -------------------------------------------------------------------------


def charged_rows(rows, model_key: str, cost_key: str) -> list[dict]:
    """Rows of usage per resource with each GPU model's use once, in the unit it was charged in.

    GPU use is metered twice, in cards of its model and in GPU-equivalents, and only one of the two is
    priced (:meth:`PriceBook.rule`). A bill that listed both would read "1.08 card-hours" next to
    "1.35 GPU-equivalent hours" for the same hour on the same card, so the uncharged twin is left out: the
    equivalents line when the model's card line carries the cost (or neither does), the card line when the
    equivalents line does. Totals do not change; only free twins go.
    """
    rows = list(rows)
    eq_cost = {r[model_key]: r[cost_key] or ZERO for r in rows if r["resource_type"] == ResourceType.GPU_EQUIVALENT}
    card_cost = {r[model_key]: r[cost_key] or ZERO for r in rows if r["resource_type"] == ResourceType.GPU}
    out = []
    for r in rows:
        model, cost = r[model_key], r[cost_key] or ZERO
        if r["resource_type"] == ResourceType.GPU_EQUIVALENT and model in card_cost and not cost:
            continue
        if r["resource_type"] == ResourceType.GPU and not cost and eq_cost.get(model):
            continue
        out.append(r)
    return out


def usage_by_resource(project: Project, since: datetime | None = None) -> list[dict]:
    """Quantity and cost per resource (GPU per model) of a project, optionally since a moment."""
    records = UsageRecord.objects.filter(project=project)
    if since is not None:
        records = records.filter(period_start__gte=since)
    rows = (
        records.values("resource_type", "gpu_model__name")
        .annotate(quantity=Sum("quantity"), cost=Sum("cost"))
        .order_by("resource_type", "gpu_model__name")
    )
    labels = dict(ResourceType.choices)
    return [
        {
            "resource": labels.get(r["resource_type"], r["resource_type"]),
            "gpu_model": r["gpu_model__name"] or "",
            "quantity": r["quantity"],
            "unit": UNITS[r["resource_type"]],
            "cost": r["cost"],
        }
        for r in charged_rows(rows, "gpu_model__name", "cost")
    ]


def daily_costs(project: Project, days: int, now: datetime | None = None) -> list[tuple[datetime, Decimal]]:
    """Cost per UTC day of a project over the last ``days`` days, oldest first, zero for quiet days."""
    now = now or timezone.now()
    first = (now - timedelta(days=days - 1)).astimezone(UTC).date()
    rows = (
        UsageRecord.objects.filter(project=project, period_start__date__gte=first)
        .annotate(day=TruncDate("period_start", tzinfo=UTC))
        .values("day")
        .annotate(cost=Sum("cost"))
        .order_by("day")
    )
    by_day = {r["day"]: r["cost"] or ZERO for r in rows}
    return [(first + timedelta(days=i), by_day.get(first + timedelta(days=i), ZERO)) for i in range(days)]


# --- Demo --------------------------------------------------------------------------------------

DEMO_PRICES = (
    (ResourceType.CPU, None, Decimal("0.05")),
    (ResourceType.MEMORY, None, Decimal("0.01")),
    (ResourceType.GPU_EQUIVALENT, None, Decimal("10.00")),
    (ResourceType.GPU, "A100-80G", Decimal("12.00")),
)


def seed_demo_prices(credit: Decimal = Decimal("1000")) -> None:
    """Global demo prices (cpu, memory, GPU-equivalents, A100-80G with tiers) and an account with credit per project.

    Idempotent: existing active prices and accounts are left as they are.
    """
    models = {m.name: m for m in GPUModel.objects.filter(name__in=[n for _, n, _ in DEMO_PRICES if n])}
    with transaction.atomic():
        for resource_type, model_name, price in DEMO_PRICES:
            model = models.get(model_name) if model_name else None
            if model_name and model is None:
                continue
            PriceRule.objects.get_or_create(
                resource_type=resource_type,
                gpu_model=model,
                vdc=None,
                active=True,
                defaults={
                    "price_per_hour": price,
                    "min_billing_minutes": 5,
                    "discount_tiers": [{"from_hours": 100, "percent": 10}, {"from_hours": 1000, "percent": 25}]
                    if resource_type == ResourceType.GPU
                    else [],
                },
            )
        for project in Project.objects.filter(account__isnull=True):
            account = Account.objects.create(project=project, credit_limit=Decimal("100"))
            add_credit(account, credit, description="Demo credit")
