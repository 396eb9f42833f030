"""Top-level URLs: admin, REST API v1, OpenAPI schema and docs, user pages; a JSON 404 under /api/."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.clusters.agent_api import AgentReportView
from hcsportal.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/agent/report/", AgentReportView.as_view(), name="agent-report"),
    path("api/v1/", include("hcsportal.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("billing/", include("apps.billing.urls")),
    path("metrics", metrics_view, name="metrics"),
    path("", include("apps.tasks.urls")),
]

handler404 = "hcsportal.views.not_found"
