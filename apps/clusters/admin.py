"""Admin for clusters, nodes, devices and the GPU model catalog."""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import OuterRef
from django.utils import timezone

from apps.clusters import partitions, services
from apps.clusters.admin_forms import (
    CapacityReservationAdminForm,
    ClusterAdminForm,
    DeviceAdminForm,
    GPUModelAdminForm,
    NodeAdminForm,
)
from apps.clusters.choices import SUB_HEALTHY_SCORE, UNHEALTHY_SCORE, ClusterStatus, NodeStatus
from apps.clusters.executors.base import ExecutorError
from apps.clusters.models import CapacityReservation, Cluster, Device, GPUModel, Node
from apps.core.admin_helpers import GREEN, GREY, ORANGE, RED, avg_of, badge, count_of, number, sum_of
from apps.tasks.choices import ACTIVE
from apps.tasks.models import Task

CLUSTER_COLOURS = {
    ClusterStatus.HEALTHY: GREEN,
    ClusterStatus.DEGRADED: ORANGE,
    ClusterStatus.UNAVAILABLE: RED,
    ClusterStatus.MAINTENANCE: GREY,
    ClusterStatus.UNKNOWN: GREY,
}
NODE_COLOURS = {NodeStatus.READY: GREEN, NodeStatus.DRAINING: ORANGE, NodeStatus.DOWN: RED}


def health_badge(score: int | None):
    """A 0-100 health score coloured by the placement thresholds (sub-healthy, unhealthy)."""
    if score is None:
        return "-"
    colour = GREEN if score >= SUB_HEALTHY_SCORE else ORANGE if score > UNHEALTHY_SCORE else RED
    return badge(str(score), colour)


class NodeInline(admin.TabularInline):
    model = Node
    fields = ("name", "cpu", "memory_gib", "status", "health_score", "last_report")
    readonly_fields = ("last_report",)
    extra = 0
    show_change_link = True


