"""Production settings pass `check --deploy`; every page carries a Content Security Policy its templates keep."""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.urls import reverse

ROOT = Path(__file__).resolve().parents[2]


def run_manage(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "ALLOWED_HOSTS", "HCS_HTTPS", "HCS_CSP")}
    environ.update(HCS_VAR_DIR=str(tmp_path / "var"), **env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )


def test_check_deploy_is_clean_with_production_settings(tmp_path):
    production = {"DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "portal.example.org"}
    result = run_manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", **production)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_a_deployment_can_opt_out_of_https_and_check_deploy_then_says_so(tmp_path):
    production = {"DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50), "ALLOWED_HOSTS": "portal.example.org"}
    result = run_manage(tmp_path, "check", "--deploy", "--fail-level", "WARNING", HCS_HTTPS="false", **production)
    assert result.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in result.stderr + result.stdout


def test_https_settings_redirect_and_mark_cookies_secure(client, settings, world):
    # SecurityMiddleware reads its settings once, at the client's first request.
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_HSTS_SECONDS = 3600
    settings.CSRF_COOKIE_SECURE = True
    response = client.get("/accounts/login/")
    assert response.status_code == 301 and response.url.startswith("https://")
    response = client.get("/accounts/login/", secure=True)
    assert response["Strict-Transport-Security"].startswith("max-age=3600")
    assert response.cookies["csrftoken"]["secure"]


@pytest.mark.parametrize("path", ["/accounts/login/", "/", "/task-queues/", "/admin/", "/api/v1/vdcs/"])
def test_every_page_sends_a_strict_content_security_policy(client, world, path):
    client.force_login(world.admin)
    policy = client.get(path)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'" and directives["style-src"] == "'self'"
    assert directives["default-src"] == "'self'" and directives["frame-ancestors"] == "'none'"
    assert directives["object-src"] == "'none'"


def test_the_api_docs_page_loads_swagger_from_the_portal_itself(client, db):
    policy = client.get(reverse("api-docs"))["Content-Security-Policy"]
    assert "cdn.jsdelivr.net" not in policy  # served from the sidecar package: works without internet
    assert "'unsafe-inline'" not in policy.split("script-src")[1].split(";")[0]


INLINE = [
    (re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>", re.I), "an inline script"),
    (re.compile(r"<style\b", re.I), "a <style> element"),
    (re.compile(r"\sstyle=", re.I), "a style attribute"),
    (re.compile(r"\son[a-z]+=", re.I), "an event handler attribute"),
    (re.compile(r"javascript:", re.I), "a javascript: URL"),
]


@pytest.mark.parametrize("template", sorted((ROOT / "templates").rglob("*.html")), ids=lambda p: p.name)
def test_templates_keep_to_the_policy(template):
    text = template.read_text()
    for pattern, what in INLINE:
        assert not pattern.search(text), f"{template.relative_to(ROOT)} has {what}, which the policy blocks"


def test_a_time_zone_the_machine_does_not_know_stops_start_up_naming_the_variable(tmp_path):
    result = run_manage(tmp_path, "check", HCS_TIME_ZONE="Mars/Olympus_Mons")
    assert result.returncode != 0
    assert "HCS_TIME_ZONE must be an IANA time zone name" in result.stderr
    assert run_manage(tmp_path, "check", HCS_TIME_ZONE="Asia/Shanghai").returncode == 0
