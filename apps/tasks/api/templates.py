"""Task templates (``task-templates``): named task files of a project. Owners write them, everyone in the project
reads them, ``POST /task-templates/{id}/submit/`` submits a task from one (docs/tasks.md, "Templates")."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.api.common import IdOrNameRelatedField, service_errors
from apps.tasks import idempotency, task_templates
from apps.tasks.admission import wait_notice
from apps.tasks.api.serializers import TaskCreatedSerializer, TaskEventSerializer, TaskSerializer
from apps.tasks.choices import TaskKind
from apps.tasks.filtersets import TaskTemplateFilterSet
from apps.tasks.models import TaskTemplate
from apps.vdc import policy
from apps.vdc.api.permissions import write_perm
from apps.vdc.models import Project
from apps.vdc.policy import scope_to_projects, visible_projects

TASK_FILE_EXAMPLE = {
    "kind": "training",
    "queue": "medium",
    "gpu_spec": "1(A100)",
    "command": "python train.py --lr 0.1",
    "secret_refs": [{"secret": "HF_TOKEN", "env": "HF_TOKEN"}],
}


class TaskTemplatePermission(BasePermission):
    """Everyone in the project reads its templates and submits from them (the submission service decides who may
    submit); owners (and staff granted the permission) write them. The service checks the same rule; here it
    gives 403 before the body is read."""

    def has_object_permission(self, request, view, obj: TaskTemplate) -> bool:
        if request.method in SAFE_METHODS or getattr(view, "action", None) == "submit":
            return True
        return policy.can_manage(request.user, obj.project_id, write_perm(request, view, TaskTemplate))


class TaskTemplateSerializer(serializers.ModelSerializer):
    """A template: its project (id or name), name, description and task file (the fields of a submission, without
    project; secret values never, secret_refs by name only)."""

    project = IdOrNameRelatedField(queryset=Project.objects.all(), scope=visible_projects)
    project_name = serializers.CharField(source="project.name", read_only=True)
    kind = serializers.ChoiceField(
        choices=TaskKind.choices, read_only=True, help_text="The kind of task it submits (its task file's)"
    )
    task_file = serializers.JSONField(
        help_text="The fields of a task submission (a task file, as POST /tasks/ takes them) without project, "
        "checked as a submission is; secret_env is refused (name project secrets under secret_refs)",
        style={"example": TASK_FILE_EXAMPLE},
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = TaskTemplate
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "kind",
            "task_file",
            "created_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        validators = []  # the unique (project, name) pair is checked by the service with a clearer message

    def validate(self, attrs: dict) -> dict:
        instance = self.instance
        user = self.context["request"].user
        if instance is not None:
            if "project" in attrs and attrs["project"] != instance.project:
                raise serializers.ValidationError(
                    {"project": ["Cannot change: a template belongs to its project; save a copy in the other one."]}
                )
            project = instance.project
        else:
            project = attrs["project"]
            task_templates.check_manager(user, project, "add")
        if "task_file" in attrs:
            name = attrs.get("name") or (instance.name if instance else "")
            errors = task_templates.task_file_errors(user, project, attrs["task_file"], name=name, context=self.context)
            if errors:
                raise serializers.ValidationError({"task_file": errors})
        return attrs

    def create(self, validated_data: dict) -> TaskTemplate:
        with service_errors():
            return task_templates.create_template(
                self.context["request"].user,
                validated_data["project"],
                validated_data["name"],
                validated_data["task_file"],
                validated_data.get("description", ""),
                context=self.context,
            )

    def update(self, instance: TaskTemplate, validated_data: dict) -> TaskTemplate:
        with service_errors():
            return task_templates.update_template(
                self.context["request"].user,
                instance,
                name=validated_data.get("name"),
                description=validated_data.get("description"),
                task_file=validated_data.get("task_file"),
                context=self.context,
            )


class TaskTemplateViewSet(viewsets.ModelViewSet):
    """Task templates of your projects: named task files. Owners (and platform admins) create, change and delete
    them; members and viewers read them; ``submit`` submits a task from one (owners and members)."""

    serializer_class = TaskTemplateSerializer
    permission_classes = [IsAuthenticated, TaskTemplatePermission]
    filterset_class = TaskTemplateFilterSet
    search_fields = ["name", "description"]
    ordering_fields = ["name", "project__name", "created_at", "updated_at"]

    def get_queryset(self):
        templates = TaskTemplate.objects.select_related("project", "created_by")
        return scope_to_projects(templates, self.request.user)

    def perform_destroy(self, instance: TaskTemplate) -> None:
        with service_errors():
            task_templates.delete_template(self.request.user, instance)

    @extend_schema(
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=[idempotency.PARAMETER],
        responses={201: TaskCreatedSerializer, 422: idempotency.KEY_REUSED},
        examples=[OpenApiExample("Overrides", value={"name": "resnet-lr-0.01", "env": {"LR": "0.01"}})],
    )
    @action(detail=True, methods=["post"], filterset_class=None, pagination_class=None)
    @idempotency.idempotent
    def submit(self, request: Request, pk=None) -> Response:
        """Submit a task from the template: its task file with the body's fields over it (any field of a
        submission, all optional; ``env``, ``secret_env`` and ``required_labels`` join the template's), named
        after the template unless the file or the body names it, checked and created exactly as ``POST /tasks/``
        does (roles: viewers get 403; queue, quota, admission). Takes an ``Idempotency-Key`` header."""
        template = self.get_object()
        overrides = request.data if hasattr(request.data, "keys") else None
        if overrides is None:
            raise serializers.ValidationError(
                {"non_field_errors": ["Expected an object of submission fields to change (or {} for none)."]}
            )
        with service_errors():
            body = task_templates.submission(template, dict(overrides.items()))
        serializer = TaskSerializer(data=body, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        task = serializer.save()
        events = TaskEventSerializer(task.events.all(), many=True).data
        answer = {**serializer.data, "events": events, "notice": wait_notice(task)}
        return Response(answer, status=status.HTTP_201_CREATED)
