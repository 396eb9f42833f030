"""The one authority: what a user may see and do. Every door asks it: pages, the API (and so CLI tokens),
admin actions through the services, the live socket, the Web Console and Connect.

Rights come from two places (docs/security.md, "Who may do what"):

- a **project role** (owner / member / viewer) gives rights inside that project: everyone in it reads it,
  owners and members act on its tasks, owners manage the project, its members and its secrets;
- Django's **model permissions** give rights across every project, and only to staff: an active superuser
  holds them all, an active staff user exactly those granted to them or to their groups
  (``tasks.view_task`` to read every task, ``tasks.change_task`` to stop any, ...). A permission given to a
  user who is not staff counts for nothing: it would be a platform-wide right the admin does not show.

No permission lets anyone act *as a job* of a project they are not owner or member of: Connect and a member's
Web Console run with the job's identity and would show its secrets. ``tasks.open_any_console`` gives a
visitor's console instead (no secrets; docs/console.md), and every such opening is on the task's timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth import get_permission_codename, get_user_model
from django.db.models import Model, OuterRef, QuerySet, Subquery, Value

from apps.vdc.choices import Role
from apps.vdc.models import VDC, Membership, Project, ProjectQuota

WRITE_ROLES = (Role.OWNER, Role.MEMBER)

# Platform-wide rights behind the task actions and the project pages.
VIEW_PROJECT = "vdc.view_project"
CHANGE_PROJECT = "vdc.change_project"
VIEW_TASK = "tasks.view_task"
SUBMIT_TASK = "tasks.add_task"
CHANGE_TASK = "tasks.change_task"  # stop, change autoscaling
DELETE_TASK = "tasks.delete_task"
OPEN_ANY_CONSOLE = "tasks.open_any_console"
# The operator dashboard and /metrics show every cluster and every project's use at once.
OPERATIONS = ("clusters.view_cluster", "tasks.view_task")

MEMBER_CONSOLE = "member"
VISITOR_CONSOLE = "visitor"


def is_active_user(user) -> bool:
    """Logged in with an account that is still active."""
    return bool(user is not None and user.is_authenticated and user.is_active)


def has_platform_perm(user, perm: str) -> bool:
    """A right over every project: any for an active superuser, those granted for active staff, none otherwise."""
    if not is_active_user(user):
        return False
    return user.is_superuser or (user.is_staff and user.has_perm(perm))


def model_perm(model: type[Model], action: str = "view") -> str:
    """The model permission of ``action`` (view / add / change / delete) on ``model``: ``"tasks.view_task"``."""
    return f"{model._meta.app_label}.{get_permission_codename(action, model._meta)}"


def sees_all(user, model: type[Model]) -> bool:
    """Whether the user reads every row of ``model``, whatever project it belongs to."""
    return has_platform_perm(user, model_perm(model, "view"))


def fresh_user(user_id: int):
    """The user as the database has it now (flags, and permissions loaded anew); None once gone or inactive."""
    return get_user_model()._default_manager.filter(pk=user_id, is_active=True).first()


def project_role(user, project: Project | int) -> str | None:
    """The user's role in the project (owner / member / viewer); None for outsiders and inactive users."""
    if not is_active_user(user):
        return None
    if getattr(project, "role_user_id", None) == user.pk:
        return project.user_role  # read with the project (``with_role``)
    project_id = project if isinstance(project, int) else project.pk
    return Membership.objects.filter(user=user, project_id=project_id).values_list("role", flat=True).first()


def with_role(projects: QuerySet[Project], user) -> QuerySet[Project]:
    """Projects read with the user's role in each (None where none), so ``project_role`` asks nothing more."""
    if not is_active_user(user):
        return projects
    role = Membership.objects.filter(project=OuterRef("pk"), user_id=user.pk).values("role")[:1]
    return projects.annotate(user_role=Subquery(role), role_user_id=Value(user.pk))


def member_project_ids(user, roles: tuple[str, ...] | None = None) -> QuerySet:
    """A subquery of the ids of the projects the user belongs to (with one of ``roles``, if given)."""
    memberships = Membership.objects.filter(user_id=user.pk if is_active_user(user) else None)
    if roles is not None:
        memberships = memberships.filter(role__in=roles)
    return memberships.values("project_id")


