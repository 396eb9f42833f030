"""One Volcano ``Queue`` per portal queue of the Volcano flavour, on each Kubernetes cluster of its VDC.

Volcano Jobs of a portal queue go to that queue's Volcano Queue, whose weight and capacity mirror the portal
queue's (docs/kubernetes.md "Volcano queues"):

- **name** ``<isolation prefix><vdc>-<queue>`` as a DNS label (a digest appended where the names had to change);
- **weight** the portal weight x 100 (Volcano takes whole numbers 1-65535, the portal two decimals), so the
  proportion of queues is the portal's;
- **capability** the portal queue's maximum, **guarantee** its guaranteed capacity, both as whole cards per
  resource (``floor(equivalents / lowest exchange rate)`` of that resource's models on the cluster, as for a
  project's ResourceQuota); a resource whose models the cluster shares gets no count (HAMi asks one card per
  share), and the ``hcs.io/quota-notes`` annotation says so; an empty maximum is no capability;
- **reclaimable** unless the queue is of the high class (its work is never preempted).

The executor makes or updates the Volcano Queue before each Volcano Job it submits; saving a portal queue brings
it in step on every Kubernetes cluster of the VDC at once (:func:`sync_queue`).
"""

from __future__ import annotations

from decimal import Decimal

from apps.clusters.backends import executor_for
from apps.clusters.choices import ClusterType
from apps.clusters.executors.base import LABEL_INSTALLATION
from apps.clusters.executors.k8s_manifests import LABEL_QUEUE_ID, NOTES_ANNOTATION, sanitize_label_value
from apps.clusters.executors.projects import LABEL_MANAGED_BY, MANAGED_BY, project_backend_name
from apps.clusters.isolation import card_limits
from apps.clusters.models import Cluster

LABEL_VDC = "hcs.io/vdc"
LABEL_QUEUE = "hcs.io/queue"
VOLCANO_MAX_WEIGHT = 65535


def volcano_weight(weight: Decimal) -> int:
    """The portal weight (two decimals) as Volcano's whole-number weight, 1 to 65535."""
    return max(1, min(VOLCANO_MAX_WEIGHT, int(Decimal(weight) * 100)))


def volcano_queue(cluster: Cluster, queue, installation: str) -> dict:
    """The Volcano Queue of portal ``queue`` on ``cluster``, as ``KubernetesExecutor.ensure_volcano_queue`` takes it."""
    capability, cap_notes = card_limits(cluster, queue.max_gpu) if queue.max_gpu is not None else ({}, ())
    guarantee, guarantee_notes = card_limits(cluster, queue.guaranteed_gpu) if queue.guaranteed_gpu else ({}, ())
    notes = sorted(set(cap_notes) | set(guarantee_notes))
    return {
        "name": project_backend_name(cluster.isolation_prefix, f"{queue.vdc.name}-{queue.name}"),
        "labels": {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_INSTALLATION: installation,
            LABEL_QUEUE_ID: str(queue.pk),
            LABEL_VDC: sanitize_label_value(queue.vdc.name),
            LABEL_QUEUE: sanitize_label_value(queue.name),
        },
        "annotations": {NOTES_ANNOTATION: "; ".join(notes)} if notes else {},
        "weight": volcano_weight(queue.weight),
        "reclaimable": queue.priority_class != "high",
        "capability": {resource: str(cards) for resource, cards in capability.items()},
        "guarantee": {resource: str(cards) for resource, cards in guarantee.items() if cards},
    }


def clusters_of(queue) -> list[Cluster]:
    """The Kubernetes clusters that run ``queue``'s Volcano Jobs: those of its VDC."""
    return list(Cluster.objects.filter(vdc_id=queue.vdc_id, cluster_type=ClusterType.KUBERNETES, enabled=True))


def sync_queue(cluster: Cluster, queue, installation: str) -> None:
    """Bring ``queue``'s Volcano Queue on ``cluster`` in step now (ExecutorError when the API server fails; the next
    Volcano Job of the queue ensures it again)."""
    executor_for(cluster).ensure_volcano_queue(volcano_queue(cluster, queue, installation))
