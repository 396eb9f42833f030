"""Control-plane endpoints (platform admins): the backend objects it tracks, and a cluster's health check now."""

from __future__ import annotations

import base64
import json

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import generics, mixins, viewsets
from rest_framework.exceptions import ValidationError
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
from apps.tasks.choices import ACTIVE, WAITING
from apps.vdc.api.permissions import HasPlatformPermission
from apps.vdc.policy import sees_all


class BackendObjectViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Every job the portal created on a backend, from its launch intent to the backend's confirmation that
    it is gone (read-only; platform admins: superusers, and staff who may view backend objects)."""

    serializer_class = BackendObjectSerializer
    filterset_class = BackendObjectFilterSet
    ordering_fields = ["created_at", "ended_at", "state", "name"]
    search_fields = ["name", "external_id"]

    def get_queryset(self):
        objects = BackendObject.objects.select_related("cluster", "task")
        return objects if sees_all(self.request.user, BackendObject) else objects.none()


def encode_log_cursor(attempt: int, position: str) -> str:
    """The cursor a follower passes back as ``after``: the run and the backend's own position in its output."""
    return base64.urlsafe_b64encode(json.dumps([attempt, position]).encode()).decode().rstrip("=")


def decode_log_cursor(cursor: str) -> tuple[int, str]:
    """(attempt, backend position) from a cursor; a 400 on ``after`` for anything else."""
    try:
        attempt, position = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if isinstance(attempt, int) and not isinstance(attempt, bool) and attempt >= 0 and isinstance(position, str):
            return attempt, position
    except (ValueError, TypeError):
        pass
    raise ValidationError({"after": ["Expected the cursor of an earlier answer (its `cursor` field)."]})


class TaskLogView(generics.GenericAPIView):
    """``tasks/{id}/logs/`` GET: the last lines of one run's output, read from its backend, or, to follow it,
    only what was written since an earlier answer.

    Every run (attempt) keeps its own log: ``?attempt=`` picks one (default: the latest), ``?tail=`` how
    many lines. ``?after=<cursor>`` (the ``cursor`` of an earlier answer) returns only newer output and the
    next cursor; ``running`` says whether more may come. Anyone who may see the task may read its logs.
    """

    serializer_class = TaskLogSerializer
    filter_backends: list = []
    validates_query = True  # the schema documents its 400

    @extend_schema(parameters=[TaskLogQuerySerializer], responses=TaskLogSerializer)
    def get(self, request: Request, pk: int) -> Response:
        # The task's status is read before its output: a run seen as ended has written all it will write.
        task = get_object_or_404(tasks_of(request.user), pk=pk)
        query = TaskLogQuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        attempt, position = (0, "") if task.attempt == 0 else self._attempt_and_position(task, query.validated_data)
        if attempt > task.attempt:
            raise ValidationError({"attempt": f"Expected a run between 1 and {task.attempt}, got {attempt}."})
        running = attempt == task.attempt and (task.status in ACTIVE or (attempt == 0 and task.status in WAITING))
        body = {
            "task": task.pk,
            "attempt": attempt,
            "attempts": task.attempt,
            "cluster": "",
            "external_id": "",
            "text": "",
            "note": "",
            "cursor": encode_log_cursor(attempt, position or ""),
            "more": False,
            "running": running,
            "status": task.status,
        }
        if attempt == 0:
            body["note"] = "The task has not run yet: no log."
            return Response(body)
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
            tail = query.validated_data["tail"]
            chunk = executor_for(job.cluster).read_logs(job.external_id, after=position, tail=tail)
        except ValueError:
            raise ValidationError({"after": ["Expected the cursor of an earlier answer (its `cursor` field)."]})
        except ExecutorError as exc:
            body["note"] = f"Log unavailable: {exc}"
        else:
            body.update(text=chunk.text, cursor=encode_log_cursor(attempt, chunk.cursor), more=chunk.more)
        if not body["text"] and not body["note"]:
            body["note"] = "No new output." if position is not None else "The run wrote nothing (yet)."
        return Response(body)

    @staticmethod
    def _attempt_and_position(task, query: dict) -> tuple[int, str | None]:
        """Which run to read, and from where: None reads the tail, "" the start, else a backend position.

        A cursor names its run; one taken before the task first ran follows its first run from the start.
        """
        attempt = query.get("attempt")
        if "after" not in query:
            return (task.attempt if attempt is None else attempt), None
        cursor_attempt, position = decode_log_cursor(query["after"])
        if cursor_attempt == 0:
            return (task.attempt if attempt is None else attempt), ""
        if attempt is not None and attempt != cursor_attempt:
            raise ValidationError({"attempt": f"The cursor belongs to run {cursor_attempt}, not {attempt}."})
        return cursor_attempt, position


class ClusterHealthCheckView(generics.GenericAPIView):
    """``clusters/{id}/health-check/`` POST (platform admins): probe the backend and its nodes now.

    Three missed checks make a cluster unavailable, and its tasks are requeued under their class rules.
    """

    serializer_class = ClusterHealthSerializer
    permission_classes = [HasPlatformPermission]
    platform_permission = "clusters.change_cluster"
    filter_backends: list = []

    @extend_schema(request=None, responses=ClusterHealthSerializer)
    def post(self, request: Request, pk: int) -> Response:
        cluster = get_object_or_404(clusters_of(request.user), pk=pk)
        return Response(ClusterHealthSerializer(check_cluster_health(cluster)).data)
