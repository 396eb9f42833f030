"""The OpenAPI schema generates and validates without warnings, says every answer, and docs/openapi.yaml is it."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from django.core.management import call_command

DOCS_SCHEMA = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"


def generated(tmp_path) -> dict:
    path = tmp_path / "schema.yml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(path))
    return yaml.safe_load(path.read_text())


def test_schema_validates_without_warnings(tmp_path):
    schema = generated(tmp_path)
    assert "/api/v1/tasks/{id}/stop/" in schema["paths"]
    assert "/api/v1/vdcs/{id}/resources/" in schema["paths"]
    cluster = schema["components"]["schemas"]["Cluster"]["properties"]
    assert "credentials" not in cluster and cluster["has_credentials"]["readOnly"] is True
    assert "credentials" in schema["components"]["schemas"]["ClusterRequest"]["properties"]
    assert {"tokenAuth", "cookieAuth"} <= set(schema["components"]["securitySchemes"])


def test_docs_endpoints_answer(client, db):
    assert client.get("/api/schema/").status_code == 200
    assert client.get("/api/docs/").status_code == 200


def test_docs_copy_of_the_schema_is_current(tmp_path):
    """The same on SQLite and PostgreSQL (hcsportal.sqlite_backend holds integers to PostgreSQL's ranges);
    regenerate with: python manage.py spectacular --validate --fail-on-warn --file docs/openapi.yaml"""
    assert yaml.safe_load(DOCS_SCHEMA.read_text()) == generated(tmp_path)


def test_every_operation_documents_its_error_answers(tmp_path):
    paths = generated(tmp_path)["paths"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            assert {"401", "403"} <= set(operation["responses"]), (method, path)
            if "{" in path:
                assert "404" in operation["responses"], (method, path)
    assert {"400", "404"} <= set(paths["/api/v1/tasks/"]["get"]["responses"])
    assert "400" in paths["/api/v1/tasks/"]["post"]["responses"]
    assert {"400", "404"} <= set(paths["/api/v1/tasks/{id}/stop/"]["post"]["responses"])
    for held in ("vdcs", "nodes", "devices"):
        assert "409" in paths[f"/api/v1/{held}/{{id}}/"]["delete"]["responses"], held
    assert "404" in paths["/api/v1/billing/price-preview/"]["post"]["responses"]
    body = paths["/api/v1/tasks/{id}/"]["get"]["responses"]["404"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ErrorDetail"}


def test_task_events_may_have_no_status_before(tmp_path):
    event = generated(tmp_path)["components"]["schemas"]["TaskEvent"]["properties"]
    refs = {choice["$ref"].rsplit("/", 1)[1] for choice in event["from_status"]["oneOf"]}
    assert refs == {"TaskStatusEnum", "BlankEnum"}


def test_api_docs_need_nothing_but_the_portal(client, db):
    """Swagger UI's files come from the portal (drf-spectacular-sidecar), so /api/docs/ works offline."""
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(asset.endswith("swagger-ui-bundle.js") for asset in assets), assets
    for asset in assets:
        assert asset.startswith("/") or asset.startswith("?"), f"{asset} is not served by the portal"
        answer = client.get(asset if asset.startswith("/") else f"/api/docs/{asset}")
        assert answer.status_code == 200, asset
    assert "https://" not in client.get("/api/docs/?script=").content.decode()
    assert "cdn" not in page["Content-Security-Policy"]
