"""Cluster-side services: the GPU catalog as the parser sees it, GPU spec validation, cluster state."""

from __future__ import annotations

import difflib
import hashlib
import logging
import re
import secrets
import time
from dataclasses import dataclass, field
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import DataError, IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from apps.clusters.catalog import VENDOR_DEFAULTS
from apps.clusters.choices import ClusterStatus, ClusterType
from apps.clusters.fingerprint import fingerprint, model_words, new_model_name, vendor_of
from apps.clusters.gpuspec import Catalog, GPURequest, GPUSpecError, UnknownGPUModel, parse_gpu_spec
from apps.clusters.models import AgentToken, Cluster, Device, GPUModel, Node
from apps.clusters.partitions import MigInstance, holders, sync_reported_mig
from apps.core.api.common import DeletionRefused

log = logging.getLogger(__name__)

# XID errors accumulate over reports; the column holds a 32-bit count.
MAX_ERROR_COUNT = 2**31 - 1


# How long a process reuses the catalog it read. Rates and models are edited rarely, by admins; a submit read the
# catalog twice (validation, then the admission notice), about a tenth of its time. An edit in this process
# clears it at once (signals in apps.py); other processes see it after this many seconds.
CATALOG_TTL_S = 5.0
# (read at, the enabled models' catalog, the device-visibility variables of every model, enabled or not)
_catalog_cache: tuple[float, Catalog, frozenset[str]] | None = None


def _catalog_copy() -> tuple[float, Catalog, frozenset[str]]:
    global _catalog_cache
    now = time.monotonic()
    cached = _catalog_cache
    if cached is not None and now - cached[0] < CATALOG_TTL_S:
        return cached
    models = list(GPUModel.objects.all())
    fresh = (
        now,
        Catalog(m.as_catalog_entry() for m in models if m.enabled),
        frozenset(m.visible_devices_env for m in models if m.visible_devices_env),
    )
    _catalog_cache = fresh
    return fresh


def catalog() -> Catalog:
    """The enabled GPU models of the database catalog, read at most every ``CATALOG_TTL_S`` seconds per process."""
    return _catalog_copy()[1]


def device_env_names() -> frozenset[str]:
    """The device-visibility variables (``NVIDIA_VISIBLE_DEVICES`` ...) of every GPU model, enabled or not: names a
    task's environment may not set. Read with the catalog, as often."""
    return _catalog_copy()[2]


def forget_catalog(**_kwargs) -> None:
    """Drop this process's catalog copy (a GPU model was saved or deleted; tests that rebuild the catalog)."""
    global _catalog_cache
    _catalog_cache = None


def validate_gpu_spec(text: str | None, gpu_catalog: Catalog | None = None, vdc_id: int | None = None) -> GPURequest:
    """Parse a GPU spec against the catalog; a ValidationError carries the parser's message.

    With ``vdc_id``, a mistyped model name is answered with the models that VDC has (the catalog knows many
    the VDC does not): "unknown GPU model 'A10O' in '1(A10O)'; VDC demo has A100-80G, V100-32G".
    """
    try:
        return parse_gpu_spec(text, gpu_catalog or catalog())
    except UnknownGPUModel as exc:
        if vdc_id is None:
            raise ValidationError(str(exc), code="gpu_spec")
        raise ValidationError(_unknown_in_vdc(exc, vdc_id), code="gpu_spec")
    except GPUSpecError as exc:
        raise ValidationError(str(exc), code="gpu_spec")


def _unknown_in_vdc(exc: UnknownGPUModel, vdc_id: int) -> str:
    from apps.vdc.models import VDC  # the VDC app's models import this module

    vdc = VDC.objects.filter(pk=vdc_id).first()
    names = sorted(
        set(
            Device.objects.filter(node__cluster__vdc=vdc_id, node__cluster__enabled=True)
            .values_list("gpu_model__name", flat=True)
            .distinct()
        )
    )
    if not names:
        return f"unknown GPU model {exc.token!r} in {exc.text!r}; VDC {vdc} has no GPUs (leave the field empty)"
    by_key = {name.lower().replace("-", ""): name for name in names}
    close = difflib.get_close_matches(exc.token.lower().replace("-", ""), list(by_key), n=3, cutoff=0.4)
    if close:
        hint = "did you mean " + " or ".join(by_key[k] for k in close) + "?"
        return f"unknown GPU model {exc.token!r} in {exc.text!r}; {hint} (VDC {vdc} has {', '.join(names)})"
    return f"unknown GPU model {exc.token!r} in {exc.text!r}; VDC {vdc} has {', '.join(names)}"


