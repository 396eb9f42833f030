"""Device sharing: partitioning a card into MIG instances or time-sliced replicas (docs/engine.md "Device sharing").

A partitioned card keeps its Device row (``sharing`` mig / time_slicing) and gets one child Device per unit, of
the unit's catalog model (``A100-80G-1g.10gb``, ``A100-80G-ts4``), which has its own exchange rate. The snapshot
offers the scheduler the children only, so a card in MIG mode is never placed as a whole card and a unit is held
by at most one task; quotas, billing and metrics count the unit's exchange rate as they count a card's.

Every change goes through :func:`set_device_sharing`: it refuses (changing nothing) while a job holds the card or
one of its units, and holds the VDC row lock, so no scheduling cycle places work on units that are being replaced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from django.apps import apps
from django.db import transaction

from apps.clusters.catalog import MIG_PROFILES, MIG_SLICES, mig_catalog_entry, time_slice_name, unit_name
from apps.clusters.choices import ClusterType, Partition, Sharing
from apps.clusters.models import Device, GPUModel
from apps.vdc.models import VDC

MAX_TIME_SLICE_REPLICAS = 64
_PROFILE_RE = re.compile(r"^(?P<slices>[1-9])g\.(?P<memory>\d+)gb\Z")
_MIN_RATE = Decimal("0.001")


class SharingError(ValueError):
    """A sharing change that cannot be made; the message says why, and nothing was changed."""


@dataclass(frozen=True)
class MigInstance:
    """One MIG instance as declared by an admin (profile only) or reported by the node agent (uuid, GI id)."""

    profile: str
    uuid: str = ""
    gpu_instance_id: int | None = None


def parse_mig_layout(text: str) -> list[MigInstance]:
    """An admin's layout such as ``3g.40gb, 2g.20gb, 1g.10gb x2`` as instances (``x N`` repeats a profile)."""
    instances: list[MigInstance] = []
    for raw in (text or "").split(","):
        item = raw.strip().lower()
        if not item:
            continue
        profile, _, times = (p.strip() for p in item.partition("x"))
        if not _PROFILE_RE.match(profile):
            raise SharingError(f"expected MIG profiles such as 1g.10gb or 3g.40gb x2, got {raw.strip()!r}")
        if times and not (times.isdigit() and 1 <= int(times) <= MIG_SLICES):
            raise SharingError(f"expected a repeat count from 1 to {MIG_SLICES} after 'x', got {raw.strip()!r}")
        instances.extend(MigInstance(profile) for _ in range(int(times or 1)))
    if not instances:
        raise SharingError("expected at least one MIG profile, such as 3g.40gb, 2g.20gb, 1g.10gb x2")
    return instances


def held_by(device: Device) -> set[int]:
    """Tasks whose jobs (launching, running or being cancelled) hold the card or one of its units."""
    return {task for tasks in holders(device).values() for task in tasks if task is not None}


def holders(device: Device) -> dict[int, set[int | None]]:
    """The card's and its units' holders, as the control plane's records of the jobs on the backend say (the app
    that owns those records is looked up by name: it depends on this one, not the reverse)."""
    objects = apps.get_model("control", "BackendObject").objects.filter(cluster=device.node.cluster_id)
    return objects.holders_of({device.pk, *device.units.values_list("pk", flat=True)})


def ensure_mig_models(card: GPUModel) -> None:
    """Catalog rows for the MIG profiles of a card model the seed catalog lacked (an A100-40G an admin added):
    the seed rows of other cards come with the migration."""
    if card.units.filter(partition=Partition.MIG).exists() or not card.is_rated:
        return
    figures = {
        "name": card.name,
        "vendor": card.vendor,
        "aliases": list(card.aliases),
        "vram_gib": float(card.vram_gib),
        "tflops_fp16": float(card.tflops_fp16 or 0),
        "tflops_fp32": float(card.tflops_fp32 or 0),
        "exchange_rate": float(card.exchange_rate),
        "visible_devices_env": card.visible_devices_env,
    }
    for profile, slices, memory in MIG_PROFILES.get(card.name, ()):
        entry = mig_catalog_entry(figures, profile, slices, memory)
        GPUModel.objects.get_or_create(
            name=entry["name"],
            defaults={
                "vendor": card.vendor,
                "aliases": entry["aliases"],
                "vram_gib": Decimal(memory),
                "tflops_fp16": Decimal(str(entry["tflops_fp16"])),
                "tflops_fp32": Decimal(str(entry["tflops_fp32"])),
                "exchange_rate": Decimal(str(entry["exchange_rate"])),
                "resource_name": entry["resource_name"],
                "visible_devices_env": card.visible_devices_env,
                "slurm_gres_type": profile,
                "shareable": False,
                "enabled": card.enabled,
                "partition": Partition.MIG,
                "parent_model": card,
            },
        )


