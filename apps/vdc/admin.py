"""Admin for VDCs, projects, memberships and quotas (the helpers every admin module shares: apps.core.admin_helpers).

Admin modules are the outer layer, like the API views: they read across apps (task counts on a VDC,
devices on a cluster) for their columns, while models and services keep the one-way dependencies.
Computed columns are scalar subqueries annotated on the changelist queryset, so a page costs the
same number of queries whatever the number of rows.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db.models import F, OuterRef
from django.db.models.functions import Coalesce

from apps.clusters.models import Cluster, Device, Node
from apps.core.admin_helpers import DECIMAL, GREEN, GREY, badge, count_of, number, percent, sum_of
from apps.core.forms import SecretTextarea
from apps.queues.services import create_class_queues
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.models import Task
from apps.vdc import services
from apps.vdc.models import VDC, CapacityLoan, Membership, Project, ProjectQuota, ProjectSecret, RebalancerSettings
from apps.vdc.signals import secret_in_use


class ClusterInline(admin.TabularInline):
    """The VDC's clusters at a glance; each links to its own change page where it is edited."""

    model = Cluster
    fields = ("name", "cluster_type", "status", "enabled", "endpoint", "last_heartbeat")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class ProjectQuotaInline(admin.TabularInline):
    model = ProjectQuota
    fields = (
        "project",
        "vdc",
        "guaranteed_gpu",
        "limit_gpu",
        "guaranteed_cpu",
        "limit_cpu",
        "guaranteed_memory_gib",
        "limit_memory_gib",
        "max_concurrent_tasks",
        "priority",
        "weight",
        "enforce",
    )
    autocomplete_fields = ("project", "vdc")
    extra = 0
    show_change_link = True

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("project", "vdc")


class VDCQuotaInline(ProjectQuotaInline):
    fields = tuple(f for f in ProjectQuotaInline.fields if f != "vdc")
    autocomplete_fields = ("project",)
    verbose_name_plural = "project quotas"


class RebalancerSettingsInline(admin.StackedInline):
    """The VDC's inter-project rebalancer (docs/rules.md#rebalancing): off until a row is added here."""

    model = RebalancerSettings
    fields = (
        "enabled",
        "threshold_percent",
        "interval",
        "max_loan_duration",
        "min_loan_duration",
        "cooldown",
        "loan_billing",
        "loans_low_class_only",
        "last_run_at",
    )
    readonly_fields = ("last_run_at",)
    extra = 0
    max_num = 1
    can_delete = True
    verbose_name = verbose_name_plural = "inter-project rebalancer (capacity loans; see docs/engine.md)"


class VDCAddForm(forms.ModelForm):
    class_queues = forms.BooleanField(
        required=False,
        initial=True,
        label="Create its class queues",
        help_text="A high, a medium and a low queue, ordered by the default queue policy (editable afterwards)",
    )

    class Meta:
        model = VDC
        fields = ("name",)  # the admin's fieldsets decide the rest


