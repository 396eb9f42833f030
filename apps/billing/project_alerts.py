"""Alerts for project members (docs/rules.md#monitoring-and-alerts): quota nearly or fully used, budget low, GPUs idle
on a running task,
tasks that keep failing, an inference service short of replicas.

A beat job (``apps.billing.jobs.refresh_project_alerts``, every minute) evaluates the conditions with a few
aggregate queries, keeps one open :class:`ProjectAlert` row per project and subject, and pushes what fired,
changed or cleared to the members' live pages (their ``user`` group of ``ws/live/``). Thresholds are per VDC
(:class:`AlertSettings`, defaults when a VDC has none). ``/metrics`` exports the firing ones
(``hcs_project_alert``) so the Prometheus rules in deploy/prometheus/alerts.yml say the same.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Count, Q, Sum
from django.utils import timezone
from redis.exceptions import RedisError

from apps.billing import waste
from apps.billing.choices import AlertRule, AlertSeverity
from apps.billing.models import Account, AlertSettings, ProjectAlert
from apps.billing.templatetags.money import format_money
from apps.clusters.models import Device
from apps.tasks import usage
from apps.tasks.choices import ACTIVE, EventKind, TaskKind, TaskStatus
from apps.tasks.live import send_all, user_group
from apps.tasks.models import Task, TaskEvent
from apps.vdc.models import Membership, ProjectQuota
from apps.vdc.policy import visible_projects

log = logging.getLogger(__name__)

DEFAULTS = AlertSettings()  # an unsaved row: the field defaults, for VDCs without thresholds of their own
# A card's utilisation counts only while its node agent reports: older figures say nothing about now.
FRESH_REPORT = timedelta(minutes=3)
FAILURE_WINDOW = timedelta(hours=1)


@dataclass(frozen=True)
class Condition:
    """A condition true now: whom it concerns, what it says, and how long it must hold before it fires."""

    project_id: int
    key: str
    rule: str
    severity: str
    message: str
    action: str
    vdc_id: int | None = None
    task_id: int | None = None
    hold: timedelta = timedelta(0)


def thresholds() -> dict[int, AlertSettings]:
    """Each VDC's alert thresholds that an admin set (one query)."""
    return {s.vdc_id: s for s in AlertSettings.objects.all()}


def conditions(now: datetime) -> list[Condition]:
    """Every condition true now, over all projects (eight queries whatever the number of tasks)."""
    limits = thresholds()
    return (
        _quota(limits)
        + _budget(limits)
        + _idle(limits, now)
        + _failures(limits, now)
        + _services(limits)
        + _idle_stop(now)
    )


def _quota(limits) -> list[Condition]:
    active = Task.objects.filter(status__in=ACTIVE).values("project_id", "vdc_id").annotate(gpu=Sum("allocated_gpu"))
    used = {(row["project_id"], row["vdc_id"]): row["gpu"] or Decimal(0) for row in active.order_by()}
    out = []
    for q in ProjectQuota.objects.filter(limit_gpu__gt=0).select_related("vdc"):
        gpu = used.get((q.project_id, q.vdc_id), Decimal(0))
        percent = float(gpu / q.limit_gpu * 100)
        warn = limits.get(q.vdc_id, DEFAULTS).quota_warn_percent
        figures = f"{gpu.normalize():f} of {q.limit_gpu.normalize():f} GPU-equivalents in VDC {q.vdc.name}"
        if percent >= 100:
            out.append(
                Condition(
                    q.project_id,
                    f"quota:{q.vdc_id}",
                    AlertRule.QUOTA_FULL,
                    AlertSeverity.CRITICAL,
                    f"GPU quota used up: {figures}. New tasks wait until running ones end.",
                    "Stop tasks you no longer need, or ask a platform admin for a larger quota.",
                    vdc_id=q.vdc_id,
                )
            )
        elif percent >= warn:
            out.append(
                Condition(
                    q.project_id,
                    f"quota:{q.vdc_id}",
                    AlertRule.QUOTA_HIGH,
                    AlertSeverity.WARNING,
                    f"GPU quota {percent:.0f}% used: {figures} (alert at {warn}%).",
                    "Plan ahead: stop idle tasks or ask a platform admin for more quota.",
                    vdc_id=q.vdc_id,
                )
            )
    return out


def _budget(limits) -> list[Condition]:
    floors: dict[int, Decimal] = {}
    for project_id, vdc_id in ProjectQuota.objects.values_list("project_id", "vdc_id"):
        floor = limits.get(vdc_id, DEFAULTS).budget_low_amount
        floors[project_id] = max(floors.get(project_id, floor), floor)
    out = []
    for account in Account.objects.filter(project__in=list(floors)):
        floor, available = floors[account.project_id], account.available
        if available >= floor:
            continue
        money = format_money(available, account.currency)
        if available <= 0:
            stop = " New tasks do not start until it is topped up." if account.enforce_budget else ""
            out.append(
                Condition(
                    account.project_id,
                    "budget",
                    AlertRule.BUDGET_LOW,
                    AlertSeverity.CRITICAL,
                    f"Budget exhausted: {money} available.{stop}",
                    "Ask a platform admin to credit the project's account.",
                )
            )
        else:
            out.append(
                Condition(
                    account.project_id,
                    "budget",
                    AlertRule.BUDGET_LOW,
                    AlertSeverity.WARNING,
                    f"Budget low: {money} available (alert below {floor.normalize():f}).",
                    "Ask a platform admin to credit the account, or stop unneeded tasks.",
                )
            )
    return out


