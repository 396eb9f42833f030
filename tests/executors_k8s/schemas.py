"""Validation of Kubernetes objects against the schemas a real API server checks them with.

Built-in kinds: the official OpenAPI schemas kubernetes-validate ships, in strict mode (a field the schema does
not know is an error), for the oldest and the newest Kubernetes the portal supports (docs/kubernetes.md). Kinds of
custom resources (Volcano, cert-manager): the ``openAPIV3Schema`` of the CRDs their projects publish, vendored in
``crds/`` (source and version in ``crds/README.md``), made strict the same way, their ``metadata`` checked as the
built-in ObjectMeta.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

# The oldest and the newest Kubernetes whose schemas kubernetes-validate ships and the portal supports.
VERSIONS = ("1.29.0", "1.37.0")
CRDS = Path(__file__).parent / "crds"


def _strict(schema: dict) -> dict:
    """The schema with every object that lists its properties closed to others, as the API server's strict field
    validation (and its pruning of unknown fields) treats them; ``x-kubernetes-preserve-unknown-fields`` stays open.
    """
    schema = copy.deepcopy(schema)
    todo = [schema]
    while todo:
        node = todo.pop()
        if isinstance(node, list):
            todo.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        chosen = "additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in node and not chosen:
            node["additionalProperties"] = False
        todo.extend(node.values())
    return schema


@cache
def crd_schemas() -> dict[tuple[str, str], dict]:
    """(apiVersion, kind) -> strict JSON schema of every served version of the vendored CRDs."""
    schemas = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schemas[f"{group}/{version['name']}", kind] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


def validate(manifest: dict) -> None:
    """Raise a ValidationError when a real API server of any supported version would refuse ``manifest`` or drop a
    field of it; a kind with no schema here fails too (kubernetes-validate's SchemaNotFoundError)."""
    schema = crd_schemas().get((manifest.get("apiVersion"), manifest.get("kind")))
    if schema is not None:
        jsonschema.Draft7Validator(schema).validate(manifest)
        carrier = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": manifest.get("metadata") or {}}
        for version in VERSIONS:
            kubernetes_validate.validate(carrier, version, strict=True)
        return
    for version in VERSIONS:
        kubernetes_validate.validate(manifest, version, strict=True)
