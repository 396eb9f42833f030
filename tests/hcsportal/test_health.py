"""/healthz and /readyz: answered for any Host over plain HTTP, readiness says which dependency fails."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client


@pytest.mark.django_db
def test_liveness_and_readiness_answer_a_probe_by_address_over_http(settings):
    settings.SECURE_SSL_REDIRECT = True  # a deployment: every other path redirects to HTTPS
    probe = Client(HTTP_HOST="10.1.2.3:8000")  # a kubelet asks by the pod's address, not a configured host
    assert probe.get("/healthz").content == b"ok\n"
    ready = probe.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"ready": True, "checks": {"database": "ok", "redis": "ok"}}
    assert probe.get("/accounts/login/").status_code == 400  # the host check still applies everywhere else


@pytest.mark.django_db
def test_readiness_names_the_dependency_that_fails(settings, monkeypatch):
    settings.REDIS_URL = "redis://127.0.0.1:9/0"  # nothing listens on the discard port
    answer = Client().get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["ready"] is False and body["checks"]["database"] == "ok"
    assert body["checks"]["redis"].startswith("unavailable (")

    def broken(*args, **kwargs):
        raise RuntimeError("database gone")

    monkeypatch.setattr(connection, "cursor", broken)
    assert Client().get("/readyz").json()["checks"]["database"] == "unavailable (RuntimeError)"