def _idle(limits, now: datetime) -> list[Condition]:
    running = Task.objects.filter(status=TaskStatus.RUNNING, allocated_gpu__gt=0)
    running = list(running.values("pk", "project_id", "vdc_id", "name", "placement", "allocated_gpu"))
    device_ids = {d["id"] for t in running for p in t["placement"] for d in p.get("devices", ())}
    reported = Device.objects.filter(pk__in=device_ids, node__last_report__gte=now - FRESH_REPORT)
    reported = reported.exclude(gpu_model__partition="mig")  # NVML gives no utilisation per MIG instance
    utilisation = dict(reported.values_list("pk", "utilization"))
    out, idle = [], []
    for t in running:
        ids = [d["id"] for p in t["placement"] for d in p.get("devices", ())]
        if not ids or any(i not in utilisation for i in ids):
            continue  # a card without a fresh agent report: nothing known, nothing said
        settings = limits.get(t["vdc_id"], DEFAULTS)
        busiest = max(utilisation[i] for i in ids)
        if busiest < settings.idle_gpu_percent:
            idle.append(t)
            out.append(
                Condition(
                    t["project_id"],
                    f"idle:{t['pk']}",
                    AlertRule.IDLE_GPUS,
                    AlertSeverity.WARNING,
                    f"Task {t['name']} (#{t['pk']}) holds {len(ids)} card(s) below "
                    f"{settings.idle_gpu_percent}% utilisation for {settings.idle_minutes} min or more.",
                    "Stop it if it is done, so others can use the cards (it is billed while it runs).",
                    vdc_id=t["vdc_id"],
                    task_id=t["pk"],
                    hold=timedelta(minutes=settings.idle_minutes),
                )
            )
    waste.record_idle(idle, now)
    return out


def _failures(limits, now: datetime) -> list[Condition]:
    since = now - FAILURE_WINDOW
    failed = Q(kind=EventKind.FAILED) | Q(kind=EventKind.REQUEUED, data__has_key="retry")
    rows = (
        TaskEvent.objects.filter(failed, created_at__gte=since)
        .values("task__project_id", "task__vdc_id")
        .annotate(n=Count("pk"))
        .order_by()
    )
    out = []
    for row in rows:
        project_id, vdc_id, n = row["task__project_id"], row["task__vdc_id"], row["n"]
        at_least = limits.get(vdc_id, DEFAULTS).failures_per_hour
        if n >= at_least:
            out.append(
                Condition(
                    project_id,
                    f"failures:{vdc_id}",
                    AlertRule.REPEATED_FAILURES,
                    AlertSeverity.WARNING,
                    f"{n} runs failed in the last hour (alert at {at_least}).",
                    "Open the failed tasks' logs: their failure reason and exit code say why.",
                    vdc_id=vdc_id,
                )
            )
    return out


def _services(limits) -> list[Condition]:
    out = []
    services = Task.objects.filter(kind=TaskKind.INFERENCE, status=TaskStatus.RUNNING).values(
        "pk",
        "project_id",
        "vdc_id",
        "name",
        "replicas",
        "ready_replicas",
        "instances",
        "autoscale_min",
        "autoscale_desired",
    )
    for t in services:
        minutes = limits.get(t["vdc_id"], DEFAULTS).unhealthy_minutes
        desired = t["autoscale_desired"]
        if desired is not None and t["replicas"] < desired:
            # The autoscaler asked for more replicas than the scheduler could grant (quota, free cards, class).
            out.append(
                Condition(
                    t["project_id"],
                    f"service-grant:{t['pk']}",
                    AlertRule.SERVICE_UNHEALTHY,
                    AlertSeverity.WARNING,
                    f"Inference service {t['name']} (#{t['pk']}) runs {t['replicas']} of the {desired} "
                    f"replicas its autoscaler asks for, for {minutes} min or more.",
                    "Its queue position says what it waits for: the project's quota, free cards of its "
                    "model, or work of a higher class. Raise the quota or the service's maximum "
                    "accordingly.",
                    vdc_id=t["vdc_id"],
                    task_id=t["pk"],
                    hold=timedelta(minutes=minutes),
                )
            )
        wanted = t["autoscale_min"] or t["instances"] or 1
        # Ready replicas where the backend checks a readiness path, else those running.
        serving = t["ready_replicas"] if t["ready_replicas"] is not None else t["replicas"]
        if serving < wanted:
            out.append(
                Condition(
                    t["project_id"],
                    f"service:{t['pk']}",
                    AlertRule.SERVICE_UNHEALTHY,
                    AlertSeverity.WARNING,
                    f"Inference service {t['name']} (#{t['pk']}) serves with {serving} of {wanted} "
                    f"replicas for {minutes} min or more.",
                    "Check its monitoring page and logs; stop and resubmit it if it does not recover.",
                    vdc_id=t["vdc_id"],
                    task_id=t["pk"],
                    hold=timedelta(minutes=minutes),
                )
            )
    return out


