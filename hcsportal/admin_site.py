"""The admin site of the portal: Django's, with the operator dashboard on its index page."""

from __future__ import annotations

from django.contrib import admin

from apps.core.charts import svg_chart
from apps.tasks.views import activity_chart
from apps.vdc.policy import can_view_operations
from hcsportal.dashboard import Dashboard, operator_dashboard


class PortalAdminSite(admin.AdminSite):
    """Index = the operator dashboard above the usual list of apps and models."""

    site_header = "HCS Portal administration"
    site_title = "HCS Portal administration"
    index_title = "Operator dashboard"
    index_template = "admin/hcs_index.html"

    def index(self, request, extra_context=None):
        """The dashboard shows every cluster and project at once: only to those who may see them all."""
        if not can_view_operations(request.user):
            return super().index(request, extra_context)
        dashboard = operator_dashboard()
        context = {"dashboard": dashboard, **dashboard_charts(dashboard), **(extra_context or {})}
        return super().index(request, context)


def dashboard_charts(dashboard: Dashboard) -> dict:
    """The two trend charts of the dashboard as templates/portal/_chart.html draws them."""
    waits = dashboard.waits
    minutes = [[round(s / 60, 1) for s in series] for series in (waits.average_s, waits.longest_s)]
    return {
        "activity_chart": activity_chart(dashboard.activity),
        "wait_chart": svg_chart(
            waits.times,
            [
                ("Average wait (min)", "running", minutes[0], minutes[0][-1] if minutes[0] else 0),
                ("Longest wait (min)", "waiting", minutes[1], minutes[1][-1] if minutes[1] else 0),
            ],
        ),
    }
