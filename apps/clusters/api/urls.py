"""Routes of the clusters app's API; hcsportal/api_urls.py registers them on the v1 router."""

from django.urls import path

from apps.clusters.api import (
    schema,  # noqa: F401 - defining the OpenAPI extensions registers them
    views,
)

ROUTES = [
    ("gpu-models", views.GPUModelViewSet, "gpumodel"),
    ("clusters", views.ClusterViewSet, "cluster"),
    ("nodes", views.NodeViewSet, "node"),
    ("devices", views.DeviceViewSet, "device"),
    ("capacity-reservations", views.CapacityReservationViewSet, "capacityreservation"),
]

urlpatterns = [
    path("vdcs/<int:pk>/clusters/", views.VDCClustersView.as_view(), name="vdc-clusters"),
]
