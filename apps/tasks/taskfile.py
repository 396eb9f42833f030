"""Task files: a task written as one YAML (or JSON) document whose keys are the fields of the API's submit body.

A task file is the body of ``POST /api/v1/tasks/``: the same field names, checked by the same serializer and
submission service. ``task_file`` writes one from a submitted task (what the user asked for, secret values never:
secret variables by name only, in a comment); ``parse`` reads one, refusing anything but a mapping of known keys.
The rules: docs/tasks.md, "Task files".
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import yaml
from django.core.exceptions import ValidationError

from apps.tasks.models import Task
from apps.tasks.services import SUBMIT_FIELDS

# Every key a task file (and a submit body) may hold, in the order a written task file lists them.
FILE_FIELDS = ("name", "kind", "project", "vdc", "queue", *SUBMIT_FIELDS[2:], "secret_env", "preferred_clusters")
SCHEMA_PATH = "/api/v1/tasks/file-schema/"
# Larger than any task a form or the API takes, with room for comments.
MAX_FILE_BYTES = 256 * 1024


def unknown_keys(data: dict) -> list[str]:
    """The keys of a submit body or task file that are no field of a submission, sorted."""
    return sorted(str(key) for key in data if key not in FILE_FIELDS)


def unknown_key_errors(data: dict) -> dict[str, str]:
    message = f"Unknown key: expected only the fields of a task submission (the task file schema, {SCHEMA_PATH})."
    return dict.fromkeys(unknown_keys(data), message)


def parse(text: str | bytes) -> dict:
    """A task file's fields. Raises ValidationError saying what was expected: YAML or JSON, one mapping,
    known keys only (each unknown one named)."""
    data = load(text)
    errors = unknown_key_errors(data)
    if errors:
        raise ValidationError(errors)
    return data


def load(text: str | bytes) -> dict:
    """A task file's mapping, its keys unchecked (the submit serializer refuses unknown ones by name). Raises
    ValidationError saying what was expected: UTF-8, YAML or JSON, one mapping."""
    if isinstance(text, bytes):
        if len(text) > MAX_FILE_BYTES:
            raise ValidationError(f"Expected a task file of at most {MAX_FILE_BYTES // 1024} KiB.")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError("Expected a task file in UTF-8 (YAML or JSON).") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValidationError(f"Expected a task file in YAML or JSON; it does not parse{where}.") from None
    if not isinstance(data, dict):
        raise ValidationError(
            "Expected a task file holding one mapping of task fields (name: ..., project: ...), "
            f"got {type(data).__name__ if data is not None else 'an empty document'}."
        )
    return data


def _plain(value):
    """A field's value as YAML and JSON write it (and the API reads it back)."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, timedelta):
        total = int(value.total_seconds())
        return f"{total // 3600:02d}:{total % 3600 // 60:02d}:{total % 60:02d}"
    return value


def task_file(task: Task) -> dict:
    """What the task was submitted with, as a task file: fields left at their defaults are left out, and
    secret variables (whose values are never shown) too; ``secret_refs`` names the project's secrets."""
    data: dict = {"name": task.name, "kind": task.kind, "project": task.project.name, "vdc": task.vdc.name}
    data["queue"] = task.queue.name
    for field in SUBMIT_FIELDS[2:]:
        value = getattr(task, field)
        default = Task._meta.get_field(field).get_default()
        if value is None or value == default or value in ("", {}, []):
            continue
        data[field] = _plain(value)
    preferred = sorted(task.preferred_clusters.values_list("pk", flat=True))
    if preferred:
        data["preferred_clusters"] = preferred
    return data


def dump_yaml(task: Task) -> str:
    """The task file of a task as YAML, with a comment naming its secret variables (their values never appear)."""
    header = f"# Task file of task {task.pk}: `hcs submit -f FILE` submits it again. Schema: {SCHEMA_PATH}\n"
    names = task.secret_env_names
    if names:
        header += (
            f"# Secret variables left out (values are never shown): {', '.join(names)}; give them again under "
            "secret_env or with --secret-env.\n"
        )
    return header + yaml.safe_dump(task_file(task), sort_keys=False, allow_unicode=True, default_flow_style=False)
