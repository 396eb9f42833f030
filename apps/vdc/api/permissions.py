"""Who may write through the API: DRF permission classes over the rules of ``apps.vdc.policy``.

Querysets are filtered by visibility (``policy.visible_projects``, ``scope_to_projects`` ...), so an outsider
asking for another project's object gets 404 and never learns it exists; these classes then decide, on
visible objects, who may write (403).
"""

from __future__ import annotations

from rest_framework.permissions import SAFE_METHODS, BasePermission

from apps.vdc import policy
from apps.vdc.models import Membership, Project, ProjectSecret

# Which model permission a write needs, by the viewset's action; any other unsafe action changes the object.
_ACTION_VERBS = {"create": "add", "destroy": "delete"}
_METHOD_VERBS = {"POST": "add", "DELETE": "delete"}


def write_perm(request, view, model) -> str:
    """The model permission an unsafe request to ``view`` needs: add, change or delete ``model``."""
    action = getattr(view, "action", None)
    verb = _ACTION_VERBS.get(action, "change") if action else _METHOD_VERBS.get(request.method, "change")
    return policy.model_perm(model, verb)


class AdminWriteOrReadOnly(BasePermission):
    """Authenticated users read what their queryset shows them; writes need the model permission (add, change or
    delete the view's model), which only superusers and staff granted it hold. A view may name another with
    ``write_permission`` (e.g. an action that adds a related object).

    Writes to a single object pass the first check so that the object lookup runs first: an invisible
    object answers 404, a visible one 403.
    """

    def _allowed(self, request, view) -> bool:
        perm = getattr(view, "write_permission", None) or write_perm(request, view, view.get_queryset().model)
        return policy.has_platform_perm(request.user, perm)

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        if request.method in SAFE_METHODS or getattr(view, "detail", False):
            return True
        return self._allowed(request, view)

    def has_object_permission(self, request, view, obj) -> bool:
        return request.method in SAFE_METHODS or self._allowed(request, view)


class HasPlatformPermission(BasePermission):
    """The view's ``platform_permission`` (a model permission such as ``"clusters.change_cluster"``)."""

    def has_permission(self, request, view) -> bool:
        return policy.has_platform_perm(request.user, view.platform_permission)


class ProjectPermission(BasePermission):
    """Members read their projects; owners change them; creating and deleting projects takes the model
    permission (superusers, granted staff)."""

    def has_permission(self, request, view) -> bool:
        if not (request.user and request.user.is_authenticated):
            return False
        return getattr(view, "action", None) != "create" or policy.has_platform_perm(
            request.user, policy.model_perm(Project, "add")
        )

    def has_object_permission(self, request, view, obj: Project) -> bool:
        if request.method in SAFE_METHODS:
            return True
        if getattr(view, "action", None) == "destroy":
            return policy.has_platform_perm(request.user, policy.model_perm(Project, "delete"))
        return policy.can_manage(request.user, obj)


class MembershipPermission(BasePermission):
    """Members read the memberships of their projects; owners (and staff granted the permission) change them."""

    def has_object_permission(self, request, view, obj: Membership) -> bool:
        return request.method in SAFE_METHODS or policy.can_manage(
            request.user, obj.project_id, write_perm(request, view, Membership)
        )


class ProjectSecretPermission(BasePermission):
    """Members (viewers too) read the names of their projects' secrets; owners (and staff granted the permission)
    write them.

    The services check the same rule; here it gives 403 before the body is read.
    """

    def has_object_permission(self, request, view, obj: ProjectSecret) -> bool:
        return request.method in SAFE_METHODS or policy.can_manage(
            request.user, obj.project_id, write_perm(request, view, ProjectSecret)
        )
