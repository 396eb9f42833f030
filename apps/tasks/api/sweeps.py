"""Parameter sweeps: ``POST /sweeps/`` creates a task per combination of values (or previews them with
``dry_run``), ``GET`` lists them with their status counts, ``POST /sweeps/{id}/stop/`` stops their tasks."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError as DjangoValidationError
from django.db.models import Count
from django.urls import reverse
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from apps.billing.services import hourly_price_of_request, price_book
from apps.core.api.common import service_errors
from apps.tasks import idempotency, sweeps
from apps.tasks.api.serializers import StopSerializer, TaskSerializer
from apps.tasks.choices import SweepGoal
from apps.tasks.filtersets import SweepFilterSet
from apps.tasks.models import Sweep, Task
from apps.vdc.policy import scope_to_projects

SWEEP_KEYS = ("parameters", "goal", "dry_run")


class SweepSubmitSerializer(TaskSerializer):
    """A task submission (the fields of ``POST /tasks/``, a task file) plus the sweep's parameters; ``name`` names
    the sweep, and its tasks ``<name>-1``, ``<name>-2``, ..."""

    parameters = serializers.JSONField(
        required=False,  # required all the same: to_internal_value says so with what is expected
        help_text='A grid, names to lists of values ({"lr": [0.1, 0.01]}: the cartesian product), or a list of '
        f'combinations ([{{"lr": 0.1, "batch_size": 32}}]); at most {sweeps.SWEEP_MAX} elements. Each element\'s '
        "job gets its values as HCS_PARAM_<NAME> variables.",
    )
    goal = serializers.ChoiceField(
        choices=SweepGoal.choices,
        required=False,
        help_text="Which element is best: the highest (max, the default) or lowest (min) metric its job reports "
        "with a last output line HCS_METRIC name=value",
    )
    dry_run = serializers.BooleanField(
        default=False, help_text="Check every element and answer the elements and price; nothing is created"
    )

    class Meta(TaskSerializer.Meta):
        fields = [*TaskSerializer.Meta.fields, *SWEEP_KEYS]

    def to_internal_value(self, data):
        if not hasattr(data, "keys"):
            return super().to_internal_value(data)
        task_data = {key: value for key, value in data.items() if key not in SWEEP_KEYS}
        extra = {}
        errors = {}
        for key in SWEEP_KEYS:
            if key in data:
                try:
                    extra[key] = self.fields[key].run_validation(data[key])
                except serializers.ValidationError as exc:
                    errors[key] = exc.detail
            elif key == "parameters":
                errors[key] = [f"Required: {sweeps.EXPECTED}."]
        try:
            values = super().to_internal_value(task_data)
        except serializers.ValidationError as exc:
            raise serializers.ValidationError({**exc.detail, **errors})
        if errors:
            raise serializers.ValidationError(errors)
        return {**values, "dry_run": False, "goal": "max", **extra}


class SweepPriceSerializer(serializers.Serializer):
    currency = serializers.CharField(allow_null=True)
    hourly_price_per_task = serializers.DecimalField(max_digits=16, decimal_places=4, allow_null=True)
    hourly_price = serializers.DecimalField(
        max_digits=18, decimal_places=4, allow_null=True, help_text="Of all the sweep's tasks running at once"
    )
    estimated_cost = serializers.DecimalField(
        max_digits=18,
        decimal_places=4,
        allow_null=True,
        help_text="Hourly price of all tasks x expected duration (null without an expected duration or a price)",
    )


class SweepElementSerializer(serializers.Serializer):
    task = serializers.IntegerField(allow_null=True, help_text="The element's task (null in a dry run)")
    name = serializers.CharField()
    values = serializers.DictField(child=serializers.CharField())
    variables = serializers.DictField(child=serializers.CharField())
    status = serializers.CharField(allow_null=True)
    url = serializers.CharField(allow_null=True, help_text="The task's page (its logs are there)")
    metric_name = serializers.CharField(help_text="Of the last HCS_METRIC line of its run's log (empty: none yet)")
    metric_value = serializers.FloatField(allow_null=True)


class SweepCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    waiting = serializers.IntegerField()
    active = serializers.IntegerField()
    finished = serializers.IntegerField()
    by_status = serializers.DictField(child=serializers.IntegerField())


class SweepSerializer(serializers.ModelSerializer):
    """A sweep with its tasks counted per status."""

    project_name = serializers.CharField(source="project.name", read_only=True)
    created_by = serializers.CharField(source="created_by.username", read_only=True)
    counts = serializers.SerializerMethodField()

    class Meta:
        model = Sweep
        fields = ["id", "name", "project", "project_name", "created_by", "parameters", "goal", "created_at", "counts"]

    @extend_schema_field(SweepCountsSerializer)
    def get_counts(self, sweep: Sweep) -> dict:
        by_status = getattr(sweep, "status_counts", None)
        if by_status is None:
            by_status = sweeps.status_counts(sweep)
        return {**sweeps.summary(by_status), "by_status": by_status}


def element(task: Task) -> dict:
    return {
        "task": task.pk,
        "name": task.name,
        "values": task.sweep_values,
        "variables": sweeps.variables(task.sweep_values),
        "status": task.status if task.pk else None,
        "url": reverse("portal:task-monitoring", args=[task.pk]) if task.pk else None,
        "metric_name": task.metric_name,
        "metric_value": task.metric_value,
    }


class SweepDetailSerializer(SweepSerializer):
    """A sweep with its elements: each one's values, variables, task, status and page."""

    elements = serializers.SerializerMethodField()
    best = serializers.SerializerMethodField()

    class Meta(SweepSerializer.Meta):
        fields = [*SweepSerializer.Meta.fields, "elements", "best"]

    def _tasks(self, sweep: Sweep) -> list[Task]:
        if not hasattr(sweep, "element_tasks"):
            sweep.element_tasks = list(sweep.tasks.order_by("pk"))
        return sweep.element_tasks

    @extend_schema_field(SweepElementSerializer(many=True))
    def get_elements(self, sweep: Sweep) -> list[dict]:
        return [element(task) for task in self._tasks(sweep)]

    @extend_schema_field(SweepElementSerializer(allow_null=True))
    def get_best(self, sweep: Sweep) -> dict | None:
        """The element whose reported metric is best by the sweep's goal; null while none reported one."""
        found = sweeps.best(sweep, self._tasks(sweep))
        return None if found is None else element(found)


