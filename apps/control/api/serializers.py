"""Serializers of the control plane's records (read-only: only the reconciler writes them)."""

from rest_framework import serializers

from apps.control.models import BackendObject
from apps.tasks.choices import TaskStatus


class TaskLogQuerySerializer(serializers.Serializer):
    attempt = serializers.IntegerField(required=False, min_value=1, help_text="Which run; default: the latest")
    tail = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=10_000,
        default=200,
        help_text="How many lines from the end (when no `after` is given)",
    )
    after = serializers.CharField(
        required=False,
        max_length=65_536,
        trim_whitespace=False,
        help_text="Follow: the `cursor` of an earlier answer; only the output written since is returned",
    )


class TaskLogSerializer(serializers.Serializer):
    task = serializers.IntegerField()
    attempt = serializers.IntegerField(help_text="The run these lines come from (0: the task never ran)")
    attempts = serializers.IntegerField(help_text="How many runs the task had; each one's log is kept")
    cluster = serializers.CharField(allow_blank=True)
    external_id = serializers.CharField(allow_blank=True, help_text="The backend's id of the run's job")
    text = serializers.CharField(allow_blank=True, help_text="The last lines of the run's output")
    note = serializers.CharField(allow_blank=True, help_text="Why there is no text, when there is none")
    cursor = serializers.CharField(help_text="Pass as `after` to get only the output written after this text")
    more = serializers.BooleanField(help_text="More output is already there: ask again with `cursor` at once")
    running = serializers.BooleanField(
        help_text="The run is waiting to start or still going: more output may come. False once it ended."
    )
    status = serializers.ChoiceField(choices=TaskStatus.choices, help_text="The task's status")


class BackendObjectSerializer(serializers.ModelSerializer):
    cluster_name = serializers.CharField(source="cluster.name", read_only=True)
    wanted = serializers.BooleanField(read_only=True, help_text="Its task is active on this cluster in this attempt")

    class Meta:
        model = BackendObject
        fields = [
            "id",
            "cluster",
            "cluster_name",
            "task",
            "task_uid",
            "attempt",
            "name",
            "external_id",
            "state",
            "wanted",
            "shares",
            "replicas",
            "phase",
            "message",
            "lease_until",
            "submit_attempts",
            "cancel_requested_at",
            "created_at",
            "submitted_at",
            "observed_at",
            "ended_at",
        ]
        read_only_fields = fields
