"""Project services: secrets, managed by owners and by staff with the secret permissions (``apps.vdc.policy``)."""

from __future__ import annotations

import logging

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import IntegrityError, transaction

from apps.vdc import policy
from apps.vdc.models import MAX_SECRET_LENGTH, Project, ProjectSecret
from apps.vdc.signals import secret_in_use

logger = logging.getLogger(__name__)


def secret_value_error(value) -> str | None:
    """A secret's value is non-empty text without NUL, at most MAX_SECRET_LENGTH characters."""
    if not isinstance(value, str) or not value:
        return "Expected the secret's value as non-empty text."
    if "\x00" in value:
        return "Expected a value without NUL characters."
    if len(value) > MAX_SECRET_LENGTH:
        return f"Expected a value of at most {MAX_SECRET_LENGTH} characters, got {len(value)}."
    return None


def _check_manager(user, project: Project, action: str) -> None:
    """PermissionDenied unless the user may ``action`` (add / change / delete) the project's secrets."""
    if not policy.can_manage(user, project, policy.model_perm(ProjectSecret, action)):
        raise PermissionDenied(
            f"Only owners of project {project} manage its secrets (staff: with the permission to {action} "
            "project secrets)."
        )


def create_secret(user, project: Project, name: str, value: str, description: str = "") -> ProjectSecret:
    """Store a new secret of the project, encrypted (owners, and staff who may add secrets).

    Raises PermissionDenied or ValidationError (per field: a bad name, a name taken, a bad value) and
    writes nothing in either case.
    """
    _check_manager(user, project, "add")
    secret = ProjectSecret(project=project, name=name, description=description, created_by=user, updated_by=user)
    errors: dict[str, list[str]] = {}
    try:
        secret.clean_fields(exclude=["project", "value", "created_by", "updated_by"])
    except ValidationError as exc:
        errors.update(exc.message_dict)
    if "name" not in errors and ProjectSecret.objects.filter(project=project, name=name).exists():
        errors["name"] = [f"Project {project} already has a secret {name}; change its value instead."]
    if message := secret_value_error(value):
        errors["value"] = [message]
    if errors:
        raise ValidationError(errors)
    secret.set_value(value)
    try:
        with transaction.atomic():
            secret.save()
    except IntegrityError:  # the same name, added at the same moment
        raise ValidationError({"name": [f"Project {project} already has a secret {name}; change its value instead."]})
    logger.info("secret %s of project %s created by %s", secret.name, project, user)
    return secret


def update_secret(
    user, secret: ProjectSecret, *, value: str | None = None, description: str | None = None
) -> ProjectSecret:
    """Rotate a secret's value and/or change its description; the next attempt of every task that refers to it
    gets the new value (running attempts keep the one they started with). Its name never changes: tasks
    refer to it by name."""
    _check_manager(user, secret.project, "change")
    if value is not None and (message := secret_value_error(value)):
        raise ValidationError({"value": [message]})
    if description is not None:
        secret.description = description
    if value is not None:
        secret.set_value(value)
    secret.updated_by = user
    secret.save()
    logger.info(
        "secret %s of project %s %s by %s",
        secret.name,
        secret.project,
        "rotated" if value is not None else "changed",
        user,
    )
    return secret


def delete_secret(user, secret: ProjectSecret) -> None:
    """Delete a secret no waiting or running task refers to; ValidationError naming those tasks otherwise
    (stop them, or let them finish, first)."""
    _check_manager(user, secret.project, "delete")
    with transaction.atomic():
        ProjectSecret.objects.select_for_update().filter(pk=secret.pk).first()
        users = sorted(
            {
                label
                for _receiver, labels in secret_in_use.send(sender=ProjectSecret, secret=secret)
                for label in labels or ()
            }
        )
        if users:
            raise ValidationError(
                f"Secret {secret.name} is still referred to by waiting or running tasks: {', '.join(users)}. "
                "Stop them (or let them finish) first, or give the secret a new value instead."
            )
        secret.delete()
    logger.info("secret %s of project %s deleted by %s", secret.name, secret.project, user)