def _idle_stop(now: datetime) -> list[Condition]:
    """Dev environments that idle autostop will stop within its warning lead (docs/rules.md#idle-autostop)."""
    out = []
    for state in usage.idle_states(now):
        if not state.warn:
            continue
        task = state.task
        stop = timezone.localtime(state.stop_at).strftime("%H:%M")
        out.append(
            Condition(
                task.project_id,
                f"idle-stop:{task.pk}",
                AlertRule.IDLE_STOP,
                AlertSeverity.WARNING,
                f"Dev environment {task.name} (#{task.pk}) has been {state.reason}: idle autostop stops it at "
                f"{stop}, as a stop by hand would (nothing is deleted).",
                "Use its GPUs to keep it running, or stop it yourself if you are done.",
                vdc_id=task.vdc_id,
                task_id=task.pk,
            )
        )
    return out


def refresh(now: datetime | None = None) -> dict[str, int]:
    """Bring the open alerts in line with the conditions true now; push what fired, changed or cleared."""
    now = now or timezone.now()
    found = {(c.project_id, c.key): c for c in conditions(now)}
    pushes: list[ProjectAlert] = []
    counts = {"fired": 0, "changed": 0, "resolved": 0}
    with transaction.atomic():
        open_alerts = {
            (a.project_id, a.key): a for a in ProjectAlert.objects.select_for_update().filter(resolved_at=None)
        }
        for ident, alert in open_alerts.items():
            if ident in found:
                continue
            if alert.fired_at is None:
                alert.delete()  # cleared before it held long enough: nobody was told, nothing to keep
                continue
            alert.resolved_at = now
            alert.save(update_fields=["resolved_at", "updated_at"])
            pushes.append(alert)
            counts["resolved"] += 1
        for ident, c in found.items():
            alert = open_alerts.get(ident) or ProjectAlert(project_id=c.project_id, key=c.key, since=now)
            is_new, before = alert.pk is None, (alert.rule, alert.severity, alert.message)
            alert.rule, alert.severity, alert.message, alert.action = c.rule, c.severity, c.message, c.action
            alert.vdc_id, alert.task_id = c.vdc_id, c.task_id
            fires = alert.fired_at is None and now - alert.since >= c.hold
            if fires:
                alert.fired_at = now
                counts["fired"] += 1
            # A firing alert that changes rule or severity (80 % -> used up) is told again; a new figure is not.
            escalated = not fires and alert.fired_at is not None and before[:2] != (c.rule, c.severity)
            if is_new or fires or before != (c.rule, c.severity, c.message):
                alert.save()
            if fires or escalated:
                counts["changed"] += escalated
                pushes.append(alert)
        transaction.on_commit(lambda: push(pushes))
    return counts


def payload(alert: ProjectAlert) -> dict:
    """What live pages receive about an alert."""
    return {
        "type": "alert",
        "id": alert.pk,
        "project": alert.project_id,
        "rule": alert.rule,
        "title": alert.get_rule_display(),
        "severity": alert.severity,
        "message": alert.message,
        "action": alert.action,
        "task": alert.task_id,
        "resolved": alert.resolved_at is not None,
    }


def push(alerts: list[ProjectAlert]) -> None:
    """Send each alert to its project's members (their user groups); a Redis outage costs only the push."""

    if not alerts:
        return
    members: dict[int, list[int]] = {}
    for project_id, user_id in Membership.objects.filter(project__in={a.project_id for a in alerts}).values_list(
        "project_id", "user_id"
    ):
        members.setdefault(project_id, []).append(user_id)
    messages = [(user_group(u), payload(a)) for a in alerts for u in members.get(a.project_id, ())]
    try:
        send_all(messages)
    except (RedisError, OSError) as exc:  # OSError covers the timeouts; pages list open alerts when they load
        log.warning("project alerts not pushed (%d messages): %s", len(messages), exc)


def open_alerts_for(user, limit: int = 20) -> list[ProjectAlert]:
    """The firing alerts of the user's projects, most severe and newest first."""
    order = {AlertSeverity.CRITICAL: 0, AlertSeverity.WARNING: 1, AlertSeverity.INFO: 2}
    alerts = list(
        ProjectAlert.objects.filter(
            project__in=visible_projects(user, "billing.view_projectalert"), resolved_at=None, fired_at__isnull=False
        )
        .select_related("project", "task")
        .order_by("-fired_at")[:limit]
    )
    return sorted(alerts, key=lambda a: order.get(a.severity, 3))
