"""Serializers of tasks and their events.

Submission validates only shapes here; ``apps.tasks.services.submit_task`` applies the rules (GPU spec,
queue, quota, permissions), so the API and the forms give the same messages.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.utils import timezone
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.clusters.api.views import clusters_of
from apps.clusters.models import Cluster
from apps.core.api.common import (
    CachedFieldsMixin,
    IdOrNameRelatedField,
    ScopedPrimaryKeyRelatedField,
    service_errors,
)
from apps.queues.models import TaskQueue
from apps.tasks import schedule
from apps.tasks import validation as limits
from apps.tasks.choices import FailureReason, TaskStatus
from apps.tasks.models import ServiceLoadSample, Task, TaskEvent, TaskUsageSample
from apps.tasks.services import AUTOSCALE_FIELDS, BULK_STOP_MAX, SUBMIT_FIELDS, submit_task
from apps.tasks.taskfile import unknown_key_errors
from apps.tasks.usage import MAX_RANGE as USAGE_MAX_RANGE
from apps.vdc.models import VDC, Project
from apps.vdc.policy import scope_to_vdcs, visible_projects, visible_vdcs, with_role

STATE_FIELDS = (
    "uid",
    "status",
    "status_message",
    "queue_position",
    "estimated_start",
    "pending_reason",
    "pending_message",
    "cluster",
    "cluster_name",
    "placement",
    "allocated_gpu",
    "replicas",
    "attempt",
    "window",
    "external_id",
    "submitted_at",
    "started_at",
    "finished_at",
    "updated_at",
    "exit_code",
    "failure_reason",
    "ready_replicas",
    "preemption_count",
    "lost_gpu_seconds",
    "autoscale_desired",
    "last_cold_start_s",
)


class QueueField(serializers.Field):
    """A queue by id (integer) or by name (string); a name is resolved within the task's VDC by the service."""

    default_error_messages = {
        "does_not_exist": "No queue with id {value} that you can see.",
        "incorrect_type": "Expected a queue id (integer) or name (string), got {data_type}.",
        "null_characters": "Expected a queue name without NUL characters.",
    }

    def to_internal_value(self, data) -> TaskQueue | str:
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("incorrect_type", data_type=type(data).__name__)
        if isinstance(data, str):
            if "\x00" in data:
                self.fail("null_characters")
            return data.strip()
        queues = scope_to_vdcs(TaskQueue.objects.select_related("vdc"), self.context["request"].user)
        queue = queues.filter(pk=data).first()
        if queue is None:
            self.fail("does_not_exist", value=data)
        return queue

    def to_representation(self, value: TaskQueue) -> int:
        return value.pk


class SubmitProjectField(IdOrNameRelatedField):
    """The project to submit to, by id or name, read with the submitter's role (the service checks it)."""

    def get_queryset(self):
        request = self.context.get("request")
        queryset = super().get_queryset()
        return queryset if request is None else with_role(queryset, request.user)


class QueueFieldSchema(OpenApiSerializerFieldExtension):
    """In the schema, ``queue`` takes an id or a name in requests and answers the queue's id."""

    target_class = QueueField

    def map_serializer_field(self, auto_schema, direction):
        if direction == "response":
            return {"type": "integer"}
        return {"oneOf": [{"type": "integer"}, {"type": "string"}], "description": "Queue id, or name within the VDC"}


STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}


@extend_schema_field({**STRING_MAP, "maxProperties": limits.MAX_ENV_VARS, "example": {"EPOCHS": "3"}})
class EnvField(serializers.JSONField):
    """Environment variables: names of letters, digits and underscores; string values (Task.clean checks them)."""


@extend_schema_field(
    {
        **STRING_MAP,
        "maxProperties": limits.MAX_ENV_VARS,
        "writeOnly": True,
        "description": "Secret variables: stored encrypted, given to the job, never shown back (see secret_env_names)",
        "example": {"WANDB_API_KEY": "<your key>"},
    }
)
class SecretEnvField(serializers.JSONField):
    """Secret environment variables, write-only: the rules of ``env``; answers show only their names."""


@extend_schema_field({**STRING_MAP, "maxProperties": limits.MAX_LABELS, "example": {"gpu": "a100"}})
class LabelsField(serializers.JSONField):
    """Cluster labels the task requires, as strings (Task.clean checks them)."""


