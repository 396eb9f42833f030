"""Fixtures of the CLI tests: a real uvicorn server (what `make run` serves) on the test database, and the `hcs`
console script run against it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.portal.conftest import live_world, seeded_catalog, uvicorn_url  # noqa: F401 - shared fixtures

# The console script `make venv` installs next to the interpreter running the tests.
HCS = Path(sys.executable).parent / "hcs"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def live_server_url(uvicorn_url, settings, tmp_path, monkeypatch):  # noqa: F811
    """The server's URL, with Celery jobs run at once (no worker in tests) and local jobs under tmp_path."""
    from celery_app.app import app as celery

    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    monkeypatch.setitem(celery.conf, "task_always_eager", True)
    return f"http://{uvicorn_url}"


@pytest.fixture
def run_hcs(live_server_url, tmp_path):
    """Run `hcs` with a private config directory; the server's URL comes from `hcs login` or HCS_URL.
    ``run_hcs.env`` is that environment, for a command a test runs in the background."""
    assert HCS.exists(), f"{HCS} is missing: `make venv` installs the project (pip install -e .)"
    base_env = {k: v for k, v in os.environ.items() if not k.startswith("HCS_")}
    base_env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    # The console script imports hcs_cli from this checkout, whichever checkout the editable install points at.
    base_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))

    def run(*args: str, stdin: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(HCS), *args], input=stdin, capture_output=True, text=True, timeout=60, env={**base_env, **(env or {})}
        )

    run.url = live_server_url
    run.config = tmp_path / "config" / "hcs" / "config.json"
    run.env = base_env
    return run