def _mig_models(card: GPUModel, instances: list[MigInstance]) -> list[GPUModel]:
    """The catalog row of each instance's profile; refuses unknown profiles and layouts the card cannot hold."""
    rows = {m.name[len(card.name) + 1 :]: m for m in card.units.filter(partition=Partition.MIG)}
    if not rows:  # a card model added after the seed: its rows are made on apply (ensure_mig_models)
        rate, enabled = card.exchange_rate, card.enabled
        rows = {
            profile: GPUModel(name=unit_name(card.name, profile), enabled=enabled, exchange_rate=rate)
            for profile, _slices, _memory in MIG_PROFILES.get(card.name, ())
        }
    if not rows:
        raise SharingError(f"{card.name} has no MIG profiles in the GPU catalog: it cannot be put in MIG mode")
    models, slices, memory = [], 0, Decimal(0)
    for instance in instances:
        model = rows.get(instance.profile)
        if model is None:
            raise SharingError(
                f"unknown MIG profile {instance.profile!r} of {card.name}; its profiles: {', '.join(sorted(rows))}"
            )
        if not model.enabled or not model.is_rated:
            raise SharingError(f"MIG profile {model.name} is disabled in the GPU catalog; enable it first")
        match = _PROFILE_RE.match(instance.profile)
        slices += int(match.group("slices"))
        memory += Decimal(match.group("memory"))
        models.append(model)
    if slices > MIG_SLICES or memory > card.vram_gib:
        raise SharingError(
            f"{card.name} has {MIG_SLICES} compute slices and {card.vram_gib.normalize():f} GB: the layout "
            f"{', '.join(i.profile for i in instances)} needs {slices} slices and {memory:f} GB"
        )
    return models


def time_slice_model(card: GPUModel, replicas: int) -> GPUModel:
    """The catalog row of one replica of a card shared ``replicas`` ways, created on first use with the card's rate
    divided by ``replicas`` (an admin may set another rate on the row; later declarations keep it)."""
    rate = max(_MIN_RATE, (card.exchange_rate / replicas).quantize(_MIN_RATE, rounding=ROUND_HALF_UP))
    model, _ = GPUModel.objects.get_or_create(
        name=time_slice_name(card.name, replicas),
        defaults={
            "vendor": card.vendor,
            "aliases": [f"{a}-ts" for a in (card.name, *card.aliases)],
            "vram_gib": card.vram_gib,
            "tflops_fp16": None,
            "tflops_fp32": None,
            "exchange_rate": rate,
            # The NVIDIA device plugin advertises replicas under the card's resource name (renameByDefault off).
            "resource_name": card.resource_name,
            "visible_devices_env": card.visible_devices_env,
            "slurm_gres_type": "",
            "shareable": False,
            "enabled": True,
            "partition": Partition.TIME_SLICE,
            "parent_model": card,
            "time_slice_replicas": replicas,
        },
    )
    return model


def check_device_sharing(
    device: Device, sharing: str, *, mig: list[MigInstance] | None = None, replicas: int | None = None
) -> list[tuple[GPUModel | None, MigInstance | None]]:
    """The units ``device`` would be partitioned into (model None: the time-slice row, made on apply), writing
    nothing; raises :class:`SharingError` for what :func:`set_device_sharing` would refuse."""
    card = device.gpu_model
    if device.parent_id is not None:
        raise SharingError(f"{device} is a unit of a partitioned card: change the sharing of its card")
    if sharing == Sharing.WHOLE:
        units: list[tuple[GPUModel | None, MigInstance | None]] = []
    elif sharing == Sharing.MIG:
        instances = list(mig or ())
        units = list(zip(_mig_models(card, instances), instances, strict=True))
    elif sharing == Sharing.TIME_SLICING:
        if device.node.cluster.cluster_type == ClusterType.SLURM:
            raise SharingError(
                "time-slicing is not offered on Slurm clusters: Slurm shares cards through its own "
                "gres/shard configuration, which the portal does not drive"
            )
        if card.vendor != "nvidia":
            raise SharingError(f"time-slicing is an NVIDIA device plugin feature; {card.name} is {card.vendor}")
        if not isinstance(replicas, int) or not 2 <= replicas <= MAX_TIME_SLICE_REPLICAS:
            raise SharingError(f"expected 2 to {MAX_TIME_SLICE_REPLICAS} time-sliced replicas, got {replicas!r}")
        units = [(None, None)] * replicas
    else:
        raise SharingError(f"expected a sharing of {', '.join(Sharing.values)}, got {sharing!r}")
    return units