def set_cluster_enabled(cluster: Cluster, enabled: bool) -> Cluster:
    """Enable or disable a cluster; a disabled cluster keeps its running tasks but takes no new ones."""
    cluster.enabled = enabled
    cluster.save(update_fields=["enabled", "updated_at"])
    return cluster


def set_cluster_maintenance(cluster: Cluster, on: bool) -> Cluster:
    """Put a cluster into maintenance (no new tasks) or back to healthy; health checks then take over."""
    cluster.status = ClusterStatus.MAINTENANCE if on else ClusterStatus.HEALTHY
    cluster.missed_heartbeats = 0
    cluster.status_message = "Maintenance set by an admin" if on else ""
    cluster.save(update_fields=["status", "missed_heartbeats", "status_message", "updated_at"])
    return cluster


def issue_agent_token(cluster: Cluster, node_name: str, name: str = "") -> str:
    """Create a token for the node agent of ``node_name`` in ``cluster`` and return the secret (shown once, stored
    hashed); it reports for that node only."""
    node_name = node_name.strip()
    limit = AgentToken._meta.get_field("node_name").max_length
    if not node_name or len(node_name) > limit:
        raise ValueError(f"Expected a node name of 1 to {limit} characters, got {node_name!r}.")
    secret = secrets.token_urlsafe(32)
    AgentToken.objects.create(
        cluster=cluster,
        node_name=node_name,
        name=(name or node_name)[: AgentToken._meta.get_field("name").max_length],
        key_hash=hashlib.sha256(secret.encode()).hexdigest(),
    )
    return secret


def agent_token(secret: str) -> AgentToken | None:
    """The live agent token (with its cluster) whose secret this is, or None; marks it used."""
    digest = hashlib.sha256(secret.encode()).hexdigest()
    token = AgentToken.objects.select_related("cluster").filter(key_hash=digest, revoked=False).first()
    if token is None:
        return None
    AgentToken.objects.filter(pk=token.pk).update(last_used=timezone.now())
    return token


def match_gpu_model(name: str, vram_gib: float, models: list[GPUModel]) -> GPUModel | None:
    """The catalog model a reported device name means, e.g. "NVIDIA A100-SXM4-80GB" -> A100-80G, "Ascend 910B3" ->
    Ascend910B, "AMD Instinct MI300X" -> MI300X.

    Tries the whole name, then its leading token; an ambiguous alias ("V100") is settled by VRAM.
    """
    gpu_catalog = Catalog(m.as_catalog_entry() for m in models if m.is_rated)
    by_name = {m.name: m for m in models}
    words = model_words(name)
    for candidate in ("-".join(words), words[0] if words else ""):
        names = gpu_catalog.resolve_all(candidate) if candidate else ()
        if names:
            return min((by_name[n] for n in names), key=lambda m: abs(float(m.vram_gib) - vram_gib))
    return None


def _new_model(device: dict, known: list[GPUModel]) -> tuple[GPUModel | None, bool]:
    """The catalog row of a reported model no enabled entry matches: an existing disabled one, or a new unrated
    one (no exchange rate, disabled) that the admin lists as "new model: set its exchange rate"."""
    words = model_words(device["name"])

    def key(text: str) -> str:  # as the GPU spec parser compares names: case, "-", "_" and spaces ignored
        return re.sub(r"[-_ ]", "", text).lower()

    for candidate in ("-".join(words), words[0] if words else ""):
        for model in known:
            if candidate and key(candidate) in {key(model.name), *(key(a) for a in model.aliases)}:
                return model, False
    vendor = vendor_of(device.get("vendor", ""))
    name = new_model_name(device["name"])
    try:
        with transaction.atomic():  # a savepoint: the report goes on without this model if the row cannot be written
            return GPUModel.objects.get_or_create(
                name=name,
                defaults={
                    "vendor": vendor,
                    "aliases": [name.lower()],
                    "vram_gib": Decimal(str(device["vram_total_gib"])),
                    "exchange_rate": None,
                    "enabled": False,
                    **VENDOR_DEFAULTS.get(vendor, VENDOR_DEFAULTS["nvidia"]),
                },
            )
    except (IntegrityError, DataError) as exc:
        log.warning("cannot enter new GPU model %r in the catalog: %s", name, exc)
        return None, False


