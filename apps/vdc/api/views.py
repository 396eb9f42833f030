"""Viewsets of VDCs, projects, memberships and project quotas."""

from __future__ import annotations

from django.db.models import Count, OuterRef, Q, Subquery
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response

from apps.core.api.common import ProtectedDestroyMixin, service_errors
from apps.vdc import services
from apps.vdc.api.permissions import (
    AdminWriteOrReadOnly,
    MembershipPermission,
    ProjectPermission,
    ProjectSecretPermission,
)
from apps.vdc.api.serializers import (
    CapacityLoanSerializer,
    MembershipSerializer,
    ProjectQuotaSerializer,
    ProjectSecretSerializer,
    ProjectSerializer,
    RebalancerSettingsSerializer,
    VDCSerializer,
    other_owners,
)
from apps.vdc.choices import Role
from apps.vdc.filtersets import (
    CapacityLoanFilterSet,
    MembershipFilterSet,
    ProjectFilterSet,
    ProjectQuotaFilterSet,
    ProjectSecretFilterSet,
    RebalancerSettingsFilterSet,
    VDCFilterSet,
)
from apps.vdc.models import CapacityLoan, Membership, ProjectQuota, ProjectSecret, RebalancerSettings
from apps.vdc.policy import (
    member_project_ids,
    model_perm,
    scope_to_projects,
    scope_to_vdcs,
    sees_all,
    visible_projects,
    visible_vdcs,
)


def quotas_of(user):
    """Quotas the user may read: those of their projects (all for staff who may view quotas), names loaded."""
    return scope_to_projects(ProjectQuota.objects.select_related("project", "vdc"), user)


def secrets_of(user):
    """Secrets of the user's projects (all for staff who may view secrets), names loaded, values left in the
    database."""
    secrets = ProjectSecret.objects.select_related("project", "created_by", "updated_by").defer("value")
    return scope_to_projects(secrets, user)


class VDCViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Virtual data centers. Users see the VDCs their projects have quotas in; only platform admins write."""

    # The model permission a write of the current action needs, when not one on VDCs (AdminWriteOrReadOnly).
    write_permission: str | None = None
    serializer_class = VDCSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = VDCFilterSet
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at", "updated_at", "enabled", "is_default"]

    def get_queryset(self):
        return visible_vdcs(self.request.user)

    @extend_schema(responses=ProjectQuotaSerializer(many=True), methods=["GET"])
    @extend_schema(request=ProjectQuotaSerializer, responses={201: ProjectQuotaSerializer}, methods=["POST"])
    @action(
        detail=True,
        methods=["get", "post"],
        serializer_class=ProjectQuotaSerializer,
        filterset_class=None,
        write_permission=model_perm(ProjectQuota, "add"),
    )
    def quotas(self, request: Request, pk=None) -> Response:
        """GET the project quotas in this VDC you may read; POST (admins) a quota here for a project."""
        vdc = self.get_object()
        if request.method == "POST":
            serializer = ProjectQuotaSerializer(data={**request.data, "vdc": vdc.pk}, context={"request": request})
            serializer.is_valid(raise_exception=True)
            serializer.save()
            return Response(serializer.data, status=status.HTTP_201_CREATED)
        page = self.paginate_queryset(quotas_of(request.user).filter(vdc=vdc))
        return self.get_paginated_response(ProjectQuotaSerializer(page, many=True).data)


class ProjectViewSet(ProtectedDestroyMixin, viewsets.ModelViewSet):
    """Projects (tenants). Members read theirs; owners update them; only platform admins create and delete."""

    serializer_class = ProjectSerializer
    permission_classes = [ProjectPermission]
    filterset_class = ProjectFilterSet
    search_fields = ["name", "description"]
    ordering_fields = ["name", "created_at", "member_count"]

    def get_queryset(self):
        my_role = Membership.objects.filter(project=OuterRef("pk"), user_id=self.request.user.pk).values("role")[:1]
        return (
            visible_projects(self.request.user)
            .annotate(my_role=Subquery(my_role), member_count=Count("memberships", distinct=True))
            .order_by("name")
        )

    @extend_schema(responses=ProjectQuotaSerializer(many=True))
    @action(
        detail=True,
        methods=["get"],
        url_path="vdc-quotas",
        serializer_class=ProjectQuotaSerializer,
        filterset_class=None,
    )
    def vdc_quotas(self, request: Request, pk=None) -> Response:
        """The project's quota in each VDC."""
        project = self.get_object()
        page = self.paginate_queryset(quotas_of(request.user).filter(project=project))
        return self.get_paginated_response(ProjectQuotaSerializer(page, many=True).data)

    @extend_schema(responses=ProjectSecretSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=ProjectSecretSerializer, filterset_class=None)
    def secrets(self, request: Request, pk=None) -> Response:
        """The project's secrets, by name (values are never returned); manage them under ``project-secrets``."""
        project = self.get_object()
        page = self.paginate_queryset(secrets_of(request.user).filter(project=project))
        return self.get_paginated_response(ProjectSecretSerializer(page, many=True).data)


