"""Queue administration: open / close and policy changes (applied by the next scheduling cycle)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from apps.queues.models import TaskQueue
from apps.vdc.choices import QueuePolicy


def set_queue_open(queue: TaskQueue, is_open: bool) -> TaskQueue:
    """Open or close a queue; a closed queue keeps its tasks but takes no new submissions."""
    queue.is_open = is_open
    queue.save(update_fields=["is_open", "updated_at"])
    return queue


def set_queue_policy(queue: TaskQueue, policy: str) -> TaskQueue:
    """Change how the queue orders its tasks (fifo / drf / backfill)."""
    if policy not in QueuePolicy.values:
        raise ValidationError({"policy": f"Expected one of {', '.join(QueuePolicy.values)}, got {policy!r}."})
    queue.policy = policy
    queue.save(update_fields=["policy", "updated_at"])
    return queue
