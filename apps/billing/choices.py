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
