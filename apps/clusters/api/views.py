"""Viewsets of clusters (with health and state actions), nodes, devices and the GPU model catalog."""

from __future__ import annotations

from django.db.models import Count
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from apps.clusters import services
from apps.clusters.api.serializers import (
    CapacityReservationSerializer,
    ClusterHealthSerializer,
    ClusterSerializer,
    DeviceSerializer,
    GPUModelSerializer,
    MaintenanceSerializer,
    NodeSerializer,
)
from apps.clusters.filtersets import (
    CapacityReservationFilterSet,
    ClusterFilterSet,
    DeviceFilterSet,
    GPUModelFilterSet,
    NodeFilterSet,
)
from apps.clusters.models import CapacityReservation, Cluster, Device, GPUModel, Node
from apps.core.api.common import ProtectedDestroyMixin
from apps.vdc.api.permissions import AdminWriteOrReadOnly
from apps.vdc.policy import has_platform_perm, model_perm, scope_to_vdcs, visible_vdcs


def clusters_of(user):
    """Clusters of the VDCs the user may see."""
    return scope_to_vdcs(Cluster.objects.select_related("vdc"), user)


class GPUModelViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """The GPU model catalog with exchange rates. Every user reads it; only platform admins write."""

    queryset = GPUModel.objects.all()
    serializer_class = GPUModelSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = GPUModelFilterSet
    search_fields = ["name", "resource_name", "slurm_gres_type"]
    ordering_fields = ["name", "vendor", "vram_gib", "tflops_fp16", "exchange_rate"]


class ClusterViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Clusters of the VDCs you may see. Only platform admins write, enable, disable or put them into maintenance."""

    serializer_class = ClusterSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = ClusterFilterSet
    search_fields = ["name", "description", "endpoint", "namespace"]
    ordering_fields = ["name", "vdc__name", "cluster_type", "status", "priority", "weight", "last_heartbeat"]

    def get_queryset(self):
        return clusters_of(self.request.user)

    @extend_schema(responses=ClusterHealthSerializer)
    @action(detail=True, methods=["get"], serializer_class=ClusterHealthSerializer, filterset_class=None)
    def health(self, request: Request, pk=None) -> Response:
        """Status, missed heartbeats, last heartbeat and the health check's message."""
        return Response(ClusterHealthSerializer(self.get_object()).data)

    @extend_schema(request=None, responses=ClusterSerializer)
    @action(detail=True, methods=["post"], filterset_class=None)
    def enable(self, request: Request, pk=None) -> Response:
        """Let the cluster take new tasks again."""
        cluster = services.set_cluster_enabled(self.get_object(), True)
        return Response(ClusterSerializer(cluster, context=self.get_serializer_context()).data)

    @extend_schema(request=None, responses=ClusterSerializer)
    @action(detail=True, methods=["post"], filterset_class=None)
    def disable(self, request: Request, pk=None) -> Response:
        """Take no new tasks on the cluster; running tasks keep running."""
        cluster = services.set_cluster_enabled(self.get_object(), False)
        return Response(ClusterSerializer(cluster, context=self.get_serializer_context()).data)

    @extend_schema(request=MaintenanceSerializer, responses=ClusterSerializer)
    @action(detail=True, methods=["post"], serializer_class=MaintenanceSerializer, filterset_class=None)
    def maintenance(self, request: Request, pk=None) -> Response:
        """Put the cluster into maintenance (``{"on": true}``, the default) or back to healthy (``{"on": false}``)."""
        cluster = self.get_object()
        body = MaintenanceSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = services.set_cluster_maintenance(cluster, body.validated_data["on"])
        return Response(ClusterSerializer(cluster, context=self.get_serializer_context()).data)


class VDCClustersView(generics.ListCreateAPIView):
    """``vdcs/{id}/clusters/``: GET the VDC's clusters; POST (platform admins) a new cluster into this VDC."""

    queryset = Cluster.objects.none()  # the schema's model; requests use get_queryset()
    serializer_class = ClusterSerializer
    filterset_class = ClusterFilterSet
    search_fields = ["name", "description", "endpoint", "namespace"]
    ordering_fields = ["name", "cluster_type", "status", "priority", "weight", "last_heartbeat"]

    def get_vdc(self):
        return get_object_or_404(visible_vdcs(self.request.user), pk=self.kwargs["pk"])

    def get_queryset(self):
        return clusters_of(self.request.user).filter(vdc=self.get_vdc())

    def create(self, request: Request, *args, **kwargs) -> Response:
        vdc = self.get_vdc()
        if not has_platform_perm(request.user, model_perm(Cluster, "add")):
            raise PermissionDenied("Only platform admins (with the permission to add clusters) add clusters.")
        serializer = self.get_serializer(data={**request.data, "vdc": vdc.pk})
        serializer.is_valid(raise_exception=True)
        serializer.save()
        return Response(serializer.data, status=status.HTTP_201_CREATED)


class NodeViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Nodes of the clusters you may see; only platform admins write (agents report through their own channel)."""

    serializer_class = NodeSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = NodeFilterSet
    search_fields = ["name", "agent_message"]
    ordering_fields = ["name", "cluster__name", "cpu", "memory_gib", "status", "health_score", "last_report"]

    def get_queryset(self):
        nodes = Node.objects.select_related("cluster").annotate(device_count=Count("devices"))
        nodes = nodes.order_by("cluster__name", "name")
        return scope_to_vdcs(nodes, self.request.user, "cluster__vdc")


class DeviceViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Accelerators on the nodes you may see; only platform admins write."""

    serializer_class = DeviceSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = DeviceFilterSet
    search_fields = ["uuid", "pci_bus_id", "node__name", "gpu_model__name"]
    ordering_fields = ["node__name", "index", "gpu_model__name", "health_score", "utilization", "temperature_c"]

    def get_queryset(self):
        devices = Device.objects.select_related("node", "gpu_model")
        return scope_to_vdcs(devices, self.request.user, "node__cluster__vdc")


class CapacityReservationViewSet(viewsets.ModelViewSet):
    """Capacity reservations: windows in which the scheduler leaves capacity free (maintenance, or an event of
    the listed projects). Users of the VDC read them; only platform admins write."""

    serializer_class = CapacityReservationSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = CapacityReservationFilterSet
    search_fields = ["name", "reason"]
    ordering_fields = ["starts_at", "ends_at", "name", "vdc__name", "created_at"]

    def get_queryset(self):
        reservations = CapacityReservation.objects.select_related("vdc", "cluster", "gpu_model").prefetch_related(
            "nodes", "projects"
        )
        return scope_to_vdcs(reservations.order_by("starts_at", "pk"), self.request.user)
