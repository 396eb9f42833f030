"""Utilisation history of running tasks, and idle autostop of dev environments (docs/monitoring.md "Utilisation
history", docs/rules.md#idle-autostop).

Every minute a beat job (``apps.control.jobs.record_task_usage``) writes one :class:`TaskUsageSample` per running
task that holds cards, from its node agents' last reports (``Device`` rows), in one insert; a second pass in the
same minute writes nothing (one row per task and minute). It then stops the dev environments whose samples say
they have been idle long enough, and prunes the history. Everything it decides on is in the database, so a
restarted worker or beat carries on where the last pass left off.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Avg, Count, Max
from django.utils import timezone

from apps.clusters.models import Device
from apps.tasks import services
from apps.tasks.choices import TaskKind, TaskStatus
from apps.tasks.models import Task, TaskUsageSample

INTERVAL = timedelta(minutes=1)
# A card's figures count only while its node agent reports (as for the idle-GPU alert).
FRESH_REPORT = timedelta(minutes=3)
# A finished task's history is kept this long after it ended; a long-running task's, for this many days back.
KEEP_AFTER_END = timedelta(days=7)
KEEP_AT_MOST = timedelta(days=30)
# Samples further apart than this break an idle spell (nothing known in between: the agents were quiet).
GAP = 3 * INTERVAL
# The warning comes this long before the stop (half the idle time when that is shorter).
WARN_LEAD = timedelta(minutes=10)
# The API answers at most this much history at a time.
MAX_RANGE = timedelta(days=31)


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def record(now: datetime | None = None) -> int:
    """One sample per running task with cards, for the current minute; returns how many were written."""
    now = now or timezone.now()
    at = minute_of(now)
    running = list(
        Task.objects.filter(status=TaskStatus.RUNNING)
        .exclude(placement=[])
        .values_list("pk", "placement")
        .order_by("pk")
    )
    cards = {
        pk: [d["id"] for p in placement or () for d in p.get("devices", ()) if "id" in d] for pk, placement in running
    }
    ids = {i for found in cards.values() for i in found}
    figures = {
        row["pk"]: row
        for row in Device.objects.filter(pk__in=ids, node__last_report__gte=now - FRESH_REPORT).values(
            "pk", "utilization", "vram_used_gib", "vram_gib", "gpu_model__partition"
        )
    }
    rows = []
    for task_id, device_ids in cards.items():
        seen = [figures[i] for i in dict.fromkeys(device_ids) if i in figures]
        if not seen:
            continue  # no card with a fresh report: nothing known this minute
        # NVML gives no utilisation per MIG instance; memory it does.
        measured = [d["utilization"] for d in seen if d["gpu_model__partition"] != "mig"]
        rows.append(
            TaskUsageSample(
                task_id=task_id,
                at=at,
                gpu_percent=round(sum(measured) / len(measured), 1) if measured else None,
                vram_used_gib=round(float(sum(d["vram_used_gib"] for d in seen)), 2),
                vram_gib=round(float(sum(d["vram_gib"] for d in seen)), 2),
                cards=len(seen),
            )
        )
    TaskUsageSample.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def prune(now: datetime | None = None) -> int:
    """Forget the samples of tasks that ended over ``KEEP_AFTER_END`` ago and any older than ``KEEP_AT_MOST``."""
    now = now or timezone.now()
    ended, _ = TaskUsageSample.objects.filter(task__finished_at__lt=now - KEEP_AFTER_END).delete()
    old, _ = TaskUsageSample.objects.filter(at__lt=now - KEEP_AT_MOST).delete()
    return ended + old


def series(task: Task, since: datetime, until: datetime) -> list[TaskUsageSample]:
    """The task's samples from ``since`` to ``until``, oldest first."""
    return list(TaskUsageSample.objects.filter(task=task, at__gte=since, at__lte=until).order_by("at"))


@dataclass(frozen=True)
class Summary:
    mean_gpu_percent: float | None
    peak_vram_used_gib: float | None
    minutes: int


