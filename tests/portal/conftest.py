"""Fixtures of the portal tests: the GPU catalog for transactional tests and a logged-in session cookie."""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis
from django.apps import apps as django_apps
from django.conf import settings
from django.db import connection, connections

from tests.conftest import IN_CI

seed_migration = importlib.import_module("apps.clusters.migrations.0002_seed_gpu_catalog")


@pytest.fixture
def seeded_catalog(transactional_db):
    """Transactional tests start from a flushed database: put the GPU catalog back before the world is built."""
    seed_migration.seed(django_apps, None)


@pytest.fixture
def live_world(seeded_catalog, world, monkeypatch):
    """The world, with the live-push job run at once (a worker job sends pushes; no worker runs in tests).

    A push requested by an earlier test whose job no worker ran would hold back this test's pushes for the
    request's lifetime (10 s): the test starts with none pending.
    """
    from apps.control import jobs, triggers

    redis.Redis.from_url(settings.REDIS_URL).delete(triggers.LIVE_PENDING_KEY, triggers.LIVE_REQUESTED_KEY)
    queue = triggers.enqueue

    def enqueue(job, *args, **kwargs):
        if job == triggers.PUSH_LIVE_UPDATES:
            jobs.push_live_updates(*args)
        else:
            queue(job, *args, **kwargs)

    monkeypatch.setattr(triggers, "enqueue", enqueue)
    return world


# --- browser tests: Chromium, a Daphne server in this process, a thread for ORM work ------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Another apt-get of the test run (the dev Slurm cluster installs its packages) may hold the lock a while.
LOCK_WAIT = "-oDPkg::Lock::Timeout=600"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "screenshots"


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The Debian Chromium; installed with apt-get when missing. In CI a missing browser fails the run."""
    if not CHROMIUM.exists() and shutil.which("apt-get") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", LOCK_WAIT, "update"], ["apt-get", LOCK_WAIT, "install", "-y", "chromium"]):
            subprocess.run(command, env=env, capture_output=True, timeout=900, check=False)
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing and could not be installed with apt-get"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return CHROMIUM


def _shares_one_connection() -> bool:
    """SQLite's in-memory test database lives in this process: every thread must use the test's connection."""
    return connection.vendor == "sqlite" and connection.is_in_memory_db()


class DBThread:
    """Runs ORM work and the scheduler off the Playwright thread (whose event loop forbids sync ORM calls)."""

    def __init__(self) -> None:
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="portal-orm")
        self.shared = _shares_one_connection()
        if self.shared:
            self.run(_use_connection, connections["default"])

    def run(self, fn, *args, **kwargs):
        return self.executor.submit(fn, *args, **kwargs).result(timeout=120)

    def close(self) -> None:
        if self.shared:
            self.run(_release_connection)
        else:
            self.run(connections.close_all)
        self.executor.shutdown(wait=True)


def _use_connection(conn) -> None:
    connections["default"] = conn


def _release_connection() -> None:
    del connections["default"]


@pytest.fixture(scope="session")
def daphne_server():
    """Daphne serving hcsportal.asgi (HTTP and WebSocket) on a free port, in a thread for the whole session.

    Twisted's reactor runs once per process, hence one server per session.
    """
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server
    from twisted.internet import reactor

    from hcsportal.asgi import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = threading.Event()
    server = Server(
        application=application,
        endpoints=build_endpoint_description_strings(host="127.0.0.1", port=port),
        signal_handlers=False,
        ready_callable=ready.set,
        verbosity=0,
    )
    thread = threading.Thread(target=server.run, name="daphne", daemon=True)
    thread.start()
    if not ready.wait(20):
        pytest.fail("Daphne did not start listening within 20 s")
    yield f"http://127.0.0.1:{port}"
    reactor.callFromThread(reactor.stop)
    thread.join(10)


@contextlib.contextmanager
def server_sees_test_db():
    """The test's database visible to a server running in this process (its views run in asgiref's executor)."""
    from asgiref.sync import SyncToAsync

    shared = _shares_one_connection()
    if shared:
        connection.inc_thread_sharing()
        # Daphne and uvicorn run views and database_sync_to_async work in asgiref's one thread-sensitive executor.
        SyncToAsync.single_thread_executor.submit(_use_connection, connections["default"]).result()
    try:
        yield
    finally:
        if shared:
            SyncToAsync.single_thread_executor.submit(_release_connection).result()
            connection.dec_thread_sharing()
        else:
            # Open connections of the server's thread would keep the test database from being dropped.
            SyncToAsync.single_thread_executor.submit(connections.close_all).result()


@pytest.fixture
def live_server_url(daphne_server, live_world, settings, tmp_path, monkeypatch):
    """The server, with the test's database visible to it and Celery jobs run at once (no worker in tests)."""
    from celery_app.app import app as celery

    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    monkeypatch.setitem(celery.conf, "task_always_eager", True)
    with server_sees_test_db():
        yield daphne_server


@pytest.fixture
def uvicorn_url(live_world):
    """uvicorn (the server `make run` starts) serving hcsportal.asgi on a free loopback port, in a thread."""
    import uvicorn

    from hcsportal.asgi import application

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(application, host="127.0.0.1", port=port, lifespan="off", log_level="info"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    with server_sees_test_db():
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                pytest.fail("uvicorn did not start listening within 20 s")
            time.sleep(0.05)
        yield f"127.0.0.1:{port}"
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def db_thread(live_server_url):
    runner = DBThread()
    yield runner
    runner.close()


@pytest.fixture
def browser(chromium):
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        yield instance
        instance.close()
