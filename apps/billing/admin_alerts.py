"""The admin's "Alerts" page: the conditions apps.billing.alerts evaluates, listed where admins work."""

from __future__ import annotations

from django.contrib import admin
from django.template.response import TemplateResponse

from apps.billing.alerts import LONG_WAIT, LOW_UTILISATION, evaluate
from apps.billing.models import Alert


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    """A read-only page instead of a changelist: there is no table behind it."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def changelist_view(self, request, extra_context=None):
        context = {
            **self.admin_site.each_context(request),
            "title": "Alerts",
            "opts": self.model._meta,
            "alerts": evaluate(),
            "low_utilisation": LOW_UTILISATION,
            "long_wait_h": LONG_WAIT.total_seconds() / 3600,
        }
        return TemplateResponse(request, "billing/admin/alerts.html", context)