class MembershipViewSet(viewsets.ModelViewSet):
    """Who is in which project with which role. Members read their projects'; owners manage them."""

    serializer_class = MembershipSerializer
    permission_classes = [IsAuthenticated, MembershipPermission]
    filterset_class = MembershipFilterSet
    search_fields = ["project__name", "user__username"]
    ordering_fields = ["project__name", "user__username", "role", "created_at"]

    def get_queryset(self):
        return scope_to_projects(Membership.objects.select_related("project", "user"), self.request.user)

    def perform_destroy(self, instance: Membership) -> None:
        if instance.role == Role.OWNER and not other_owners(instance).exists():
            raise ValidationError({"role": f"{instance.user} is the last owner of project {instance.project}."})
        instance.delete()


class ProjectQuotaViewSet(viewsets.ModelViewSet):
    """Project quotas per VDC (``vdc-quotas``). Members read their projects'; only platform admins write."""

    serializer_class = ProjectQuotaSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = ProjectQuotaFilterSet
    search_fields = ["project__name", "vdc__name"]
    ordering_fields = ["project__name", "vdc__name", "priority", "guaranteed_gpu", "limit_gpu", "created_at"]

    def get_queryset(self):
        return quotas_of(self.request.user)


class ProjectSecretViewSet(viewsets.ModelViewSet):
    """Secrets of projects, by name: members read the names; owners (and platform admins) add, rotate and delete.

    Values are write-only: no answer ever holds one. A secret that waiting or running tasks refer to is not deleted
    (400 naming them).
    """

    serializer_class = ProjectSecretSerializer
    permission_classes = [IsAuthenticated, ProjectSecretPermission]
    filterset_class = ProjectSecretFilterSet
    search_fields = ["name", "description", "project__name"]
    ordering_fields = ["project__name", "name", "created_at", "updated_at"]

    def get_queryset(self):
        return secrets_of(self.request.user)

    def perform_destroy(self, instance: ProjectSecret) -> None:
        with service_errors():
            services.delete_secret(self.request.user, instance)


def loans_of(user):
    """Loans the user may read: those its projects lent or borrowed (all for staff who may view loans), names
    loaded."""
    loans = CapacityLoan.objects.select_related("vdc", "lender", "borrower")
    if sees_all(user, CapacityLoan):
        return loans
    mine = member_project_ids(user)
    return loans.filter(Q(lender_id__in=mine) | Q(borrower_id__in=mine))


class CapacityLoanViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    """Capacity loans between projects (``capacity-loans``, read-only): the rebalancer lends a project's unused
    guarantee to another with waiting work, for a bounded time. Members of the lender and of the borrower see
    them; platform admins see all (and return one early in the admin)."""

    serializer_class = CapacityLoanSerializer
    permission_classes = [IsAuthenticated]
    filterset_class = CapacityLoanFilterSet
    search_fields = ["lender__name", "borrower__name", "reason"]
    ordering_fields = ["started_at", "expires_at", "returned_at", "gpu"]

    def get_queryset(self):
        return loans_of(self.request.user)


class RebalancerSettingsViewSet(viewsets.ModelViewSet):
    """Per VDC, the inter-project rebalancer's settings (``rebalancer-settings``); a VDC without a row is not
    rebalanced. Users of the VDC read them; only platform admins write."""

    serializer_class = RebalancerSettingsSerializer
    permission_classes = [AdminWriteOrReadOnly]
    filterset_class = RebalancerSettingsFilterSet
    search_fields = ["vdc__name"]
    ordering_fields = ["vdc__name", "threshold_percent", "last_run_at"]

    def get_queryset(self):
        return scope_to_vdcs(RebalancerSettings.objects.select_related("vdc").order_by("vdc__name"), self.request.user)
