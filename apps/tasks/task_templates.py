"""Task templates: named task files a project keeps (docs/tasks.md, "Templates"; docs/rules.md#templates).

A template's task file is checked by the submit serializer, as a task file is, with the template's project as
its project; it never holds a secret value (``secret_env``), only references to project secrets by name. Owners of
the project (and staff holding the model permission) create, change and delete templates; everyone in the project
reads them, and those who may submit there submit from them through the submission service.
"""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from apps.tasks import taskfile
from apps.tasks.api.serializers import TaskSerializer
from apps.tasks.models import Task, TaskTemplate
from apps.tasks.services import SUBMIT_FIELDS, submission_field_errors
from apps.vdc import policy
from apps.vdc.models import Project

logger = logging.getLogger(__name__)

# Keys of a submission's mapping fields: those given at submit join the template's, and win where both name one.
JOINED_FIELDS = ("env", "secret_env", "required_labels")
NO_SECRET_VALUES = (
    "Secret values are never kept in a template: keep the value as a project secret and name it under "
    "secret_refs, or give the variable at submit."
)


def check_manager(user, project: Project, action: str) -> None:
    """PermissionDenied unless the user may ``action`` (add / change / delete) the project's templates."""
    if not policy.can_manage(user, project, policy.model_perm(TaskTemplate, action)):
        raise PermissionDenied(
            f"Only owners of project {project} create, change and delete its templates; members and viewers use them."
        )


def _names_project(value, project: Project) -> bool:
    return str(value) in (str(project.pk), project.name)


def task_file_errors(user, project: Project, data, *, name: str = "", context: dict | None = None) -> dict:
    """What is wrong with ``data`` as the task file of a template of ``project``, per task-file key (empty when
    nothing is): the submit serializer's checks, an unknown key, a secret value, another project. ``name`` stands
    for the task's name when the file has none (a task from a template is named after it)."""
    if not isinstance(data, dict):
        return {"non_field_errors": ["Expected a task file: one mapping of task fields (kind: ..., gpu_spec: ...)."]}
    errors: dict[str, list[str]] = {}
    if "project" in data and not _names_project(data["project"], project):
        errors["project"] = [
            f"A template's tasks go to its project, {project.name}: leave project out or name that one."
        ]
    if data.get("secret_env"):
        errors["secret_env"] = [NO_SECRET_VALUES]
    try:
        json.dumps(data)
    except (TypeError, ValueError):
        errors["non_field_errors"] = ["Expected a task file of plain values (text, numbers, lists, mappings)."]
        return errors
    body = {"name": name or "template", **data, "project": project.pk}
    body.pop("secret_env", None)
    serializer = TaskSerializer(data=body, context=context or {"request": SimpleNamespace(user=user)})
    if not serializer.is_valid():
        for key, messages in serializer.errors.items():
            errors.setdefault(key, []).extend(str(m) for m in (messages if isinstance(messages, list) else [messages]))
        return errors
    fields = {key: value for key, value in serializer.validated_data.items() if key in SUBMIT_FIELDS}
    for key, messages in submission_field_errors(project, **fields).items():
        errors.setdefault(key, []).extend(messages)
    return errors


def clean_task_file(user, project: Project, data, *, name: str = "", context: dict | None = None) -> dict:
    """The task file to keep: ``data`` without ``project`` (the template's) and without an empty ``secret_env``.
    Raises ValidationError on ``task_file`` with one ``key: message`` line per fault."""
    errors = task_file_errors(user, project, data, name=name, context=context)
    if errors:
        raise ValidationError({"task_file": [f"{key}: {m}" for key, messages in errors.items() for m in messages]})
    return {key: value for key, value in data.items() if key not in ("project", "secret_env")}