@transaction.atomic
def apply_node_report(cluster: Cluster, report: dict) -> Node:
    """Upsert the reporting node and its devices from a node agent report (see apps.clusters.detectors).

    Each device is matched to an enabled catalog model and fingerprinted against it: mismatches lower its health
    with a reason. A device of a model the catalog lacks is not added: the model is entered unrated and disabled
    ("new model: set its exchange rate") and the node's agent message names it; once an admin rates and enables
    it, the next report adds the device.

    A reported card is matched to its row by hardware identity (:func:`match_reported_cards`), so a card keeps its
    row (and whoever holds it) when indices shift; a card no longer reported is marked missing, never deleted.
    """
    node, _ = Node.objects.select_for_update().get_or_create(
        cluster=cluster,
        name=report["node"],
        defaults={"cpu": Decimal(report["cpu"]), "memory_gib": Decimal(str(report["memory_gib"]))},
    )
    all_models = list(GPUModel.objects.all())
    # Cards only: a MIG profile or time-sliced replica row is no name a vendor tool reports for a card.
    all_models = [m for m in all_models if not m.partition]
    enabled = [m for m in all_models if m.enabled and m.is_rated]
    notes = [report["message"]] if report.get("message") else []
    now = timezone.now()
    reported = []
    for d in report.get("devices", []):
        model = match_gpu_model(d["name"], d["vram_total_gib"], enabled)
        if model is None:
            model, _ = _new_model(d, [m for m in all_models if not m.enabled])
            if model is None:
                notes.append(
                    f"GPU {d['index']} ({d['name']}) is of a model the catalog lacks and that could not be "
                    "entered; add it in the admin (GPU models)"
                )
            elif model.is_rated:
                notes.append(
                    f"GPU {d['index']} ({d['name']}) is of the disabled model {model.name}; enable it in "
                    "the admin to use it"
                )
            else:
                notes.append(
                    f"GPU {d['index']} ({d['name']}): new model {model.name}: set its exchange rate in the "
                    "admin (GPU models) and enable it; until then the card is not scheduled"
                )
            continue
        reported.append((d, model))
    rows, gone = match_reported_cards(node, [d for d, _model in reported], now)
    notes += [
        f"GPU {device.index} ({device.hardware_id or device.gpu_model}) is no longer reported: marked missing"
        for device in gone
    ]
    scores = []
    for (d, model), device in zip(reported, rows, strict=True):
        fp = fingerprint(d, model, report.get("driver", ""), report.get("runtime", ""))
        device.gpu_model = model
        device.uuid = d["uuid"]
        device.reported_name = d["name"][:128]
        device.vram_gib = Decimal(str(d["vram_total_gib"]))
        device.vram_used_gib = Decimal(str(d["vram_used_gib"]))
        device.utilization = max(0, min(100, int(d["utilization"])))
        device.temperature_c = d.get("temperature_c")
        device.ecc_errors = min(d.get("ecc_uncorrected", 0) + d.get("ecc_corrected", 0), MAX_ERROR_COUNT)
        xids = (device.xid_errors if device.pk else 0) + d.get("xid_errors", 0)
        device.xid_errors = min(xids, MAX_ERROR_COUNT)
        device.health_score = max(0, min(100, int(d.get("health_score", 100)) - fp.penalty))
        device.health_reason = "; ".join([*d.get("health_reasons", []), *fp.reasons])
        device.pci_bus_id = d.get("pci_bus_id", "")
        device.numa_node = d.get("numa_node")
        device.links = d.get("links", [])
        device.memory_bandwidth_gbps = fp.memory_bandwidth_gbps
        device.tflops_fp16 = fp.tflops_fp16
        device.tflops_fp32 = fp.tflops_fp32
        device.figures_source = fp.figures_source
        device.interconnect = fp.interconnect
        device.driver_version = fp.driver_version
        device.runtime_version = fp.runtime_version
        device.save()
        scores.append(device.health_score)
        if fp.reasons:
            notes.append(f"GPU {d['index']} ({model.name}): {'; '.join(fp.reasons)}")
        mig = [MigInstance(m["profile"], m.get("uuid", ""), m.get("gpu_instance_id")) for m in d.get("mig", ())]
        if note := sync_reported_mig(device, bool(d.get("mig_mode")), mig):
            notes.append(note)
        if device.time_slice_replicas:
            # Replicas share the card: each shows the card's figures (NVML has none per replica).
            device.units.update(
                utilization=device.utilization,
                vram_used_gib=device.vram_used_gib,
                temperature_c=device.temperature_c,
                health_score=device.health_score,
            )
    node.cpu = Decimal(report["cpu"])
    node.memory_gib = Decimal(str(report["memory_gib"]))
    node.health_score = min(scores, default=100)
    node.last_report = timezone.now()
    node.agent_message = "; ".join(notes)
    node.save()
    return node


