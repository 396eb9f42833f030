"""The REST API v1: every app's viewsets on one router, plus the apps' nested endpoints and token login."""

from django.conf import settings
from django.urls import path
from rest_framework.routers import DefaultRouter

from apps.billing.api import urls as billing
from apps.clusters.api import urls as clusters
from apps.control.api import urls as control
from apps.queues.api import urls as queues
from apps.tasks.api import urls as tasks
from apps.vdc.api import urls as vdc
from hcsportal.auth import obtain_auth_token

APPS = (vdc, clusters, queues, tasks, billing, control)

router = DefaultRouter()
for app in APPS:
    for prefix, viewset, basename in app.ROUTES:
        router.register(prefix, viewset, basename=basename)

urlpatterns = [
    path("auth/token/", obtain_auth_token, name="api-token"),
    *(pattern for app in APPS for pattern in app.urlpatterns),
    *router.urls,
]
if settings.HCS_BENCH_ENDPOINTS:
    from hcsportal.bench import OneRowView  # loaded only for the benchmark's server

    urlpatterns.append(path("bench/one-row/", OneRowView.as_view(), name="bench-one-row"))