@extend_schema_field(
    {
        "type": "array",
        "maxItems": limits.MAX_VOLUMES,
        "items": {
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": limits.VOLUME_NAME.pattern},
                "mount_path": {"type": "string", "description": "Absolute path in the container"},
                "claim_name": {"type": "string", "description": "A volume claim (one source of the two)"},
                "host_path": {"type": "string", "description": "A node directory a cluster admin approved"},
                "read_only": {"type": "boolean"},
            },
            "required": ["name", "mount_path"],
            "additionalProperties": False,
        },
        "example": [{"name": "data", "mount_path": "/data", "claim_name": "datasets", "read_only": True}],
    }
)
class VolumesField(serializers.JSONField):
    """Volumes: name, absolute mount path and one source, a claim or an approved host path (Task.clean checks)."""


@extend_schema_field(
    {
        "type": "array",
        "maxItems": limits.MAX_SECRET_REFS,
        "items": {
            "type": "object",
            "properties": {
                "secret": {"type": "string", "description": "The name of a secret of the task's project"},
                "env": {"type": "string", "description": "Given to the job as this environment variable"},
                "file": {"type": "string", "description": "Or given as an owner-read-only file at this absolute path"},
            },
            "required": ["secret"],
            "additionalProperties": False,
        },
        "description": "Project secrets given to the job by name, each as a variable (env) or a file (file); the "
        "values never appear here. Every attempt gets the secret's value at its start.",
        "example": [{"secret": "HF_TOKEN", "env": "HF_TOKEN"}, {"secret": "REGISTRY", "file": "/run/secrets/registry"}],
    }
)
class SecretRefsField(serializers.JSONField):
    """References to project secrets by name (``submit_task`` checks them and that they exist)."""


@extend_schema_field(
    {
        "type": "array",
        "maxItems": schedule.MAX_ENTRIES,
        "items": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {
                        "days": {"type": "string", "description": "Days and ranges of Mon..Sun: Mon-Fri, Sat,Sun"},
                        "from": {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9]$"},
                        "to": {
                            "type": "string",
                            "pattern": "^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$",
                            "description": "Earlier than from: the window crosses midnight",
                        },
                        "timezone": {"type": "string", "description": "A time zone name (default UTC)"},
                        "min_replicas": {"type": "integer", "minimum": 1},
                    },
                    "required": ["days", "from", "to", "min_replicas"],
                    "additionalProperties": False,
                },
                {"type": "string", "description": f"One line: {schedule.LINE_FORM}"},
            ]
        },
        "description": "Inference: scheduled minimums. While an entry holds, the service runs at least its "
        "min_replicas (within min..max replicas); answers give every entry as an object",
        "example": [
            {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "Europe/Berlin", "min_replicas": 4}
        ],
    }
)
class ScheduleField(serializers.JSONField):
    """Scheduled minimums: objects or one-line entries, stored as objects (``Task.clean`` checks them)."""

    def to_internal_value(self, data):
        return schedule.normalise(super().to_internal_value(data))


def _bounds(lowest, highest) -> dict:
    return {"min_value": lowest, "max_value": highest}


class TaskEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor.username", read_only=True, allow_null=True, default=None)
    # Blank when the event changed no status (the first event has no status before it).
    from_status = serializers.ChoiceField(choices=TaskStatus.choices, allow_blank=True, read_only=True)
    to_status = serializers.ChoiceField(choices=TaskStatus.choices, allow_blank=True, read_only=True)

    class Meta:
        model = TaskEvent
        fields = ["id", "task", "kind", "from_status", "to_status", "message", "data", "actor", "created_at"]
        read_only_fields = fields


class HumanDurationField(serializers.DurationField):
    """A duration as the pages take it (``2h``, ``1h30m``, ``90m``, ``02:00:00``) or as Django writes it
    (``[-]D HH:MM:SS``, ISO 8601 ``P1DT2H``)."""

    def to_internal_value(self, value):
        if isinstance(value, str) and limits.is_unit_duration(value.strip()):
            try:
                return limits.parse_duration_text(value)
            except ValueError as exc:
                raise serializers.ValidationError(str(exc))
        return super().to_internal_value(value)