def summary(task: Task) -> Summary:
    """Mean GPU utilisation and peak memory used over everything recorded of the task (its runs)."""
    row = TaskUsageSample.objects.filter(task=task).aggregate(
        mean=Avg("gpu_percent"), peak=Max("vram_used_gib"), n=Count("pk")
    )
    mean = round(row["mean"], 1) if row["mean"] is not None else None
    return Summary(mean, row["peak"], row["n"] * int(INTERVAL.total_seconds() // 60))


# --- idle autostop -------------------------------------------------------------------------------------------


def settings_of(task: Task) -> tuple[int, int]:
    """The task's idle threshold (%) and idle minutes (0: off): its own, else its project's."""
    percent = task.idle_stop_percent if task.idle_stop_percent is not None else task.project.idle_stop_percent
    minutes = task.idle_stop_minutes if task.idle_stop_minutes is not None else task.project.idle_stop_minutes
    return percent, minutes


@dataclass(frozen=True)
class IdleState:
    """A running dev environment idle now: since when, and when autostop stops it."""

    task: Task
    percent: int
    minutes: int
    idle_since: datetime
    idle_for: timedelta
    stop_at: datetime
    warn: bool  # within the warning lead of the stop
    due: bool  # idle long enough: stop it

    @property
    def idle_minutes(self) -> int:
        return int(self.idle_for.total_seconds() // 60)

    @property
    def reason(self) -> str:
        return f"idle for {self.idle_minutes} min under {self.percent}% GPU"

    @property
    def stop_reason(self) -> str:
        """The rule met (the history read covers the set time, not the whole spell)."""
        return f"idle for {self.minutes} min under {self.percent}% GPU"


def warn_lead(minutes: int) -> timedelta:
    return min(WARN_LEAD, timedelta(minutes=minutes) / 2)


def idle_states(now: datetime | None = None, task_ids=None) -> list[IdleState]:
    """The running dev environments with autostop on that are idle now (two queries)."""
    now = now or timezone.now()
    tasks = Task.objects.filter(kind=TaskKind.DEV_ENV, status=TaskStatus.RUNNING, started_at__isnull=False)
    if task_ids is not None:
        tasks = tasks.filter(pk__in=task_ids)
    watched = []
    for task in tasks.select_related("project").order_by("pk"):
        percent, minutes = settings_of(task)
        if minutes > 0:
            watched.append((task, percent, minutes))
    if not watched:
        return []
    longest = max(minutes for _, _, minutes in watched)
    samples: dict[int, list[tuple[datetime, float | None]]] = {}
    for task_id, at, gpu in (
        TaskUsageSample.objects.filter(
            task__in=[t for t, _, _ in watched], at__gte=now - timedelta(minutes=longest) - GAP
        )
        .order_by("task", "-at")
        .values_list("task_id", "at", "gpu_percent")
    ):
        samples.setdefault(task_id, []).append((at, gpu))
    out = []
    for task, percent, minutes in watched:
        newest_first = [s for s in samples.get(task.pk, ()) if s[0] >= minute_of(task.started_at)]
        since = _idle_since(newest_first, percent, now)
        if since is None:
            continue
        idle_for = newest_first[0][0] + INTERVAL - since  # each sample stands for its minute
        stop_at = since + timedelta(minutes=minutes)
        out.append(
            IdleState(
                task=task,
                percent=percent,
                minutes=minutes,
                idle_since=since,
                idle_for=idle_for,
                stop_at=stop_at,
                warn=idle_for >= timedelta(minutes=minutes) - warn_lead(minutes),
                due=idle_for >= timedelta(minutes=minutes),
            )
        )
    return out


def _idle_since(newest_first: list[tuple[datetime, float | None]], percent: int, now: datetime) -> datetime | None:
    """Start of the trailing run of idle samples (under ``percent``, none missing); None when the newest sample
    is busy, unknown or stale."""
    if not newest_first or now - newest_first[0][0] > GAP:
        return None
    since, newer = None, None
    for at, gpu in newest_first:
        if gpu is None or gpu >= percent or (newer is not None and newer - at > GAP):
            break
        since, newer = at, at
    return since


def stop_idle(now: datetime | None = None) -> list[int]:
    """Stop every dev environment idle long enough; returns their ids. Safe to run twice: a stopped task is no
    longer running, so a second pass finds nothing to stop."""
    stopped = []
    for state in idle_states(now):
        if not state.due:
            continue
        message = f"Stopped by idle autostop: {state.stop_reason}"
        data = {"percent": state.percent, "minutes": state.minutes, "idle_since": state.idle_since.isoformat()}
        if services.stop_idle_task(state.task.pk, message, data):
            stopped.append(state.task.pk)
    return stopped
