"""The capacity ledger: what an active task holds, worked out in one place (docs/rules.md, "Held capacity").

A task's held capacity is its placement: every instance in it holds the task's cpu and memory per instance, and
its cards' shares at their model's exchange rate. Capacity the portal took back (a preemption, an elastic shrink)
leaves the ledger at once; the backend job that may still use it is tracked by its backend object, which keeps
those cards from everyone else until the backend confirms them free.

:mod:`apps.tasks.lifecycle` stores the figures on the task (``held_cpu``, ``held_memory_gib``, ``allocated_gpu``)
at every change of placement, with :func:`held_by`; the scheduler's snapshot, the API, ``/metrics``, the admin,
the dashboards and the alerts read those columns (:func:`allocation_sums`) or the placements (:func:`card_use`),
never a formula of their own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Q, Sum

from apps.clusters.models import Device
from apps.tasks.choices import ACTIVE
from apps.tasks.models import Task

ZERO = Decimal("0")
WHOLE = 1000  # a card in thousandths: a placement's share of a card is its "milli"
# A card whose model has no exchange rate (unrated since, or a row gone) counts as the reference card: held
# capacity is never free because the catalog changed under a running task.
REFERENCE_RATE = Decimal("1")
EQUIVALENTS_STEP = Decimal("0.001")


@dataclass(frozen=True)
class Held:
    """Capacity one task holds: cpu cores, memory GiB and GPU-equivalents."""

    cpu: Decimal = ZERO
    memory_gib: Decimal = ZERO
    gpu: Decimal = ZERO


def placement_devices(placement: Iterable[dict]) -> dict[int, int]:
    """Card id -> thousandths of it a stored placement holds (all its instances)."""
    shares: dict[int, int] = defaultdict(int)
    for instance in placement or ():
        for device in instance.get("devices", ()):
            shares[device["id"]] += int(device.get("milli", WHOLE))
    return dict(shares)


def device_rates(device_ids: Iterable[int]) -> dict[int, Decimal | None]:
    """Exchange rate of each card's model (one query); a card of an unrated model maps to None."""
    ids = set(device_ids)
    if not ids:
        return {}
    return dict(Device.objects.filter(pk__in=ids).values_list("pk", "gpu_model__exchange_rate"))


def placement_equivalents(placement: Iterable[dict], rates: Mapping[int, Decimal | None] | None = None) -> Decimal:
    """GPU-equivalents a placement holds: each card share times its model's exchange rate, to 0.001.

    ``rates`` (card id -> rate) saves the query when the caller has them; a card without a rate counts as the
    reference card (:data:`REFERENCE_RATE`).
    """
    shares = placement_devices(placement)
    if rates is None:
        rates = device_rates(shares)
    total = ZERO
    for device_id, milli in shares.items():
        rate = rates.get(device_id)
        total += (REFERENCE_RATE if rate is None else Decimal(rate)) * milli / WHOLE
    return total.quantize(EQUIVALENTS_STEP)


def held_by(task, placement: list[dict], rates: Mapping[int, Decimal | None] | None = None) -> Held:
    """What ``task`` holds with ``placement``: per-instance cpu and memory times its instances, and its cards."""
    instances = len(placement or ())
    return Held(
        cpu=Decimal(task.cpu) * instances,
        memory_gib=Decimal(task.memory_gib) * instances,
        gpu=placement_equivalents(placement, rates) if instances else ZERO,
    )


def allocation_sums() -> dict:
    """What active tasks hold, as aggregates over the stored ledger columns: cpu cores, memory GiB and
    GPU-equivalents. Every reader of held capacity aggregates with it (filter the tasks on ``ACTIVE`` first)."""
    return {"cpu": Sum("held_cpu"), "memory_gib": Sum("held_memory_gib"), "gpu": Sum("allocated_gpu")}


@dataclass
class CardUse:
    """The schedulable cards of one model in one cluster: how many, how much of them active tasks hold (in cards),
    how many no task holds any share of, and their mean utilisation."""

    cluster_id: int
    model: str
    cards: int = 0
    held: Decimal = ZERO
    free: int = 0
    utilisation: float = 0.0


def card_use(clusters: Q | None = None) -> dict[tuple[int, str], CardUse]:
    """Per (cluster, model): cards present (missing cards are not capacity), held and free (two queries).

    ``clusters`` narrows the clusters (a ``Q`` on Device, e.g. ``Q(node__cluster__vdc__in=ids)``). Held shares
    come from the active tasks' placements, so the dashboards, the admin and the scheduler agree on what is free.
    """
    units = Device.objects.units().present()
    if clusters is not None:
        units = units.filter(clusters)
    rows = list(units.values_list("pk", "node__cluster_id", "gpu_model__name", "utilization"))
    holders = Task.objects.filter(status__in=ACTIVE, cluster_id__in={row[1] for row in rows})
    shares: dict[int, int] = defaultdict(int)
    for placement in holders.values_list("placement", flat=True):
        for device_id, milli in placement_devices(placement).items():
            shares[device_id] += milli
    out: dict[tuple[int, str], CardUse] = {}
    busy: dict[tuple[int, str], int] = defaultdict(int)
    for pk, cluster_id, model, utilisation in rows:
        use = out.setdefault((cluster_id, model), CardUse(cluster_id, model))
        use.cards += 1
        use.held += Decimal(shares.get(pk, 0)) / WHOLE
        use.free += pk not in shares
        busy[(cluster_id, model)] += utilisation or 0
    for key, use in out.items():
        use.utilisation = busy[key] / use.cards if use.cards else 0.0
    return out