class TaskSerializer(CachedFieldsMixin, serializers.ModelSerializer):
    """A task: what was asked for (writable on submit) and how far it got (read-only, set by the scheduler).

    ``project`` and ``vdc`` take an id or a name; ``vdc`` defaults to the default VDC; ``queue`` takes an id
    or a name within the VDC.
    """

    project = SubmitProjectField(queryset=Project.objects.all(), scope=visible_projects)
    vdc = IdOrNameRelatedField(queryset=VDC.objects.all(), scope=visible_vdcs, required=False, allow_null=True)
    queue = QueueField(required=False, allow_null=True)
    preferred_clusters = ScopedPrimaryKeyRelatedField(
        scope=clusters_of, many=True, queryset=Cluster.objects.all(), required=False
    )
    project_name = serializers.CharField(source="project.name", read_only=True)
    vdc_name = serializers.CharField(source="vdc.name", read_only=True)
    queue_name = serializers.CharField(source="queue.name", read_only=True)
    priority_class = serializers.CharField(source="queue.priority_class", read_only=True)
    owner = serializers.CharField(source="owner.username", read_only=True)
    cluster_name = serializers.CharField(source="cluster.name", read_only=True, allow_null=True, default=None)
    env = EnvField(required=False)
    secret_env = SecretEnvField(required=False, write_only=True)
    secret_env_names = serializers.ListField(child=serializers.CharField(), read_only=True)
    failure_reason = serializers.ChoiceField(
        choices=FailureReason.choices,
        allow_blank=True,
        read_only=True,
        help_text="Why the last run failed (empty if it did not)",
    )
    required_labels = LabelsField(required=False)
    volumes = VolumesField(required=False)
    secret_refs = SecretRefsField(required=False)
    autoscale_schedule = ScheduleField(required=False)

    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.DurationField: HumanDurationField,
    }

    class Meta:
        model = Task
        fields = [
            "id",
            "project",
            "project_name",
            "vdc",
            "vdc_name",
            "queue",
            "queue_name",
            "priority_class",
            "owner",
            *SUBMIT_FIELDS,
            "secret_env",
            "secret_env_names",
            "preferred_clusters",
            *STATE_FIELDS,
        ]
        read_only_fields = [f for f in STATE_FIELDS if f not in ("cluster_name",)]
        # The bounds of apps.tasks.validation, so the schema shows them; Task.clean checks them for every door.
        extra_kwargs = {field: _bounds(lowest, highest) for field, lowest, highest in limits.NUMBER_BOUNDS}

    def to_internal_value(self, data):
        # A submit body is a task file: a key that is no field of a submission is refused by name, not ignored.
        if hasattr(data, "keys"):
            errors = unknown_key_errors(data)
            for key in errors:
                if key in self.fields and self.fields[key].read_only:
                    errors[key] = "Read-only: the portal sets it; a submission may not."
            if errors:
                raise serializers.ValidationError({key: [message] for key, message in errors.items()})
        return super().to_internal_value(data)

    def create(self, validated_data: dict) -> Task:
        user = self.context["request"].user
        project = validated_data.pop("project")
        queue = validated_data.pop("queue", None)
        vdc = validated_data.pop("vdc", None)
        preferred = validated_data.pop("preferred_clusters", [])
        with service_errors():
            return submit_task(
                user, project=project, queue=queue, vdc=vdc, preferred_clusters=preferred, **validated_data
            )


class TaskDetailSerializer(TaskSerializer):
    """A task with its timeline."""

    events = TaskEventSerializer(many=True, read_only=True)

    class Meta(TaskSerializer.Meta):
        fields = [*TaskSerializer.Meta.fields, "events"]


class TaskCreatedSerializer(TaskDetailSerializer):
    """A task just submitted, and what to expect of it."""

    notice = serializers.CharField(
        read_only=True,
        help_text="Set when it can only start after others leave (tasks waiting ahead, its GPUs in use now); empty "
        "otherwise",
    )

    class Meta(TaskDetailSerializer.Meta):
        fields = [*TaskDetailSerializer.Meta.fields, "notice"]


class AutoscaleSerializer(serializers.ModelSerializer):
    """The autoscaling settings of an inference service, the only fields a PATCH of a task may change."""

    autoscale_schedule = ScheduleField(required=False)

    class Meta:
        model = Task
        fields = list(AUTOSCALE_FIELDS)
        extra_kwargs = {
            field: _bounds(lowest, highest)
            for field, lowest, highest in limits.NUMBER_BOUNDS
            if field in AUTOSCALE_FIELDS
        }


class LoadPointSerializer(serializers.ModelSerializer):
    """One 5-minute bucket of a service's load: measured (null in the future) and forecast (null when none)."""

    class Meta:
        model = ServiceLoadSample
        fields = ["start", "rps", "forecast_rps", "forecast_method", "gpu_percent"]


class UsageSampleSerializer(serializers.ModelSerializer):
    """One minute of a task's cards, from its node agents' reports."""

    class Meta:
        model = TaskUsageSample
        fields = ["at", "gpu_percent", "vram_used_gib", "vram_gib", "cards"]


