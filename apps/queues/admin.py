"""Admin for task queues: load per queue, open / close through the queue services."""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.views.main import ChangeList
from django.db.models import OuterRef

from apps.core.admin_helpers import ZERO, count_of, number, sum_of
from apps.queues import services
from apps.queues.models import TaskQueue
from apps.tasks.choices import ACTIVE, WAITING
from apps.tasks.models import Task
from apps.tasks.services import waiting_gpu_equivalents
from apps.vdc.models import VDC


class QueueChangeList(ChangeList):
    """Adds the waiting demand to the rows of the page in one go, after the page is fetched."""

    def get_results(self, request) -> None:
        super().get_results(request)
        demand = waiting_gpu_equivalents([queue.pk for queue in self.result_list])
        for queue in self.result_list:
            queue.waiting_gpu = demand.get(queue.pk, ZERO)


@admin.register(TaskQueue)
class TaskQueueAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "vdc",
        "priority_class",
        "policy",
        "is_open",
        "waiting_tasks",
        "running_tasks",
        "gpu_in_use",
        "gpu_waiting",
        "guaranteed_gpu",
        "max_gpu",
        "weight",
    )
    list_filter = ("vdc", "priority_class", "policy", "is_open", "backend_flavour")
    search_fields = ("name", "description", "vdc__name")
    list_select_related = ("vdc",)
    autocomplete_fields = ("vdc",)
    actions = ("open_queues", "close_queues")
    readonly_fields = ("class_rules", "created_at", "updated_at")
    fieldsets = (
        (None, {"fields": ("vdc", "name", "description", "is_open")}),
        (
            "Ordering",
            {
                "fields": (
                    "priority_class",
                    "class_rules",
                    "policy",
                    "las_thresholds_gpu_s",
                    "backend_flavour",
                    "min_window",
                )
            },
        ),
        (
            "Starvation and churn",
            {
                "fields": ("reserve_after", "min_run_before_reclaim"),
                "description": "A waiting high task always reserves the capacity it needs; a medium task does once it "
                "has waited longer than the first value. The second protects the queue's running tasks from "
                "guarantee reclaims until they have run that long (higher-class preemption is not affected).",
            },
        ),
        (
            "Limits",
            {
                "fields": ("max_expected_duration", ("default_wall_time", "max_wall_time")),
                "description": "Submissions declaring a longer expected duration or wall time are refused (at most "
                "366 days). The wall-time default applies to tasks that set no limit; an expected duration never "
                "stops a job.",
            },
        ),
        (
            "Capacity",
            {"fields": ("guaranteed_gpu", "max_gpu", "weight"), "description": "GPU-equivalents (A100-80G = 1)."},
        ),
        ("History", {"fields": ("created_at", "updated_at")}),
    )

    def get_changelist(self, request, **kwargs):
        return QueueChangeList

    def get_changeform_initial_data(self, request):
        # "Add queue" from a VDC: its default policy is the new queue's.
        initial = super().get_changeform_initial_data(request)
        vdc = VDC.objects.filter(pk=initial.get("vdc") or 0).first() if str(initial.get("vdc", "")).isdigit() else None
        if vdc is not None:
            initial.setdefault("policy", vdc.default_queue_policy)
        return initial

    def get_queryset(self, request):
        tasks = Task.objects.filter(queue=OuterRef("pk"))
        return (
            super()
            .get_queryset(request)
            .annotate(
                n_waiting=count_of(tasks.filter(status__in=WAITING)),
                n_active=count_of(tasks.filter(status__in=ACTIVE)),
                used_gpu=sum_of(tasks.filter(status__in=ACTIVE), "allocated_gpu"),
            )
        )

    @admin.display(description="Rules of the class")
    def class_rules(self, obj) -> str:
        return obj.rules if obj.priority_class else "-"

    @admin.display(description="Waiting", ordering="n_waiting")
    def waiting_tasks(self, obj) -> int:
        return obj.n_waiting

    @admin.display(description="Running", ordering="n_active")
    def running_tasks(self, obj) -> int:
        return obj.n_active

    @admin.display(description="GPU-eq in use", ordering="used_gpu")
    def gpu_in_use(self, obj) -> str:
        return number(obj.used_gpu)

    @admin.display(description="GPU-eq waiting")
    def gpu_waiting(self, obj) -> str:
        return number(getattr(obj, "waiting_gpu", ZERO))

    def _set_open(self, request, queryset, is_open: bool) -> None:
        queues = list(queryset)
        done = "opened" if is_open else "closed"
        for queue in queues:
            services.set_queue_open(queue, is_open)
            self.log_change(request, queue, done)
        self.message_user(request, f"{len(queues)} queue(s) {done}.", messages.SUCCESS)

    @admin.action(description="Open selected queues", permissions=["change"])
    def open_queues(self, request, queryset) -> None:
        self._set_open(request, queryset, True)

    @admin.action(description="Close selected queues (keep their tasks, take no new ones)", permissions=["change"])
    def close_queues(self, request, queryset) -> None:
        self._set_open(request, queryset, False)