@admin.register(Cluster)
class ClusterAdmin(admin.ModelAdmin):
    form = ClusterAdminForm
    list_display = (
        "name",
        "vdc",
        "cluster_type",
        "status_badge",
        "enabled",
        "node_count",
        "gpu_count",
        "capacity_gpu",
        "allocated_gpu",
        "card_utilisation",
        "running_tasks",
        "last_heartbeat",
    )
    list_filter = ("vdc", "cluster_type", "status", "enabled", "project_isolation")
    search_fields = ("name", "description", "endpoint", "namespace", "vdc__name")
    list_select_related = ("vdc",)
    autocomplete_fields = ("vdc",)
    inlines = (NodeInline,)
    actions = ("check_now", "discover", "enable", "disable", "maintenance_on", "maintenance_off")
    readonly_fields = (
        "credentials_state",
        "status",
        "status_message",
        "last_heartbeat",
        "missed_heartbeats",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("vdc", "name", "description", "cluster_type", "enabled")}),
        ("Connection", {"fields": ("endpoint", "api_version", "namespace")}),
        (
            "Credentials",
            {
                "fields": (
                    "credentials_state",
                    "token",
                    "user",
                    "kubeconfig",
                    "ca_cert",
                    "verify_ssl",
                    "other_credentials",
                    "clear_credentials",
                ),
                "description": "Write-only and encrypted at rest: values are never shown. A filled field replaces "
                "that key; empty fields keep what is stored.",
            },
        ),
        (
            "Scheduling",
            {"fields": ("priority", "weight", "cost_weight", "labels", "max_tasks_per_user", "max_total_tasks")},
        ),
        ("Volumes", {"fields": ("allowed_host_paths",)}),
        (
            "Project isolation",
            {
                "fields": ("project_isolation", "isolation_prefix"),
                "description": "Per project: each project gets its own Kubernetes namespace with a ResourceQuota, "
                "or its own Slurm account with GrpTRES, both mirroring its quota in this VDC and kept in step when "
                "the quota changes (docs/kubernetes.md, docs/slurm.md).",
            },
        ),
        (
            "Admission webhook",
            {
                "fields": ("webhook_namespaces",),
                "description": "Kubernetes: pods created in these namespaces by anyone get the vendor runtime "
                "injected; the token the API server presents comes from manage.py webhook_token "
                "(docs/kubernetes.md).",
            },
        ),
        (
            "Checkpoints",
            {
                "fields": ("checkpoint_root", ("checkpoint_storage_class", "checkpoint_size_gib")),
                "description": "Where training tasks keep the checkpoint directory that survives their requeues on "
                "this cluster: a shared root on Slurm, a volume per task on Kubernetes (local clusters keep it "
                "under their job directory). It is removed when the task is deleted.",
            },
        ),
        (
            "Health",
            {
                "fields": ("status", "status_message", "last_heartbeat", "missed_heartbeats", "unknown_grace_s"),
                "description": "Written by the health checks; use the maintenance actions of the list to change it. "
                "The grace period is how long the running tasks of an unreachable cluster stay unknown before they "
                "are requeued (docs/control.md).",
            },
        ),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request):
        tasks = Task.objects.filter(cluster=OuterRef("pk"), status__in=ACTIVE)
        devices = Device.objects.cards().filter(node__cluster=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_nodes=count_of(Node.objects.filter(cluster=OuterRef("pk"))),
                n_gpus=count_of(devices),
                cap_gpu=sum_of(Device.objects.units().filter(node__cluster=OuterRef("pk")), "gpu_model__exchange_rate"),
                card_util=avg_of(devices, "utilization"),
                used_gpu=sum_of(tasks, "allocated_gpu"),
                n_running=count_of(tasks),
            )
        )

    @admin.display(description="Status", ordering="status")
    def status_badge(self, obj):
        return badge(obj.get_status_display(), CLUSTER_COLOURS.get(obj.status, GREY))

    @admin.display(description="Nodes", ordering="n_nodes")
    def node_count(self, obj) -> int:
        return obj.n_nodes

    @admin.display(description="GPUs", ordering="n_gpus")
    def gpu_count(self, obj) -> int:
        return obj.n_gpus

    @admin.display(description="GPU-eq", ordering="cap_gpu")
    def capacity_gpu(self, obj) -> str:
        return number(obj.cap_gpu)

    @admin.display(description="Allocated GPU-eq", ordering="used_gpu")
    def allocated_gpu(self, obj) -> str:
        return number(obj.used_gpu)

    @admin.display(description="Card utilisation", ordering="card_util")
    def card_utilisation(self, obj) -> str:
        return f"{number(obj.card_util, 0)}%" if obj.n_gpus else "-"

    @admin.display(description="Running tasks", ordering="n_running")
    def running_tasks(self, obj) -> int:
        return obj.n_running

    @admin.display(description="Stored credentials")
    def credentials_state(self, obj) -> str:
        """Which keys are stored, never their values."""
        if not obj.has_credentials:
            return "not set"
        try:
            keys = sorted(obj.get_credentials())
        except ValueError:
            return "set, but unreadable: HCS_CREDENTIALS_KEY changed since they were saved"
        return f"set ({', '.join(keys)})"

    def _apply(self, request, queryset, change, done: str) -> None:
        """Run a cluster service on each selected cluster, log it on the cluster's history, report the count."""
        clusters = list(queryset)
        for cluster in clusters:
            change(cluster)
            self.log_change(request, cluster, done)
        self.message_user(request, f"{len(clusters)} cluster(s) {done}.", messages.SUCCESS)

    @admin.action(description="Test connection: health-check selected clusters now", permissions=["change"])
    def check_now(self, request, queryset) -> None:
        """The control plane's health check, run at once: the backend's answer (or error) for each cluster."""
        from apps.control.health import check_cluster_health  # control builds on clusters

        for cluster in queryset:
            checked = check_cluster_health(cluster)
            level = messages.SUCCESS if checked.status == ClusterStatus.HEALTHY else messages.WARNING
            text = f"{checked.name}: {checked.get_status_display()}: {checked.status_message or 'no message'}"
            self.message_user(request, text, level)
            self.log_change(request, checked, f"health checked: {checked.get_status_display()}")

    @admin.action(description="Discover nodes: read nodes and cards from the backend now", permissions=["change"])
    def discover(self, request, queryset) -> None:
        for cluster in queryset:
            try:
                found = services.discover_nodes(cluster)
            except ExecutorError as exc:
                self.message_user(request, f"{cluster.name}: nodes could not be read: {exc}", messages.ERROR)
                continue
            level = messages.WARNING if found.notes or found.gone else messages.SUCCESS
            self.message_user(request, f"{cluster.name}: {found.summary()}", level)
            self.log_change(request, cluster, f"nodes discovered: {found.summary()}")

    @admin.action(description="Enable selected clusters", permissions=["change"])
    def enable(self, request, queryset) -> None:
        self._apply(request, queryset, lambda c: services.set_cluster_enabled(c, True), "enabled")

    @admin.action(description="Disable selected clusters (no new tasks)", permissions=["change"])
    def disable(self, request, queryset) -> None:
        self._apply(request, queryset, lambda c: services.set_cluster_enabled(c, False), "disabled")

    @admin.action(description="Put selected clusters into maintenance", permissions=["change"])
    def maintenance_on(self, request, queryset) -> None:
        self._apply(request, queryset, lambda c: services.set_cluster_maintenance(c, True), "put into maintenance")

    @admin.action(description="Take selected clusters out of maintenance", permissions=["change"])
    def maintenance_off(self, request, queryset) -> None:
        self._apply(request, queryset, lambda c: services.set_cluster_maintenance(c, False), "taken out of maintenance")


