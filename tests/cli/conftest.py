"""Fixtures of the CLI tests: a real uvicorn server (what `make run` serves) on the test database."""

from __future__ import annotations

import pytest

from tests.portal.conftest import live_world, seeded_catalog, uvicorn_url  # noqa: F401 - shared fixtures


@pytest.fixture
def live_server_url(uvicorn_url, settings, tmp_path, monkeypatch):  # noqa: F811
    """The server's URL, with Celery jobs run at once (no worker in tests) and local jobs under tmp_path."""
    from celery_app.app import app as celery

    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    monkeypatch.setitem(celery.conf, "task_always_eager", True)
    return f"http://{uvicorn_url}"