@admin.register(VDC)
class VDCAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "enabled",
        "is_default",
        "capacity_cpu",
        "capacity_memory",
        "capacity_gpu",
        "allocated_gpu",
        "utilisation",
        "cluster_count",
        "queued_tasks",
        "default_queue_policy",
    )
    list_filter = ("enabled", "allow_overcommit", "default_queue_policy", "cluster_selection_strategy")
    search_fields = ("name", "description")
    inlines = (ClusterInline, VDCQuotaInline, RebalancerSettingsInline)
    readonly_fields = ("created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("name", "description", "enabled", "is_default")}),
        (
            "Capacity caps",
            {
                "fields": ("total_cpu", "total_memory_gib", "total_gpu", "allow_overcommit", "overcommit_ratio"),
                "description": "Empty caps mean the sum of the enabled clusters' nodes.",
            },
        ),
        ("Scheduling", {"fields": ("default_queue_policy", "cluster_selection_strategy", "node_scorer")}),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = VDCAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        if obj is not None:
            return self.fieldsets
        scheduling = ("default_queue_policy", "class_queues", "cluster_selection_strategy", "node_scorer")
        return tuple(
            (name, {**opts, "fields": scheduling}) if name == "Scheduling" else (name, opts)
            for name, opts in self.fieldsets
        )

    def save_formset(self, request, form, formset, change) -> None:
        super().save_formset(request, form, formset, change)
        for quota in formset.new_objects + [obj for obj, _fields in formset.changed_objects]:
            if isinstance(quota, ProjectQuota):
                for warning in quota.warnings():
                    self.message_user(request, warning, messages.WARNING)

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        if not change and form.cleaned_data.get("class_queues"):
            created = create_class_queues(obj)
            names = ", ".join(q.name for q in created)
            self.message_user(request, f"Queues {names} created ({obj.get_default_queue_policy_display()}).")

    def get_queryset(self, request):
        nodes = Node.objects.filter(cluster__vdc=OuterRef("pk"), cluster__enabled=True)
        devices = (
            Device.objects.units().present().filter(node__cluster__vdc=OuterRef("pk"), node__cluster__enabled=True)
        )
        tasks = Task.objects.filter(vdc=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                cap_cpu=Coalesce(F("total_cpu"), sum_of(nodes, "cpu"), output_field=DECIMAL),
                cap_memory=Coalesce(F("total_memory_gib"), sum_of(nodes, "memory_gib"), output_field=DECIMAL),
                cap_gpu=Coalesce(F("total_gpu"), sum_of(devices, "gpu_model__exchange_rate"), output_field=DECIMAL),
                used_gpu=sum_of(tasks.filter(status__in=ACTIVE), "allocated_gpu"),
                n_clusters=count_of(Cluster.objects.filter(vdc=OuterRef("pk"))),
                n_queued=count_of(tasks.filter(status__in=WAITING)),
            )
        )

    @admin.display(description="CPU cores", ordering="cap_cpu")
    def capacity_cpu(self, obj) -> str:
        return number(obj.cap_cpu, 0)

    @admin.display(description="Memory GiB", ordering="cap_memory")
    def capacity_memory(self, obj) -> str:
        return number(obj.cap_memory, 0)

    @admin.display(description="GPU-eq", ordering="cap_gpu")
    def capacity_gpu(self, obj) -> str:
        return number(obj.cap_gpu)

    @admin.display(description="Allocated GPU-eq", ordering="used_gpu")
    def allocated_gpu(self, obj) -> str:
        return number(obj.used_gpu)

    @admin.display(description="Utilisation")
    def utilisation(self, obj) -> str:
        return percent(obj.used_gpu, obj.cap_gpu)

    @admin.display(description="Clusters", ordering="n_clusters")
    def cluster_count(self, obj) -> int:
        return obj.n_clusters

    @admin.display(description="Queued tasks", ordering="n_queued")
    def queued_tasks(self, obj) -> int:
        return obj.n_queued


class MembershipInline(admin.TabularInline):
    model = Membership
    fields = ("user", "role", "created_at")
    readonly_fields = ("created_at",)
    autocomplete_fields = ("user",)
    extra = 0

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user")


class ProjectQuotaOfProjectInline(ProjectQuotaInline):
    fields = tuple(f for f in ProjectQuotaInline.fields if f != "project")
    autocomplete_fields = ("vdc",)
    verbose_name_plural = "quotas"


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "member_count", "active_tasks", "waiting_tasks", "gpu_in_use", "created_at")
    search_fields = ("name", "description", "memberships__user__username")
    list_filter = ("quotas__vdc",)
    inlines = (MembershipInline, ProjectQuotaOfProjectInline)
    readonly_fields = ("created_at",)

    def get_queryset(self, request):
        tasks = Task.objects.filter(project=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_members=count_of(Membership.objects.filter(project=OuterRef("pk"))),
                n_active=count_of(tasks.filter(status__in=ACTIVE)),
                n_waiting=count_of(tasks.filter(status__in=WAITING)),
                used_gpu=sum_of(tasks.filter(status__in=ACTIVE), "allocated_gpu"),
            )
        )

    @admin.display(description="Members", ordering="n_members")
    def member_count(self, obj) -> int:
        return obj.n_members

    @admin.display(description="Running tasks", ordering="n_active")
    def active_tasks(self, obj) -> int:
        return obj.n_active

    @admin.display(description="Waiting tasks", ordering="n_waiting")
    def waiting_tasks(self, obj) -> int:
        return obj.n_waiting

    @admin.display(description="GPU-eq in use", ordering="used_gpu")
    def gpu_in_use(self, obj) -> str:
        return number(obj.used_gpu)


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "project", "role", "created_at")
    list_filter = ("role", "project")
    search_fields = ("user__username", "user__email", "project__name")
    list_select_related = ("user", "project")
    autocomplete_fields = ("user", "project")


