"""Template pages: the templates of my projects, one template (its task file; owners edit and delete it), and
"Save as template" from a task's page (docs/tasks.md, "Templates"). "Use" opens the submit form of the template's
kind filled from it (``/<kind page>/new/?template=<id>``, ``views.kind_create``)."""

from __future__ import annotations

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.tasks import task_templates, taskfile
from apps.tasks.models import TaskTemplate
from apps.tasks.views import KIND_PAGES, _error_lines, _visible_task
from apps.vdc import policy
from apps.vdc.choices import Role

ADD = policy.model_perm(TaskTemplate, "add")
CHANGE = policy.model_perm(TaskTemplate, "change")
DELETE = policy.model_perm(TaskTemplate, "delete")


def visible_templates(user):
    """Templates of the user's projects (all for staff who may view templates)."""
    return policy.scope_to_projects(TaskTemplate.objects.select_related("project", "created_by"), user)


def use_url(template: TaskTemplate) -> str:
    """The submit form of the template's kind, filled from it."""
    slug = next((page.slug for page in KIND_PAGES.values() if template.kind in page.kinds), "training-jobs")
    return f"{reverse(f'portal:{slug}-new')}?template={template.pk}"


def dump(task_file: dict) -> str:
    return yaml.safe_dump(task_file, sort_keys=False, allow_unicode=True, default_flow_style=False)


@login_required
def template_list(request: HttpRequest) -> HttpResponse:
    templates = visible_templates(request.user).order_by("project__name", "name")
    project = request.GET.get("project", "")
    if project.isdecimal():
        templates = templates.filter(project_id=int(project))
    rights = policy.ProjectRights.of(request.user)
    rows = list(templates[:500])
    for template in rows:
        template.use_url = use_url(template) if rights.can_act(template.project_id, policy.SUBMIT_TASK) else ""
        template.can_manage = rights.roles.get(template.project_id) == Role.OWNER or policy.has_platform_perm(
            request.user, CHANGE
        )
    projects = list(policy.visible_projects(request.user).order_by("name").values_list("pk", "name"))
    context = {"templates": rows, "projects": projects, "project": project, "nav": "templates"}
    return render(request, "portal/templates.html", context)


@login_required
def template_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """A template's task file; its owners change the name, description and file here (YAML or JSON)."""
    template = get_object_or_404(visible_templates(request.user), pk=pk)
    can_change = policy.can_manage(request.user, template.project, CHANGE)
    errors: list[str] = []
    name, description, text = template.name, template.description, dump(template.task_file)
    if request.method == "POST":
        name = request.POST.get("name", "")
        description = request.POST.get("description", "")
        text = request.POST.get("task_file", "")
        try:
            data = taskfile.load(text)
            task_templates.update_template(request.user, template, name=name, description=description, task_file=data)
        except PermissionDenied as exc:
            errors = [str(exc)]
        except ValidationError as exc:
            errors = list(_error_lines(exc.message_dict if hasattr(exc, "error_dict") else exc.messages))
        else:
            messages.success(request, f"Template {template.name} saved.")
            return redirect("portal:template", pk=template.pk)
    context = {
        "template": template,
        "name": name,
        "description": description,
        "text": text,
        "errors": errors,
        "can_change": can_change,
        "can_delete": policy.can_manage(request.user, template.project, DELETE),
        "use_url": use_url(template) if policy.can_act(request.user, template.project, policy.SUBMIT_TASK) else "",
        "nav": "templates",
    }
    return render(request, "portal/template.html", context, status=400 if errors else 200)


@login_required
@require_POST
def template_delete(request: HttpRequest, pk: int) -> HttpResponse:
    template = get_object_or_404(visible_templates(request.user), pk=pk)
    try:
        task_templates.delete_template(request.user, template)
    except PermissionDenied as exc:
        messages.error(request, str(exc))
        return redirect("portal:template", pk=template.pk)
    messages.success(request, f"Template {template.name} of project {template.project.name} deleted.")
    return redirect("portal:templates")


@login_required
@require_POST
def task_save_template(request: HttpRequest, pk: int) -> HttpResponse:
    """ "Save as template" on a task's page: the task's task file (never its secret values) as a template of its
    project, for the project's owners."""
    task = _visible_task(request, pk)
    name = request.POST.get("name", "").strip() or task.name
    try:
        template = task_templates.template_from_task(request.user, task, name, request.POST.get("description", ""))
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    except ValidationError as exc:
        for line in _error_lines(exc.message_dict if hasattr(exc, "error_dict") else exc.messages):
            messages.error(request, f"Not saved as a template: {line}")
    else:
        messages.success(request, f"Saved as template {template.name} of project {task.project.name}.")
        return redirect("portal:template", pk=template.pk)
    return redirect("portal:task-monitoring", pk=task.pk)
