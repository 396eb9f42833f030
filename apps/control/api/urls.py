"""Routes of the control plane's API."""

from django.urls import path

from apps.control.api import views

ROUTES = [("backend-objects", views.BackendObjectViewSet, "backend-object")]

urlpatterns = [
    path("clusters/<int:pk>/health-check/", views.ClusterHealthCheckView.as_view(), name="cluster-health-check"),
    path("tasks/<int:pk>/logs/", views.TaskLogView.as_view(), name="task-logs"),
]
