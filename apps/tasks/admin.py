"""Admin for tasks and their timelines: submission and cancellation go through the task services."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied, ValidationError
from django.template.response import TemplateResponse
from django.utils.html import format_html, format_html_join

from apps.core.admin_helpers import GREEN, GREY, ORANGE, RED, ReadOnlyAdminMixin, badge
from apps.core.forms import JSONDocumentField
from apps.queues.models import TaskQueue
from apps.tasks.admin_forms import TaskChangeForm, TaskSubmitForm
from apps.tasks.choices import ACTIVE, FINAL, WAITING, TaskStatus
from apps.tasks.models import ServiceLoadSample, Sweep, Task, TaskEvent, TaskTemplate, TaskUsageSample
from apps.tasks.services import delete_task, stop_tasks, update_autoscaling
from apps.tasks.sweeps import status_counts, stop_sweep
from apps.tasks.task_templates import delete_template

STATUS_COLOURS = {
    TaskStatus.PENDING: GREY,
    TaskStatus.QUEUED: GREY,
    TaskStatus.SCHEDULED: ORANGE,
    TaskStatus.STARTING: ORANGE,
    TaskStatus.RUNNING: GREEN,
    TaskStatus.UNKNOWN: ORANGE,
    TaskStatus.SCALED_TO_ZERO: GREY,
    TaskStatus.PREEMPTED: ORANGE,
    TaskStatus.SUSPENDED: ORANGE,
    TaskStatus.COMPLETED: GREEN,
    TaskStatus.FAILED: RED,
    TaskStatus.STOPPED: GREY,
}
CANCEL_REASON = "cancelled by an admin"
CONFIRM_SHOWN = 50  # tasks named on the cancel confirmation page; the rest are counted

# Written by services and the scheduler, never by hand.
STATE_FIELDS = (
    "status",
    "status_message",
    "pending_reason",
    "pending_message",
    "queue_position",
    "estimated_start",
    "cluster",
    "placement_table",
    "allocated_gpu",
    "held_cpu",
    "held_memory_gib",
    "replicas",
    "external_id",
    "attempt",
    "window",
    "submitted_at",
    "started_at",
    "finished_at",
    "updated_at",
    "exit_code",
    "failure_reason",
    "preemption_count",
    "lost_gpu_seconds",
    "autoscale_desired",
    "last_cold_start_s",
)
# Checked against queue rules and quotas at submission; changing them afterwards would bypass the checks.
SUBMITTED_FIELDS = (
    "project",
    "owner",
    "vdc",
    "queue",
    "kind",
    "cpu",
    "memory_gib",
    "gpu_spec",
    "instances",
    "elastic_min",
    "elastic_max",
)

REQUEST_FIELDSETS = (
    (
        "Resources (per instance)",
        {"fields": ("cpu", "memory_gib", "gpu_spec", "instances", ("elastic_min", "elastic_max"))},
    ),
    (
        "Scheduling",
        {"fields": ("expected_duration", "wall_time", "preemptible", "required_labels", "preferred_clusters")},
    ),
    # secret_variables: a write-only input on add (TaskSubmitForm), the names on change.
    ("What to run", {"fields": ("image", "command", "env", "secret_variables", "secret_refs", "volumes")}),
    (
        "Kind-specific settings",
        {
            "classes": ("collapse",),
            "fields": (
                "ide_type",
                ("idle_stop_percent", "idle_stop_minutes"),
                ("framework", "model_path"),
                ("epochs", "batch_size"),
                ("checkpoint_path", "tensorboard_dir"),
                "max_retries",
                ("port", "max_tokens", "temperature"),
                ("autoscale_min", "autoscale_max"),
                ("autoscale_cpu_percent", "autoscale_gpu_percent", "autoscale_memory_percent"),
                ("autoscale_rps", "autoscale_concurrency", "autoscale_latency_ms"),
                "autoscale_predictive",
                "autoscale_schedule",
                "scale_to_zero_after_s",
                "readiness_path",
            ),
        },
    ),
)


class TaskEventInline(ReadOnlyAdminMixin, admin.TabularInline):
    """The task's timeline, oldest first; events are written by the services only."""

    model = TaskEvent
    fields = ("created_at", "kind", "from_status", "to_status", "message", "actor")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("actor")


