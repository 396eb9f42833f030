"""Enumerations of the billing app."""

from django.db import models


class ResourceType(models.TextChoices):
    CPU = "cpu", "CPU core-hour"
    MEMORY = "memory", "Memory GiB-hour"
    GPU = "gpu", "GPU hour (per model)"
    GPU_EQUIVALENT = "gpu_eq", "GPU-equivalent hour"


class TransactionKind(models.TextChoices):
    CREDIT = "credit", "Credit"
    CHARGE = "charge", "Charge"
    ADJUSTMENT = "adjustment", "Adjustment"


class InvoiceStatus(models.TextChoices):
    DRAFT = "draft", "Draft"
    ISSUED = "issued", "Issued"
    CLOSED = "closed", "Closed"


# What one unit of a usage record's quantity is, per resource.
UNITS = {
    ResourceType.CPU: "core-hours",
    ResourceType.MEMORY: "GiB-hours",
    ResourceType.GPU: "card-hours",
    ResourceType.GPU_EQUIVALENT: "GPU-equivalent hours",
}


class AlertRule(models.TextChoices):
    """What a project alert is about (apps.billing.project_alerts evaluates each)."""

    QUOTA_HIGH = "quota_high", "Quota nearly used"
    QUOTA_FULL = "quota_full", "Quota used up"
    BUDGET_LOW = "budget_low", "Budget low"
    IDLE_GPUS = "idle_gpus", "GPUs idle on a running task"
    REPEATED_FAILURES = "repeated_failures", "Tasks keep failing"
    SERVICE_UNHEALTHY = "service_unhealthy", "Inference service short of replicas"
    IDLE_STOP = "idle_stop", "Idle dev environment about to be stopped"


class AlertSeverity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"
