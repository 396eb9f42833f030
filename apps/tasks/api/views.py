"""Task endpoints (submit, list, detail, stop, delete, events, instances) and the task-derived VDC and cluster stats.

The VDC and cluster stats live here rather than in the vdc and clusters apps because they aggregate
tasks, and dependencies point from tasks to the other apps, not back.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.db.models import Prefetch
from django.shortcuts import get_object_or_404
from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import generics, mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from apps.clusters.api.views import clusters_of
from apps.core.api.common import Conflict, service_errors
from apps.core.api.schema import ErrorDetailSerializer
from apps.queues.models import TaskQueue
from apps.tasks import access, connect, idempotency, lineup, live, services, taskfile, usage
from apps.tasks.admission import wait_notice
from apps.tasks.api import stats
from apps.tasks.api.file_schema import task_file_schema
from apps.tasks.api.serializers import (
    AutoscaleSerializer,
    BulkStopResultSerializer,
    BulkStopSerializer,
    ClusterStatsSerializer,
    ConnectTicketAskSerializer,
    ConnectTicketSerializer,
    LoadPointSerializer,
    QueueLineupSerializer,
    StopSerializer,
    TaskCreatedSerializer,
    TaskDetailSerializer,
    TaskEventSerializer,
    TaskInstancesSerializer,
    TaskSerializer,
    TaskUtilisationSerializer,
    UsageRangeSerializer,
    VDCResourcesSerializer,
    VDCStatsSerializer,
)
from apps.tasks.filtersets import TaskFilterSet
from apps.tasks.instances import task_instances
from apps.tasks.load import load_series
from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import AUTOSCALE_FIELDS
from apps.vdc.policy import scope_to_projects, scope_to_vdcs, visible_vdcs

TASK_ORDERING = [
    "submitted_at",
    "started_at",
    "finished_at",
    "name",
    "status",
    "queue_position",
    "estimated_start",
    "queue__priority_class",
    "allocated_gpu",
]
TASK_SEARCH = ["name", "image", "external_id"]


def with_events(tasks):
    """Tasks with their timeline (and each event's actor) loaded in two queries."""
    return tasks.prefetch_related(Prefetch("events", TaskEvent.objects.select_related("actor")))


def tasks_of(user):
    """Tasks of the user's projects (all for staff who may view tasks), with what lists show loaded up front."""
    tasks = Task.objects.select_related("project", "owner", "vdc", "queue", "cluster").prefetch_related(
        "preferred_clusters"
    )
    return scope_to_projects(tasks, user)


class TaskViewSet(
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Compute tasks of your projects. Owners and members submit, stop and delete; viewers read.

    A task is not edited after submission (stop it and submit a new one), except an inference service's
    autoscaling settings (PATCH).
    """

    serializer_class = TaskSerializer
    filterset_class = TaskFilterSet
    search_fields = TASK_SEARCH
    ordering_fields = TASK_ORDERING

    def get_queryset(self):
        tasks = tasks_of(self.request.user)
        return with_events(tasks) if self.action == "retrieve" else tasks

    def get_serializer_class(self):
        return TaskDetailSerializer if self.action == "retrieve" else super().get_serializer_class()

    def _detail(self, pk: int) -> dict:
        """The task as the detail endpoint shows it, freshly loaded with its timeline (404 once deleted)."""
        task = get_object_or_404(with_events(tasks_of(self.request.user)), pk=pk)
        return TaskDetailSerializer(task, context=self.get_serializer_context()).data

    @extend_schema(
        request=TaskSerializer,
        parameters=[idempotency.PARAMETER],
        responses={201: TaskCreatedSerializer, 422: idempotency.KEY_REUSED},
    )
    @idempotency.idempotent
    def create(self, request: Request, *args, **kwargs) -> Response:
        """Submit a task through the submission service (GPU spec, queue, quota and role rules); with an
        ``Idempotency-Key`` header, a retry gets the first answer instead of a second task."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        task = serializer.save()
        # Shown as the detail endpoint shows it, from the rows just written (the service keeps the submission
        # event and the preferred clusters on the task): nothing is loaded back.
        events = TaskEventSerializer(task.events.all(), many=True).data
        body = {**serializer.data, "events": events, "notice": wait_notice(task)}
        return Response(body, status=status.HTTP_201_CREATED)

    @extend_schema(request=AutoscaleSerializer, responses=TaskDetailSerializer)
    def partial_update(self, request: Request, *args, **kwargs) -> Response:
        """Change an inference service's autoscaling (min/max replicas, CPU/GPU/memory %, requests/s and
        requests-in-flight targets), validated like a submission; any other field is refused."""
        task = self.get_object()
        others = sorted(set(request.data) - set(AUTOSCALE_FIELDS)) if hasattr(request.data, "keys") else []
        if others:
            raise ValidationError(
                dict.fromkeys(others, "Only the autoscaling settings of a task can change after submission.")
            )
        body = AutoscaleSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        with service_errors():
            services.update_autoscaling(task, request.user, **body.validated_data)
        return Response(self._detail(task.pk))

    def perform_destroy(self, instance: Task) -> None:
        with service_errors():
            services.delete_task(instance, self.request.user)

    @extend_schema(
        request=ConnectTicketAskSerializer,
        responses={
            200: ConnectTicketSerializer,
            409: OpenApiResponse(ErrorDetailSerializer, description="The task is not running."),
        },
    )
    @action(
        detail=True,
        methods=["post"],
        url_path="connect-ticket",
        serializer_class=ConnectTicketAskSerializer,
        filterset_class=None,
        pagination_class=None,
    )
    def connect_ticket(self, request: Request, pk=None) -> Response:
        """A Connect ticket for a port of the task, for a client that is not a browser (``hcs port-forward``):
        the same hand-over and the same rule as the task page's Connect link (owners and members of the project,
        a declared port, a running task). GET ``url`` once, within ``expires_in`` seconds and without following
        its redirect: its answer sets the app cookie of ``origin``, which every request to the app then carries
        (docs/console.md)."""
        body = ConnectTicketAskSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        task_id, port = int(pk), body.validated_data["port"]
        try:
            access.check_connect(request.user, task_id, port)
        except access.Refused as refused:
            raise {404: NotFound, 409: Conflict}.get(refused.code, PermissionDenied)(str(refused))
        back = request.build_absolute_uri(reverse("portal:task-monitoring", args=[task_id]))
        ticket = connect.issue_ticket(request.user, task_id, port, "/", back=back)
        origin = connect.app_origin(request, task_id, port)
        answer = {
            "origin": origin,
            "url": f"{origin}{connect.EXCHANGE_PATH}?{urlencode({'ticket': ticket})}",
            "expires_in": connect.TICKET_MAX_AGE_S,
        }
        return Response(ConnectTicketSerializer(answer).data)

    @extend_schema(request=StopSerializer, responses=TaskDetailSerializer)
    @action(detail=True, methods=["post"], serializer_class=StopSerializer, filterset_class=None)
    def stop(self, request: Request, pk=None) -> Response:
        """Stop the task: a waiting one at once, a running one on its backend right after."""
        task = self.get_object()
        body = StopSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            with service_errors():
                services.stop_task(task, request.user, body.validated_data["reason"])
        except Task.DoesNotExist:
            # Deleted by another request since it was looked up.
            raise NotFound(f"Task {task.pk} no longer exists.")
        return Response(self._detail(task.pk))

    @extend_schema(request=BulkStopSerializer, responses=BulkStopResultSerializer)
    @action(
        detail=False,
        methods=["post"],
        url_path="stop-selected",
        serializer_class=BulkStopSerializer,
        filterset_class=None,
    )
    def stop_selected(self, request: Request) -> Response:
        """Stop many tasks in one call (the list page's "Stop selected"): those you may stop that are not
        finished; the others are counted in ``left_alone``. Viewers get 403."""
        body = BulkStopSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        stopped, left = services.stop_tasks(body.validated_data["ids"], request.user, body.validated_data["reason"])
        return Response(BulkStopResultSerializer({"stopped": [t.pk for t in stopped], "left_alone": left}).data)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=False, methods=["get"], url_path="file-schema", filterset_class=None, pagination_class=None)
    def file_schema(self, request: Request) -> Response:
        """The JSON Schema of a task file: the submit body of ``POST /tasks/`` (its request schema, every
        reference resolved) as one standalone document; a task file is that body in YAML or JSON, and unknown
        keys are refused. docs/task-file.schema.json is a copy."""
        return Response(task_file_schema())

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], url_path="task-file", filterset_class=None, pagination_class=None)
    def task_file(self, request: Request, pk=None) -> Response:
        """The task's task file as JSON: what it was submitted with, fields left at their defaults left out, and
        secret variables too (their values are never shown; ``secret_env_names`` in the detail names them).
        Submitted again as it is, it gives an equal task. The task page downloads the same as YAML."""
        return Response(taskfile.task_file(self.get_object()))

    @extend_schema(responses=TaskEventSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=TaskEventSerializer, filterset_class=None)
    def events(self, request: Request, pk=None) -> Response:
        """The task's timeline, oldest first."""
        task = self.get_object()
        page = self.paginate_queryset(task.events.select_related("actor").order_by("created_at", "id"))
        return self.get_paginated_response(TaskEventSerializer(page, many=True).data)

    @extend_schema(responses=LoadPointSerializer(many=True))
    @action(
        detail=True, methods=["get"], serializer_class=LoadPointSerializer, filterset_class=None, pagination_class=None
    )
    def load(self, request: Request, pk=None) -> Response:
        """An inference service's load per 5-minute bucket, from a day ago to an hour ahead: the request rate
        and GPU utilisation the autoscaler measured, and the request rate forecast for the bucket (predictive
        scaling). Empty for a task the portal's autoscaler does not watch."""
        task = self.get_object()
        return Response(LoadPointSerializer(load_series(task), many=True).data)

    @extend_schema(parameters=[UsageRangeSerializer], responses=TaskUtilisationSerializer)
    @action(
        detail=True,
        methods=["get"],
        serializer_class=TaskUtilisationSerializer,
        filterset_class=None,
        pagination_class=None,
    )
    def utilisation(self, request: Request, pk=None) -> Response:
        """The task's utilisation history: per minute while it ran, the mean utilisation of its cards and the GPU
        memory used on them, from its node agents' reports, between ``since`` and ``until`` (default the last
        24 h, at most 31 days), and its mean GPU utilisation over everything recorded (docs/monitoring.md)."""
        task = self.get_object()
        query = UsageRangeSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        since, until = query.validated_data["since"], query.validated_data["until"]
        body = {
            "since": since,
            "until": until,
            "interval_seconds": int(usage.INTERVAL.total_seconds()),
            "mean_gpu_percent": usage.summary(task).mean_gpu_percent,
            "samples": usage.series(task, since, until),
        }
        return Response(TaskUtilisationSerializer(body).data)

    utilisation.validates_query = True  # the schema documents its 400

    @extend_schema(responses=TaskInstancesSerializer)
    @action(
        detail=True,
        methods=["get"],
        serializer_class=TaskInstancesSerializer,
        filterset_class=None,
        pagination_class=None,
    )
    def instances(self, request: Request, pk=None) -> Response:
        """Each instance (replica, rank) of the task now: state, node, IP, restarts, CPU and memory used against
        requested, its cards with the node agent's figures, Service ports, Ingress host and TLS, and the names
        (never the values) of its secrets. Asks the backend (at most a few seconds): ``error`` says when it
        did not answer, ``note`` why there is no instance."""
        task = self.get_object()
        found = task_instances(task)
        body = {"instances": found.rows, "error": found.error, "note": found.note}
        return Response(TaskInstancesSerializer(body).data)


