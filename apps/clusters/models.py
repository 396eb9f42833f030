"""Clusters, their nodes and devices, and the GPU model catalog."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from apps.clusters.catalog import parent_of, time_slice_name, unit_name
from apps.clusters.choices import (
    ClusterStatus,
    ClusterType,
    FiguresSource,
    LinkType,
    NodeStatus,
    Partition,
    ProjectIsolation,
    Sharing,
    Vendor,
)
from apps.clusters.hostpaths import path_problem
from apps.core.crypto import decrypt_json, encrypt_json
from apps.vdc.models import VDC

ZERO = Decimal("0")
_health = [MinValueValidator(0), MaxValueValidator(100)]
MAX_HOST_PATH_PREFIXES = 64


def _validate_labels(value) -> None:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise ValidationError('Expected labels as an object of strings, e.g. {"gpu": "a100", "region": "north"}.')


def validate_host_path_prefixes(value) -> None:
    """Approved host path prefixes: a list of plain absolute paths, never ``/`` itself."""
    if not isinstance(value, list):
        raise ValidationError('Expected a list of absolute path prefixes, e.g. ["/data", "/scratch"].')
    if len(value) > MAX_HOST_PATH_PREFIXES:
        raise ValidationError(f"Expected at most {MAX_HOST_PATH_PREFIXES} host path prefixes, got {len(value)}.")
    for prefix in value:
        problem = path_problem(prefix)
        if problem:
            raise ValidationError(f"Host path prefix {prefix!r}: {problem}.")
        if prefix == "/":
            raise ValidationError("Expected prefixes narrower than / (the node's whole file tree), e.g. /data.")


def validate_checkpoint_root(value: str) -> None:
    """A checkpoint root is a plain absolute directory, never ``/`` itself."""
    problem = path_problem(value)
    if problem:
        raise ValidationError(f"{problem[0].upper()}{problem[1:]}, e.g. /shared/checkpoints.")
    if value == "/":
        raise ValidationError("Expected a directory narrower than /, e.g. /shared/checkpoints.")


class GPUModel(models.Model):
    """A catalog entry: one accelerator model of one vendor and what it is worth.

    The exchange rate turns cards into GPU-equivalents (A100-80G = 1.0), which quotas, fair share
    and prices use, so "8 GPU" means the same on any vendor.
    """

    name = models.CharField(max_length=64, unique=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    aliases = models.JSONField(default=list, blank=True, help_text="Other spellings users type, e.g. a100, 910b")
    vram_gib = models.DecimalField(max_digits=8, decimal_places=2, validators=[MinValueValidator(ZERO)])
    tflops_fp16 = models.DecimalField(
        max_digits=8,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(ZERO)],
        help_text="Dense peak; empty when the vendor publishes none",
    )
    tflops_fp32 = models.DecimalField(
        max_digits=8, decimal_places=2, null=True, blank=True, validators=[MinValueValidator(ZERO)]
    )
    exchange_rate = models.DecimalField(
        max_digits=6,
        decimal_places=3,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.001"))],
        help_text="A100-80G = 1.0; empty: a new model a node agent found, not rated yet (it cannot be enabled)",
    )
    memory_bandwidth_gbps = models.DecimalField(
        "memory bandwidth (GB/s)",
        max_digits=8,
        decimal_places=1,
        null=True,
        blank=True,
        validators=[MinValueValidator(ZERO)],
        help_text="Vendor's published peak; empty when it publishes none",
    )
    resource_name = models.CharField(max_length=64, help_text="Kubernetes extended resource, e.g. nvidia.com/gpu")
    visible_devices_env = models.CharField(max_length=64, help_text="e.g. NVIDIA_VISIBLE_DEVICES")
    slurm_gres_type = models.CharField(max_length=32, blank=True, help_text="gres type on Slurm, e.g. a100")
    shareable = models.BooleanField(default=False, help_text="Supports fractional sharing (vGPU / HAMi)")
    enabled = models.BooleanField(default=True)
    partition = models.CharField(
        max_length=16,
        choices=Partition.choices,
        blank=True,
        default=Partition.CARD,
        help_text="A MIG profile or a time-sliced replica of the parent card model; empty for a card",
    )
    parent_model = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="units",
        help_text="The card model this MIG profile or time-sliced replica is a unit of",
    )
    time_slice_replicas = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="Time-sliced replica: how many replicas share one card"
    )

    class Meta:
        verbose_name = "GPU model"
        ordering = ["vendor", "name"]
        constraints = [
            models.CheckConstraint(condition=Q(exchange_rate__gt=0), name="gpumodel_exchange_rate_positive"),
            # A model nobody has rated yet never prices or schedules anything (it would count as 1.0 or 0).
            models.CheckConstraint(
                condition=Q(enabled=False) | Q(exchange_rate__isnull=False), name="gpumodel_enabled_needs_rate"
            ),
            models.CheckConstraint(
                condition=Q(vram_gib__gte=0)
                & (Q(tflops_fp16__gte=0) | Q(tflops_fp16__isnull=True))
                & (Q(tflops_fp32__gte=0) | Q(tflops_fp32__isnull=True)),
                name="gpumodel_specs_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(partition="", parent_model__isnull=True)
                | (~Q(partition="") & Q(parent_model__isnull=False)),
                name="gpumodel_unit_has_parent",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_rated(self) -> bool:
        """False for a new model a node agent found: an admin must set its exchange rate first."""
        return self.exchange_rate is not None

    def clean(self) -> None:
        if self.partition and self.parent_model_id and parent_of(self.name, self.partition) != self.parent_model.name:
            raise ValidationError(
                {
                    "name": f"Expected the name of a unit of {self.parent_model.name}, such as "
                    f"{unit_name(self.parent_model.name, '1g.10gb')} or "
                    f"{time_slice_name(self.parent_model.name, 4)}."
                }
            )
        if not isinstance(self.aliases, list) or not all(isinstance(a, str) for a in self.aliases):
            raise ValidationError({"aliases": 'Expected a list of strings, e.g. ["a100", "a100-80g"].'})
        if self.exchange_rate is None and self.enabled:
            raise ValidationError(
                {"exchange_rate": "New model: set its exchange rate (A100-80G = 1.0) before enabling it."}
            )
        if self.exchange_rate is None and self.pk:
            stored = GPUModel.objects.filter(pk=self.pk).values_list("exchange_rate", flat=True).first()
            if stored is not None:
                # Its cards, prices and placements already count in GPU-equivalents: a rate can change, not vanish.
                raise ValidationError(
                    {
                        "exchange_rate": f"Expected an exchange rate (it was {stored}); a rated "
                        "model cannot go back to unrated."
                    }
                )

    def as_catalog_entry(self) -> dict:
        """The plain dict the GPU spec parser and the engine read."""
        return {
            "name": self.name,
            "vendor": self.vendor,
            "aliases": list(self.aliases),
            "vram_gib": self.vram_gib,
            "tflops_fp16": self.tflops_fp16,
            "tflops_fp32": self.tflops_fp32,
            "exchange_rate": self.exchange_rate,
            "shareable": self.shareable,
            "resource_name": self.resource_name,
            "visible_devices_env": self.visible_devices_env,
            "slurm_gres_type": self.slurm_gres_type,
            "partition": self.partition,
            "parent": parent_of(self.name, self.partition),
            "replicas": self.time_slice_replicas or 0,
        }


# A Kubernetes namespace name (DNS-1123 label).
_NAMESPACE_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def validate_namespaces(value) -> None:
    """Enrolled namespaces: a list of distinct Kubernetes namespace names."""
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ValidationError('Expected a list of namespace names, e.g. ["team-a", "research"].')
    for name in value:
        if not _NAMESPACE_RE.match(name):
            raise ValidationError(
                f"Namespace {name!r}: expected a DNS label (lowercase letters, digits and '-', at most 63)."
            )
    if len(set(value)) != len(value):
        raise ValidationError("Expected each namespace once.")


# What project namespaces (Kubernetes) and accounts (Slurm) are named from: <prefix><project>.
_ISOLATION_PREFIX_RE = re.compile(r"^[a-z][-a-z0-9]{0,19}$")


def validate_isolation_prefix(value: str) -> None:
    """A prefix of per-project namespace / account names: a lowercase letter, then letters, digits or '-'."""
    if not _ISOLATION_PREFIX_RE.match(value):
        raise ValidationError(
            f"Expected a prefix of 1 to 20 lowercase letters, digits or '-', starting with a letter (e.g. hcs-), "
            f"got {value!r}."
        )


class ClusterQuerySet(models.QuerySet):
    def schedulable(self) -> ClusterQuerySet:
        """Clusters that take new tasks: enabled, and healthy or degraded."""
        return self.filter(enabled=True, status__in=[ClusterStatus.HEALTHY, ClusterStatus.DEGRADED])


class Cluster(models.Model):
    """A physical cluster (Kubernetes, Slurm or local processes) that belongs to one VDC.

    Credentials (tokens, kubeconfig, JWT) are encrypted at rest and write-only: set them with
    :meth:`set_credentials`, read them only inside executors via :meth:`get_credentials`.
    """

    vdc = models.ForeignKey(VDC, on_delete=models.PROTECT, related_name="clusters", verbose_name="VDC")
    name = models.SlugField(max_length=64)
    description = models.TextField(blank=True)
    cluster_type = models.CharField(max_length=16, choices=ClusterType.choices)
    endpoint = models.CharField(max_length=255, blank=True, help_text="API URL; empty for local clusters")
    api_version = models.CharField(max_length=16, blank=True, help_text="Slurm REST API version, e.g. v0.0.38")
    credentials_encrypted = models.TextField(blank=True, editable=False)
    namespace = models.CharField(max_length=64, blank=True, help_text="Kubernetes namespace or Slurm partition")
    status = models.CharField(max_length=16, choices=ClusterStatus.choices, default=ClusterStatus.UNKNOWN)
    status_message = models.TextField(blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    missed_heartbeats = models.PositiveIntegerField(default=0)
    unknown_grace_s = models.PositiveIntegerField(
        default=300,
        validators=[MinValueValidator(1)],
        verbose_name="grace period when unreachable (s)",
        help_text="How long after the last answer of an unavailable cluster its running tasks stay unknown (holding "
        "their cards, neither requeued nor cancelled) before they are requeued (docs/control.md)",
    )
    enabled = models.BooleanField(default=True, help_text="Off: takes no new tasks")
    priority = models.IntegerField(default=0)
    weight = models.DecimalField(
        max_digits=6, decimal_places=2, default=Decimal("1"), validators=[MinValueValidator(ZERO)]
    )
    cost_weight = models.DecimalField(
        max_digits=6, decimal_places=2, default=Decimal("1"), validators=[MinValueValidator(ZERO)]
    )
    labels = models.JSONField(default=dict, blank=True, validators=[_validate_labels])
    max_tasks_per_user = models.PositiveIntegerField(null=True, blank=True)
    max_total_tasks = models.PositiveIntegerField(null=True, blank=True)
    allowed_host_paths = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_host_path_prefixes],
        help_text="Node directories tasks may mount as host paths (this path or below it), e.g. /data; empty: none",
    )
    checkpoint_root = models.CharField(
        max_length=255,
        blank=True,
        validators=[validate_checkpoint_root],
        help_text="Slurm: a directory shared by every node (and mounted at the same path on the portal host); "
        "training tasks keep checkpoints in ROOT/PROJECT/TASK-UID. Empty: no checkpoint directory",
    )
    checkpoint_storage_class = models.CharField(
        max_length=253,
        blank=True,
        help_text="Kubernetes: storage class of each training task's checkpoint volume; empty: the cluster's default",
    )
    checkpoint_size_gib = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text="Kubernetes: size of each training task's checkpoint volume (GiB); empty: no checkpoint volume",
    )
    webhook_namespaces = models.JSONField(
        default=list,
        blank=True,
        validators=[validate_namespaces],
        help_text="Kubernetes: namespaces whose pods the admission webhook injects the vendor runtime into, "
        "whoever creates them (docs/kubernetes.md); empty: none",
    )
    project_isolation = models.CharField(
        max_length=16,
        choices=ProjectIsolation.choices,
        default=ProjectIsolation.SHARED,
        help_text="Kubernetes: a namespace per project with a ResourceQuota mirroring its quota; Slurm: an account "
        "per project with GrpTRES (needs Slurm accounting). Shared: every project in the cluster's namespace / "
        "the submitting user's default account",
    )
    isolation_prefix = models.CharField(
        max_length=20,
        default="hcs-",
        validators=[validate_isolation_prefix],
        help_text="Per project: namespaces and accounts are named PREFIX followed by the project, e.g. hcs-vision",
    )
    # SHA-256 of the token the cluster's API server presents to the admission webhook; empty: webhook off.
    webhook_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = ClusterQuerySet.as_manager()

    class Meta:
        ordering = ["vdc__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["vdc", "name"], name="unique_cluster_name_per_vdc"),
            models.CheckConstraint(
                condition=Q(weight__gte=0) & Q(cost_weight__gte=0), name="cluster_weights_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def set_credentials(self, value: dict) -> None:
        """Encrypt and keep credentials (e.g. {"token": ...}); call save() afterwards."""
        self.credentials_encrypted = encrypt_json(value)

    def get_credentials(self) -> dict:
        """Decrypted credentials, for executors only."""
        return decrypt_json(self.credentials_encrypted)

    @property
    def has_credentials(self) -> bool:
        return bool(self.credentials_encrypted)

    @property
    def is_schedulable(self) -> bool:
        return self.enabled and self.status in (ClusterStatus.HEALTHY, ClusterStatus.DEGRADED)

    def clean(self) -> None:
        if self.cluster_type in (ClusterType.KUBERNETES, ClusterType.SLURM) and not self.endpoint:
            raise ValidationError(
                {"endpoint": f"Expected the API URL of the {self.get_cluster_type_display()} cluster."}
            )
        if self.cluster_type == ClusterType.SLURM and not self.namespace:
            raise ValidationError({"namespace": "Expected the Slurm partition jobs go to."})
        if self.project_isolation == ProjectIsolation.PER_PROJECT and self.cluster_type == ClusterType.LOCAL:
            raise ValidationError(
                {"project_isolation": "Expected shared on a local cluster: it has no namespaces or accounts."}
            )


class Node(models.Model):
    """A machine of a cluster: its cpu and memory, labels and health as its agent last reported."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    name = models.CharField(max_length=128)
    cpu = models.DecimalField(max_digits=8, decimal_places=2, validators=[MinValueValidator(ZERO)])
    memory_gib = models.DecimalField(max_digits=10, decimal_places=2, validators=[MinValueValidator(ZERO)])
    labels = models.JSONField(default=dict, blank=True, validators=[_validate_labels])
    status = models.CharField(
        max_length=16, choices=NodeStatus.choices, default=NodeStatus.READY, help_text="Set by admins"
    )
    # What the cluster's own scheduler says of the node, read at every health check (empty: it says nothing).
    backend_state = models.CharField(max_length=16, choices=NodeStatus.choices, blank=True)
    backend_reason = models.CharField(max_length=255, blank=True)
    health_score = models.PositiveSmallIntegerField(default=100, validators=_health)
    last_report = models.DateTimeField(null=True, blank=True)
    agent_message = models.TextField(blank=True)

    class Meta:
        ordering = ["cluster__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="unique_node_name_per_cluster"),
            models.CheckConstraint(condition=Q(cpu__gte=0) & Q(memory_gib__gte=0), name="node_capacity_non_negative"),
            models.CheckConstraint(condition=Q(health_score__lte=100), name="node_health_score_lte_100"),
        ]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def effective_status(self) -> str:
        """What scheduling obeys: the worse of the admins' status and the backend's (down > draining > ready)."""
        return effective_node_status(self.status, self.backend_state)


