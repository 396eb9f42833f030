"""Read-only serializers of prices, accounts, usage records, transactions and invoices."""

from __future__ import annotations

from rest_framework import serializers

from apps.billing.models import Account, Invoice, InvoiceLine, PriceRule, ProjectAlert, Transaction, UsageRecord


class PriceRuleSerializer(serializers.ModelSerializer):
    gpu_model_name = serializers.CharField(source="gpu_model.name", read_only=True, allow_null=True, default=None)
    vdc_name = serializers.CharField(source="vdc.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = PriceRule
        fields = [
            "id",
            "resource_type",
            "gpu_model",
            "gpu_model_name",
            "vdc",
            "vdc_name",
            "price_per_hour",
            "currency",
            "min_billing_minutes",
            "discount_tiers",
            "active",
            "created_at",
        ]
        read_only_fields = fields


class AccountSerializer(serializers.ModelSerializer):
    project_name = serializers.CharField(source="project.name", read_only=True)
    available = serializers.DecimalField(max_digits=16, decimal_places=4, read_only=True)
    exhausted = serializers.BooleanField(read_only=True)

    class Meta:
        model = Account
        fields = [
            "id",
            "project",
            "project_name",
            "balance",
            "credit_limit",
            "available",
            "currency",
            "enforce_budget",
            "exhausted",
            "updated_at",
        ]
        read_only_fields = fields


class UsageRecordSerializer(serializers.ModelSerializer):
    task_name = serializers.CharField(source="task.name", read_only=True)
    project_name = serializers.CharField(source="project.name", read_only=True)
    gpu_model_name = serializers.CharField(source="gpu_model.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = UsageRecord
        fields = [
            "id",
            "task",
            "task_name",
            "project",
            "project_name",
            "vdc",
            "resource_type",
            "gpu_model",
            "gpu_model_name",
            "quantity",
            "period_start",
            "period_end",
            "unit_price",
            "cost",
            "invoice",
            "created_at",
        ]
        read_only_fields = fields


class TransactionSerializer(serializers.ModelSerializer):
    project = serializers.IntegerField(source="account.project_id", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = Transaction
        fields = [
            "id",
            "account",
            "project",
            "kind",
            "amount",
            "balance_after",
            "description",
            "usage_record",
            "created_by",
            "created_at",
        ]
        read_only_fields = fields


class InvoiceLineSerializer(serializers.ModelSerializer):
    gpu_model_name = serializers.CharField(source="gpu_model.name", read_only=True, allow_null=True, default=None)

    class Meta:
        model = InvoiceLine
        fields = ["id", "resource_type", "gpu_model", "gpu_model_name", "quantity", "amount"]
        read_only_fields = fields


class InvoiceSerializer(serializers.ModelSerializer):
    project = serializers.IntegerField(source="account.project_id", read_only=True)
    project_name = serializers.CharField(source="account.project.name", read_only=True)
    lines = InvoiceLineSerializer(many=True, read_only=True)

    class Meta:
        model = Invoice
        fields = [
            "id",
            "account",
            "project",
            "project_name",
            "period_start",
            "period_end",
            "status",
            "total",
            "currency",
            "created_at",
            "issued_at",
            "lines",
        ]
        read_only_fields = fields


class ProjectAlertSerializer(serializers.ModelSerializer):
    project_name = serializers.CharField(source="project.name", read_only=True)
    title = serializers.CharField(source="get_rule_display", read_only=True)

    class Meta:
        model = ProjectAlert
        fields = [
            "id",
            "project",
            "project_name",
            "vdc",
            "task",
            "rule",
            "title",
            "severity",
            "message",
            "action",
            "since",
            "fired_at",
            "resolved_at",
        ]
        read_only_fields = fields