class VDCStatsView(generics.GenericAPIView):
    """``vdcs/{id}/stats/``: task counts per status in the VDC (all projects, counts only), GPU-equivalents held."""

    serializer_class = VDCStatsSerializer
    filter_backends: list = []

    def get(self, request: Request, pk: int) -> Response:
        vdc = get_object_or_404(visible_vdcs(request.user), pk=pk)
        return Response(VDCStatsSerializer(stats.vdc_stats(vdc)).data)


class VDCResourcesView(generics.GenericAPIView):
    """``vdcs/{id}/resources/``: capacity, allocated and free cpu / memory / GPU-equivalents, total and per cluster."""

    serializer_class = VDCResourcesSerializer
    filter_backends: list = []

    def get(self, request: Request, pk: int) -> Response:
        vdc = get_object_or_404(visible_vdcs(request.user), pk=pk)
        return Response(VDCResourcesSerializer(stats.vdc_resources(vdc)).data)


class QueueLineupView(generics.GenericAPIView):
    """``queues/{id}/lineup/``: who is ahead of you. The queue's first waiting tasks in order and yours beyond
    them, with positions and estimated starts; another project's task shows only its request and wait."""

    serializer_class = QueueLineupSerializer
    filter_backends: list = []

    def get(self, request: Request, pk: int) -> Response:
        queue = get_object_or_404(scope_to_vdcs(TaskQueue.objects.all(), request.user), pk=pk)
        waiting = live.queue_counts([queue.pk])[queue.pk]["waiting"]
        entries = [e for e in lineup.lineups([queue.pk], request.user)[queue.pk] if isinstance(e, lineup.Entry)]
        body = {"queue": queue.pk, "waiting": waiting, "shown": len(entries), "entries": entries}
        return Response(QueueLineupSerializer(body).data)


class ClusterStatsView(generics.GenericAPIView):
    """``clusters/{id}/stats/``: nodes per status, devices per GPU model, capacity and allocation."""

    serializer_class = ClusterStatsSerializer
    filter_backends: list = []

    def get(self, request: Request, pk: int) -> Response:
        cluster = get_object_or_404(clusters_of(request.user), pk=pk)
        return Response(ClusterStatsSerializer(stats.cluster_stats(cluster)).data)


class ClusterJobsView(generics.ListAPIView):
    """``clusters/{id}/jobs/``: the tasks placed on the cluster, limited to your projects' tasks."""

    queryset = Task.objects.none()  # the schema's model; requests use get_queryset()
    serializer_class = TaskSerializer
    filterset_class = TaskFilterSet
    search_fields = TASK_SEARCH
    ordering_fields = TASK_ORDERING

    def get_queryset(self):
        cluster = get_object_or_404(clusters_of(self.request.user), pk=self.kwargs["pk"])
        return tasks_of(self.request.user).filter(cluster=cluster)
