"""Prices, metered usage, project accounts, their ledger, and invoices. Money is Decimal."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce

from apps.billing.choices import AlertRule, AlertSeverity, InvoiceStatus, ResourceType, TransactionKind
from apps.clusters.models import GPUModel
from apps.tasks.models import Task
from apps.vdc.models import VDC, Project

ZERO = Decimal("0")


class ImmutablePeriodError(ValidationError):
    """A change to usage, lines or totals of an issued or closed invoice."""


def _money(**kwargs) -> models.DecimalField:
    return models.DecimalField(max_digits=14, decimal_places=4, **kwargs)


class PriceRule(models.Model):
    """The hourly price of one resource (optionally per VDC), with a minimum billing period and discount tiers.

    ``discount_tiers`` is a list like ``[{"from_hours": 100, "percent": 10}, {"from_hours": 1000, "percent": 25}]``:
    hours accumulated by the project on this resource past ``from_hours`` are discounted by ``percent``.
    """

    resource_type = models.CharField(max_length=16, choices=ResourceType.choices)
    gpu_model = models.ForeignKey(GPUModel, null=True, blank=True, on_delete=models.CASCADE, related_name="prices")
    vdc = models.ForeignKey(VDC, null=True, blank=True, on_delete=models.CASCADE, related_name="prices")
    price_per_hour = _money(validators=[MinValueValidator(ZERO)])
    currency = models.CharField(max_length=3, default="CNY")
    min_billing_minutes = models.PositiveIntegerField(default=1, help_text="Shorter usage is billed as this long")
    discount_tiers = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["resource_type", "gpu_model__name"]
        constraints = [
            models.CheckConstraint(condition=Q(price_per_hour__gte=0), name="price_non_negative"),
            models.CheckConstraint(
                condition=Q(resource_type="gpu", gpu_model__isnull=False)
                | (~Q(resource_type="gpu") & Q(gpu_model__isnull=True)),
                name="price_gpu_model_iff_gpu",
            ),
            # Coalesce: "no model" / "every VDC" must collide like values do, on SQLite and PostgreSQL alike.
            models.UniqueConstraint(
                F("resource_type"),
                Coalesce(F("gpu_model"), Value(0)),
                Coalesce(F("vdc"), Value(0)),
                condition=Q(active=True),
                name="one_active_price_per_resource",
            ),
        ]

    def __str__(self) -> str:
        what = self.gpu_model.name if self.gpu_model_id else self.get_resource_type_display()
        return f"{what}: {self.price_per_hour} {self.currency}/h" + (f" in {self.vdc}" if self.vdc_id else "")

    def clean(self) -> None:
        if self.resource_type == ResourceType.GPU and not self.gpu_model_id:
            raise ValidationError({"gpu_model": "Expected the GPU model this price is for."})
        if self.resource_type != ResourceType.GPU and self.gpu_model_id:
            raise ValidationError({"gpu_model": "Only GPU prices name a GPU model."})
        expected = 'Expected tiers like [{"from_hours": 100, "percent": 10}] with increasing hours and 0-100 percent.'
        tiers = self.discount_tiers
        if not isinstance(tiers, list):
            raise ValidationError({"discount_tiers": expected})
        last = -1
        for tier in tiers:
            if not isinstance(tier, dict) or set(tier) != {"from_hours", "percent"}:
                raise ValidationError({"discount_tiers": expected})
            hours, percent = tier["from_hours"], tier["percent"]
            if not isinstance(hours, int | float) or not isinstance(percent, int | float):
                raise ValidationError({"discount_tiers": expected})
            if hours <= last or not 0 <= percent <= 100:
                raise ValidationError({"discount_tiers": expected})
            last = hours


class Account(models.Model):
    """A project's money: balance and credit limit. With ``enforce_budget`` an exhausted account starts no new task."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="account")
    balance = _money(default=ZERO)
    credit_limit = _money(default=ZERO, validators=[MinValueValidator(ZERO)])
    currency = models.CharField(max_length=3, default="CNY")
    enforce_budget = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(credit_limit__gte=0), name="account_credit_non_negative")]

    def __str__(self) -> str:
        return f"{self.project} account"

    @property
    def available(self) -> Decimal:
        return self.balance + self.credit_limit

    @property
    def exhausted(self) -> bool:
        return self.enforce_budget and self.available <= 0


