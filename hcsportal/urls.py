"""Top-level URLs: admin, REST API v1, OpenAPI schema and docs, user pages; a JSON 404 under /api/."""

from csp.constants import UNSAFE_INLINE
from csp.decorators import csp_update
from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.clusters.agent_api import AgentReportView
from apps.clusters.webhook import admission_review, token_in_path_refused
from hcsportal.metrics import metrics_view

# Swagger UI's files come from this portal (drf-spectacular-sidecar, as static files), its script from this page
# (?script=); its inline <style> is allowed on this page alone.
api_docs = csp_update({"style-src": [UNSAFE_INLINE]}, REPORT_ONLY=settings.HCS_CSP == "report-only")(
    SpectacularSwaggerSplitView.as_view(url_name="schema")
)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/agent/report/", AgentReportView.as_view(), name="agent-report"),
    path("k8s/admission/", admission_review, name="k8s-admission"),
    path("k8s/admission/<path:rest>", token_in_path_refused, name="k8s-admission-token-refused"),
    path("api/v1/", include("hcsportal.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", api_docs, name="api-docs"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("billing/", include("apps.billing.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("apps.tasks.urls")),
]

handler404 = "hcsportal.views.not_found"
handler500 = "hcsportal.db_faults.server_error"
