"""FilterSets of prices, accounts, usage, transactions and invoices (API, pages and tests share them)."""

from __future__ import annotations

import django_filters

from apps.billing.models import (
    Account,
    AlertSettings,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    PriceRule,
    ProjectAlert,
    Transaction,
    UsageMeter,
    UsageRecord,
    VDCAlerts,
)
from apps.core.filtersets import NUMBER, TIME, BaseFilterSet, IdFilter
from apps.vdc.filtersets import VDCFilterSet


class PriceRuleFilterSet(BaseFilterSet):
    search_fields = ("gpu_model__name",)

    class Meta(BaseFilterSet.Meta):
        model = PriceRule
        fields = {
            "id": ["exact", "in"],
            "resource_type": ["exact", "in"],
            "gpu_model": ["exact", "in"],
            "vdc": ["exact", "in", "isnull"],
            "price_per_hour": NUMBER,
            "currency": ["exact"],
            "min_billing_minutes": NUMBER,
            "active": ["exact"],
            "created_at": TIME,
        }


class AccountFilterSet(BaseFilterSet):
    search_fields = ("project__name",)

    class Meta(BaseFilterSet.Meta):
        model = Account
        fields = {
            "id": ["exact", "in"],
            "project": ["exact", "in"],
            "balance": NUMBER,
            "credit_limit": NUMBER,
            "currency": ["exact"],
            "enforce_budget": ["exact"],
            "updated_at": TIME,
        }


class UsageRecordFilterSet(BaseFilterSet):
    search_fields = ("task__name", "project__name", "gpu_model__name")

    class Meta(BaseFilterSet.Meta):
        model = UsageRecord
        fields = {
            "id": ["exact", "in"],
            "task": ["exact", "in"],
            "project": ["exact", "in"],
            "vdc": ["exact", "in"],
            "resource_type": ["exact", "in"],
            "gpu_model": ["exact", "in"],
            "quantity": NUMBER,
            "period_start": TIME,
            "period_end": TIME,
            "unit_price": NUMBER,
            "cost": NUMBER,
            "invoice": ["exact", "isnull"],
            "created_at": TIME,
        }


class TransactionFilterSet(BaseFilterSet):
    search_fields = ("description",)

    project = IdFilter(field_name="account__project")

    class Meta(BaseFilterSet.Meta):
        model = Transaction
        fields = {
            "id": ["exact", "in"],
            "account": ["exact", "in"],
            "kind": ["exact", "in"],
            "amount": NUMBER,
            "balance_after": NUMBER,
            "description": ["exact", "icontains"],
            "usage_record": ["exact"],
            "created_by": ["exact"],
            "created_at": TIME,
        }


class InvoiceFilterSet(BaseFilterSet):
    project = IdFilter(field_name="account__project")

    class Meta(BaseFilterSet.Meta):
        model = Invoice
        fields = {
            "id": ["exact", "in"],
            "account": ["exact", "in"],
            "period_start": TIME,
            "period_end": TIME,
            "status": ["exact", "in"],
            "total": NUMBER,
            "currency": ["exact"],
            "created_at": TIME,
            "issued_at": TIME,
        }


class InvoiceRunFilterSet(BaseFilterSet):
    """Invoice runs (admin-only today: Billing > Invoice runs), by state and period."""

    class Meta(BaseFilterSet.Meta):
        model = InvoiceRun
        fields = {
            "id": ["exact", "in"],
            "period_start": TIME,
            "period_end": TIME,
            "status": ["exact", "in"],
            "done": NUMBER,
            "issued": NUMBER,
            "created_by": ["exact"],
            "created_at": TIME,
            "finished_at": TIME,
        }


class InvoiceLineFilterSet(BaseFilterSet):
    class Meta(BaseFilterSet.Meta):
        model = InvoiceLine
        fields = {
            "id": ["exact", "in"],
            "invoice": ["exact", "in"],
            "resource_type": ["exact", "in"],
            "gpu_model": ["exact", "in"],
            "quantity": NUMBER,
            "amount": NUMBER,
        }


class UsageMeterFilterSet(BaseFilterSet):
    placement = django_filters.CharFilter(field_name="placement", lookup_expr="icontains", label="Placement mentions")

    class Meta(BaseFilterSet.Meta):
        model = UsageMeter
        fields = {
            "id": ["exact", "in"],
            "task": ["exact", "in"],
            "attempt": NUMBER,
            "run_started_at": TIME,
            "metered_until": TIME,
            "closed": ["exact"],
            "updated_at": TIME,
        }


class VDCAlertsFilterSet(VDCFilterSet):
    """The VDC filters, for the alerts proxy of VDC."""

    description = django_filters.CharFilter(lookup_expr="icontains")

    class Meta(VDCFilterSet.Meta):
        model = VDCAlerts


class AlertSettingsFilterSet(BaseFilterSet):
    search_fields = ("vdc__name",)

    class Meta(BaseFilterSet.Meta):
        model = AlertSettings
        fields = {
            "id": ["exact", "in"],
            "vdc": ["exact", "in"],
            "quota_warn_percent": NUMBER,
            "budget_low_amount": NUMBER,
            "idle_gpu_percent": NUMBER,
            "idle_minutes": NUMBER,
            "failures_per_hour": NUMBER,
            "unhealthy_minutes": NUMBER,
        }


class ProjectAlertFilterSet(BaseFilterSet):
    search_fields = ("project__name", "message")

    class Meta(BaseFilterSet.Meta):
        model = ProjectAlert
        fields = {
            "id": ["exact", "in"],
            "project": ["exact", "in"],
            "vdc": ["exact", "in", "isnull"],
            "task": ["exact", "in", "isnull"],
            "rule": ["exact", "in"],
            "severity": ["exact", "in"],
            "key": ["exact"],
            "since": TIME,
            "fired_at": [*TIME, "isnull"],
            "resolved_at": [*TIME, "isnull"],
            "updated_at": TIME,
        }
