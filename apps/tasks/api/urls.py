"""Routes of the tasks app's API: the task viewset and the task-derived VDC and cluster stats."""

from django.urls import path

from apps.tasks.api import sweeps, templates, views

ROUTES = [
    ("tasks", views.TaskViewSet, "task"),
    ("sweeps", sweeps.SweepViewSet, "sweep"),
    ("task-templates", templates.TaskTemplateViewSet, "task-template"),
]

urlpatterns = [
    path("vdcs/<int:pk>/stats/", views.VDCStatsView.as_view(), name="vdc-stats"),
    path("vdcs/<int:pk>/resources/", views.VDCResourcesView.as_view(), name="vdc-resources"),
    path("queues/<int:pk>/lineup/", views.QueueLineupView.as_view(), name="queue-lineup"),
    path("clusters/<int:pk>/stats/", views.ClusterStatsView.as_view(), name="cluster-stats"),
    path("clusters/<int:pk>/jobs/", views.ClusterJobsView.as_view(), name="cluster-jobs"),
]