def _wanted(device: Device, sharing: str, mig, replicas) -> list[tuple[GPUModel, str, int]]:
    """(model, uuid, slot) of each unit the card is to have; catalog rows a declaration needs are made here."""
    if sharing == Sharing.MIG:
        ensure_mig_models(device.gpu_model)
    planned = check_device_sharing(device, sharing, mig=mig, replicas=replicas)
    if sharing == Sharing.TIME_SLICING:
        replica = time_slice_model(device.gpu_model, replicas)
        planned = [(replica, None) for _ in planned]
    return [(model, inst.uuid if inst else "", _slot(inst, i)) for i, (model, inst) in enumerate(planned)]


def _unchanged(device: Device, sharing: str, wanted: list[tuple[GPUModel, str, int]]) -> bool:
    """True when the card already has these units (uuids aside); then only the uuids are brought in step."""
    current = [(u.gpu_model_id, u.slot) for u in device.units.all()]
    if sharing != device.sharing or sorted((m.pk, s) for m, _u, s in wanted) != sorted(current):
        return False
    for model, uuid, slot in wanted:
        device.units.filter(slot=slot, gpu_model=model).exclude(uuid=uuid).update(uuid=uuid)
    return True


@transaction.atomic
def set_device_sharing(
    device: Device, sharing: str, *, mig: list[MigInstance] | None = None, replicas: int | None = None
) -> Device:
    """Offer a card whole, as MIG instances (``mig``) or as ``replicas`` time-sliced replicas.

    Raises :class:`SharingError` (and changes nothing) for a unit rather than a card, an unknown profile, a
    layout the card cannot hold, time-slicing on Slurm, or a card a job holds while its units would change.
    """
    device = Device.objects.select_related("gpu_model", "node__cluster").get(pk=device.pk)
    # Every agent report passes here: an unchanged layout must not take the VDC lock (a cycle would skip the VDC).
    if _unchanged(device, sharing, _wanted(device, sharing, mig, replicas)):
        return device
    VDC.objects.select_for_update().filter(pk=device.node.cluster.vdc_id).first()  # no cycle places meanwhile
    device = Device.objects.select_for_update().select_related("gpu_model", "node__cluster").get(pk=device.pk)
    wanted = _wanted(device, sharing, mig, replicas)
    if _unchanged(device, sharing, wanted):
        return device
    holders = held_by(device)
    if holders:
        raise SharingError(
            f"{device} is held by task(s) {', '.join(map(str, sorted(holders)))}: its sharing can change once "
            "they end (drain the node to stop new work landing on it)"
        )
    device.units.all().delete()
    Device.objects.bulk_create(
        Device(
            node=device.node,
            index=device.index,
            parent=device,
            slot=slot,
            gpu_model=model,
            uuid=uuid,
            vram_gib=model.vram_gib,
            health_score=device.health_score,
            numa_node=device.numa_node,
            pci_bus_id=device.pci_bus_id,
            reported_name=device.reported_name,
            driver_version=device.driver_version,
            runtime_version=device.runtime_version,
        )
        for model, uuid, slot in wanted
    )
    device.sharing = sharing
    device.time_slice_replicas = replicas if sharing == Sharing.TIME_SLICING else None
    device.save(update_fields=["sharing", "time_slice_replicas"])
    return device


def _slot(instance: MigInstance | None, position: int) -> int:
    """A MIG instance's GPU instance id when the agent reported it (the id nvidia-smi shows), else its position."""
    if instance is not None and instance.gpu_instance_id is not None:
        return instance.gpu_instance_id
    return position


def sync_reported_mig(device: Device, mig_mode: bool, instances: list[MigInstance]) -> str:
    """Follow what the node agent saw of a card's MIG mode and instances; returns a note for the node's agent
    message when the portal cannot follow yet (a job holds the card, an unknown profile), else ""."""
    if not mig_mode:
        if device.sharing != Sharing.MIG:
            return ""
        target: dict = {"sharing": Sharing.WHOLE}
    else:
        target = {"sharing": Sharing.MIG, "mig": instances}
    try:
        set_device_sharing(device, **target)
    except SharingError as exc:
        return f"GPU {device.index}: the reported MIG layout is not applied: {exc}"
    if mig_mode and not instances:
        return f"GPU {device.index}: MIG mode is on but no MIG instance is configured; the card takes no work"
    return ""
