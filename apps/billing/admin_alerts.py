"""The admin's "Alerts" page: the conditions apps.billing.alerts evaluates, listed where admins work.

Registered on a proxy of VDC so that it shows on the admin index; the list shows every VDC's alerts,
a VDC's own page only its own.
"""

from __future__ import annotations

from django.contrib import admin
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse

from apps.billing.alerts import LONG_WAIT, LOW_UTILISATION, evaluate
from apps.billing.models import VDCAlerts


@admin.register(VDCAlerts)
class VDCAlertsAdmin(admin.ModelAdmin):
    """Read-only pages instead of a changelist and change forms."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def _render(self, request, title: str, alerts, vdc=None):
        context = {
            **self.admin_site.each_context(request),
            "title": title,
            "opts": self.model._meta,
            "alerts": alerts,
            "vdc": vdc,
            "low_utilisation": LOW_UTILISATION,
            "long_wait_h": LONG_WAIT.total_seconds() / 3600,
        }
        return TemplateResponse(request, "billing/admin/alerts.html", context)

    def changelist_view(self, request, extra_context=None):
        if not self.has_view_permission(request):
            return super().changelist_view(request, extra_context)
        return self._render(request, "Alerts", evaluate())

    def change_view(self, request, object_id, form_url="", extra_context=None):
        vdc = get_object_or_404(VDCAlerts, pk=object_id)
        if not self.has_view_permission(request, vdc):
            return super().change_view(request, object_id, form_url, extra_context)
        return self._render(request, f"Alerts of {vdc.name}", [a for a in evaluate() if a.vdc == vdc.name], vdc)