def refuse_deleting_held_card(sender, instance: Device, **kwargs) -> None:
    """A card (or a unit of one) that a job may still hold is never deleted, whatever deletes it (the admin, a
    node's or cluster's deletion): a card that came back would get a new id the scheduler sees as free."""
    held = holders(instance)
    if held:
        tasks = sorted({task for owners in held.values() for task in owners if task is not None})
        who = f"task(s) {', '.join(f'#{task}' for task in tasks)}" if tasks else "a job being cancelled"
        raise DeletionRefused(f"{instance} is held by {who}: it can be deleted once they end.", {instance})


def match_reported_cards(node: Node, reported: list[dict], now) -> tuple[list[Device], list[Device]]:
    """The node's card rows for the cards a report names, in the report's order, and the rows that went missing
    with this report.

    A card is matched by UUID, else PCI bus id, else (a row that has neither, from a backend that only counts
    cards) by index; a card seen for the first time gets a new, unsaved row. Rows not matched are marked missing
    since ``now`` (never deleted: a task may hold them, and a card that comes back is the same row); matched rows
    lose the mark and take their reported index (saved by the caller).
    """
    cards = list(node.devices.cards())
    by_uuid = {d.uuid: d for d in cards if d.uuid}
    by_bus = {d.pci_bus_id: d for d in cards if d.pci_bus_id}
    # A card without identity that comes back at its index is that card (a present one first, should both exist).
    by_index = {d.index: d for d in sorted(cards, key=lambda d: d.missing_since is None) if not d.hardware_id}
    rows: list[Device] = []
    taken: set[int] = set()
    for d in reported:
        uuid, bus = d.get("uuid") or "", d.get("pci_bus_id") or ""
        row = by_uuid.get(uuid) if uuid else None
        row = row or (by_bus.get(bus) if bus else None) or by_index.get(d["index"])
        if row is None or row.pk in taken:
            row = Device(node=node, index=d["index"])
        else:
            taken.add(row.pk)
        rows.append(row)
    gone = [d for d in cards if d.pk not in taken and d.missing_since is None]
    node.devices.filter(pk__in=[d.pk for d in gone]).update(missing_since=now)
    # Indices may move between cards (a card left, the others were renumbered): park the moving rows on indices no
    # card has before each takes its new one, so that no two present cards share an index at any moment.
    moving = [row for row, d in zip(rows, reported, strict=True) if row.pk and row.index != d["index"]]
    for spare, row in enumerate(moving, start=PARKED_INDEX):
        Device.objects.filter(pk=row.pk).update(index=spare)
    for row, d in zip(rows, reported, strict=True):
        row.index, row.missing_since = d["index"], None
    return rows, gone


# Indices no reported card has (reports carry at most 256 cards a node): a card moving to another index waits here.
PARKED_INDEX = 30000


def sync_catalog() -> int:
    """Create the seed GPU models (apps.clusters.catalog) that are missing; existing rows keep admins' edits."""
    from apps.clusters.catalog import GPU_CATALOG  # seed data, read only here

    forget_catalog()
    created = 0
    for entry in GPU_CATALOG:
        defaults = {k: v for k, v in entry.items() if k != "name"}
        defaults["aliases"] = list(entry["aliases"])
        for key in ("vram_gib", "tflops_fp16", "tflops_fp32", "exchange_rate", "memory_bandwidth_gbps"):
            defaults[key] = None if entry.get(key) is None else Decimal(str(entry[key]))
        if not defaults["memory_bandwidth_gbps"]:
            defaults["memory_bandwidth_gbps"] = None  # 0 in the seed data: the vendor publishes none
        _, was_created = GPUModel.objects.get_or_create(name=entry["name"], defaults=defaults)
        created += was_created
    return created


def import_slurm_nodes(cluster: Cluster) -> list[Node]:
    """Create or update a Slurm cluster's nodes and GPUs from what slurmrestd reports (see :func:`discover_nodes`)."""
    return discover_nodes(cluster).nodes


# Node labels that name the GPU product (GPU feature discovery of each vendor's device plugin).
PRODUCT_LABELS = ("nvidia.com/gpu.product", "amd.com/gpu.product-name", "huawei.com/npu.product")


@dataclass
class Discovery:
    """What a discovery found: the nodes it created or updated, nodes the portal has that the backend no longer
    reports (kept: their tasks decide), and what it could not map (an unknown GPU model)."""

    nodes: list[Node] = field(default_factory=list)
    created: int = 0
    gone: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        text = f"{len(self.nodes)} node(s) ({self.created} new), {self.cards} card(s)"
        if self.gone:
            text += f"; not reported any more: {', '.join(self.gone)}"
        return text + "".join(f"; {note}" for note in self.notes)

    @property
    def cards(self) -> int:
        return sum(node.devices.cards().present().count() for node in self.nodes)


