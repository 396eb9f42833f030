"""Cluster selection strategies (docs/rules.md#placement): pluggable scorers returning a sort key, lower is better.

A strategy is a function ``(cluster_view, task) -> tuple``; the engine tries eligible
clusters in ascending key order (ties by the order the clusters came in) and places the task
on the first one where it fits. Register more with :func:`register_cluster_strategy`.

``cluster_view`` has ``cluster`` (the input :class:`~.model.Cluster`), ``total_gpu`` and
``used_gpu`` (GPU-equivalents of schedulable cards), ``running`` (task count) and ``order``.
"""

from __future__ import annotations

from collections.abc import Callable

from .model import Task

ClusterStrategy = Callable[[object, Task], tuple]


def _load(cv) -> float:
    return cv.used_gpu / cv.total_gpu if cv.total_gpu > 0 else 0.0


def load_balancing(cv, task: Task) -> tuple:
    """Least allocated cluster first (GPU-equivalents), then the one with most free capacity."""
    return (_load(cv), -(cv.total_gpu - cv.used_gpu))


def resource_fit(cv, task: Task) -> tuple:
    """Tightest cluster first: the least free capacity that still fits keeps big holes elsewhere."""
    return (cv.total_gpu - cv.used_gpu,)


def priority_weight(cv, task: Task) -> tuple:
    """Admin-set priority, then weight (both higher first)."""
    return (-cv.cluster.priority, -cv.cluster.weight)


def affinity(cv, task: Task) -> tuple:
    """The task's preferred clusters in its order, then the rest by load (required labels filter)."""
    prefs = task.preferred_clusters
    rank = prefs.index(cv.cluster.id) if cv.cluster.id in prefs else len(prefs)
    return (rank, _load(cv))


def cost_optimized(cv, task: Task) -> tuple:
    """Lowest cost weight first, then by load."""
    return (cv.cluster.cost_weight, _load(cv))


CLUSTER_STRATEGIES: dict[str, ClusterStrategy] = {
    "load_balancing": load_balancing,
    "resource_fit": resource_fit,
    "priority_weight": priority_weight,
    "affinity": affinity,
    "cost_optimized": cost_optimized,
}


def register_cluster_strategy(name: str, strategy: ClusterStrategy) -> None:
    """Make another cluster selection strategy available under ``name``."""
    CLUSTER_STRATEGIES[name] = strategy
