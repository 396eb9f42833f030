"""Admin for prices, accounts, their ledger, metered usage and invoices.

The ledger and the meter are written by the billing jobs only: transactions and usage records are
read-only here, as are issued and closed invoices.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import OuterRef
from django.forms.models import BaseInlineFormSet

from apps.billing.admin_actions import add_credit, generate_invoices
from apps.billing.admin_forms import PriceRuleAdminForm
from apps.billing.choices import UNITS, InvoiceStatus
from apps.billing.models import (
    Account,
    AlertSettings,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    PriceRule,
    ProjectAlert,
    Transaction,
    UsageRecord,
)
from apps.billing.templatetags.money import format_money, format_quantity
from apps.core.admin_helpers import ReadOnlyAdminMixin, count_of

LEDGER_ROWS = 50


@admin.register(PriceRule)
class PriceRuleAdmin(admin.ModelAdmin):
    form = PriceRuleAdminForm
    list_display = (
        "__str__",
        "resource_type",
        "gpu_model",
        "vdc",
        "price_per_hour",
        "currency",
        "min_billing_minutes",
        "tiers",
        "active",
    )
    list_filter = ("resource_type", "active", "vdc", "gpu_model__vendor", "currency")
    search_fields = ("gpu_model__name", "vdc__name")
    list_select_related = ("gpu_model", "vdc")
    autocomplete_fields = ("gpu_model", "vdc")
    readonly_fields = ("created_at",)

    @admin.display(description="Discount tiers")
    def tiers(self, obj) -> str:
        return ", ".join(f"{t['from_hours']}h: {t['percent']}%" for t in obj.discount_tiers) or "-"


class LatestFormSet(BaseInlineFormSet):
    """Only the newest rows of a long ledger; the full list is one filter away in its own changelist."""

    def get_queryset(self):
        return super().get_queryset()[:LEDGER_ROWS]


class LedgerAmounts:
    """A ledger row's amount and balance as every page reads money (cents, grouped, the account's currency)."""

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, obj) -> str:
        return format_money(obj.amount, obj.account.currency)

    @admin.display(description="balance after", ordering="balance_after")
    def balance_after_display(self, obj) -> str:
        return format_money(obj.balance_after, obj.account.currency)


class InvoiceLineAmounts:
    @admin.display(description="quantity", ordering="quantity")
    def quantity_display(self, obj) -> str:
        return format_quantity(obj.quantity, UNITS[obj.resource_type])

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, obj) -> str:
        return format_money(obj.amount, obj.invoice.currency)


class TransactionInline(LedgerAmounts, ReadOnlyAdminMixin, admin.TabularInline):
    model = Transaction
    formset = LatestFormSet
    fields = ("created_at", "kind", "amount_display", "balance_after_display", "description", "created_by")
    readonly_fields = fields
    verbose_name_plural = f"latest {LEDGER_ROWS} transactions"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("created_by", "account")


class InvoiceInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Invoice
    fields = ("period_start", "period_end", "status", "total", "currency", "issued_at")
    readonly_fields = fields
    show_change_link = True


@admin.register(Account)
class AccountAdmin(admin.ModelAdmin):
    list_display = (
        "project",
        "balance_shown",
        "credit_limit_shown",
        "available",
        "enforce_budget",
        "is_exhausted",
    )
    list_filter = ("enforce_budget", "currency")
    search_fields = ("project__name",)
    list_select_related = ("project",)
    autocomplete_fields = ("project",)
    readonly_fields = ("balance", "available", "updated_at")
    fields = ("project", "balance", "credit_limit", "available", "currency", "enforce_budget", "updated_at")
    inlines = (InvoiceInline, TransactionInline)
    actions = (add_credit, generate_invoices)

    @admin.display(description="Available")
    def available(self, obj):
        return format_money(obj.available, obj.currency) if obj.pk else "-"

    @admin.display(description="Balance", ordering="balance")
    def balance_shown(self, obj) -> str:
        return format_money(obj.balance, obj.currency)

    @admin.display(description="Credit limit", ordering="credit_limit")
    def credit_limit_shown(self, obj) -> str:
        return format_money(obj.credit_limit, obj.currency)

    @admin.display(description="Exhausted", boolean=True)
    def is_exhausted(self, obj) -> bool:
        return obj.exhausted


@admin.register(Transaction)
class TransactionAdmin(LedgerAmounts, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "created_at",
        "account",
        "kind",
        "amount_display",
        "balance_after_display",
        "description",
        "created_by",
    )
    list_filter = ("kind", "account__project")
    search_fields = ("account__project__name", "description")
    list_select_related = ("account__project", "created_by")


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = (
        "period_start",
        "period_end",
        "task_id",
        "project",
        "vdc",
        "resource_type",
        "gpu_model",
        "quantity",
        "unit_price",
        "cost",
        "invoice_id",
    )
    list_filter = ("resource_type", "vdc", "project", "gpu_model", ("invoice", admin.EmptyFieldListFilter))
    search_fields = ("task__name", "project__name")
    list_select_related = ("project", "vdc", "gpu_model")

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            results |= queryset.filter(task_id=int(term))
        return results, may_have_duplicates


class InvoiceLineInline(InvoiceLineAmounts, ReadOnlyAdminMixin, admin.TabularInline):
    model = InvoiceLine
    fields = ("resource_type", "gpu_model", "quantity_display", "amount_display")
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("gpu_model")


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):
    list_display = (
        "__str__",
        "account",
        "period_start",
        "period_end",
        "status",
        "total_shown",
        "line_count",
        "issued_at",
    )
    list_filter = ("status", "currency", "account__project")
    search_fields = ("account__project__name",)
    list_select_related = ("account__project",)
    autocomplete_fields = ("account",)
    readonly_fields = ("total", "created_at", "issued_at")
    inlines = (InvoiceLineInline,)

    @admin.display(description="Total", ordering="total")
    def total_shown(self, obj) -> str:
        return format_money(obj.total, obj.currency)

    def get_queryset(self, request):
        lines = InvoiceLine.objects.filter(invoice=OuterRef("pk"))
        return super().get_queryset(request).annotate(n_lines=count_of(lines))

    @admin.display(description="Lines", ordering="n_lines")
    def line_count(self, obj) -> int:
        return obj.n_lines

    def has_change_permission(self, request, obj=None) -> bool:
        # Issued and closed invoices are immutable.
        return super().has_change_permission(request, obj) and (obj is None or obj.status == InvoiceStatus.DRAFT)

    def has_delete_permission(self, request, obj=None) -> bool:
        return super().has_delete_permission(request, obj) and (obj is None or obj.status == InvoiceStatus.DRAFT)


@admin.register(InvoiceLine)
class InvoiceLineAdmin(InvoiceLineAmounts, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("invoice", "resource_type", "gpu_model", "quantity_display", "amount_display")
    list_filter = ("resource_type", "gpu_model", "invoice__status")
    search_fields = ("invoice__account__project__name", "gpu_model__name")
    list_select_related = ("invoice__account__project", "gpu_model")


@admin.register(InvoiceRun)
class InvoiceRunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Invoice runs an admin started ("Issue invoices" on accounts): how far each got and how it ended."""

    list_display = ("__str__", "status", "progress", "issued", "created_by", "created_at", "finished_at")
    list_filter = ("status",)
    fields = (
        "period_start",
        "period_end",
        "status",
        "progress",
        "issued",
        "message",
        "created_by",
        "created_at",
        "finished_at",
    )
    readonly_fields = fields

    @admin.display(description="Accounts done")
    def progress(self, obj) -> str:
        return f"{obj.done} / {len(obj.accounts)}"


@admin.register(AlertSettings)
class AlertSettingsAdmin(admin.ModelAdmin):
    """Per VDC, the thresholds of the alerts project members get (apps.billing.project_alerts)."""

    list_display = (
        "vdc",
        "quota_warn_percent",
        "budget_low_amount",
        "idle_gpu_percent",
        "idle_minutes",
        "failures_per_hour",
        "unhealthy_minutes",
    )
    list_select_related = ("vdc",)
    search_fields = ("vdc__name",)


@admin.register(ProjectAlert)
class ProjectAlertAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """What project members were told, and since when (the job evaluates; nobody edits)."""

    list_display = ("project", "rule", "severity", "message", "since", "fired_at", "resolved_at")
    list_filter = ("rule", "severity", ("resolved_at", admin.EmptyFieldListFilter))
    list_select_related = ("project",)
    search_fields = ("project__name", "message")
    date_hierarchy = "since"