class DeviceInline(admin.TabularInline):
    model = Device
    form = DeviceAdminForm
    fields = (
        "index",
        "gpu_model",
        "vram_gib",
        "health_score",
        "numa_node",
        "pci_bus_id",
        "links",
        "utilization",
        "missing_since",
    )
    readonly_fields = ("utilization", "missing_since")
    extra = 0
    can_delete = False  # a card is deleted from its own page, which refuses held cards with the reason

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("gpu_model")


class HeldCardsAdminMixin:
    """The admin's delete pages list held cards as protected (a card a job may still hold is never deleted), so
    deleting one, or a node with one, is refused with the reason before anything is deleted."""

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        cards = [d for obj in objs for d in (obj.devices.all() if isinstance(obj, Node) else [obj])]
        for card in cards:
            held = partitions.held_by(card)
            if held:
                protected.append(f"{card}: held by task(s) {', '.join(f'#{t}' for t in sorted(held))}")
        return deleted, counts, perms_needed, protected


@admin.register(Node)
class NodeAdmin(HeldCardsAdminMixin, admin.ModelAdmin):
    form = NodeAdminForm
    list_display = (
        "name",
        "cluster",
        "status_badge",
        "backend_badge",
        "health",
        "cpu",
        "memory_gib",
        "device_count",
        "capacity_gpu",
        "card_utilisation",
        "last_report",
    )
    list_filter = ("cluster__vdc", "cluster", "status", "backend_state")
    search_fields = ("name", "cluster__name", "agent_message", "backend_reason")
    list_select_related = ("cluster",)
    autocomplete_fields = ("cluster",)
    inlines = (DeviceInline,)
    readonly_fields = ("backend_state", "backend_reason", "last_report", "agent_message")

    def get_queryset(self, request):
        devices = Device.objects.cards().filter(node=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_devices=count_of(devices),
                cap_gpu=sum_of(Device.objects.units().filter(node=OuterRef("pk")), "gpu_model__exchange_rate"),
                card_util=avg_of(devices, "utilization"),
            )
        )

    @admin.display(description="Status", ordering="status")
    def status_badge(self, obj):
        return badge(obj.get_status_display(), NODE_COLOURS.get(obj.status, GREY))

    @admin.display(description="Backend says", ordering="backend_state")
    def backend_badge(self, obj):
        """The node as its cluster's own scheduler reports it (scheduling obeys the worse of the two)."""
        if not obj.backend_state:
            return "-"
        text = obj.get_backend_state_display() + (f": {obj.backend_reason}" if obj.backend_reason else "")
        return badge(text, NODE_COLOURS.get(obj.backend_state, GREY))

    @admin.display(description="Health", ordering="health_score")
    def health(self, obj):
        return health_badge(obj.health_score)

    @admin.display(description="Devices", ordering="n_devices")
    def device_count(self, obj) -> int:
        return obj.n_devices

    @admin.display(description="Card utilisation", ordering="card_util")
    def card_utilisation(self, obj) -> str:
        return f"{number(obj.card_util, 0)}%" if obj.n_devices else "-"

    @admin.display(description="GPU-eq", ordering="cap_gpu")
    def capacity_gpu(self, obj) -> str:
        return number(obj.cap_gpu)