class SweepCreatedSerializer(serializers.Serializer):
    """What a sweep submission created (or, with ``dry_run``, would create) and what it costs."""

    id = serializers.IntegerField(allow_null=True, help_text="The sweep's id (null in a dry run)")
    name = serializers.CharField()
    project = serializers.IntegerField()
    project_name = serializers.CharField()
    created_by = serializers.CharField()
    parameters = serializers.JSONField()
    goal = serializers.ChoiceField(choices=SweepGoal.choices)
    created_at = serializers.DateTimeField(allow_null=True, help_text="Null in a dry run")
    dry_run = serializers.BooleanField()
    size = serializers.IntegerField(help_text="How many tasks it created (would create)")
    elements = SweepElementSerializer(many=True)
    price = SweepPriceSerializer()


def sweep_price(task: Task, size: int) -> dict:
    """The list price of one element (``hourly_price_of_request``, as the create forms estimate) times the
    sweep's size, and over the expected duration when one is set."""
    book = price_book(task.vdc)
    try:
        hourly = hourly_price_of_request(task.vdc, task.cpu, task.memory_gib, task.gpu_spec, task.instances, book=book)
    except DjangoValidationError:
        hourly = None
    total = None if hourly is None else hourly * size
    hours = task.expected_duration / timedelta(hours=1) if task.expected_duration else None
    cost = None if total is None or hours is None else total * Decimal(str(round(hours, 6)))
    return {
        "currency": book.currency if book else None,
        "hourly_price_per_task": hourly,
        "hourly_price": total,
        "estimated_cost": cost,
    }


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Parameter sweeps of your projects: one submission, a task per combination of values. Owners and members
    create and stop them; viewers read."""

    serializer_class = SweepSerializer
    filterset_class = SweepFilterSet
    search_fields = ["name"]
    ordering_fields = ["created_at", "name"]

    def get_queryset(self):
        return scope_to_projects(Sweep.objects.select_related("project", "created_by"), self.request.user)

    def get_serializer_class(self):
        return SweepDetailSerializer if self.action == "retrieve" else super().get_serializer_class()

    def paginate_queryset(self, queryset):
        page = super().paginate_queryset(queryset)
        rows = page if page is not None else list(queryset)
        counts: dict[int, dict[str, int]] = {sweep.pk: {} for sweep in rows}
        found = Task.objects.filter(sweep__in=[s.pk for s in rows]).values("sweep", "status").annotate(n=Count("pk"))
        for row in found:
            counts[row["sweep"]][row["status"]] = row["n"]
        for sweep in rows:
            sweep.status_counts = counts[sweep.pk]
        return page

    @extend_schema(
        request=SweepSubmitSerializer,
        parameters=[idempotency.PARAMETER],
        responses={201: SweepCreatedSerializer, 200: SweepCreatedSerializer, 422: idempotency.KEY_REUSED},
    )
    @idempotency.idempotent
    def create(self, request: Request) -> Response:
        """Create a task per element of ``parameters`` through the submission service (roles, queue, quota, admission),
        all or none: one refused element is a 400 naming it and nothing is created. With ``dry_run`` every element
        is checked the same way and nothing is created (200). The answer prices the whole sweep. With an
        ``Idempotency-Key`` header, a retry gets the first answer instead of a second sweep."""
        body = SweepSubmitSerializer(data=request.data, context=self.get_serializer_context())
        body.is_valid(raise_exception=True)
        dry_run = body.validated_data["dry_run"]
        with service_errors():
            sweep, tasks = sweeps.create_from_body(request.user, body.validated_data, dry_run=dry_run)
        answer = {
            "id": sweep.pk,
            "name": sweep.name,
            "project": sweep.project_id,
            "project_name": sweep.project.name,
            "created_by": sweep.created_by.username,
            "parameters": sweep.parameters,
            "goal": sweep.goal,
            "created_at": None if dry_run else sweep.created_at,
            "dry_run": dry_run,
            "size": len(tasks),
            "elements": [element(task) for task in tasks],
            "price": sweep_price(tasks[0], len(tasks)),
        }
        return Response(
            SweepCreatedSerializer(answer).data, status=status.HTTP_200_OK if dry_run else status.HTTP_201_CREATED
        )

    @extend_schema(request=StopSerializer, responses=SweepDetailSerializer)
    @action(detail=True, methods=["post"], serializer_class=StopSerializer, filterset_class=None)
    def stop(self, request: Request, pk=None) -> Response:
        """Stop every task of the sweep that has not finished (owners and members; viewers get 403)."""
        sweep = self.get_object()
        body = StopSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        sweeps.stop_sweep(sweep, request.user, body.validated_data["reason"])
        return Response(SweepDetailSerializer(sweep, context=self.get_serializer_context()).data)