class UsageRangeSerializer(serializers.Serializer):
    """The time range of ``GET /tasks/{id}/utilisation/``."""

    since = serializers.DateTimeField(required=False, help_text="ISO 8601; default 24 h before until")
    until = serializers.DateTimeField(required=False, help_text="ISO 8601; default now")

    def validate(self, attrs):
        until = attrs.get("until") or timezone.now()
        try:
            since = attrs.get("since") or until - timedelta(days=1)
        except OverflowError:
            raise serializers.ValidationError({"until": "Expected a time after 0001-01-02."})
        if since >= until:
            raise serializers.ValidationError({"since": "Expected a time before until."})
        if until - since > USAGE_MAX_RANGE:
            raise serializers.ValidationError(
                {"since": f"Expected a range of at most {USAGE_MAX_RANGE.days} days; ask for it in parts."}
            )
        return {"since": since, "until": until}


class TaskUtilisationSerializer(serializers.Serializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    interval_seconds = serializers.IntegerField()
    mean_gpu_percent = serializers.FloatField(
        allow_null=True, help_text="Mean GPU utilisation over everything recorded of the task"
    )
    samples = UsageSampleSerializer(many=True)


class StopSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class ConnectTicketAskSerializer(serializers.Serializer):
    port = serializers.IntegerField(min_value=1, max_value=65535, help_text="a port of the task (its Connect ports)")


class ConnectTicketSerializer(serializers.Serializer):
    origin = serializers.CharField(help_text="the port's own origin, http(s)://<task>-<port>.<HCS_APPS_DOMAIN>")
    url = serializers.CharField(help_text="the origin's ticket exchange: GET it once, within a minute")
    expires_in = serializers.IntegerField(help_text="seconds the ticket stays valid")


class BulkStopSerializer(serializers.Serializer):
    ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**31 - 1),
        min_length=1,
        max_length=BULK_STOP_MAX,
        help_text=f"Ids of the tasks to stop (at most {BULK_STOP_MAX})",
    )
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)


class BulkStopResultSerializer(serializers.Serializer):
    stopped = serializers.ListField(child=serializers.IntegerField(), help_text="Ids of the tasks stopped now")
    left_alone = serializers.IntegerField(
        help_text="Ids not stopped: already finished, unknown, or of a project where you may not stop tasks"
    )


class InstanceDeviceSerializer(serializers.Serializer):
    node = serializers.CharField()
    index = serializers.IntegerField(help_text="The card's index on its node")
    model = serializers.CharField(help_text="GPU model")
    share_percent = serializers.FloatField(help_text="Share of the card the instance holds")
    utilization_percent = serializers.IntegerField(help_text="The node agent's last reading")
    vram_used_gib = serializers.FloatField()
    vram_gib = serializers.FloatField()
    temperature_c = serializers.IntegerField(allow_null=True)


class InstancePortSerializer(serializers.Serializer):
    port = serializers.IntegerField(help_text="The Service's port (or the job's own port where there is no Service)")
    target_port = serializers.JSONField(help_text="The port in the instance (a number or a named port)")
    protocol = serializers.CharField()
    name = serializers.CharField(allow_blank=True)
    node_port = serializers.IntegerField(required=False)


class InstanceSerializer(serializers.Serializer):
    """One instance (replica, rank) of a task now; null where the backend cannot tell."""

    index = serializers.IntegerField(help_text="Rank (indexed jobs, gangs) or replica number")
    name = serializers.CharField(help_text="The backend's name: pod, local rank, Slurm job/node")
    state = serializers.CharField(help_text="In the backend's words (Running, CrashLoopBackOff, exited 0 ...)")
    node = serializers.CharField(allow_null=True)
    ip = serializers.CharField(allow_null=True)
    restarts = serializers.IntegerField(allow_null=True)
    cpu_used_cores = serializers.FloatField(allow_null=True)
    cpu_requested_cores = serializers.FloatField()
    cpu_percent = serializers.FloatField(allow_null=True, help_text="CPU used against requested")
    memory_used_gib = serializers.FloatField(allow_null=True)
    memory_requested_gib = serializers.FloatField()
    memory_percent = serializers.FloatField(allow_null=True, help_text="Memory used against requested")
    usage_note = serializers.CharField(allow_blank=True, help_text="Why CPU / memory use is unknown")
    started_at = serializers.DateTimeField(allow_null=True)
    message = serializers.CharField(allow_blank=True)
    devices = InstanceDeviceSerializer(many=True)
    service = serializers.CharField(allow_null=True)
    ports = InstancePortSerializer(many=True)
    ingress_host = serializers.CharField(allow_null=True)
    ingress_tls = serializers.BooleanField(allow_null=True)
    secrets = serializers.ListField(
        child=serializers.CharField(), help_text="Names of the secrets it mounts and of the task's secret variables"
    )


