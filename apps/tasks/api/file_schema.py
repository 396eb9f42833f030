"""The JSON Schema of a task file: the OpenAPI component of the submit body (``TaskRequest``), resolved into a
standalone JSON Schema (every ``$ref`` inlined, OpenAPI's ``nullable`` as a null type) that refuses unknown keys
as the API does (docs/tasks.md, "Task files")."""

from __future__ import annotations

import copy
import functools

from drf_spectacular.generators import SchemaGenerator

from apps.tasks.taskfile import SCHEMA_PATH

COMPONENT = "TaskRequest"
DIALECT = "https://json-schema.org/draft/2020-12/schema"


def _inline(node, components: dict):
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            target = copy.deepcopy(components[ref.rsplit("/", 1)[1]])
            return _inline({**target, **{k: v for k, v in node.items() if k != "$ref"}}, components)
        return {key: _inline(value, components) for key, value in node.items()}
    if isinstance(node, list):
        return [_inline(item, components) for item in node]
    return node


def _json_schema(node):
    """OpenAPI 3.0's dialect in JSON Schema's words: ``nullable`` as a null type, a decimal (a string in answers)
    as a string or a number (both are taken), ``example`` as ``examples``."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _json_schema(value) for key, value in node.items() if key not in ("nullable", "example")}
    if "example" in node:
        out["examples"] = [node["example"]]
    if out.get("format") == "decimal" and out.get("type") == "string":
        out["type"] = ["string", "number"]
    if node.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        elif isinstance(out.get("type"), list):
            out["type"] = [*out["type"], "null"]
        else:
            choices = out.pop("oneOf", None) or [{}]
            out["oneOf"] = [*choices, {"type": "null"}]
    return out


@functools.cache
def task_file_schema() -> dict:
    """The schema, generated once per process from the API's schema (the submit serializer's request component)."""
    components = SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]
    body = _json_schema(_inline(copy.deepcopy(components[COMPONENT]), components))
    return {
        "$schema": DIALECT,
        "$id": SCHEMA_PATH,
        "title": "HCS Portal task file",
        **body,
        "description": "A task as one YAML or JSON document: the fields of the submit body of POST /api/v1/tasks/, "
        "checked as the API checks them. Unknown keys are refused.",
        "additionalProperties": False,
    }
