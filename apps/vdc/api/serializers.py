"""Serializers of VDCs, projects, memberships and project quotas."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from rest_framework import serializers
from rest_framework.exceptions import PermissionDenied

from apps.core.api.common import ModelCleanMixin, SlugField, service_errors
from apps.queues.services import create_class_queues
from apps.vdc import services
from apps.vdc.choices import LoanReturnReason, Role
from apps.vdc.models import (
    MAX_SECRET_LENGTH,
    VDC,
    CapacityLoan,
    Membership,
    Project,
    ProjectQuota,
    ProjectSecret,
    RebalancerSettings,
)
from apps.vdc.policy import can_manage, model_perm, visible_projects


class VDCSerializer(serializers.ModelSerializer):
    effective_overcommit_ratio = serializers.DecimalField(max_digits=5, decimal_places=2, read_only=True)
    class_queues = serializers.BooleanField(
        write_only=True,
        required=False,
        default=True,
        help_text="On create: also create its high, medium and low queues, ordered by default_queue_policy",
    )

    class Meta:
        model = VDC
        fields = [
            "id",
            "name",
            "description",
            "total_cpu",
            "total_memory_gib",
            "total_gpu",
            "allow_overcommit",
            "overcommit_ratio",
            "effective_overcommit_ratio",
            "default_queue_policy",
            "cluster_selection_strategy",
            "node_scorer",
            "is_default",
            "enabled",
            "class_queues",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        extra_kwargs = {"is_default": {"validators": []}}  # the model's message names no VDC; validate_is_default does

    def create(self, validated_data: dict) -> VDC:
        class_queues = validated_data.pop("class_queues", True)
        with transaction.atomic():
            vdc = super().create(validated_data)
            if class_queues:
                create_class_queues(vdc)
        return vdc

    def update(self, instance: VDC, validated_data: dict) -> VDC:
        validated_data.pop("class_queues", None)
        return super().update(instance, validated_data)

    def validate_is_default(self, value: bool) -> bool:
        current = VDC.objects.filter(is_default=True).exclude(pk=getattr(self.instance, "pk", None)).first()
        if value and current is not None:
            raise serializers.ValidationError(f"VDC {current} is already the default; unset it there first.")
        return value


class ProjectSerializer(serializers.ModelSerializer):
    # Annotations of the viewset's queryset; a project just created has neither, and no members yet.
    my_role = serializers.CharField(
        read_only=True, allow_null=True, default=None, help_text="Your role; null for admins"
    )
    member_count = serializers.IntegerField(read_only=True, default=0)

    class Meta:
        model = Project
        fields = [
            "id",
            "name",
            "description",
            "idle_stop_percent",
            "idle_stop_minutes",
            "my_role",
            "member_count",
            "created_at",
        ]
        read_only_fields = ["created_at"]


class MembershipSerializer(serializers.ModelSerializer):
    """A membership; ``user`` is the username. Only the role changes once it exists."""

    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.all())
    user = SlugField(slug_field="username", queryset=get_user_model().objects.all())
    project_name = serializers.CharField(source="project.name", read_only=True)

    class Meta:
        model = Membership
        fields = ["id", "project", "project_name", "user", "role", "created_at"]
        read_only_fields = ["created_at"]
        validators = []  # the unique (project, user) pair is checked in validate() with a clearer message

    def get_fields(self):
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None:
            fields["project"].queryset = visible_projects(request.user)
        return fields

    def validate(self, attrs: dict) -> dict:
        user = self.context["request"].user
        instance = self.instance
        project = attrs.get("project", instance.project if instance else None)
        member = attrs.get("user", instance.user if instance else None)
        if instance is not None and (project != instance.project or member != instance.user):
            raise serializers.ValidationError("Only the role of a membership can change; add a new one instead.")
        if not can_manage(user, project, model_perm(Membership, "add" if instance is None else "change")):
            raise PermissionDenied(f"Only owners of project {project} manage its members.")
        if instance is None and Membership.objects.filter(project=project, user=member).exists():
            raise serializers.ValidationError({"user": f"{member} is already in project {project}."})
        demoted = instance is not None and instance.role == Role.OWNER and attrs.get("role", Role.OWNER) != Role.OWNER
        if demoted and not other_owners(instance).exists():
            raise serializers.ValidationError({"role": f"{member} is the last owner of project {project}."})
        return attrs


def other_owners(membership: Membership):
    """The owners of the membership's project other than its user."""
    return Membership.objects.filter(project_id=membership.project_id, role=Role.OWNER).exclude(pk=membership.pk)