_NODE_SEVERITY = {NodeStatus.READY: 0, NodeStatus.DRAINING: 1, NodeStatus.DOWN: 2}


def effective_node_status(admin_status: str, backend_state: str) -> str:
    """The worse of an admin-set node status and the backend's view of the node."""
    return max((admin_status, backend_state or NodeStatus.READY), key=lambda s: _NODE_SEVERITY.get(s, 0))


class DeviceQuerySet(models.QuerySet):
    def cards(self) -> DeviceQuerySet:
        """Physical cards: what a node has, whatever it is partitioned into."""
        return self.filter(parent__isnull=True)

    def units(self) -> DeviceQuerySet:
        """What the scheduler places work on: whole cards, MIG instances and time-sliced replicas (a partitioned
        card itself is not offered); summing their exchange rates gives capacity in GPU-equivalents."""
        return self.filter(sharing=Sharing.WHOLE)  # a unit is never partitioned itself

    def present(self) -> DeviceQuerySet:
        """Devices their node still reports (a unit: its card is reported): what capacity counts."""
        return self.filter(missing_since__isnull=True, parent__missing_since__isnull=True)

    def missing(self) -> DeviceQuerySet:
        """Cards (and the units of cards) their node's agent or backend stopped reporting."""
        return self.filter(Q(missing_since__isnull=False) | Q(parent__missing_since__isnull=False))


