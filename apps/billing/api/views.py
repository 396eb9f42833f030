"""Read-only billing endpoints: prices for everyone; accounts, usage, ledger and invoices of your projects."""

from __future__ import annotations

from django.db.models import Q
from rest_framework import viewsets

from apps.billing.api.serializers import (
    AccountSerializer,
    InvoiceSerializer,
    PriceRuleSerializer,
    ProjectAlertSerializer,
    TransactionSerializer,
    UsageRecordSerializer,
)
from apps.billing.filtersets import (
    AccountFilterSet,
    InvoiceFilterSet,
    PriceRuleFilterSet,
    ProjectAlertFilterSet,
    TransactionFilterSet,
    UsageRecordFilterSet,
)
from apps.billing.models import Account, Invoice, PriceRule, ProjectAlert, Transaction, UsageRecord
from apps.vdc.policy import scope_to_projects, sees_all, visible_vdcs


class PriceRuleViewSet(viewsets.ReadOnlyModelViewSet):
    """Prices: the platform-wide ones and those of the VDCs you may see."""

    serializer_class = PriceRuleSerializer
    filterset_class = PriceRuleFilterSet
    search_fields = ["gpu_model__name"]
    ordering_fields = ["resource_type", "price_per_hour", "created_at"]

    def get_queryset(self):
        prices = PriceRule.objects.select_related("gpu_model", "vdc")
        user = self.request.user
        if sees_all(user, PriceRule):
            return prices
        return prices.filter(Q(vdc__isnull=True) | Q(vdc__in=visible_vdcs(user).values("pk")))


class AccountViewSet(viewsets.ReadOnlyModelViewSet):
    """Accounts (balance, credit) of your projects."""

    serializer_class = AccountSerializer
    filterset_class = AccountFilterSet
    search_fields = ["project__name"]
    ordering_fields = ["project__name", "balance", "updated_at"]

    def get_queryset(self):
        return scope_to_projects(Account.objects.select_related("project").order_by("project__name"), self.request.user)


class UsageRecordViewSet(viewsets.ReadOnlyModelViewSet):
    """Metered usage of your projects' tasks."""

    serializer_class = UsageRecordSerializer
    filterset_class = UsageRecordFilterSet
    search_fields = ["task__name", "project__name", "gpu_model__name"]
    ordering_fields = ["period_start", "period_end", "cost", "quantity", "resource_type"]

    def get_queryset(self):
        records = UsageRecord.objects.select_related("task", "project", "gpu_model")
        return scope_to_projects(records, self.request.user)


class TransactionViewSet(viewsets.ReadOnlyModelViewSet):
    """The ledger of your projects' accounts."""

    serializer_class = TransactionSerializer
    filterset_class = TransactionFilterSet
    search_fields = ["description"]
    ordering_fields = ["created_at", "amount", "kind"]

    def get_queryset(self):
        entries = Transaction.objects.select_related("account", "created_by")
        return scope_to_projects(entries, self.request.user, "account__project")


class InvoiceViewSet(viewsets.ReadOnlyModelViewSet):
    """Invoices of your projects' accounts, with a line per resource."""

    serializer_class = InvoiceSerializer
    filterset_class = InvoiceFilterSet
    ordering_fields = ["period_start", "period_end", "total", "status", "created_at"]

    def get_queryset(self):
        invoices = Invoice.objects.select_related("account__project").prefetch_related("lines__gpu_model")
        return scope_to_projects(invoices, self.request.user, "account__project")


class ProjectAlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts of your projects (quota, budget, idle cards, failures, services): firing ones have ``fired_at`` and no
    ``resolved_at``; conditions still within their hold time are not listed."""

    serializer_class = ProjectAlertSerializer
    filterset_class = ProjectAlertFilterSet
    search_fields = ["project__name", "message"]
    ordering_fields = ["fired_at", "severity", "rule"]

    def get_queryset(self):
        alerts = (
            ProjectAlert.objects.filter(fired_at__isnull=False).select_related("project").order_by("-fired_at", "-id")
        )
        return scope_to_projects(alerts, self.request.user)
