"""Who is ahead of me in a queue: its waiting tasks in order, mine and my projects' by name, others anonymised.

The queue page and ``GET /api/v1/queues/{id}/lineup/`` show the same entries. A user never learns the name,
owner, project or id of a task of a project they cannot see (docs/rules.md#security): such an entry keeps only its
place,
its request, how long it has waited ("another project's task, 2(A100), waiting 12 min") and the kind of reason
it waits for ("its project's quota"), never the reason's message, which may name the project's own tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Exists, F, OuterRef, Q, QuerySet, Value, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from apps.core.templatetags.moments import format_moment
from apps.tasks.choices import WAITING
from apps.tasks.live import from_now, span
from apps.tasks.models import Task
from apps.vdc import policy
from apps.vdc.models import Membership

# Each queue shows its first HEAD waiting tasks, and the user's own beyond them (at most MORE_OF_MINE).
HEAD = 20
MORE_OF_MINE = 100
# The kind of reason a task waits for, in words, by the engine's reason code (``Task.pending_reason``): all a user
# learns of why another project's task waits.
REASON_KINDS = {
    "quota_exceeded": "its project's quota",
    "max_concurrent": "its project's quota",
    "kind_limit": "its project's quota",
    "budget_exhausted": "its project's budget",
    "queue_capacity": "the queue's capacity limit",
    "vdc_capacity": "the VDC's capacity cap",
    "insufficient_capacity": "free capacity",
    "holds_reservation": "free capacity",
    "waiting_for_reservation": "a task ahead of it",
    "queue_order": "a task ahead of it",
    "waiting_for_higher_class": "higher-class work",
    "capacity_reserved": "capacity an admin reserved",
    "invalid_request": "a request no cluster can serve",
    "no_matching_gpu_model": "a request no cluster can serve",
    "no_eligible_cluster": "a request no cluster can serve",
}
ORDER = (F("queue_position").asc(nulls_last=True), F("submitted_at").asc(), F("id").asc())


@dataclass(frozen=True)
class Entry:
    """One waiting task as this user may see it; ``task_id``, ``name``, ``project`` and ``owner`` are empty
    for another project's task."""

    queue_id: int
    position: int | None
    status: str
    resources: str
    waiting_seconds: int
    visible: bool
    mine: bool = False
    task_id: int | None = None
    name: str = ""
    project: str = ""
    owner: str = ""
    estimated_start: datetime | None = None
    reason: str = ""
    reason_code: str = ""

    @property
    def reason_kind(self) -> str:
        """The kind of reason the task waits for, in words ("its project's quota"); empty when unknown."""
        return REASON_KINDS.get(self.reason_code, "")

    @property
    def estimated_start_display(self) -> str:
        """The estimated start as pages show it, with its zone and how far ahead it is."""
        if self.estimated_start is None:
            return ""
        return f"{format_moment(self.estimated_start)} ({from_now(self.estimated_start)})"

    @property
    def waiting_for(self) -> str:
        return span(self.waiting_seconds)

    @property
    def label(self) -> str:
        """The line an anonymised entry shows in place of a name."""
        return f"another project's task, {self.resources}, waiting {self.waiting_for}"


@dataclass(frozen=True)
class Gap:
    """Tasks left out between two shown entries (the queue is longer than its shown head)."""

    count: int


def resources(task: Task) -> str:
    """The request in a few words: "2(A100) × 2, 8 CPU, 32 GiB"."""
    gpus = task.gpu_spec or "no GPU"
    times = f" × {task.instances}" if task.instances > 1 else ""
    return f"{gpus}{times}, {task.cpu.normalize():f} CPU, {task.memory_gib.normalize():f} GiB"


def _seen_by(tasks: QuerySet[Task], user) -> QuerySet[Task]:
    """Mark each task ``shown``: True when ``user`` may see it by name (staff who may view tasks see all)."""
    if policy.sees_all(user, Task):
        return tasks.annotate(shown=Value(True))
    return tasks.annotate(shown=Exists(Membership.objects.filter(user=user, project_id=OuterRef("project_id"))))


def _head(queue_ids, user) -> QuerySet[Task]:
    """The first HEAD waiting tasks of each queue, in queue order (one query)."""
    ranked = Task.objects.filter(queue_id__in=queue_ids, status__in=WAITING).annotate(
        rank=Window(RowNumber(), partition_by=F("queue_id"), order_by=ORDER)
    )
    return _seen_by(ranked.filter(rank__lte=HEAD), user).select_related("project", "owner")


def _mine(queue_ids, user) -> QuerySet[Task]:
    """The user's own waiting tasks and their projects' (staff who may view tasks: their own), in queue order."""
    scope = Q(owner=user) if policy.sees_all(user, Task) else Q(project__memberships__user=user)
    waiting = _seen_by(Task.objects.filter(scope, queue_id__in=queue_ids, status__in=WAITING), user)
    return waiting.select_related("project", "owner").order_by(*ORDER)[:MORE_OF_MINE]


def entry(task: Task, user, now: datetime) -> Entry:
    """The task as ``user`` may see it in a queue's line (``task.shown`` from ``_seen_by``)."""
    common = {
        "queue_id": task.queue_id,
        "position": task.queue_position,
        "status": task.status,
        "resources": resources(task),
        "waiting_seconds": max(0, int((now - task.submitted_at).total_seconds())),
        "reason_code": task.pending_reason,
    }
    if not task.shown:
        return Entry(visible=False, **common)
    return Entry(
        visible=True,
        mine=task.owner_id == user.pk,
        task_id=task.pk,
        name=task.name,
        project=task.project.name,
        owner=task.owner.username,
        estimated_start=task.estimated_start,
        reason=task.pending_message,
        **common,
    )


def lineups(queue_ids, user, waiting_counts: dict[int, int] | None = None) -> dict[int, list[Entry | Gap]]:
    """Per queue, its waiting tasks in order as ``user`` may see them, with gaps where tasks are left out.

    Two queries whatever the queues' length. ``waiting_counts`` (per queue) lets the line say how many
    wait after the last entry shown.
    """
    queue_ids = list(queue_ids)
    tasks = {task.pk: task for task in _head(queue_ids, user)}
    for task in _mine(queue_ids, user):
        tasks.setdefault(task.pk, task)
    now = timezone.now()
    per_queue: dict[int, list[Task]] = {qid: [] for qid in queue_ids}
    for task in tasks.values():
        per_queue[task.queue_id].append(task)
    counts = waiting_counts or {}
    out: dict[int, list[Entry | Gap]] = {}
    for qid, queue_tasks in per_queue.items():
        queue_tasks.sort(key=lambda t: (t.queue_position is None, t.queue_position or 0, t.submitted_at, t.pk))
        out[qid] = _with_gaps([entry(t, user, now) for t in queue_tasks], counts.get(qid))
    return out


def _with_gaps(entries: list[Entry], waiting: int | None) -> list[Entry | Gap]:
    """Mark where the line skips tasks: before an entry past the head whose position does not follow the one
    before, and after the last one when the queue holds more than are shown. (Inside the head, positions a
    stop left behind until the next cycle re-ranks the queue are not gaps.)"""
    out: list[Entry | Gap] = []
    previous = 0
    for index, item in enumerate(entries):
        if index >= HEAD and item.position is not None and item.position > previous + 1:
            out.append(Gap(item.position - previous - 1))
        previous = item.position or previous
        out.append(item)
    if waiting is not None and waiting > len(entries):
        rest = waiting - max(previous, len(entries))
        if rest > 0:
            out.append(Gap(rest))
    return out