@admin.register(Device)
class DeviceAdmin(HeldCardsAdminMixin, admin.ModelAdmin):
    form = DeviceAdminForm
    list_display = (
        "__str__",
        "gpu_model",
        "sharing",
        "vram_gib",
        "vram_used_gib",
        "health",
        "health_reason_short",
        "utilisation",
        "temperature_c",
        "ecc_errors",
        "xid_errors",
        "driver_version",
        "missing_since",
    )
    list_filter = ("gpu_model__vendor", "gpu_model", "node__cluster", ("missing_since", admin.EmptyFieldListFilter))
    search_fields = ("node__name", "node__cluster__name", "uuid", "pci_bus_id", "gpu_model__name", "reported_name")
    list_select_related = ("node__cluster", "gpu_model")
    autocomplete_fields = ("node",)
    readonly_fields = (
        "vram_used_gib",
        "utilization",
        "temperature_c",
        "ecc_errors",
        "xid_errors",
        "health_reason",
        "reported_name",
        "driver_version",
        "runtime_version",
        "memory_bandwidth_gbps",
        "tflops_fp16",
        "tflops_fp32",
        "figures_source",
        "interconnect",
        "missing_since",
    )
    fieldsets = (
        (None, {"fields": ("node", "index", "gpu_model", "uuid", "vram_gib", "missing_since")}),
        ("Sharing: MIG instances or time-sliced replicas", {"fields": ("sharing_mode", "mig_layout", "replicas")}),
        ("Topology", {"fields": ("numa_node", "pci_bus_id", "links")}),
        (
            "Health (reported by the node agent)",
            {
                "fields": (
                    "health_score",
                    "health_reason",
                    "utilization",
                    "vram_used_gib",
                    "temperature_c",
                    "ecc_errors",
                    "xid_errors",
                )
            },
        ),
        (
            "Fingerprint (reported by the node agent, checked against the GPU catalog)",
            {
                "fields": (
                    "reported_name",
                    "driver_version",
                    "runtime_version",
                    "memory_bandwidth_gbps",
                    "tflops_fp16",
                    "tflops_fp32",
                    "figures_source",
                    "interconnect",
                )
            },
        ),
    )

    @admin.display(description="Health", ordering="health_score")
    def health(self, obj):
        return health_badge(obj.health_score)

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if getattr(form, "sharing_request", None):
            try:
                partitions.set_device_sharing(obj, **form.sharing_request)
            except partitions.SharingError as exc:  # a job took the card since the form was checked
                self.message_user(request, f"Sharing not changed: {exc}", messages.ERROR)

    @admin.display(description="Why", ordering="health_reason")
    def health_reason_short(self, obj) -> str:
        return (obj.health_reason[:80] + "…") if len(obj.health_reason) > 80 else obj.health_reason or "-"

    @admin.display(description="Utilisation", ordering="utilization")
    def utilisation(self, obj) -> str:
        return f"{obj.utilization}%"


