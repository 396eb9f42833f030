"""The OpenAPI schema generates and validates without warnings, and never offers credentials back."""

from __future__ import annotations

import yaml
from django.core.management import call_command


def test_schema_validates_without_warnings(tmp_path):
    path = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    schema = yaml.safe_load(path.read_text())
    assert "/api/v1/tasks/{id}/stop/" in schema["paths"]
    assert "/api/v1/vdcs/{id}/resources/" in schema["paths"]
    cluster = schema["components"]["schemas"]["Cluster"]["properties"]
    assert "credentials" not in cluster and cluster["has_credentials"]["readOnly"] is True
    assert "credentials" in schema["components"]["schemas"]["ClusterRequest"]["properties"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])


def test_docs_endpoints_answer(client, db):
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200
