"""Who sees what through the API: visibility querysets and permission classes shared by every app.

Querysets are filtered by visibility, so an outsider asking for another project's object gets 404 and
never learns it exists; permission classes then decide, on visible objects, who may write (403).
"""

from __future__ import annotations

from django.db.models import QuerySet
from rest_framework.permissions import SAFE_METHODS, BasePermission

from apps.vdc.models import VDC, Membership, Project, ProjectQuota
from apps.vdc.services import can_manage, is_platform_admin


def member_project_ids(user) -> QuerySet:
    """A subquery of the ids of the projects the user belongs to (none for anonymous users)."""
    return Membership.objects.filter(user_id=user.pk if user.is_authenticated else None).values("project_id")


def visible_projects(user) -> QuerySet[Project]:
    """Projects the user belongs to; every project for platform admins."""
    if is_platform_admin(user):
        return Project.objects.all()
    return Project.objects.filter(pk__in=member_project_ids(user))


def visible_vdcs(user) -> QuerySet[VDC]:
    """VDCs in which one of the user's projects has a quota; every VDC for platform admins."""
    if is_platform_admin(user):
        return VDC.objects.all()
    return VDC.objects.filter(
        pk__in=ProjectQuota.objects.filter(project_id__in=member_project_ids(user)).values("vdc_id")
    )


def scope_to_projects(queryset: QuerySet, user, field: str = "project") -> QuerySet:
    """Rows whose project (reached through ``field``) the user belongs to; all rows for platform admins."""
    if is_platform_admin(user):
        return queryset
    return queryset.filter(**{f"{field}__in": member_project_ids(user)})


def scope_to_vdcs(queryset: QuerySet, user, field: str = "vdc") -> QuerySet:
    """Rows whose VDC (reached through ``field``) the user may see; all rows for platform admins."""
    if is_platform_admin(user):
        return queryset
    return queryset.filter(**{f"{field}__in": visible_vdcs(user).values("pk")})


class AdminWriteOrReadOnly(BasePermission):
    """Authenticated users read what their queryset shows them; only platform admins write.

    Writes to a single object pass the first check so that the object lookup runs first: an invisible
    object answers 404, a visible one 403.
    """

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or is_platform_admin(request.user) or bool(getattr(view, "detail", False))

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in SAFE_METHODS or is_platform_admin(request.user)


class ProjectPermission(BasePermission):
    """Members read their projects; owners change them; only platform admins create or delete projects."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return getattr(view, "action", None) != "create" or is_platform_admin(request.user)

    def has_object_permission(self, request, view, obj: Project) -> bool:
        if request.method in SAFE_METHODS:
            return True
        if getattr(view, "action", None) == "destroy":
            return is_platform_admin(request.user)
        return can_manage(request.user, obj)


class MembershipPermission(BasePermission):
    """Members read the memberships of their projects; owners (and admins) change them."""

    def has_object_permission(self, request, view, obj: Membership) -> bool:
        return request.method in SAFE_METHODS or can_manage(request.user, obj.project)


class ProjectSecretPermission(BasePermission):
    """Members (viewers too) read the names of their projects' secrets; owners and platform admins write them.

    The services check the same rule; here it gives 403 before the body is read.
    """

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in SAFE_METHODS or can_manage(request.user, obj.project)
