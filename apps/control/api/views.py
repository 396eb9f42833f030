"""Control-plane endpoints (platform admins): the backend objects it tracks, and a cluster's health check now."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, viewsets
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response

from apps.clusters.api.serializers import ClusterHealthSerializer
from apps.clusters.api.views import clusters_of
from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError
from apps.control.api.serializers import BackendObjectSerializer, TaskLogQuerySerializer, TaskLogSerializer
from apps.control.filtersets import BackendObjectFilterSet
from apps.control.health import check_cluster_health
from apps.control.models import BackendObject
from apps.tasks.api.views import tasks_of


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


class TaskLogView(generics.GenericAPIView):
    """``tasks/{id}/logs/`` GET: the last lines of one run's output, read from its backend.

    Every run (attempt) keeps its own log: ``?attempt=`` picks one (default: the latest), ``?tail=`` how
    many lines. Anyone who may see the task may read its logs.
    """

    serializer_class = TaskLogSerializer
    filter_backends: list = []
    validates_query = True  # the schema documents its 400

    @extend_schema(parameters=[TaskLogQuerySerializer], responses=TaskLogSerializer)
    def get(self, request: Request, pk: int) -> Response:
        task = get_object_or_404(tasks_of(request.user), pk=pk)
        query = TaskLogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        attempt = query.validated_data.get("attempt", task.attempt)
        body = {"task": task.pk, "attempt": attempt, "attempts": task.attempt, "cluster": "", "external_id": "",
                "text": "", "note": ""}  # fmt: skip
        if task.attempt == 0:
            body["note"] = "The task has not run yet: no log."
            return Response(body)
        if attempt > task.attempt:
            raise ValidationError({"attempt": f"Expected a run between 1 and {task.attempt}, got {attempt}."})
        job = (
            BackendObject.objects.filter(task=task, attempt=attempt)
            .exclude(external_id="")
            .select_related("cluster")
            .order_by("-created_at")
            .first()
        )
        if job is None:
            body["note"] = f"Run {attempt} never reached a backend: no log."
            return Response(body)
        body["cluster"], body["external_id"] = job.cluster.name, job.external_id
        try:
            body["text"] = executor_for(job.cluster).logs(job.external_id, tail=query.validated_data["tail"])
        except ExecutorError as exc:
            body["note"] = f"Log unavailable: {exc}"
        if not body["text"] and not body["note"]:
            body["note"] = "The run wrote nothing (yet)."
        return Response(body)


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