@admin.register(Task)
class TaskAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "kind",
        "status_badge",
        "project",
        "queue_column",
        "gpu_spec",
        "cluster",
        "queue_position",
        "estimated_start",
        "submitted_at",
    )
    list_display_links = ("id", "name")
    list_filter = ("status", "failure_reason", "kind", "queue__priority_class", "vdc", "cluster", "project")
    search_fields = ("name", "owner__username", "external_id")
    search_help_text = "Name, owner, backend id, or a task id (e.g. 42 or #42)."
    list_select_related = ("project", "queue", "cluster")
    actions = ("cancel",)
    inlines = (TaskEventInline,)
    autocomplete_fields = ("project", "preferred_clusters")
    form = TaskChangeForm
    add_form = TaskSubmitForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = self.add_form
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None:
            form.submitter = request.user
        return form

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return ((None, {"fields": ("name", "kind", "project", "queue", "vdc")}), *REQUEST_FIELDSETS)
        return (
            (None, {"fields": ("name", "kind", "project", "owner", "vdc", "queue")}),
            ("State", {"fields": STATE_FIELDS}),
            *REQUEST_FIELDSETS,
        )

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return (*SUBMITTED_FIELDS, *STATE_FIELDS, "secret_variables", "secret_refs")

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else ()

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and not (obj is not None and obj.is_final)

    def has_delete_permission(self, request, obj=None) -> bool:
        # Only ended tasks may go, and through delete_task (see delete_model).
        return super().has_delete_permission(request, obj) and (obj is None or obj.is_final)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        if db_field.name == "volumes":
            kwargs["form_class"] = JSONDocumentField
            kwargs["help_text"] = (
                'A JSON list of volumes, e.g. [{"name": "data", "mount_path": "/data", "claim_name": "datasets"}]; '
                "a host_path instead of a claim must be approved on every enabled cluster of the VDC"
            )
        return super().formfield_for_dbfield(db_field, request, **kwargs)

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "queue":
            kwargs["queryset"] = TaskQueue.objects.select_related("vdc")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            results |= queryset.filter(pk=int(term))
        return results, may_have_duplicates

    def save_model(self, request, obj, form, change) -> None:
        if change:
            # Autoscaling goes through its service (checks, timeline event, desired count in the new bounds).
            changes = form.autoscale_changes()
            if changes:
                original = Task.objects.get(pk=obj.pk)
                for field in changes:
                    setattr(obj, field, getattr(original, field))
            super().save_model(request, obj, form, change)
            if changes:
                update_autoscaling(obj, request.user, **changes)
        # On add, TaskSubmitForm already saved the task through submit_task.

    def delete_model(self, request, obj) -> None:
        try:
            delete_task(obj, request.user)
        except (ValidationError, PermissionDenied) as exc:
            self.message_user(request, f"{obj}: {_reason(exc)}", messages.ERROR)

    @admin.display(description="Status", ordering="status")
    def status_badge(self, obj):
        return badge(obj.get_status_display(), STATUS_COLOURS.get(obj.status, GREY))

    @admin.display(description="Queue (class)", ordering="queue__name")
    def queue_column(self, obj) -> str:
        return f"{obj.queue.name} ({obj.queue.priority_class})"

    @admin.display(description="Secret variables")
    def secret_variables(self, obj) -> str:
        """Names only: the values are write-only, for the job alone."""
        return ", ".join(obj.secret_env_names) or "-"

    @admin.display(description="Placement")
    def placement_table(self, obj):
        if not obj.placement:
            return "-"
        return format_html(
            "<table><tr><th>Node</th><th>Devices</th></tr>{}</table>",
            format_html_join(
                "",
                "<tr><td>{}</td><td>{}</td></tr>",
                (
                    (p.get("node_name", "?"), ", ".join(str(d) for d in p.get("devices", [])))
                    for p in obj.placement
                    if isinstance(p, dict)
                ),
            ),
        )

    @admin.action(description="Cancel (stop) selected tasks", permissions=["change"])
    def cancel(self, request, queryset):
        """Stop them all in one transaction of a fixed number of statements (``stop_tasks``): 1,000 tasks stop
        inside the request, all or none, and the message says which were left alone and why. A page asks
        first, naming how many run and how many wait."""
        if "confirm" not in request.POST:
            return self._confirm_cancel(request, queryset)
        selected = dict(queryset.values_list("pk", "status"))
        stopped, _left = stop_tasks(list(selected), request.user, CANCEL_REASON)
        done = set(selected) - {task.pk for task in stopped}
        finished = Task.objects.filter(pk__in=done).order_by("pk")
        for task in finished[:10]:
            self.message_user(
                request,
                f"{task}: Task is already {task.get_status_display().lower()}; nothing to stop.",
                messages.ERROR,
            )
        if len(done) > 10:
            self.message_user(request, f"… and {len(done) - 10} more already finished.", messages.ERROR)
        if stopped:
            LogEntry.objects.log_actions(
                request.user.pk, stopped, CHANGE, change_message=CANCEL_REASON, single_object=False
            )
            self.message_user(request, f"{len(stopped)} task(s) stopped.", messages.SUCCESS)

    def _confirm_cancel(self, request, queryset) -> TemplateResponse:
        statuses = list(queryset.values_list("status", flat=True))
        shown = list(queryset.select_related("project").order_by("pk")[:CONFIRM_SHOWN])
        context = {
            **self.admin_site.each_context(request),
            "title": "Cancel (stop) tasks",
            "opts": self.model._meta,
            "selected": list(queryset.values_list("pk", flat=True)),
            "shown": shown,
            "more": max(0, len(statuses) - CONFIRM_SHOWN),
            "count": len(statuses),
            "active": sum(s in ACTIVE for s in statuses),
            "waiting": sum(s in WAITING for s in statuses),
            "ended": sum(s in FINAL for s in statuses),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/tasks/cancel_confirm.html", context)


def _reason(exc: Exception) -> str:
    return "; ".join(exc.messages) if isinstance(exc, ValidationError) else str(exc)


@admin.register(TaskEvent)
class TaskEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """The audit timeline of every task: read-only."""

    list_display = ("created_at", "task", "kind", "from_status", "to_status", "message", "actor")
    list_filter = ("kind", "to_status", "task__vdc", "task__project")
    search_fields = ("task__name", "message", "actor__username")
    list_select_related = ("task", "actor")

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        term = search_term.strip().lstrip("#")
        if term.isdigit():
            results |= queryset.filter(task_id=int(term))
        return results, may_have_duplicates


@admin.register(ServiceLoadSample)
class ServiceLoadSampleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Services' load history (5-minute buckets) and forecasts, written by the autoscaler: read-only."""

    list_display = ("start", "task", "rps", "forecast_rps", "forecast_method", "gpu_percent", "samples")
    list_filter = ("forecast_method", "task__project")
    search_fields = ("task__name",)
    list_select_related = ("task",)
    date_hierarchy = "start"


@admin.register(TaskUsageSample)
class TaskUsageSampleAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Tasks' utilisation history (a sample a minute from the node agents' reports), written by a beat job:
    read-only."""

    list_display = ("at", "task", "gpu_percent", "vram_used_gib", "vram_gib", "cards")
    list_filter = ("task__project",)
    search_fields = ("task__name",)
    list_select_related = ("task",)
    date_hierarchy = "at"


class SweepTaskInline(ReadOnlyAdminMixin, admin.TabularInline):
    model = Task
    fields = ("name", "sweep_values", "status", "submitted_at")
    readonly_fields = fields
    show_change_link = True
    extra = 0
    ordering = ("pk",)


@admin.register(Sweep)
class SweepAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Parameter sweeps (docs/tasks.md, "Parameter sweeps"): created through the API, the CLI or the sweep form;
    read-only here, their tasks listed, and "Stop all" stops their unfinished tasks."""

    list_display = ("id", "name", "project", "created_by", "created_at", "counts")
    list_display_links = ("id", "name")
    list_filter = ("project",)
    search_fields = ("name", "created_by__username")
    list_select_related = ("project", "created_by")
    fields = ("name", "project", "created_by", "created_at", "parameters")
    readonly_fields = fields
    inlines = (SweepTaskInline,)
    actions = ("stop_all",)

    @admin.display(description="tasks")
    def counts(self, obj: Sweep) -> str:
        return ", ".join(f"{n} {status}" for status, n in status_counts(obj).items()) or "none"

    @admin.action(description="Stop all unfinished tasks of the selected sweeps")
    def stop_all(self, request, queryset):
        """Stop the unfinished tasks of the sweeps (``stop_sweep``), after a page naming them, as Cancel asks."""
        if "confirm" not in request.POST:
            tasks = Task.objects.filter(sweep__in=queryset).exclude(status__in=FINAL)
            statuses = list(tasks.values_list("status", flat=True))
            context = {
                **self.admin_site.each_context(request),
                "title": "Stop all tasks of sweeps",
                "opts": self.model._meta,
                "selected": list(queryset.values_list("pk", flat=True)),
                "shown": list(tasks.select_related("project").order_by("pk")[:CONFIRM_SHOWN]),
                "more": max(0, len(statuses) - CONFIRM_SHOWN),
                "count": len(statuses),
                "active": sum(s in ACTIVE for s in statuses),
                "waiting": sum(s in WAITING for s in statuses),
                "ended": 0,
                "action": "stop_all",
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            }
            return TemplateResponse(request, "admin/tasks/cancel_confirm.html", context)
        stopped = 0
        for sweep in queryset:
            try:
                stopped += len(stop_sweep(sweep, request.user, "stopped by an admin"))
            except PermissionDenied as exc:
                self.message_user(request, f"{sweep}: {exc}", messages.ERROR)
        self.message_user(request, f"Stopped {stopped} task(s).", messages.SUCCESS)


@admin.register(TaskTemplate)
class TaskTemplateAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Task templates of projects (docs/tasks.md, "Templates"): their owners write them through the pages, the API
    and the CLI, where the task file is checked; here they are read, and deleted through the same service."""

    list_display = ("id", "name", "project", "kind", "created_by", "updated_at")
    list_display_links = ("id", "name")
    list_filter = ("project",)
    search_fields = ("name", "description", "project__name", "created_by__username")
    list_select_related = ("project", "created_by")
    fields = ("name", "project", "description", "task_file", "created_by", "created_at", "updated_at")
    readonly_fields = fields

    def has_delete_permission(self, request, obj=None) -> bool:
        return admin.ModelAdmin.has_delete_permission(self, request, obj)

    def delete_model(self, request, obj: TaskTemplate) -> None:
        delete_template(request.user, obj)

    def delete_queryset(self, request, queryset) -> None:
        for template in queryset.select_related("project"):
            delete_template(request.user, template)