class TaskInstancesSerializer(serializers.Serializer):
    instances = InstanceSerializer(many=True)
    error = serializers.CharField(allow_blank=True, help_text="Why the backend could not be asked")
    note = serializers.CharField(allow_blank=True, help_text="Why there is no instance (waiting, ended)")


class ResourceVectorSerializer(serializers.Serializer):
    cpu = serializers.DecimalField(max_digits=16, decimal_places=3)
    memory_gib = serializers.DecimalField(max_digits=16, decimal_places=3)
    gpu = serializers.DecimalField(max_digits=16, decimal_places=3, help_text="GPU-equivalents")


class VDCStatsSerializer(serializers.Serializer):
    vdc = serializers.IntegerField()
    tasks_by_status = serializers.DictField(child=serializers.IntegerField())
    queued = serializers.IntegerField(help_text="Tasks waiting for the scheduler")
    active = serializers.IntegerField(help_text="Tasks holding resources")
    running_gpu_equivalents = serializers.DecimalField(max_digits=16, decimal_places=3)


class ClusterResourcesSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    enabled = serializers.BooleanField()
    status = serializers.CharField()
    capacity = ResourceVectorSerializer()
    allocated = ResourceVectorSerializer()
    free = ResourceVectorSerializer()


class VDCResourcesSerializer(serializers.Serializer):
    vdc = serializers.IntegerField()
    capacity = ResourceVectorSerializer()
    allocated = ResourceVectorSerializer()
    free = ResourceVectorSerializer()
    clusters = ClusterResourcesSerializer(many=True)


class DeviceModelCountSerializer(serializers.Serializer):
    gpu_model = serializers.CharField()
    vendor = serializers.CharField()
    count = serializers.IntegerField()
    vram_gib = serializers.DecimalField(max_digits=16, decimal_places=2)
    gpu_equivalents = serializers.DecimalField(max_digits=16, decimal_places=3)


class NodeCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField()
    by_status = serializers.DictField(child=serializers.IntegerField())


class ClusterStatsSerializer(serializers.Serializer):
    cluster = serializers.IntegerField()
    nodes = NodeCountsSerializer()
    devices = DeviceModelCountSerializer(many=True)
    capacity = ResourceVectorSerializer()
    allocated = ResourceVectorSerializer()
    active_tasks = serializers.IntegerField()


class LineupEntrySerializer(serializers.Serializer):
    """One waiting task as you may see it; another project's task has no id, name, project or owner."""

    position = serializers.IntegerField(allow_null=True, help_text="1-based place in the queue; null until ranked")
    status = serializers.CharField()
    request = serializers.CharField(source="resources", help_text='e.g. "2(A100), 8 CPU, 32 GiB"')
    waiting_seconds = serializers.IntegerField(help_text="Time since submission")
    waiting_for = serializers.CharField(help_text='The wait in words, e.g. "12 min"')
    visible = serializers.BooleanField(help_text="A task of one of your projects (shown by name)")
    mine = serializers.BooleanField(help_text="Your own task")
    task = serializers.IntegerField(source="task_id", allow_null=True)
    name = serializers.CharField(allow_null=True)
    project = serializers.CharField(allow_null=True)
    owner = serializers.CharField(allow_null=True)
    estimated_start = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="Why the task waits, e.g. the project's quota")
    reason_kind = serializers.CharField(
        help_text='The kind of reason it waits for in words, e.g. "its project\'s quota" (empty when unknown); '
        "all that is shown of another project's task"
    )
    label = serializers.CharField(help_text="What pages show: the name, or an anonymised description")

    def to_representation(self, instance):
        data = super().to_representation(instance)
        if not instance.visible:
            data.update(task=None, name=None, project=None, owner=None, estimated_start=None, reason=None)
        else:
            data["label"] = instance.name
        return data


class QueueLineupSerializer(serializers.Serializer):
    queue = serializers.IntegerField()
    waiting = serializers.IntegerField(help_text="Tasks waiting in the queue (all projects)")
    shown = serializers.IntegerField(help_text="Entries below; the first ones of the queue and yours beyond them")
    entries = LineupEntrySerializer(many=True)
