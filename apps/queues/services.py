"""Queue administration: open / close and policy changes (applied by the next scheduling cycle)."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import transaction

from apps.queues.choices import PriorityClass
from apps.queues.models import TaskQueue
from apps.vdc.choices import QueuePolicy

# The queues a new VDC starts with: one per priority class, named after it (editable afterwards).
CLASS_QUEUES = (
    (PriorityClass.HIGH, "Never preempted: for interactive and urgent work."),
    (PriorityClass.MEDIUM, "Guaranteed for a window set by the expected duration, then preemptible by high work."),
    (PriorityClass.LOW, "Runs on idle capacity; suspended when high or medium work needs it."),
)


def create_class_queues(vdc) -> list[TaskQueue]:
    """Give a VDC its three class queues (high, medium, low), ordered by the VDC's default policy.

    A name the VDC already uses is left alone, so calling it again adds only what is missing.
    """
    with transaction.atomic():
        taken = set(TaskQueue.objects.filter(vdc=vdc).values_list("name", flat=True))
        return [
            TaskQueue.objects.create(
                vdc=vdc, name=str(klass), priority_class=klass, policy=vdc.default_queue_policy, description=text
            )
            for klass, text in CLASS_QUEUES
            if str(klass) not in taken
        ]


def set_queue_open(queue: TaskQueue, is_open: bool) -> TaskQueue:
    """Open or close a queue; a closed queue keeps its tasks but takes no new submissions."""
    queue.is_open = is_open
    queue.save(update_fields=["is_open", "updated_at"])
    return queue


def set_queue_policy(queue: TaskQueue, policy: str) -> TaskQueue:
    """Change how the queue orders its tasks (one of QueuePolicy: fifo, drf, backfill, nonstrict_fifo, ...)."""
    if policy not in QueuePolicy.values:
        raise ValidationError({"policy": f"Expected one of {', '.join(QueuePolicy.values)}, got {policy!r}."})
    queue.policy = policy
    queue.save(update_fields=["policy", "updated_at"])
    return queue
