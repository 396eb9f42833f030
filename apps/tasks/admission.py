"""Admission: a submission that no cluster of its VDC could ever run is refused at the door.

Accepting such a task would leave it queued forever ("larger than any node") or placed, failed at
launch and billed. For every enabled cluster of the VDC the rules ask what the cluster's backend can
do and what its nodes hold; the task is admitted when at least one cluster could run it once free.
A VDC without enabled clusters, or a cluster without registered nodes, admits what its backend can
run (its tasks wait until an admin adds the cluster or its nodes register).

Whether the cluster has room now is the scheduler's business, never admission's.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import Count, Q, Sum

from apps.clusters import services as cluster_services
from apps.clusters.capabilities import capabilities, refusal, runnable_options
from apps.clusters.choices import ClusterType
from apps.clusters.gpuspec import Catalog, GPURequest, candidate_models, parse_gpu_spec
from apps.clusters.models import Cluster, Device
from apps.tasks.choices import ACTIVE, WAITING

# Which field a refusal belongs to, in the order a message names them.
_FIELDS = ("kind", "instances", "elastic_min", "command", "image", "gpu_spec", "cpu", "memory_gib")


@dataclass
class _NodeView:
    cpu: Decimal
    memory_gib: Decimal
    cards: Counter = field(default_factory=Counter)  # model name -> cards on the node


@dataclass
class _ClusterView:
    name: str
    cluster_type: str
    nodes: list[_NodeView] = field(default_factory=list)


def admission_errors(task, request: GPURequest, gpu_catalog: Catalog) -> dict[str, str]:
    """{field: message} when no enabled cluster of ``task.vdc`` could ever run ``task``; {} otherwise."""
    clusters = _clusters_of(task.vdc_id)
    if not clusters:
        return {}
    refusals: list[tuple[str, str, str]] = []  # (field, cluster, reason)
    for cluster in clusters:
        refusal = _why_not(task, request, gpu_catalog, cluster)
        if refusal is None:
            return {}
        refusals.append((refusal[0], cluster.name, refusal[1]))
    # The field most clusters refused on carries the message; the message names every cluster's reason.
    counts = Counter(f for f, _c, _r in refusals)
    field_name = min(counts, key=lambda f: (-counts[f], _FIELDS.index(f)))
    reasons = "; ".join(f"{cluster}: {reason}" for _f, cluster, reason in refusals)
    return {field_name: f"No cluster of VDC {task.vdc} can ever run this task ({reasons})."}


def _clusters_of(vdc_id: int) -> list[_ClusterView]:
    """The VDC's enabled clusters with their nodes and cards per model, in one query."""
    rows = (
        Cluster.objects.filter(vdc_id=vdc_id, enabled=True)
        .values_list(
            "pk",
            "name",
            "cluster_type",
            "nodes__pk",
            "nodes__cpu",
            "nodes__memory_gib",
            "nodes__devices__gpu_model__name",
        )
        # A card partitioned into MIG instances or replicas counts as those units, never as a whole card.
        .annotate(cards=Count("nodes__devices", filter=Q(nodes__devices__sharing="whole")))
        .order_by("name")
    )
    clusters: dict[int, _ClusterView] = {}
    nodes: dict[int, _NodeView] = {}
    for cluster_id, name, cluster_type, node_id, cpu, memory, model, cards in rows:
        cluster = clusters.setdefault(cluster_id, _ClusterView(name, cluster_type))
        if node_id is None:
            continue
        if node_id not in nodes:
            nodes[node_id] = _NodeView(cpu, memory)
            cluster.nodes.append(nodes[node_id])
        if model is not None:
            nodes[node_id].cards[model] += cards
    return list(clusters.values())


def _start_size(task) -> int:
    """Instances the task needs at once: its gang, or an elastic task's minimum."""
    return task.elastic_min if task.is_elastic else max(task.instances or 1, 1)


