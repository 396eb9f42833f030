"""HCS_APPS_DOMAIN, the domain Connect serves task ports under: a clear error for a bad value, and a deployment
whose portal names overlap it (or whose trusted origins span it) does not start."""

from __future__ import annotations

import secrets

import pytest
from django.core.exceptions import ImproperlyConfigured

from hcsportal.env import env_domain
from tests.hcsportal.test_deploy_settings import run_manage

PRODUCTION = {"DEBUG": "false", "SECRET_KEY": secrets.token_urlsafe(50), "HCS_APPS_DOMAIN": "apps.example.net"}
SHOW = "from django.conf import settings as s; print(s.ALLOWED_HOSTS, s.SESSION_COOKIE_NAME, s.CSRF_COOKIE_NAME)"


@pytest.mark.parametrize(
    ("raw", "value"), [("apps.example.org", "apps.example.org"), (" Apps.Localhost:8443 ", "apps.localhost:8443")]
)
def test_a_domain_with_an_optional_port_is_read_in_lower_case(monkeypatch, raw, value):
    monkeypatch.setenv("HCS_APPS_DOMAIN", raw)
    assert env_domain("HCS_APPS_DOMAIN", "apps.localhost") == value


BAD = [
    "localhost",
    "apps..example.org",
    "-apps.example.org",
    "apps.example.org:0",
    "apps.example.org:70000",
    "https://apps.example.org",
    "*.apps.example.org",
]


@pytest.mark.parametrize("raw", BAD)
def test_anything_else_is_refused_naming_the_variable(monkeypatch, raw):
    monkeypatch.setenv("HCS_APPS_DOMAIN", raw)
    with pytest.raises(ImproperlyConfigured, match="HCS_APPS_DOMAIN must be a domain of two labels or more"):
        env_domain("HCS_APPS_DOMAIN", "apps.localhost")


def test_a_deployment_admits_its_apps_domain_and_gives_the_portals_cookies_the_host_prefix(tmp_path):
    result = run_manage(tmp_path, "shell", "-c", SHOW, ALLOWED_HOSTS="portal.example.org", **PRODUCTION)
    assert result.returncode == 0, result.stderr
    shown = result.stdout.strip().splitlines()[-1]
    assert shown == "['portal.example.org', '.apps.example.net'] __Host-sessionid __Host-csrftoken"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ALLOWED_HOSTS", "portal.example.net,.example.net"),
        ("ALLOWED_HOSTS", "x.apps.example.net"),
        ("CSRF_TRUSTED_ORIGINS", "https://*.example.net"),
    ],
)
def test_portal_names_that_overlap_the_apps_domain_stop_start_up(tmp_path, variable, value):
    settings = {**PRODUCTION, "ALLOWED_HOSTS": "portal.example.net", variable: value}
    result = run_manage(tmp_path, "check", **settings)
    assert result.returncode != 0
    assert f"{variable} entry" in result.stderr and "covers HCS_APPS_DOMAIN 'apps.example.net'" in result.stderr