def can_view(user, project: Project | int, perm: str = VIEW_PROJECT) -> bool:
    """May read the project's ``perm`` kind of thing (its tasks with ``VIEW_TASK``): anyone in it, or staff
    holding ``perm``."""
    return has_platform_perm(user, perm) or project_role(user, project) is not None


def can_act(user, project: Project | int, perm: str) -> bool:
    """May do what ``perm`` names (``SUBMIT_TASK``, ``CHANGE_TASK``, ``DELETE_TASK``) to the project's tasks:
    its owners and members (viewers only read), or staff holding ``perm``."""
    return has_platform_perm(user, perm) or project_role(user, project) in WRITE_ROLES


def can_manage(user, project: Project | int, perm: str = CHANGE_PROJECT) -> bool:
    """May change the project, its memberships or its secrets (``perm`` names which): its owners, or staff
    holding ``perm``."""
    return has_platform_perm(user, perm) or project_role(user, project) == Role.OWNER


def can_enter(user, project: Project | int) -> bool:
    """May reach into the project's running jobs as the job (a member's Web Console, Connect): its owners and
    members only. No permission grants it: the job's identity reads the job's secrets."""
    return project_role(user, project) in WRITE_ROLES


def console_access(user, project: Project | int) -> str | None:
    """Which Web Console the user may open in the project's tasks: ``MEMBER_CONSOLE`` (as the job) for owners
    and members, ``VISITOR_CONSOLE`` (without the job's secrets) for staff holding ``OPEN_ANY_CONSOLE``, None."""
    if can_enter(user, project):
        return MEMBER_CONSOLE
    if has_platform_perm(user, OPEN_ANY_CONSOLE):
        return VISITOR_CONSOLE
    return None


def can_view_operations(user) -> bool:
    """May see platform-wide figures at once (the operator dashboard, /metrics)."""
    return all(has_platform_perm(user, perm) for perm in OPERATIONS)


def visible_projects(user, perm: str = VIEW_PROJECT) -> QuerySet[Project]:
    """Projects whose ``perm`` kind of thing the user reads: theirs, or all for staff holding ``perm``."""
    if has_platform_perm(user, perm):
        return Project.objects.all()
    return Project.objects.filter(pk__in=member_project_ids(user))


def scope_to_projects(queryset: QuerySet, user, field: str = "project") -> QuerySet:
    """Rows whose project (reached through ``field``) the user belongs to; all rows for staff who may view
    the queryset's model."""
    if sees_all(user, queryset.model):
        return queryset
    return queryset.filter(**{f"{field}__in": member_project_ids(user)})


def visible_vdcs(user) -> QuerySet[VDC]:
    """VDCs in which one of the user's projects has a quota; every VDC for staff who may view VDCs."""
    if sees_all(user, VDC):
        return VDC.objects.all()
    return VDC.objects.filter(
        pk__in=ProjectQuota.objects.filter(project_id__in=member_project_ids(user)).values("vdc_id")
    )


def scope_to_vdcs(queryset: QuerySet, user, field: str = "vdc") -> QuerySet:
    """Rows whose VDC (reached through ``field``) the user may see; all rows for staff who may view the
    queryset's model."""
    if sees_all(user, queryset.model):
        return queryset
    return queryset.filter(**{f"{field}__in": visible_vdcs(user).values("pk")})


@dataclass
class ProjectRights:
    """One user's rights in every project, loaded once (a query) for a page of rows of many projects."""

    user: object
    roles: dict[int, str] = field(default_factory=dict)

    @classmethod
    def of(cls, user) -> ProjectRights:
        """The user's rights as of now."""
        roles = {}
        if is_active_user(user):
            roles = dict(Membership.objects.filter(user=user).values_list("project_id", "role"))
        return cls(user, roles)

    def can_act(self, project_id: int, perm: str) -> bool:
        """As :func:`can_act`."""
        return self.roles.get(project_id) in WRITE_ROLES or has_platform_perm(self.user, perm)

    def can_enter(self, project_id: int) -> bool:
        """As :func:`can_enter`."""
        return self.roles.get(project_id) in WRITE_ROLES

    def console_access(self, project_id: int) -> str | None:
        """As :func:`console_access`."""
        if self.can_enter(project_id):
            return MEMBER_CONSOLE
        return VISITOR_CONSOLE if has_platform_perm(self.user, OPEN_ANY_CONSOLE) else None
