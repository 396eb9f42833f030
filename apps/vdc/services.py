"""Permission rules of projects, shared by the API, the pages and the services."""

from __future__ import annotations

from apps.vdc.choices import Role
from apps.vdc.models import Project

WRITE_ROLES = (Role.OWNER, Role.MEMBER)


def is_platform_admin(user) -> bool:
    """Platform admins see and manage everything."""
    return bool(user and user.is_authenticated and (user.is_superuser or user.is_staff))


def project_role(user, project: Project) -> str | None:
    """The user's role in the project; "admin" for platform admins, None for outsiders."""
    if is_platform_admin(user):
        return "admin"
    if not user or not user.is_authenticated:
        return None
    return project.role_of(user)


def can_view(user, project: Project) -> bool:
    return project_role(user, project) is not None


def can_act(user, project: Project) -> bool:
    """May submit, stop and delete tasks of the project (owners and members; viewers only read)."""
    return project_role(user, project) in ("admin", *WRITE_ROLES)


def can_manage(user, project: Project) -> bool:
    """May change the project itself and its memberships (owners)."""
    return project_role(user, project) in ("admin", Role.OWNER)
