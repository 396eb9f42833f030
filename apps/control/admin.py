"""Admin views of the control plane: the backend objects it tracks, read-only (only the reconciler writes them)."""

from django.contrib import admin

from apps.control.models import BackendObject, CheckpointStore, Installation, ObjectState
from apps.core.admin_helpers import GREEN, GREY, ORANGE, ReadOnlyAdminMixin, badge

STATE_COLOURS = {ObjectState.PENDING: ORANGE, ObjectState.ACTIVE: GREEN, ObjectState.ENDED: GREY}


@admin.register(BackendObject)
class BackendObjectAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Every job the portal created on a backend, from the intent to the backend's confirmation that it is gone."""

    list_display = (
        "name",
        "cluster",
        "task",
        "attempt",
        "state_badge",
        "phase",
        "external_id",
        "cancelling",
        "message",
        "created_at",
        "ended_at",
    )
    list_filter = ("state", "cluster", "cluster__vdc", "phase")
    search_fields = ("name", "external_id", "task__name", "message")
    list_select_related = ("cluster", "task")
    date_hierarchy = "created_at"

    @admin.display(description="State", ordering="state")
    def state_badge(self, obj: BackendObject):
        return badge(obj.get_state_display(), STATE_COLOURS.get(obj.state, GREY))

    @admin.display(description="Cancelling", boolean=True)
    def cancelling(self, obj: BackendObject) -> bool:
        return obj.cancel_requested_at is not None and obj.state != ObjectState.ENDED


@admin.register(CheckpointStore)
class CheckpointStoreAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Training tasks' checkpoint directories per cluster; a deleted task's is removed by the reconciler."""

    list_display = ("task_uid", "task", "project", "cluster", "message", "failed_at", "created_at")
    list_filter = ("cluster", "cluster__vdc")
    search_fields = ("task_uid", "project", "task__name", "message")
    list_select_related = ("cluster", "task")


@admin.register(Installation)
class InstallationAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """This installation's identity, carried by every backend object it creates."""

    list_display = ("uid", "created_at")