def _name_errors(project: Project, name, template: TaskTemplate | None = None) -> list[str]:
    if not isinstance(name, str) or not name.strip():
        return ["Expected a name for the template."]
    if len(name) > 128 or "\x00" in name:
        return ["Expected a name of at most 128 characters, without NUL."]
    taken = TaskTemplate.objects.filter(project=project, name=name)
    if template is not None:
        taken = taken.exclude(pk=template.pk)
    if taken.exists():
        return [f"Project {project.name} already has a template {name}; change that one or pick another name."]
    return []


def _save(template: TaskTemplate) -> TaskTemplate:
    try:
        with transaction.atomic():
            template.save()
    except IntegrityError:  # the same name, saved at the same moment
        raise ValidationError({"name": [f"Project {template.project.name} already has a template {template.name}."]})
    return template


def create_template(
    user, project: Project, name: str, task_file, description: str = "", *, context: dict | None = None
) -> TaskTemplate:
    """Keep a new template of the project (owners, and staff who may add templates). Raises PermissionDenied or
    ValidationError (per field: ``name``, ``task_file``) and writes nothing in either case."""
    check_manager(user, project, "add")
    name = name.strip() if isinstance(name, str) else name
    errors = {}
    if name_errors := _name_errors(project, name):
        errors["name"] = name_errors
    try:
        cleaned = clean_task_file(user, project, task_file, name=name, context=context)
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)
    template = TaskTemplate(
        project=project, name=name, description=description or "", task_file=cleaned, created_by=user
    )
    _save(template)
    logger.info("template %s of project %s created by %s", template.name, project, user)
    return template


def update_template(
    user,
    template: TaskTemplate,
    *,
    name: str | None = None,
    description: str | None = None,
    task_file=None,
    context: dict | None = None,
) -> TaskTemplate:
    """Change a template's name, description and/or task file (owners, and staff who may change templates); its
    project never changes. Raises as ``create_template``."""
    check_manager(user, template.project, "change")
    name = name.strip() if isinstance(name, str) else name
    errors = {}
    if name is not None and (name_errors := _name_errors(template.project, name, template)):
        errors["name"] = name_errors
    cleaned = None
    if task_file is not None:
        try:
            cleaned = clean_task_file(user, template.project, task_file, name=name or template.name, context=context)
        except ValidationError as exc:
            errors.update(exc.message_dict)
    if errors:
        raise ValidationError(errors)
    if name is not None:
        template.name = name
    if description is not None:
        template.description = description
    if cleaned is not None:
        template.task_file = cleaned
    _save(template)
    logger.info("template %s of project %s changed by %s", template.name, template.project, user)
    return template


def delete_template(user, template: TaskTemplate) -> None:
    """Delete a template (owners, and staff who may delete templates); tasks submitted from it stay as they are."""
    check_manager(user, template.project, "delete")
    template.delete()
    logger.info("template %s of project %s deleted by %s", template.name, template.project, user)


def template_from_task(user, task: Task, name: str, description: str = "") -> TaskTemplate:
    """Keep the task file of ``task`` (what it was submitted with, never its secret values) as a template of its
    project named ``name`` ("Save as template")."""
    data = taskfile.task_file(task)
    data.pop("project", None)
    return create_template(user, task.project, name, data, description)


def submission(template: TaskTemplate, overrides: dict | None = None) -> dict:
    """The submit body of a task from the template: its task file, named after the template unless the file
    names the task, with ``overrides`` (fields of a submission) over it; ``env``, ``secret_env`` and
    ``required_labels`` given there join the template's and win where both name one. Raises ValidationError on
    an override of ``project`` naming another project."""
    overrides = dict(overrides or {})
    if "project" in overrides and not _names_project(overrides.pop("project"), template.project):
        raise ValidationError(
            {"project": [f"Template {template.name} submits to its project, {template.project.name}."]}
        )
    body = {"name": template.name, **template.task_file}
    for key, value in overrides.items():
        if key in JOINED_FIELDS and isinstance(value, dict) and isinstance(body.get(key), dict):
            body[key] = {**body[key], **value}
        else:
            body[key] = value
    body["project"] = template.project_id
    return body