class ProjectQuotaSerializer(ModelCleanMixin, serializers.ModelSerializer):
    """A project's quota in a VDC; the model's rules (limit >= guaranteed, guarantees fit the VDC) apply."""

    project_name = serializers.CharField(source="project.name", read_only=True)
    vdc_name = serializers.CharField(source="vdc.name", read_only=True)

    class Meta:
        model = ProjectQuota
        fields = [
            "id",
            "project",
            "project_name",
            "vdc",
            "vdc_name",
            "guaranteed_cpu",
            "limit_cpu",
            "guaranteed_memory_gib",
            "limit_memory_gib",
            "guaranteed_gpu",
            "limit_gpu",
            "max_concurrent_tasks",
            "max_training_tasks",
            "max_inference_tasks",
            "max_dev_env_tasks",
            "priority",
            "weight",
            "enforce",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]


class ProjectSecretSerializer(serializers.ModelSerializer):
    """A project secret: its name and description; ``value`` is write-only and never answered.

    Creating takes project, name and value; changing takes a new value (a rotation: the next attempt of every
    task that refers to it gets it) and/or a description. The name never changes: tasks refer to it.
    """

    project = serializers.PrimaryKeyRelatedField(queryset=Project.objects.all())
    project_name = serializers.CharField(source="project.name", read_only=True)
    value = serializers.CharField(
        write_only=True,
        required=False,
        trim_whitespace=False,
        max_length=MAX_SECRET_LENGTH,
        style={"input_type": "password"},
        help_text="The secret itself: required on create, a rotation on update; stored encrypted, never returned",
    )
    created_by = serializers.CharField(source="created_by.username", read_only=True, allow_null=True, default=None)
    updated_by = serializers.CharField(source="updated_by.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ProjectSecret
        fields = [
            "id",
            "project",
            "project_name",
            "name",
            "description",
            "value",
            "created_by",
            "updated_by",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]
        validators = []  # the unique (project, name) pair is checked by the service with a clearer message

    def get_fields(self):
        fields = super().get_fields()
        request = self.context.get("request")
        if request is not None:
            fields["project"].queryset = visible_projects(request.user)
        return fields

    def validate(self, attrs: dict) -> dict:
        instance = self.instance
        if instance is not None:
            changed = [f for f in ("project", "name") if f in attrs and attrs[f] != getattr(instance, f)]
            if changed:
                message = "Cannot change: tasks refer to a secret by project and name; add a new secret instead."
                raise serializers.ValidationError(dict.fromkeys(changed, message))
        elif "value" not in attrs:
            raise serializers.ValidationError({"value": "Expected the secret's value."})
        return attrs

    def create(self, validated_data: dict) -> ProjectSecret:
        user = self.context["request"].user
        with service_errors():
            return services.create_secret(
                user,
                validated_data["project"],
                validated_data["name"],
                validated_data["value"],
                validated_data.get("description", ""),
            )

    def update(self, instance: ProjectSecret, validated_data: dict) -> ProjectSecret:
        user = self.context["request"].user
        with service_errors():
            return services.update_secret(
                user, instance, value=validated_data.get("value"), description=validated_data.get("description")
            )


class RebalancerSettingsSerializer(ModelCleanMixin, serializers.ModelSerializer):
    """A VDC's inter-project rebalancer: when it lends unused guarantees, for how long, how loans are billed and
    counted in fair share, and whether only low-class work runs on them (docs/engine.md, Rebalancer)."""

    vdc_name = serializers.CharField(source="vdc.name", read_only=True)

    class Meta:
        model = RebalancerSettings
        fields = [
            "id",
            "vdc",
            "vdc_name",
            "enabled",
            "interval",
            "threshold_percent",
            "max_loan_duration",
            "min_loan_duration",
            "cooldown",
            "loan_billing",
            "loans_low_class_only",
            "last_run_at",
        ]
        read_only_fields = ["last_run_at"]


class CapacityLoanSerializer(serializers.ModelSerializer):
    """A capacity loan between two projects of a VDC (read-only: only the rebalancer and admins open and return
    them): who lent what to whom, since when, until when, why, and why it ended."""

    vdc_name = serializers.CharField(source="vdc.name", read_only=True)
    lender_name = serializers.CharField(source="lender.name", read_only=True)
    borrower_name = serializers.CharField(source="borrower.name", read_only=True)
    active = serializers.BooleanField(read_only=True, help_text="Not returned yet")
    return_reason = serializers.ChoiceField(
        choices=LoanReturnReason.choices, allow_blank=True, read_only=True, help_text="Empty while active"
    )

    class Meta:
        model = CapacityLoan
        fields = [
            "id",
            "vdc",
            "vdc_name",
            "lender",
            "lender_name",
            "borrower",
            "borrower_name",
            "gpu",
            "cpu",
            "memory_gib",
            "reason",
            "figures",
            "started_at",
            "expires_at",
            "returned_at",
            "return_reason",
            "return_message",
            "active",
            "used_gpu_hours",
            "accounted_until",
            "settlement",
        ]
        read_only_fields = fields
