"""Control-plane endpoints (platform admins): the backend objects it tracks, and a cluster's health check now."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, viewsets
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.clusters.api.serializers import ClusterHealthSerializer
from apps.clusters.api.views import clusters_of
from apps.control.api.serializers import BackendObjectSerializer
from apps.control.filtersets import BackendObjectFilterSet
from apps.control.health import check_cluster_health
from apps.control.models import BackendObject


class BackendObjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every job the portal created on a backend, from its launch intent to the backend's confirmation that
    it is gone (read-only; platform admins)."""

    serializer_class = BackendObjectSerializer
    filterset_class = BackendObjectFilterSet
    ordering_fields = ["created_at", "ended_at", "state", "name"]
    search_fields = ["name", "external_id"]

    def get_queryset(self):
        objects = BackendObject.objects.select_related("cluster", "task")
        return objects if self.request.user.is_staff else objects.none()


class ClusterHealthCheckView(generics.GenericAPIView):
    """``clusters/{id}/health-check/`` POST (platform admins): probe the backend and its nodes now.

    Three missed checks make a cluster unavailable, and its tasks are requeued under their class rules.
    """

    serializer_class = ClusterHealthSerializer
    permission_classes = [IsAdminUser]
    filter_backends: list = []

    @extend_schema(request=None, responses=ClusterHealthSerializer)
    def post(self, request: Request, pk: int) -> Response:
        cluster = get_object_or_404(clusters_of(request.user), pk=pk)
        return Response(ClusterHealthSerializer(check_cluster_health(cluster)).data)
