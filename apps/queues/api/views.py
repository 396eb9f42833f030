"""Viewset of task queues with open / close actions."""

from __future__ import annotations

from django.db.models import Count, Q
from drf_spectacular.utils import extend_schema
from rest_framework import viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.api.common import ProtectedDestroyMixin
from apps.queues import services
from apps.queues.api.serializers import TaskQueueSerializer
from apps.queues.filtersets import TaskQueueFilterSet
from apps.queues.models import TaskQueue
from apps.vdc.api.permissions import AdminWriteOrReadOnly
from apps.vdc.policy import scope_to_vdcs

# The task statuses are the tasks app's; queues count them by value without importing it.
WAITING_STATUSES = ("pending", "queued", "preempted", "suspended")
ACTIVE_STATUSES = ("scheduled", "starting", "running", "unknown")


class TaskQueueViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Queues of the VDCs you may see. Only platform admins write, open, close or change a policy (PATCH)."""

    serializer_class = TaskQueueSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = TaskQueueFilterSet
    search_fields = ["name", "description"]
    ordering_fields = ["name", "vdc__name", "priority_class", "policy", "weight", "waiting_count", "created_at"]

    def get_queryset(self):
        queues = (
            TaskQueue.objects.select_related("vdc")
            .annotate(
                waiting_count=Count("tasks", filter=Q(tasks__status__in=WAITING_STATUSES)),
                active_count=Count("tasks", filter=Q(tasks__status__in=ACTIVE_STATUSES)),
            )
            .order_by("vdc__name", "priority_class", "name")
        )
        return scope_to_vdcs(queues, self.request.user)

    def _set_open(self, is_open: bool) -> Response:
        queue = services.set_queue_open(self.get_object(), is_open)
        return Response(self.get_serializer(self.get_queryset().get(pk=queue.pk)).data)

    @extend_schema(request=None, responses=TaskQueueSerializer)
    @action(detail=True, methods=["post"], filterset_class=None)
    def open(self, request: Request, pk=None) -> Response:
        """Take new submissions again."""
        return self._set_open(True)

    @extend_schema(request=None, responses=TaskQueueSerializer)
    @action(detail=True, methods=["post"], filterset_class=None)
    def close(self, request: Request, pk=None) -> Response:
        """Take no new submissions; queued and running tasks stay."""
        return self._set_open(False)
