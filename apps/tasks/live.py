"""Live updates: the group names of the ``ws/live/`` socket and what is pushed to them.

Pages subscribe to a task, a project, a queue or their own user group (``apps.tasks.consumers``).
``push_task_changed`` runs in a worker job for the tasks ``task_changed`` (sent on commit with task
ids) noted since the last push (``apps.control.triggers.request_live_push``): it loads the tasks once
and sends each one's state to the task's, project's and owner's groups, and the queues' counts (never
task details, since every project in the queue's VDC may subscribe) to the queue groups.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db.models import Count, Q, Sum
from django.utils import timezone
from redis.exceptions import RedisError

from apps.core.templatetags.moments import format_moment
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.models import Task

log = logging.getLogger(__name__)

# The consumer's handler for every message below is ``live_message``.
MESSAGE_TYPE = "live.message"


def user_group(user_id: int) -> str:
    return f"live.user.{user_id}"


def project_group(project_id: int) -> str:
    return f"live.project.{project_id}"


def task_group(task_id: int) -> str:
    return f"live.task.{task_id}"


def queue_group(queue_id: int) -> str:
    return f"live.queue.{queue_id}"


def span(seconds: float) -> str:
    """A length of time as people say it: "12 min", "2 h 5 min", "3 days"."""
    minutes = max(0, int(seconds // 60))
    if minutes < 60:
        return f"{minutes} min"
    if minutes < 48 * 60:
        hours, minutes = divmod(minutes, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{minutes // (24 * 60)} days"


def duration_words(value: timedelta) -> str:
    """A duration people set, in words: "30 s" under a minute, else as ``span`` says it."""
    seconds = value.total_seconds()
    return f"{int(seconds)} s" if seconds < 60 else span(seconds)


def from_now(value, now=None) -> str:
    """How far ahead a time is, as people say it: "in 3 min", "in 2 h 5 min", "in 3 days"; an estimate that
    passed more than a minute ago says so ("passed 12 min ago") instead of promising "any moment now"."""
    seconds = (value - (now or timezone.now())).total_seconds()
    if seconds < -60:
        return f"passed {span(-seconds)} ago"
    return "any moment now" if seconds < 60 else f"in {span(seconds)}"


def status_summary(task: Task) -> str:
    """One line on where the task stands, e.g. "queued, position 3, estimated start 2025-01-01 10:00 UTC (in
    12 min)"."""
    if task.status in WAITING:
        parts = [task.get_status_display().lower()]
        if task.queue_position:
            parts.append(f"position {task.queue_position}")
            start = format_moment(task.estimated_start)
            when = f"estimated start {start} ({from_now(task.estimated_start)})" if start else None
            parts.append(when or "estimated start unknown")
        else:
            parts.append("waiting for the next scheduling cycle")
        if task.pending_message:
            parts.append(f"waiting because {task.pending_message}")
        return ", ".join(parts)
    if task.status in ACTIVE:
        where = task.cluster.name if task.cluster_id and task.cluster else ""
        nodes = ", ".join(n for n in task.node_names if n)
        place = f" on {where}" + (f" ({nodes})" if nodes else "") if where else ""
        return f"{task.get_status_display().lower()}{place}"
    return task.get_status_display().lower()


def task_payload(task: Task) -> dict:
    """What pages need to redraw a task's status cells (JSON-safe)."""
    return {
        "type": "task",
        "id": task.pk,
        "project": task.project_id,
        "status": task.status,
        "status_display": task.get_status_display(),
        "summary": status_summary(task),
        "queue_position": task.queue_position,
        "estimated_start": task.estimated_start.isoformat() if task.estimated_start else None,
        "estimated_start_display": format_moment(task.estimated_start),
        "pending_reason": task.pending_reason,
        "pending_message": task.pending_message,
        "status_message": task.status_message,
        "cluster": task.cluster.name if task.cluster_id and task.cluster else "",
        "nodes": [n for n in task.node_names if n],
        "is_final": task.is_final,
    }


def queue_counts(queue_ids) -> dict[int, dict]:
    """Waiting / running task counts and GPU-equivalents in use per queue (one query)."""
    rows = (
        Task.objects.filter(queue_id__in=queue_ids, status__in=(*WAITING, *ACTIVE))
        .values("queue_id")
        .annotate(
            waiting=Count("id", filter=Q(status__in=WAITING)),
            running=Count("id", filter=Q(status__in=ACTIVE)),
            gpu_in_use=Sum("allocated_gpu", filter=Q(status__in=ACTIVE)),
        )
        .order_by()
    )
    out = {qid: {"waiting": 0, "running": 0, "gpu_in_use": "0.00"} for qid in queue_ids}
    for row in rows:
        out[row["queue_id"]] = {
            "waiting": row["waiting"],
            "running": row["running"],
            "gpu_in_use": f"{row['gpu_in_use'] or 0:.2f}",
        }
    return out


def send_all(messages: list[tuple[str, dict]]) -> None:
    """Send every (group, payload) in one trip to the event loop: a cycle that moves 200 queued tasks sends
    600 messages, and one ``async_to_sync`` hop each would cost seconds.

    Each send waits at most ``HCS_LIVE_PUSH_TIMEOUT_S``: the channel layer's Redis reads may block for long
    (its consumers wait on blocking reads), and a hung Redis must not hold up the request or cycle that pushes.
    """
    timeout = settings.HCS_LIVE_PUSH_TIMEOUT_S

    async def send() -> None:
        layer = get_channel_layer()
        for group, payload in messages:
            await asyncio.wait_for(layer.group_send(group, {"type": MESSAGE_TYPE, "payload": payload}), timeout)

    if messages:
        async_to_sync(send)()


def push_task_changed(sender=None, task_ids: list[int] | None = None, **kwargs) -> None:
    """Push each task's state to its groups, and fresh counts to its queues.

    Two queries whatever the number of tasks. A Redis outage costs live pages an update (they reload
    state on reconnect), never the write that sent the signal.
    """
    tasks = list(Task.objects.select_related("cluster").filter(pk__in=task_ids or ()))
    if not tasks:
        return
    counts = queue_counts({t.queue_id for t in tasks})
    messages = []
    for task in tasks:
        payload = task_payload(task)
        for group in {task_group(task.pk), project_group(task.project_id), user_group(task.owner_id)}:
            messages.append((group, payload))
    for queue_id, queue_count in counts.items():
        messages.append((queue_group(queue_id), {"type": "queue", "id": queue_id, **queue_count}))
    try:
        send_all(messages)
    except (RedisError, OSError) as exc:  # OSError covers the timeouts
        log.warning("live updates of %d tasks not sent: %s", len(tasks), exc)
