"""Which cards a job's instances got, as the backend reports them, read back into the task's placement.

On Kubernetes the node's device plugin chooses the cards of the resource a pod asks for (``nvidia.com/gpu: 2``):
the scheduler decides how many cards of which model on which node, and its choice of card is only a count there.
Where the kubelet reports what the plugin allocated (``JobState.devices``), the task's placement follows it: each
instance holds the cards it really got, found by their UUIDs among the node's cards (the node agent reports them),
so per-card figures, alerts and the ledger name the right task. Another active task of the node whose placement
named one of those cards gets a free card of the same model instead: the plugin gave its pod another one, which
its own report confirms. Read back only when it adds up: whole cards (shares, MIG instances and time-sliced replicas
are the plugin's or HAMi's to choose, and stay as placed), every reported card known by its UUID on that node, of
the placement's model, as many as the instance holds (docs/kubernetes.md "Which cards a pod got").
"""

from __future__ import annotations

import logging
from collections import Counter

from django.db import transaction

from apps.clusters.executors.base import JobState
from apps.clusters.models import Device
from apps.control.models import BackendObject, shares_of
from apps.tasks import lifecycle
from apps.tasks.choices import ACTIVE
from apps.tasks.models import Task

log = logging.getLogger(__name__)
WHOLE = 1000


def follow_devices(obj: BackendObject, state: JobState) -> bool:
    """Bring the placement of ``obj``'s task to the cards its backend reports; True when it changed."""
    if not state.devices or obj.task is None or _holds(obj.task, state.devices):
        return False
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=obj.task_id)
        if task.attempt != obj.attempt or task.status not in ACTIVE or task.cluster_id != obj.cluster_id:
            return False
        placement = _reported(task, state.devices)
        if placement is None or placement == task.placement:
            return False
        ids = {d["id"] for entry in placement for d in entry["devices"]}
        moved = _make_room(task, ids, ids - {d["id"] for entry in task.placement for d in entry["devices"]})
        if moved is None:
            return False
        cards = ", ".join(f"{e['node_name']}: {', '.join(str(d['index']) for d in e['devices'])}" for e in placement)
        message = f"{task.cluster.name} reports the cards its device plugin gave: {cards}"
        lifecycle.save(lifecycle.cards_reported(task, placement, message, {"reported": sorted(ids)}))
        _follow_object(task)
        for other, other_placement in moved:
            note = f"cards renumbered: the device plugin gave task #{task.pk} cards this placement named"
            lifecycle.save(lifecycle.cards_reported(other, other_placement, note, {"by_task": task.pk}))
            _follow_object(other)
    return True


def _holds(task: Task, reported: tuple[tuple[str, tuple[str, ...]], ...]) -> bool:
    """Whether the placement already names every reported card where it was reported (one query, no lock)."""
    ids = [d["id"] for entry in task.placement or [] for d in entry.get("devices", ())]
    uuids = dict(Device.objects.filter(pk__in=ids).values_list("pk", "uuid"))
    placed = Counter(
        (entry.get("node_name"), tuple(sorted(uuids.get(d["id"], "") for d in entry.get("devices", ()))))
        for entry in task.placement or []
    )
    return not Counter(reported) - placed


def _whole_cards(entry: dict) -> bool:
    return (
        bool(entry.get("devices"))
        and not entry.get("releasing")
        and all(d.get("milli", WHOLE) == WHOLE and not d.get("uuid") for d in entry["devices"])
    )


def _reported(task: Task, reported: tuple[tuple[str, tuple[str, ...]], ...]) -> list[dict] | None:
    """The task's placement with the reported cards in place of the placed ones; None when a report does not add
    up (the placement stays)."""
    placement = [dict(entry) for entry in task.placement or []]
    if not placement or not all(_whole_cards(entry) for entry in placement):
        return None
    uuids = {uuid for _node, ids in reported for uuid in ids}
    known = {
        (d.node.name, d.uuid): d
        for d in Device.objects.filter(
            node__cluster=task.cluster_id, uuid__in=uuids, parent__isnull=True
        ).select_related("node", "gpu_model")
    }
    for node in {node for node, _ids in reported}:
        entries = [e for e in placement if e.get("node_name") == node]
        reports = [ids for n, ids in reported if n == node]
        if len(reports) > len(entries):
            return None  # more pods than instances there (a rollout): wait until it settles
        cards = []
        for ids in reports:
            devices = [known.get((node, uuid)) for uuid in ids]
            if any(d is None or d.gpu_model.name != entries[0].get("gpu_model") for d in devices):
                return None
            cards.append(sorted(devices, key=lambda d: d.index))
        placed = {frozenset(d["id"] for d in e["devices"]): e for e in entries}
        unmatched = [
            e
            for e in entries
            if frozenset(d["id"] for d in e["devices"]) not in {frozenset(d.pk for d in c) for c in cards}
        ]
        for devices in cards:
            if frozenset(d.pk for d in devices) in placed:
                continue  # this instance holds what it was given
            entry = unmatched.pop(0)
            if len(entry["devices"]) != len(devices):
                return None
            entry["devices"] = [{"id": d.pk, "index": d.index, "milli": WHOLE} for d in devices]
    return placement


def _make_room(task: Task, holds: set[int], taken: set[int]) -> list[tuple[Task, list[dict]]] | None:
    """Other active tasks of the cluster whose placement names one of ``taken`` (cards ``task`` newly holds; it
    holds ``holds`` now), each with a placement on free cards of the same model and node instead (the cards
    ``task`` no longer holds among them); None when a node has no such free card (nothing changes)."""
    if not taken:
        return []
    others = list(
        Task.objects.select_for_update()
        .filter(cluster_id=task.cluster_id, status__in=ACTIVE)
        .exclude(pk=task.pk)
        .order_by("pk")
    )
    held = {d["id"] for t in others for e in t.placement or [] for d in e.get("devices", ())} | holds
    moved = []
    for other in others:
        if not taken & {d["id"] for e in other.placement or [] for d in e.get("devices", ())}:
            continue
        placement = []
        for entry in other.placement or []:
            clashing = [d for d in entry.get("devices", ()) if d["id"] in taken]
            if not clashing:
                placement.append(entry)
                continue
            if not _whole_cards(entry):
                return None
            free = list(
                Device.objects.units()
                .filter(node_id=entry["node"], gpu_model__name=entry.get("gpu_model"))
                .exclude(pk__in=held)
                .order_by("index")[: len(clashing)]
            )
            if len(free) < len(clashing):
                log.warning(
                    "task %s: no free card on %s for task %s's clashing cards", task.pk, entry["node_name"], other.pk
                )
                return None
            held |= {d.pk for d in free}
            replacement = iter(free)
            devices = []
            for d in entry["devices"]:
                if d["id"] in taken:
                    card = next(replacement)
                    d = {"id": card.pk, "index": card.index, "milli": WHOLE}
                devices.append(d)
            placement.append({**entry, "devices": devices})
        moved.append((other, placement))
    return moved


def _follow_object(task: Task) -> None:
    """The job of the task's live attempt holds the cards of its placement now."""
    BackendObject.objects.filter(task=task, attempt=task.attempt, cluster_id=task.cluster_id).update(
        shares=shares_of(task.placement)
    )