class Invoice(models.Model):
    """The bill of one account for one period, with a line per resource. Issued and closed invoices are immutable."""

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="invoices")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    status = models.CharField(max_length=8, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT)
    total = _money(default=ZERO)
    currency = models.CharField(max_length=3, default="CNY")
    created_at = models.DateTimeField(auto_now_add=True)
    issued_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-period_start"]
        constraints = [
            models.CheckConstraint(condition=Q(period_end__gt=models.F("period_start")), name="invoice_period_ordered"),
            models.UniqueConstraint(fields=["account", "period_start", "period_end"], name="unique_invoice_period"),
        ]

    def __str__(self) -> str:
        return f"{self.account.project} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d}"

    def save(self, *args, **kwargs) -> None:
        # A closed period never changes; an issued invoice may only move on to closed.
        if self.pk:
            stored = Invoice.objects.filter(pk=self.pk).values_list("status", "total", "period_start", "period_end")
            stored = stored.first()
            if stored is not None and stored[0] != InvoiceStatus.DRAFT:
                status, total, start, end = stored
                unchanged = (total, start, end) == (self.total, self.period_start, self.period_end)
                closing = status == InvoiceStatus.ISSUED and self.status == InvoiceStatus.CLOSED
                if not (unchanged and (self.status == status or closing)):
                    raise ImmutablePeriodError(f"Invoice {self.pk} is {status}: its period is closed to changes.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self.is_final:
            raise ImmutablePeriodError(f"Invoice {self.pk} is {self.status} and cannot be deleted.")
        return super().delete(*args, **kwargs)

    @property
    def is_final(self) -> bool:
        return self.status != InvoiceStatus.DRAFT


class InvoiceLine(models.Model):
    """One resource's quantity and amount on an invoice."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    resource_type = models.CharField(max_length=16, choices=ResourceType.choices)
    gpu_model = models.ForeignKey(GPUModel, null=True, blank=True, on_delete=models.PROTECT)
    quantity = models.DecimalField(max_digits=16, decimal_places=6)
    amount = _money()

    class Meta:
        ordering = ["resource_type", "gpu_model__name"]

    def __str__(self) -> str:
        return f"{self.invoice}: {self.resource_type} {self.quantity}"

    def save(self, *args, **kwargs) -> None:
        if Invoice.objects.filter(pk=self.invoice_id).exclude(status=InvoiceStatus.DRAFT).exists():
            raise ImmutablePeriodError("Lines of an issued or closed invoice cannot change.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if Invoice.objects.filter(pk=self.invoice_id).exclude(status=InvoiceStatus.DRAFT).exists():
            raise ImmutablePeriodError("Lines of an issued or closed invoice cannot be deleted.")
        return super().delete(*args, **kwargs)


class UsageRecordQuerySet(models.QuerySet):
    """Bulk updates and deletes refuse rows of an issued or closed invoice, like single saves do."""

    def _locked_rows(self) -> models.QuerySet:
        return self.filter(invoice__isnull=False).exclude(invoice__status=InvoiceStatus.DRAFT)

    def update(self, **kwargs) -> int:
        if self._locked_rows().exists():
            raise ImmutablePeriodError("Usage on an issued or closed invoice cannot change.")
        return super().update(**kwargs)

    def delete(self):
        if self._locked_rows().exists():
            raise ImmutablePeriodError("Usage on an issued or closed invoice cannot be deleted.")
        return super().delete()


class UsageRecord(models.Model):
    """Metered use of one resource by one task over one interval, with its cost.

    Unique per (task, resource, model, interval start) so that a retried or overlapping metering run
    can never charge the same interval twice.
    """

    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="usage_records")
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="usage_records")
    vdc = models.ForeignKey(VDC, on_delete=models.PROTECT, related_name="usage_records")
    resource_type = models.CharField(max_length=16, choices=ResourceType.choices)
    gpu_model = models.ForeignKey(GPUModel, null=True, blank=True, on_delete=models.PROTECT)
    quantity = models.DecimalField(max_digits=16, decimal_places=6, help_text="Units x hours")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    unit_price = _money(default=ZERO)
    cost = _money(default=ZERO)
    invoice = models.ForeignKey(Invoice, null=True, blank=True, on_delete=models.PROTECT, related_name="records")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = UsageRecordQuerySet.as_manager()

    class Meta:
        ordering = ["-period_start"]
        indexes = [models.Index(fields=["project", "period_start"])]
        constraints = [
            models.UniqueConstraint(
                F("task"),
                F("resource_type"),
                Coalesce(F("gpu_model"), Value(0)),
                F("period_start"),
                name="usage_once_per_interval",
            ),
            models.CheckConstraint(condition=Q(period_end__gt=models.F("period_start")), name="usage_period_ordered"),
            models.CheckConstraint(condition=Q(quantity__gte=0) & Q(cost__gte=0), name="usage_non_negative"),
        ]

    def __str__(self) -> str:
        return f"task {self.task_id} {self.resource_type} {self.quantity}"

    def save(self, *args, **kwargs) -> None:
        if self._on_final_invoice():
            raise ImmutablePeriodError(f"Usage record {self.pk} is on an issued or closed invoice and cannot change.")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        if self._on_final_invoice():
            raise ImmutablePeriodError(f"Usage record {self.pk} is on an issued or closed invoice.")
        return super().delete(*args, **kwargs)

    def _on_final_invoice(self) -> bool:
        if not self.pk:
            return False
        stored = UsageRecord.objects.filter(pk=self.pk).values_list("invoice__status", flat=True).first()
        return stored not in (None, InvoiceStatus.DRAFT)


class UsageMeter(models.Model):
    """How far a task's usage is metered: the run (attempt) being metered and the end of its last interval.

    Accrual continues from ``metered_until``, so a crash never loses an interval and a retry never repeats
    one. ``placement`` keeps what the run held, for the final accrual after a preemption cleared the task's.
    """

    task = models.OneToOneField(Task, on_delete=models.CASCADE, related_name="meter")
    attempt = models.PositiveIntegerField(default=0)
    run_started_at = models.DateTimeField(null=True, blank=True)
    metered_until = models.DateTimeField(null=True, blank=True)
    placement = models.JSONField(default=list, blank=True)
    closed = models.BooleanField(default=True, help_text="The run's final accrual is done")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"task {self.task_id} run {self.attempt} metered until {self.metered_until}"


class Transaction(models.Model):
    """One entry of an account's ledger: a credit added by an admin, or a charge for usage."""

    account = models.ForeignKey(Account, on_delete=models.PROTECT, related_name="transactions")
    kind = models.CharField(max_length=16, choices=TransactionKind.choices)
    amount = _money(help_text="Positive for credits, negative for charges")
    balance_after = _money()
    description = models.CharField(max_length=255, blank=True)
    usage_record = models.OneToOneField(
        UsageRecord, null=True, blank=True, on_delete=models.PROTECT, related_name="transaction"
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.account}: {self.kind} {self.amount}"


class VDCAlerts(VDC):
    """No rows of its own: the admin's "Alerts" entry, listing per VDC the conditions apps.billing.alerts evaluates."""

    class Meta:
        proxy = True
        verbose_name = "alerts of a VDC"
        verbose_name_plural = "alerts"
        default_permissions = ("view",)


class InvoiceRun(models.Model):
    """An admin's "Issue invoices" over many accounts, run by a worker: its progress and how it ended.

    Each account's invoice is its own transaction (idempotent per period), so a run that fails part-way has
    issued exactly the invoices it counts and names the accounts it could not invoice.
    """

    class Status(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        DONE = "done", "Done"
        FAILED = "failed", "Done with failures"

    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    accounts = models.JSONField(default=list, help_text="Ids of the accounts to invoice")
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.QUEUED)
    done = models.PositiveIntegerField(default=0, help_text="Accounts handled so far")
    issued = models.PositiveIntegerField(default=0, help_text="Invoices issued (or found issued) so far")
    message = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"Invoice run #{self.pk} {self.period_start:%Y-%m-%d}..{self.period_end:%Y-%m-%d}"


class AlertSettings(models.Model):
    """Per VDC, the thresholds of the alerts its projects' members get (defaults when a VDC has no row)."""

    vdc = models.OneToOneField(VDC, on_delete=models.CASCADE, related_name="alert_settings")
    quota_warn_percent = models.PositiveSmallIntegerField(
        default=80,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Warn when a project's GPU use reaches this share of its quota limit (100: only when full)",
    )
    budget_low_amount = _money(
        default=Decimal("100"),
        validators=[MinValueValidator(ZERO)],
        help_text="Warn when a project's available money (balance + credit) falls below this",
    )
    idle_gpu_percent = models.PositiveSmallIntegerField(
        default=5,
        validators=[MaxValueValidator(100)],
        help_text="A running task's cards count as idle below this utilisation (node agent reports)",
    )
    idle_minutes = models.PositiveIntegerField(
        default=60, validators=[MinValueValidator(1)], help_text="Alert when a task's cards stay idle this long"
    )
    failures_per_hour = models.PositiveSmallIntegerField(
        default=3,
        validators=[MinValueValidator(1)],
        help_text="Alert when a project has this many failed runs in an hour",
    )
    unhealthy_minutes = models.PositiveIntegerField(
        default=10,
        validators=[MinValueValidator(1)],
        help_text="Alert when an inference service runs fewer replicas than asked for this long",
    )

    class Meta:
        verbose_name = "alert thresholds of a VDC"
        verbose_name_plural = "alert thresholds"
        constraints = [
            models.CheckConstraint(
                condition=Q(quota_warn_percent__gte=1, quota_warn_percent__lte=100), name="alert_quota_percent_range"
            ),
            models.CheckConstraint(condition=Q(idle_gpu_percent__lte=100), name="alert_idle_percent_range"),
        ]

    def __str__(self) -> str:
        return f"alert thresholds of {self.vdc}"


class ProjectAlert(models.Model):
    """A condition a project's members are told about: firing from ``fired_at`` until ``resolved_at``.

    A condition that must hold for a while (idle cards, a service short of replicas) is recorded from
    ``since`` and fires once it has held long enough; one that clears before then is dropped unseen.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="alerts")
    vdc = models.ForeignKey(VDC, null=True, blank=True, on_delete=models.CASCADE, related_name="project_alerts")
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.CASCADE, related_name="alerts")
    rule = models.CharField(max_length=24, choices=AlertRule.choices)
    severity = models.CharField(max_length=8, choices=AlertSeverity.choices, default=AlertSeverity.WARNING)
    key = models.CharField(max_length=64, help_text="What it is about: one open alert per project and key")
    message = models.TextField()
    action = models.TextField(blank=True, help_text="What the members can do about it")
    since = models.DateTimeField(help_text="When the condition was first seen")
    fired_at = models.DateTimeField(null=True, blank=True, db_index=True)
    resolved_at = models.DateTimeField(null=True, blank=True, db_index=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-fired_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "key"], condition=Q(resolved_at__isnull=True), name="one_open_alert_per_project_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.project}: {self.get_rule_display()}"

    @property
    def firing(self) -> bool:
        return self.fired_at is not None and self.resolved_at is None
