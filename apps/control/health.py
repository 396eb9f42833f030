"""Cluster health and node state: what the scheduler may place on, read from the backends themselves.

A health check probes the backend and reads its nodes (Slurm node states and reasons, Kubernetes node
conditions and cordons) in the same pass, so a node that goes down stops taking placements within one
check and the tasks on it are requeued by their class rules. A cluster that misses three checks is
unavailable: its running tasks are unknown (they keep their cards; nothing is requeued, cancelled or started
there) until it answers or its grace period ends, then they go back to the queue and their jobs are cancelled as
soon as it answers again; when it does, it is reconciled before it takes anything new.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.clusters.backends import executor_for
from apps.clusters.choices import ClusterStatus, NodeStatus
from apps.clusters.executors.base import ExecutorError, NodeCondition
from apps.clusters.models import Cluster, Node
from apps.control import outages
from apps.control.models import BackendObject, ObjectState
from apps.control.reconcile import reconcile_cluster
from apps.tasks import lifecycle
from apps.tasks.choices import ACTIVE, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import requeue_task

log = logging.getLogger(__name__)

# Health: degraded after one missed check, unavailable after three.
UNAVAILABLE_AFTER = 3


def check_cluster_health(cluster: Cluster) -> Cluster:
    """Probe a cluster's backend and its nodes: healthy on success; degraded after one miss, unavailable after three.

    Tasks on a cluster that just became unavailable are requeued under their class rules; a cluster coming
    back from unavailable (or with jobs left to cancel) is reconciled first and is healthy only once that
    reconciliation could list its backend.
    """
    cluster = Cluster.objects.get(pk=cluster.pk)  # the status as it is now, not as the caller last read it
    conditions: list[NodeCondition] | None = None
    try:
        executor = executor_for(cluster)
        message = executor.health()
        conditions = executor.node_conditions()
        ok = True
        outages.answered(cluster)
    except ExecutorError as exc:
        message, ok = str(exc), False
        outages.unreachable(cluster, f"health check: {exc}")
    if ok and _needs_reconcile_first(cluster):
        result = reconcile_cluster(cluster.pk)
        if not result.reachable:
            ok, message = False, f"reconciliation after an outage failed: {'; '.join(result.errors)}"
        else:
            message += f"; reconciled ({result.cancelled} job(s) cancelled)"
    with transaction.atomic():
        cluster = Cluster.objects.select_for_update().get(pk=cluster.pk)
        if ok:
            cluster.missed_heartbeats = 0
            cluster.last_heartbeat = timezone.now()
            if cluster.status != ClusterStatus.MAINTENANCE:
                cluster.status = ClusterStatus.HEALTHY
        else:
            cluster.missed_heartbeats += 1
            if cluster.status != ClusterStatus.MAINTENANCE:
                unavailable = cluster.missed_heartbeats >= UNAVAILABLE_AFTER
                cluster.status = ClusterStatus.UNAVAILABLE if unavailable else ClusterStatus.DEGRADED
        cluster.status_message = message[:2000]
        cluster.save(update_fields=["missed_heartbeats", "last_heartbeat", "status", "status_message", "updated_at"])
        if conditions is not None:
            apply_node_conditions(cluster, conditions)
        if cluster.status == ClusterStatus.UNAVAILABLE:
            _unreachable(cluster, message)
    return cluster


def _unreachable(cluster: Cluster, message: str) -> None:
    """An unavailable cluster's tasks (caller is atomic): an unreachable API says nothing about the jobs, so running
    tasks become unknown and keep what they hold, and tasks that are only starting wait, until the API answers or
    the cluster's grace period after its last answer ends; then every task is requeued by its class rules and its
    job cancelled once the cluster answers. A task whose job never reached the backend goes back to the queue at once
    (docs/control.md, "Cluster health and node state")."""
    now = timezone.now()
    since = cluster.last_heartbeat
    expired = since is None or now - since >= timedelta(seconds=cluster.unknown_grace_s)
    active = Task.objects.select_for_update().select_related("queue").filter(cluster=cluster, status__in=ACTIVE)
    for task in active:
        if expired or not task.external_id:
            job = (
                f"; its job {task.external_id} there is cancelled once the cluster answers" if task.external_id else ""
            )
            grace = f" for more than {cluster.unknown_grace_s} s" if since is not None and task.external_id else ""
            requeue_task(task, f"Cluster {cluster.name} is unavailable{grace} ({message}){job}")
        elif task.status == TaskStatus.RUNNING:
            lifecycle.save(
                lifecycle.unknown(
                    task,
                    f"Cluster {cluster.name} does not answer ({message}); job "
                    f"{task.external_id} is left alone until it does, or for "
                    f"{cluster.unknown_grace_s} s after its last answer",
                )
            )


def _needs_reconcile_first(cluster: Cluster) -> bool:
    """Coming back from an outage, or with jobs of no live attempt still on the backend."""
    if cluster.status == ClusterStatus.UNAVAILABLE:
        return True
    cancelling = BackendObject.objects.filter(
        cluster=cluster, state=ObjectState.ACTIVE, cancel_requested_at__isnull=False
    )
    return cancelling.exists()


def apply_node_conditions(cluster: Cluster, conditions: list[NodeCondition]) -> list[Node]:
    """Record the backend's view of each node; requeue the tasks of nodes that went down (caller is atomic).

    Returns the nodes that went down in this pass.
    """
    by_name = {c.name: c for c in conditions}
    went_down = []
    for node in Node.objects.select_for_update().filter(cluster=cluster):
        condition = by_name.get(node.name)
        state = condition.state if condition else ""
        reason = (condition.reason if condition else "")[:255]
        if (node.backend_state, node.backend_reason) == (state, reason):
            continue
        if state == NodeStatus.DOWN and node.backend_state != NodeStatus.DOWN:
            went_down.append(node)
        node.backend_state, node.backend_reason = state, reason
        node.save(update_fields=["backend_state", "backend_reason"])
    for node in went_down:
        for task in _tasks_on(cluster, node.name):
            requeue_task(task, f"Node {node.name} of {cluster.name} is down ({node.backend_reason})")
    return went_down


def _tasks_on(cluster: Cluster, node_name: str) -> list[Task]:
    tasks = Task.objects.select_for_update().select_related("queue").filter(cluster=cluster, status__in=ACTIVE)
    return [t for t in tasks if node_name in t.node_names]