class RatedFilter(admin.SimpleListFilter):
    """New models found by node agents (no exchange rate yet) apart from rated ones."""

    title = "exchange rate"
    parameter_name = "rated"

    def lookups(self, request, model_admin):
        return (("no", "New model: not rated"), ("yes", "Rated"))

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(exchange_rate__isnull=self.value() == "no")
        return queryset


@admin.register(GPUModel)
class GPUModelAdmin(admin.ModelAdmin):
    form = GPUModelAdminForm
    list_display = (
        "name",
        "vendor",
        "rating",
        "vram_gib",
        "memory_bandwidth_gbps",
        "tflops_fp16",
        "tflops_fp32",
        "exchange_rate",
        "shareable",
        "enabled",
        "device_count",
    )
    list_editable = ("exchange_rate", "enabled")
    list_filter = (RatedFilter, "vendor", "partition", "shareable", "enabled")
    search_fields = ("name", "resource_name", "slurm_gres_type")

    def get_queryset(self, request):
        return (
            super().get_queryset(request).annotate(n_devices=count_of(Device.objects.filter(gpu_model=OuterRef("pk"))))
        )

    @admin.display(description="Rating", ordering="exchange_rate")
    def rating(self, obj):
        if obj.exchange_rate is None:
            return badge("new model: set its exchange rate", ORANGE)
        return badge("rated", GREEN)

    @admin.display(description="Devices", ordering="n_devices")
    def device_count(self, obj) -> int:
        return obj.n_devices


class ReservationStateFilter(admin.SimpleListFilter):
    """Current, upcoming or ended windows."""

    title = "window"
    parameter_name = "window"

    def lookups(self, request, model_admin):
        return (("current", "Current"), ("upcoming", "Upcoming"), ("ended", "Ended"))

    def queryset(self, request, queryset):
        # An unknown value (a hand-edited URL) filters nothing, as for any admin list filter.
        return queryset.in_window(self.value(), timezone.now()) if self.value() in queryset.WINDOWS else queryset


@admin.register(CapacityReservation)
class CapacityReservationAdmin(admin.ModelAdmin):
    form = CapacityReservationAdminForm
    list_display = (
        "name",
        "vdc",
        "cluster",
        "starts_at",
        "ends_at",
        "window_badge",
        "held",
        "for_whom",
        "preempt_at_start",
    )
    list_filter = (ReservationStateFilter, "vdc", "cluster", "preempt_at_start", "starts_at")
    search_fields = ("name", "reason", "vdc__name", "cluster__name")
    list_select_related = ("vdc", "cluster", "gpu_model")
    autocomplete_fields = ("vdc", "cluster", "gpu_model", "nodes", "projects")
    date_hierarchy = "starts_at"
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("vdc", "cluster", "name", "reason", "starts_at", "ends_at")}),
        (
            "What is held",
            {
                "fields": ("nodes", "gpu_model", "cards", "gpu", "cpu", "memory_gib"),
                "description": "Named nodes are held whole. Otherwise an amount (cards of a model, or "
                "GPU-equivalents; cpu and memory optional) is held as whole nodes the scheduler picks. Neither: "
                "every node of the cluster (or of the VDC).",
            },
        ),
        ("Who may use it", {"fields": ("projects",)}),
        ("Scheduling", {"fields": ("lead_time", "preempt_at_start")}),
        ("Record", {"fields": ("created_at", "updated_at")}),
    )

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("nodes", "projects")

    @admin.display(description="Window", ordering="starts_at")
    def window_badge(self, obj):
        state = obj.state(timezone.now())
        return badge(state, {"current": ORANGE, "upcoming": GREEN, "ended": GREY}[state])

    @admin.display(description="Holds")
    def held(self, obj) -> str:
        return obj.held_summary()

    @admin.display(description="For")
    def for_whom(self, obj) -> str:
        names = sorted(p.name for p in obj.projects.all())
        return ", ".join(names) if names else "nobody (maintenance)"
