"""Enumerations of the queues app."""

from django.db import models

from apps.vdc.choices import QueuePolicy  # noqa: F401 - one enumeration, re-exported where queues use it


class PriorityClass(models.TextChoices):
    HIGH = "high", "High"
    MEDIUM = "medium", "Medium"
    LOW = "low", "Low"


class BackendFlavour(models.TextChoices):
    DEFAULT = "default", "Default"
    VOLCANO = "volcano", "Volcano"


PRIORITY_RANK = {PriorityClass.HIGH: 0, PriorityClass.MEDIUM: 1, PriorityClass.LOW: 2}

CLASS_RULES = {
    PriorityClass.HIGH: (
        "Scheduled first and never preempted; may preempt low tasks and medium tasks past their window."
    ),
    PriorityClass.MEDIUM: (
        "Needs an expected duration: guaranteed for that window from each start. After it, a high task may "
        "preempt it; it is then requeued with its window halved, down to the queue's floor."
    ),
    PriorityClass.LOW: (
        "Runs only on idle capacity; suspended when high or medium work needs the room, and restarted when no "
        "such work is waiting for it."
    ),
}