@admin.register(ProjectQuota)
class ProjectQuotaAdmin(admin.ModelAdmin):
    list_display = (
        "project",
        "vdc",
        "gpu_usage",
        "cpu_usage",
        "memory_usage",
        "tasks_usage",
        "priority",
        "enforce",
    )
    list_filter = ("vdc", "enforce", "project")
    search_fields = ("project__name", "vdc__name")
    list_select_related = ("project", "vdc")
    autocomplete_fields = ("project", "vdc")
    readonly_fields = ("usage_now", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("project", "vdc", "priority", "weight", "enforce", "usage_now")}),
        (
            "Guaranteed and limit",
            {
                "fields": (
                    ("guaranteed_gpu", "limit_gpu"),
                    ("guaranteed_cpu", "limit_cpu"),
                    ("guaranteed_memory_gib", "limit_memory_gib"),
                ),
                "description": "GPU in GPU-equivalents (A100-80G = 1). Usage between guaranteed and limit is "
                "borrowed from idle capacity and can be reclaimed.",
            },
        ),
        (
            "Task limits",
            {
                "fields": (
                    "max_concurrent_tasks",
                    "max_training_tasks",
                    "max_inference_tasks",
                    "max_dev_env_tasks",
                )
            },
        ),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    def save_model(self, request, obj, form, change) -> None:
        super().save_model(request, obj, form, change)
        for warning in obj.warnings():
            self.message_user(request, warning, messages.WARNING)

    def get_queryset(self, request):
        active = Task.objects.filter(project=OuterRef("project"), vdc=OuterRef("vdc"), status__in=ACTIVE)
        return (
            super()
            .get_queryset(request)
            .annotate(
                used_gpu=sum_of(active, "allocated_gpu"),
                used_cpu=sum_of(active, "held_cpu"),
                used_memory=sum_of(active, "held_memory_gib"),
                n_active=count_of(active),
            )
        )

    @staticmethod
    def _usage(used, guaranteed, limit) -> str:
        return f"{number(used)} / {number(guaranteed)} / {number(limit)}"

    @admin.display(description="GPU-eq used / guaranteed / limit", ordering="used_gpu")
    def gpu_usage(self, obj) -> str:
        return self._usage(obj.used_gpu, obj.guaranteed_gpu, obj.limit_gpu)

    @admin.display(description="CPU used / guaranteed / limit", ordering="used_cpu")
    def cpu_usage(self, obj) -> str:
        return self._usage(obj.used_cpu, obj.guaranteed_cpu, obj.limit_cpu)

    @admin.display(description="Memory GiB used / guaranteed / limit", ordering="used_memory")
    def memory_usage(self, obj) -> str:
        return self._usage(obj.used_memory, obj.guaranteed_memory_gib, obj.limit_memory_gib)

    @admin.display(description="Running tasks / max", ordering="n_active")
    def tasks_usage(self, obj) -> str:
        return f"{obj.n_active} / {obj.max_concurrent_tasks if obj.max_concurrent_tasks is not None else '∞'}"

    @admin.display(description="In use now")
    def usage_now(self, obj) -> str:
        if obj.pk is None:
            return "-"
        return (
            f"{self.gpu_usage(obj)} GPU-eq, {self.cpu_usage(obj)} CPU, {self.memory_usage(obj)} GiB "
            "(used / guaranteed / limit)"
        )


class ProjectSecretForm(forms.ModelForm):
    """Name and description, and the value as a write-only box: required on add, a rotation when filled on change.

    The value is never rendered, not even after a failed save; the encrypted column is not a form field.
    """

    new_value = forms.CharField(
        required=False,
        strip=False,
        label="Value",
        widget=SecretTextarea(attrs={"rows": 3, "cols": 60}),
        help_text="Stored encrypted, given to tasks that refer to the secret, never shown again (not even here). "
        "On change: leave empty to keep the current value; a new one reaches each task's next attempt.",
    )

    class Meta:
        model = ProjectSecret
        fields = ("project", "name", "description")

    def clean_new_value(self) -> str:
        value = self.cleaned_data.get("new_value") or ""
        if not value and self.instance.pk is not None:
            return ""
        message = services.secret_value_error(value)
        if message:
            raise forms.ValidationError(message)
        return value


