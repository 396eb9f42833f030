"""Clusters, their nodes and devices, and the GPU model catalog."""

from __future__ import annotations

import re
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from apps.clusters.choices import (
    ClusterStatus,
    ClusterType,
    FiguresSource,
    LinkType,
    NodeStatus,
    ProjectIsolation,
    Vendor,
)
from apps.clusters.crypto import decrypt_json, encrypt_json
from apps.clusters.hostpaths import path_problem
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
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_rated(self) -> bool:
        """False for a new model a node agent found: an admin must set its exchange rate first."""
        return self.exchange_rate is not None

    def clean(self) -> None:
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
                raise ValidationError({"exchange_rate": f"Expected an exchange rate (it was {stored}); a rated "
                                                        "model cannot go back to unrated."})  # fmt: skip

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
        "training tasks keep checkpoints in <root>/<project>/<task uid>. Empty: no checkpoint directory",
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
        help_text="Per project: namespaces and accounts are named <prefix><project>, e.g. hcs-vision",
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


class Device(models.Model):
    """One accelerator on a node, with its health and topology (NUMA, PCI bus, links to peers)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="devices")
    index = models.PositiveSmallIntegerField()
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
    # The fingerprint (seed 004 §4.1): what the agent reported, and the figures the model's catalog entry adds.
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

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="unique_device_index_per_node"),
            models.CheckConstraint(condition=Q(vram_gib__gte=0), name="device_vram_non_negative"),
            models.CheckConstraint(condition=Q(health_score__lte=100), name="device_health_score_lte_100"),
        ]

    def __str__(self) -> str:
        return f"{self.node}#{self.index} ({self.gpu_model})"

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
    """A secret that node agents of one cluster present when they report; only its SHA-256 is stored."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="agent_tokens")
    name = models.CharField(max_length=64, help_text="What the token is for, e.g. the host or rack")
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["cluster__name", "name"]

    def __str__(self) -> str:
        return f"{self.cluster}: {self.name}"