def _why_not(task, request: GPURequest, gpu_catalog: Catalog, cluster: _ClusterView):
    """(field, reason) why ``cluster`` could never run ``task``, or None when it could."""
    nodes = cluster.nodes
    size = _start_size(task)
    caps = capabilities(cluster.cluster_type)
    refused = refusal(task, request, gpu_catalog, caps)
    if refused is not None:
        return refused
    if not nodes:
        return None  # nothing registered yet: what it will hold is unknown, so the task may wait for it
    # The local executor runs every rank of a gang on its one host.
    roomy_host = any(n.cpu >= task.cpu * size and n.memory_gib >= task.memory_gib * size for n in nodes)
    if cluster.cluster_type == ClusterType.LOCAL and size > 1 and not roomy_host:
        each = f"{task.cpu.normalize():f} cores and {task.memory_gib.normalize():f} GiB"
        return "instances", f"runs every instance on its one host, which has no room for {size} instances of {each}"
    fitting = [n for n in nodes if n.cpu >= task.cpu]
    if not fitting:
        return "cpu", f"no node has {task.cpu.normalize():f} cores (largest {max(n.cpu for n in nodes).normalize():f})"
    roomy = [n for n in fitting if n.memory_gib >= task.memory_gib]
    if not roomy:
        largest = max(n.memory_gib for n in fitting).normalize()
        return "memory_gib", f"no node with those cores has {task.memory_gib.normalize():f} GiB (largest {largest:f})"
    if request.is_none:
        return None
    options = runnable_options(candidate_models(request, gpu_catalog), gpu_catalog, caps)
    for model, count in options:
        cards = max(int(count), 1)  # a share of a card needs one card
        if any(n.cards[model] >= cards for n in roomy):
            return None
    held = sorted({m for n in nodes for m in n.cards})
    wanted = ", ".join(f"{max(int(c), 1)} {m}" for m, c in options[:4]) or "a fitting model"
    return "gpu_spec", (f"no node has {wanted} per instance; its nodes hold {', '.join(held) or 'no GPUs'}")


def wait_notice(task) -> str:
    """A sentence for the submitter when an admitted task can only start after others leave; "" otherwise.

    Counts, never names: tasks waiting ahead in its queue, and free cards of the models it accepts on the VDC's
    enabled clusters against what it needs to start. The scheduler decides; this only sets expectations.
    """
    from apps.tasks.models import Task  # the models' module imports the services that import this

    gpu_catalog = cluster_services.catalog()
    request = parse_gpu_spec(task.gpu_spec, gpu_catalog)
    reasons = []
    ahead = Task.objects.filter(queue=task.queue_id, status__in=WAITING, submitted_at__lt=task.submitted_at).count()
    if ahead:
        reasons.append(
            f"{ahead} task{'s' if ahead != 1 else ''} wait{'s' if ahead == 1 else ''} ahead of it in "
            f"queue {task.queue.name}"
        )
    options = dict(candidate_models(request, gpu_catalog))
    if options:
        # Two aggregates, whatever the number of tasks: cards per model, and what active tasks hold of each model
        # (their GPU-equivalents over the model's exchange rate; a shared card counts its share).
        total = Counter(
            dict(
                Device.objects.units()
                .filter(node__cluster__vdc=task.vdc_id, node__cluster__enabled=True, gpu_model__name__in=options)
                .values_list("gpu_model__name")
                .annotate(n=Count("pk"))
            )
        )
        # Without such cards there is nothing free to count (and no notice about them).
        held = (
            Task.objects.filter(vdc=task.vdc_id, status__in=ACTIVE)
            .exclude(pk=task.pk)
            .values_list("placement__0__gpu_model")
            .annotate(eq=Sum("allocated_gpu"))
            if total
            else ()
        )
        free = Counter(total)
        for model, eq in held:
            if model in total and eq:
                free[model] -= math.ceil(eq / gpu_catalog.entry(model).exchange_rate)
        instances = _start_size(task)
        fits_now = any(free[m] >= max(1, math.ceil(count)) * instances for m, count in options.items())
        if total and not fits_now:
            n_free, n_total = max(0, sum(free.values())), sum(total.values())
            reasons.append(f"{n_free} of the {n_total} GPUs it can use are free now")
    if not reasons:
        return ""
    detail = "; ".join(reasons)
    return f"It can start only after others leave: {detail}. Its page shows its position and estimated start."