class Device(models.Model):
    """One accelerator on a node, with its health and topology (NUMA, PCI bus, links to peers).

    A card partitioned into MIG instances or time-sliced replicas (``sharing``) has one child Device per unit
    (``parent``, ``slot``), of the unit's catalog model; the scheduler places work on the children only.

    A card is known by what the hardware says (its UUID, else its PCI bus id), not by its index in a report: a
    card its node stops reporting is marked missing (``missing_since``), never deleted while held, and is the
    same row when it comes back (docs/rules.md, "Cards").
    """

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField(help_text="The card's index on its node (a unit: its card's)")
    parent = models.ForeignKey(
        "self",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="units",
        editable=False,
        help_text="The card this MIG instance or time-sliced replica is part of",
    )
    slot = models.PositiveSmallIntegerField(
        null=True, blank=True, editable=False, help_text="A unit: its MIG GPU instance id or replica number"
    )
    sharing = models.CharField(max_length=16, choices=Sharing.choices, default=Sharing.WHOLE, editable=False)
    time_slice_replicas = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    gpu_model = models.ForeignKey(GPUModel, on_delete=models.PROTECT, related_name="devices")
    uuid = models.CharField(max_length=96, blank=True)
    vram_gib = models.DecimalField(max_digits=8, decimal_places=2, validators=[MinValueValidator(ZERO)])
    health_score = models.PositiveSmallIntegerField(default=100, validators=_health)
    numa_node = models.SmallIntegerField(null=True, blank=True)
    pci_bus_id = models.CharField(max_length=32, blank=True)
    links = models.JSONField(
        default=list, blank=True, help_text='Peers: [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 600}]'
    )
    vram_used_gib = models.DecimalField(max_digits=8, decimal_places=2, default=ZERO)
    utilization = models.PositiveSmallIntegerField(default=0, validators=_health, help_text="Percent")
    temperature_c = models.SmallIntegerField(null=True, blank=True)
    ecc_errors = models.PositiveIntegerField(default=0)
    xid_errors = models.PositiveIntegerField(default=0)
    health_reason = models.TextField(
        blank=True, help_text="Why the health score is below 100: the agent's signals and catalog mismatches"
    )
    # The fingerprint (docs/rules.md#cards): what the agent reported, and the figures the model's catalog entry adds.
    reported_name = models.CharField(max_length=128, blank=True, help_text="Model name as the vendor tool reports it")
    driver_version = models.CharField(max_length=64, blank=True)
    runtime_version = models.CharField(max_length=64, blank=True, help_text="CUDA, CANN, ROCm / DTK release")
    memory_bandwidth_gbps = models.DecimalField(
        "memory bandwidth (GB/s)", max_digits=8, decimal_places=1, null=True, blank=True
    )
    tflops_fp16 = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    tflops_fp32 = models.DecimalField(max_digits=8, decimal_places=2, null=True, blank=True)
    figures_source = models.CharField(
        max_length=16,
        choices=FiguresSource.choices,
        blank=True,
        help_text="Where bandwidth and TFLOPS come from: the catalog entry or the agent's measurement",
    )
    interconnect = models.CharField(max_length=32, blank=True, help_text="Links to peers, e.g. nvlink, hccs, pcie")
    missing_since = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="When its node's agent or backend stopped reporting it: a missing card takes no new work, and "
        "a task holding it keeps it until the task ends",
    )

    objects = DeviceQuerySet.as_manager()

    class Meta:
        ordering = ["node__name", "index", "slot"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=Q(parent__isnull=True, missing_since__isnull=True),
                name="unique_device_index_per_node",
            ),
            models.UniqueConstraint(fields=["parent", "slot"], name="unique_unit_slot_per_card"),
            models.CheckConstraint(condition=Q(vram_gib__gte=0), name="device_vram_non_negative"),
            models.CheckConstraint(condition=Q(health_score__lte=100), name="device_health_score_lte_100"),
        ]

    def __str__(self) -> str:
        if self.parent_id:
            return f"{self.node}#{self.index}/{self.slot} ({self.gpu_model})"
        return f"{self.node}#{self.index} ({self.gpu_model})"

    @property
    def hardware_id(self) -> str:
        """What identifies the card whatever its index: its UUID, else its PCI bus id (empty when neither is
        known, e.g. a card a backend only counts)."""
        return self.uuid or self.pci_bus_id

    @property
    def is_missing(self) -> bool:
        return self.missing_since is not None

    def clean(self) -> None:
        if self.gpu_model_id and not self.gpu_model.is_rated:
            raise ValidationError(
                {"gpu_model": f"New model {self.gpu_model}: set its exchange rate in the GPU catalog first."}
            )
        links = self.links
        expected = 'Expected links as a list like [{"peer": 1, "type": "nvlink", "bandwidth_gbps": 600}].'
        if not isinstance(links, list):
            raise ValidationError({"links": expected})
        for link in links:
            if not isinstance(link, dict) or not isinstance(link.get("peer"), int):
                raise ValidationError({"links": expected})
            if link.get("type") not in LinkType.values:
                raise ValidationError(
                    {"links": f"Expected a link type of {', '.join(LinkType.values)}, got {link.get('type')!r}."}
                )