def _model_resolver(cluster: Cluster):
    """reported GPU resource (+ the node's labels) -> catalog model, or None: Slurm gres types through the cluster's
    ``slurm-gres.<MODEL>`` labels or the catalog's gres types; Kubernetes resources through the node's product label,
    else the one catalog model of that resource name."""
    models = {m.name: m for m in GPUModel.objects.filter(exchange_rate__isnull=False)}  # unrated: never matched
    by_gres = {
        v: k.removeprefix("slurm-gres.") for k, v in (cluster.labels or {}).items() if k.startswith("slurm-gres.")
    }
    by_gres.update(
        {m.slurm_gres_type: m.name for m in models.values() if m.slurm_gres_type and m.slurm_gres_type not in by_gres}
    )
    by_resource: dict[str, list[GPUModel]] = {}
    for m in models.values():
        by_resource.setdefault(m.resource_name, []).append(m)
    gpu_catalog = catalog()

    def resolve(resource: str, labels: dict) -> GPUModel | None:
        if cluster.cluster_type == ClusterType.SLURM:
            return models.get(by_gres.get(resource, ""))
        candidates = by_resource.get(resource, [])
        for key in PRODUCT_LABELS:
            product = labels.get(key, "").upper().removeprefix("NVIDIA-")
            if not product:
                continue
            # "A100-SXM4-80GB": the family from the first part, the variant from the memory it names.
            named = set(gpu_catalog.resolve_all(product.split("-")[0]))
            fitting = [m for m in candidates if m.name in named]
            sized = [m for m in fitting if m.vram_gib and f"{int(m.vram_gib)}GB" in product.replace("GIB", "GB")]
            if sized or fitting:
                return (sized or fitting)[0]
        return candidates[0] if len(candidates) == 1 else None

    return resolve


def discover_nodes(cluster: Cluster) -> Discovery:
    """Create or update the cluster's nodes (cores, memory) and their cards from what its backend reports.

    Slurm: slurmrestd's nodes and gres; Kubernetes: the nodes' allocatable resources through the official client;
    local: this host (its cards come from the node agent). Cards of a model the portal cannot name are not
    invented: the discovery says so ("new model: add it to the catalog"). Nodes the backend no longer reports
    are listed, not deleted.
    """
    from apps.clusters.backends import executor_for  # backends import this module's models

    reported = executor_for(cluster).nodes()
    resolve = _model_resolver(cluster)
    result = Discovery()
    now = timezone.now()
    with transaction.atomic():
        for entry in reported:
            node, created = Node.objects.update_or_create(
                cluster=cluster,
                name=entry["name"],
                defaults={"cpu": Decimal(str(entry["cpus"])), "memory_gib": Decimal(str(entry["memory_gib"]))},
            )
            result.created += created
            result.nodes.append(node)
            if entry.get("gpus") is None:
                continue  # the backend cannot tell: the node agent reports this node's cards
            counted: list[GPUModel] = []
            for resource, count in sorted(entry["gpus"].items()):
                model = resolve(resource, entry.get("labels") or {})
                if model is None:
                    accelerator = any(word in resource for word in ("gpu", "npu", "dcu", "mlu"))
                    if cluster.cluster_type == ClusterType.SLURM or accelerator:
                        result.notes.append(
                            f"{node.name}: {count} x {resource} of a model the catalog does not name "
                            "(new model: add it to the GPU catalog or label the cluster)"
                        )
                    continue
                counted += [model] * count
            _apply_card_count(node, counted, now, result)
        names = {entry["name"] for entry in reported}
        result.gone = sorted(set(cluster.nodes.values_list("name", flat=True)) - names)
    return result


def _apply_card_count(node: Node, models: list[GPUModel], now, result: Discovery) -> None:
    """A backend that only counts a node's cards: card ``i`` is the row at index ``i``. Cards beyond the count are
    marked missing (a task may still hold them; one that comes back is the same row). A node whose cards carry a
    hardware identity is its node agent's to report: the backend's count is noted, not applied."""
    if node.devices.cards().filter(Q(uuid__gt="") | Q(pci_bus_id__gt="")).exists():
        result.notes.append(
            f"{node.name}: its node agent reports its cards; the backend's count ({len(models)}) is not applied"
        )
        return
    rows, gone = match_reported_cards(node, [{"index": index} for index in range(len(models))], now)
    for row, model in zip(rows, models, strict=True):
        row.gpu_model, row.vram_gib = model, model.vram_gib
        row.save()
    for device in gone:
        result.notes.append(f"{node.name}#{device.index}: not reported by the backend any more: marked missing")
