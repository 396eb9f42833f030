"""The alert conditions of deploy/prometheus/alerts.yml, evaluated by the portal itself for the admin page.

Same thresholds as the Prometheus rules: GPU utilisation (allocation over capacity) below 50% in a
VDC, a task waiting more than an hour in a queue, an enabled cluster marked unavailable, cards their node agent or
backend no longer reports (docs/rules.md, "Cards").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from apps.billing.monitoring import State, ratio, read_state
from apps.clusters.choices import ClusterStatus

LOW_UTILISATION = 0.5
LONG_WAIT = timedelta(hours=1)


@dataclass(frozen=True)
class Alert:
    """One firing condition: which rule, about what, how bad, and what to do."""

    rule: str
    severity: str
    vdc: str
    subject: str
    message: str
    action: str


def evaluate(state: State | None = None, now: datetime | None = None) -> list[Alert]:
    """The alerts firing now, most severe first."""
    now = now or timezone.now()
    state = state or read_state(now)
    alerts = []
    for c in state.clusters:
        if c.enabled and c.status == ClusterStatus.UNAVAILABLE:
            alerts.append(
                Alert(
                    "ClusterUnavailable",
                    "critical",
                    c.vdc,
                    f"cluster {c.name} ({c.vdc})",
                    f"{c.name} misses its health checks; its tasks were requeued.",
                    "Check the backend endpoint and credentials, or put the cluster in maintenance.",
                )
            )
    for c in state.clusters:
        if c.missing_cards:
            alerts.append(
                Alert(
                    "CardMissing",
                    "warning",
                    c.vdc,
                    f"cluster {c.name} ({c.vdc})",
                    f"{c.missing_cards} card(s) are no longer reported by their node agent or backend: they take no "
                    "new work, and a task holding one keeps it until it ends.",
                    "Check the nodes' agents and hardware (admin: Devices, filtered on missing since).",
                )
            )
    for q in state.queues:
        if q.waiting and q.oldest_wait_s > LONG_WAIT.total_seconds():
            hours = q.oldest_wait_s / 3600
            alerts.append(
                Alert(
                    "LongQueueWait",
                    "warning",
                    q.vdc,
                    f"queue {q.name} ({q.vdc})",
                    f"{q.waiting} task(s) waiting, the oldest for {hours:.1f} h (threshold 1 h).",
                    "Add capacity or adjust quotas and queue limits.",
                )
            )
    for vdc, (capacity, allocated) in sorted(state.vdcs().items()):
        if capacity["gpu"] > 0:
            used = ratio(allocated["gpu"], capacity["gpu"])
            if used < LOW_UTILISATION:
                alerts.append(
                    Alert(
                        "LowUtilisation",
                        "info",
                        vdc,
                        f"VDC {vdc}",
                        f"GPU utilisation is {used:.0%} of {capacity['gpu'].normalize()} GPU-equivalents "
                        f"(threshold {LOW_UTILISATION:.0%}).",
                        "Check the scheduling policy, quotas and queue limits.",
                    )
                )
    order = {"critical": 0, "warning": 1, "info": 2}
    return sorted(alerts, key=lambda a: (order[a.severity], a.rule, a.subject))