class AgentToken(models.Model):
    """A secret that the node agent of one node presents when it reports; only its SHA-256 is stored.

    A token reports for its ``node_name`` alone. Tokens issued before tokens were scoped to a node have none
    and are refused with a message saying to issue one per node (docs/node-agent.md).
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="agent_tokens")
    node_name = models.CharField(
        max_length=128, blank=True, help_text="The one node this token reports for (empty: an old cluster-wide token)"
    )
    name = models.CharField(max_length=64, help_text="What the token is for, e.g. the host or rack")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["cluster__name", "name"]

    def __str__(self) -> str:
        return f"{self.cluster}/{self.node_name or '*'}: {self.name}"


class CapacityReservationQuerySet(models.QuerySet):
    WINDOWS = ("current", "upcoming", "ended", "active")

    def in_window(self, window: str, now) -> CapacityReservationQuerySet:
        """Reservations ``window`` at ``now``: current, upcoming, ended, or active (current or upcoming)."""
        match window:
            case "current":
                return self.filter(starts_at__lte=now, ends_at__gt=now)
            case "upcoming":
                return self.filter(starts_at__gt=now)
            case "ended":
                return self.filter(ends_at__lte=now)
            case "active":
                return self.filter(ends_at__gt=now)
        raise ValueError(f"expected a window of {', '.join(self.WINDOWS)}, got {window!r}")

    def current_and_upcoming(self, now) -> CapacityReservationQuerySet:
        """Reservations that have not ended, soonest first."""
        return self.filter(ends_at__gt=now).order_by("starts_at", "ends_at", "pk")


class CapacityReservation(models.Model):
    """Capacity an admin holds back for a time window, which the scheduler leaves free: maintenance (nobody
    may use it) or an event (only the listed projects may).

    It lives with the clusters because it holds their nodes and cards; the clusters app already depends on
    the VDC app (VDC, Project), never the reverse. What is held: the named nodes whole; else the amount
    (cards of a GPU model, or GPU-equivalents, with cpu / memory optional) as whole nodes the scheduler picks;
    else every node of the cluster (or of the VDC when no cluster is named).
    """

    vdc = models.ForeignKey(VDC, on_delete=models.CASCADE, related_name="capacity_reservations", verbose_name="VDC")
    cluster = models.ForeignKey(
        Cluster,
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="capacity_reservations",
        help_text="Empty: the clusters of the whole VDC",
    )
    nodes = models.ManyToManyField(
        Node,
        blank=True,
        related_name="capacity_reservations",
        help_text="Held whole; empty: the amount below, or (no amount) every node of the cluster / VDC",
    )
    name = models.CharField(max_length=128)
    reason = models.TextField(blank=True, help_text="Why, as the VDC's users read it on the queue pages")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    gpu_model = models.ForeignKey(
        GPUModel,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="capacity_reservations",
        help_text="With cards: hold this many cards of this model",
    )
    cards = models.PositiveIntegerField(default=0, help_text="Cards of the GPU model to hold (0: none)")
    gpu = models.DecimalField(
        max_digits=10,
        decimal_places=3,
        default=ZERO,
        validators=[MinValueValidator(ZERO)],
        help_text="GPU-equivalents to hold, any model (0: none); instead of cards",
    )
    cpu = models.DecimalField(
        max_digits=10, decimal_places=2, default=ZERO, validators=[MinValueValidator(ZERO)], help_text="CPU cores"
    )
    memory_gib = models.DecimalField(
        max_digits=12, decimal_places=2, default=ZERO, validators=[MinValueValidator(ZERO)], help_text="Memory (GiB)"
    )
    projects = models.ManyToManyField(
        "vdc.Project",
        blank=True,
        related_name="capacity_reservations",
        help_text="Projects that may use the held capacity (an event); empty: nobody (maintenance)",
    )
    lead_time = models.DurationField(
        default=timedelta(days=1),
        help_text="Tasks with neither a wall-time limit nor an expected duration keep off the held capacity from "
        "this long before the start",
    )
    preempt_at_start = models.BooleanField(
        default=False,
        help_text="Drain: preempt preemptible medium and low work of other projects on the held nodes when the "
        "window starts (off: running work runs on)",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = CapacityReservationQuerySet.as_manager()

    class Meta:
        ordering = ["starts_at", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=F("starts_at")), name="reservation_ends_after_start"),
            models.CheckConstraint(
                condition=Q(gpu__gte=0) & Q(cpu__gte=0) & Q(memory_gib__gte=0), name="reservation_amounts_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def holds_amount(self) -> bool:
        return bool(self.cards or self.gpu or self.cpu or self.memory_gib)

    @property
    def is_maintenance(self) -> bool:
        """Nobody may use it (no project listed); needs a saved row (reads prefetched projects)."""
        return not self.projects.all()

    def state(self, now) -> str:
        """ "current", "upcoming" or "ended" at ``now``."""
        if self.ends_at <= now:
            return "ended"
        return "current" if self.starts_at <= now else "upcoming"

    def held_summary(self) -> str:
        """What is held, in words (for lists and the queue pages)."""
        where = self.cluster.name if self.cluster_id else "every cluster"
        named = sorted(n.name for n in self.nodes.all()) if self.pk else []
        if named:
            return f"nodes {', '.join(named)}"
        parts = []
        if self.cards:
            parts.append(f"{self.cards} × {self.gpu_model.name if self.gpu_model_id else '?'}")
        if self.gpu:
            parts.append(f"{self.gpu.normalize():f} GPU-equivalents")
        if self.cpu:
            parts.append(f"{self.cpu.normalize():f} CPU")
        if self.memory_gib:
            parts.append(f"{self.memory_gib.normalize():f} GiB memory")
        if not parts:
            return f"all nodes of {where}" if self.cluster_id else "all nodes of the VDC"
        return f"{', '.join(parts)} on {where} (whole nodes)"

    def capacity(self) -> dict[str, Decimal]:
        """What the scope (the cluster, or the whole VDC) has: cards of the chosen model, GPU-equivalents,
        cpu and memory."""
        nodes = Node.objects.filter(cluster__vdc_id=self.vdc_id)
        if self.cluster_id:
            nodes = nodes.filter(cluster_id=self.cluster_id)
        totals = nodes.aggregate(cpu=models.Sum("cpu"), memory_gib=models.Sum("memory_gib"))
        devices = Device.objects.filter(node__in=nodes)
        gpu = devices.aggregate(total=models.Sum("gpu_model__exchange_rate"))["total"]
        cards = devices.filter(gpu_model_id=self.gpu_model_id).count() if self.gpu_model_id else 0
        return {
            "cards": Decimal(cards),
            "gpu": gpu or ZERO,
            "cpu": totals["cpu"] or ZERO,
            "memory_gib": totals["memory_gib"] or ZERO,
        }

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            errors["ends_at"] = f"Expected an end after the start ({self.starts_at.isoformat()})."
        if self.cluster_id and self.vdc_id and self.cluster.vdc_id != self.vdc_id:
            errors["cluster"] = f"Expected a cluster of VDC {self.vdc}; {self.cluster} belongs to {self.cluster.vdc}."
        if self.cards and not self.gpu_model_id:
            errors["gpu_model"] = "Expected the GPU model whose cards are held."
        if self.gpu_model_id and not self.cards:
            errors["cards"] = f"Expected how many {self.gpu_model.name} cards to hold."
        if self.cards and self.gpu:
            errors["gpu"] = "Hold either cards of a model or GPU-equivalents, not both."
        if self.lead_time is not None and self.lead_time < timedelta(0):
            errors["lead_time"] = "Expected a lead time of 0 or more."
        if not errors and self.vdc_id and self.holds_amount:
            have = self.capacity()
            scope = f"cluster {self.cluster}" if self.cluster_id else f"VDC {self.vdc}"
            asked = {"cards": Decimal(self.cards), "gpu": self.gpu, "cpu": self.cpu, "memory_gib": self.memory_gib}
            units = {
                "cards": f"{self.gpu_model.name} cards" if self.gpu_model_id else "cards",
                "gpu": "GPU-equivalents",
                "cpu": "CPU cores",
                "memory_gib": "GiB of memory",
            }
            for key, amount in asked.items():
                if amount and amount > have[key]:
                    errors[key] = f"Expected at most {have[key].normalize():f} {units[key]} (what {scope} has)."
        if errors:
            raise ValidationError(errors)

    def clean_nodes(self, nodes) -> None:
        """Rules on the node list (a many-to-many, so forms and serializers call this with the chosen nodes)."""
        nodes = list(nodes)
        if not nodes:
            return
        if self.holds_amount:
            raise ValidationError({"nodes": "Hold either named nodes or an amount, not both."})
        for n in nodes:
            if self.cluster_id and n.cluster_id != self.cluster_id:
                raise ValidationError({"nodes": f"Expected nodes of cluster {self.cluster}; {n} is not."})
            if n.cluster.vdc_id != self.vdc_id:
                raise ValidationError({"nodes": f"Expected nodes of VDC {self.vdc}; {n} is not."})