@admin.register(ProjectSecret)
class ProjectSecretAdmin(admin.ModelAdmin):
    """Project secrets by name; values are write-only and go through the same services as the API."""

    form = ProjectSecretForm
    list_display = ("name", "project", "description", "updated_by", "updated_at")
    list_filter = ("project",)
    search_fields = ("name", "description", "project__name")
    list_select_related = ("project", "updated_by")
    autocomplete_fields = ("project",)
    readonly_fields = ("created_by", "created_at", "updated_by", "updated_at")
    fields = ("project", "name", "description", "new_value", *readonly_fields)

    def get_readonly_fields(self, request, obj=None):
        # Tasks refer to a secret by project and name, so neither changes once it exists.
        return (*self.readonly_fields, "project", "name") if obj is not None else self.readonly_fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("value")

    def save_model(self, request, obj, form, change) -> None:
        value = form.cleaned_data.get("new_value") or None
        if change:
            services.update_secret(request.user, obj, value=value, description=obj.description)
        else:
            saved = services.create_secret(request.user, obj.project, obj.name, value, obj.description)
            obj.pk = saved.pk

    def get_deleted_objects(self, objs, request):
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        for secret in objs:
            for _receiver, users in secret_in_use.send(sender=ProjectSecret, secret=secret):
                protected += [f"{secret.name}: still referred to by waiting or running task {u}" for u in users]
        return deleted, counts, perms_needed, protected

    def delete_model(self, request, obj) -> None:
        services.delete_secret(request.user, obj)

    def delete_queryset(self, request, queryset) -> None:
        for secret in queryset:
            services.delete_secret(request.user, secret)


@admin.register(RebalancerSettings)
class RebalancerSettingsAdmin(admin.ModelAdmin):
    """Per VDC, when the rebalancer lends unused guarantees and how loans are billed (apps.control.rebalance)."""

    list_display = (
        "vdc",
        "enabled",
        "threshold_percent",
        "interval",
        "max_loan_duration",
        "min_loan_duration",
        "cooldown",
        "loan_billing",
        "loans_low_class_only",
        "last_run_at",
    )
    list_filter = ("enabled", "loan_billing", "loans_low_class_only")
    list_select_related = ("vdc",)
    search_fields = ("vdc__name",)
    autocomplete_fields = ("vdc",)
    readonly_fields = ("last_run_at",)


@admin.register(CapacityLoan)
class CapacityLoanAdmin(admin.ModelAdmin):
    """Every capacity loan the rebalancer opened: who lent what to whom, since when, why, and how it ended.

    Nobody edits a loan; "Return now" ends an active one (settled like any return), and the lender reclaims.
    """

    list_display = (
        "id",
        "vdc",
        "lender",
        "borrower",
        "amount",
        "started_at",
        "expires_at",
        "state",
        "used_gpu_hours",
        "reason",
    )
    list_filter = ("vdc", ("returned_at", admin.EmptyFieldListFilter), "return_reason")
    list_select_related = ("vdc", "lender", "borrower")
    search_fields = ("lender__name", "borrower__name", "reason", "return_message")
    date_hierarchy = "started_at"
    actions = ("return_now",)
    readonly_fields = (
        "vdc",
        "lender",
        "borrower",
        "gpu",
        "cpu",
        "memory_gib",
        "reason",
        "figures",
        "started_at",
        "expires_at",
        "returned_at",
        "return_reason",
        "return_message",
        "used_gpu_hours",
        "accounted_until",
        "settlement",
    )

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="Amount")
    def amount(self, obj: CapacityLoan) -> str:
        return obj.amount_text

    @admin.display(description="State", ordering="returned_at")
    def state(self, obj: CapacityLoan):
        if obj.returned_at is None:
            return badge("active", GREEN)
        return badge(f"returned: {obj.get_return_reason_display().lower()}", GREY)

    @admin.action(description="Return selected loans now (the lender reclaims)", permissions=["change"])
    def return_now(self, request, queryset) -> None:
        from apps.control.rebalance import return_loan  # control builds on vdc

        returned = 0
        for loan in queryset.filter(returned_at__isnull=True):
            loan = return_loan(loan.pk, user=request.user)
            self.log_change(request, loan, f"returned: {loan.settlement}")
            returned += 1
        self.message_user(request, f"{returned} loans returned; the lenders reclaim at the next scheduling cycle.")
