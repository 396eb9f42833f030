"""API load: submit and list latency at 1 / 10 / 50 clients, next to a one-row write, on the real web server.

Starts the web server as ``manage.py runportal`` does (uvicorn, ``HCS_WEB_WORKERS`` processes) on a free
loopback port, against a dedicated database on the PostgreSQL server of ``DATABASE_URL`` (created, then
dropped at the end) and the Redis of ``REDIS_URL``. It seeds one VDC, two projects, a user per client and
10,000 finished and waiting tasks, then for each client count runs, one after the other and each for a
fixed time: the one-row write (``hcsportal/bench.py``: token auth, one INSERT), ``POST /api/v1/tasks/``
and ``GET /api/v1/tasks/`` (first page of the 10,000). Each client is a closed loop (next request when the
answer came) with its own token. No Celery worker runs: the submits' on-commit triggers still go to Redis.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REDIS_URL=redis://127.0.0.1:6379/7 \\
        python -m benchmarks.api_load [--clients 1,10,50] [--seconds 8] [--workers N]

The load generator runs on the same machine as the server and the database: figures are upper bounds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from benchmarks.table import print_table

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
LIST_TASKS = 10_000
# No phase sends more than this many requests, whatever the server's speed.
MAX_REQUESTS_PER_PHASE = 20_000
WARMUP_S = 1.0
SUBMIT_BODY = {
    "project": "bench-submit",
    "queue": "high",
    "name": "load",
    "kind": "training",
    "gpu_spec": "1(A100)",
    "cpu": "2",
    "memory_gib": "8",
    "image": "python:3.12-slim",
    "command": "python train.py",
    "env": {"EPOCHS": "3"},
}


def _require_services(database: str) -> tuple[str, str]:
    """PostgreSQL and Redis from the environment; the benchmark's database URL on the same server."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("set DATABASE_URL=postgres://... (the benchmark creates, uses and drops a database there)")
    redis_url = os.environ.get("REDIS_URL", "")
    if not redis_url.startswith(("redis://", "rediss://", "unix://")):
        sys.exit("set REDIS_URL=redis://... (the web server's channel layer and on-commit triggers use it)")
    return url, urlunparse(urlparse(url)._replace(path=f"/{database}"))


def _recreate_database(server_url: str, database: str, *, drop_only: bool = False) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        if not drop_only:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))


def seed(clients: int) -> dict:
    """The benchmark's world; returns the member tokens, the admin token and a task for the one-row write."""
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from rest_framework.authtoken.models import Token

    from apps.queues.models import TaskQueue
    from apps.tasks.models import Task
    from apps.vdc.models import VDC, Membership, Project, ProjectQuota

    call_command("migrate", verbosity=0)
    User = get_user_model()
    vdc = VDC.objects.create(name="bench", is_default=True)
    queue = TaskQueue.objects.create(vdc=vdc, name="high", priority_class="high")
    submit_project = Project.objects.create(name="bench-submit")
    list_project = Project.objects.create(name="bench-list")
    projects = (submit_project, list_project)
    limits = {"limit_cpu": 1024, "limit_memory_gib": 4096, "limit_gpu": 64}
    for project in projects:
        ProjectQuota.objects.create(project=project, vdc=vdc, **limits)
    users = User.objects.bulk_create(User(username=f"bench-{i}") for i in range(clients))
    Membership.objects.bulk_create(Membership(project=p, user=user, role="member") for user in users for p in projects)
    admin = User.objects.create(username="bench-admin", is_staff=True, is_superuser=True)
    statuses = ["completed"] * 8 + ["queued", "running"]
    Task.objects.bulk_create(
        (
            Task(
                name=f"seed-{i}",
                project=list_project,
                owner=users[i % clients],
                vdc=vdc,
                queue=queue,
                kind="training",
                gpu_spec="1(A100)",
                command="true",
                status=statuses[i % len(statuses)],
            )
            for i in range(LIST_TASKS)
        ),
        batch_size=2000,
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # as autovacuum would have by now: plans for a table of 10,000 rows, not 0
    return {
        "members": [Token.objects.create(user=user).key for user in users],
        "admin": Token.objects.create(user=admin).key,
        "task": Task.objects.filter(project=list_project).values_list("pk", flat=True).first(),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_server(env: dict, workers: int, log_path: Path) -> tuple[subprocess.Popen, str]:
    """The portal's web server as ``runportal`` starts it, on a free loopback port; waits until it answers."""
    import shlex

    import requests

    from hcsportal.management.commands.runportal import web_command

    port = _free_port()
    log = log_path.open("w")
    proc = subprocess.Popen(shlex.split(web_command(HOST, port, workers)), cwd=ROOT, env=env, stdout=log, stderr=log)
    base = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the web server exited with {proc.returncode}; see {log_path}")
        try:
            if requests.get(f"{base}/api/v1/", timeout=1).status_code in (200, 401, 403):
                return proc, base
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.terminate()
    sys.exit(f"the web server did not answer within 60 s; see {log_path}")


@dataclass
class Phase:
    """One endpoint at one client count: latencies (s) of the requests started after the warm-up."""

    endpoint: str
    clients: int
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000 if ordered else float("nan")

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


async def run_phase(base: str, endpoint: str, method: str, path: str, tokens: list[str], body, seconds: float) -> Phase:
    """``len(tokens)`` closed-loop clients for ``seconds`` after a warm-up; at most MAX_REQUESTS_PER_PHASE sent."""
    import aiohttp

    phase = Phase(endpoint, len(tokens))
    sent = 0
    start = time.monotonic()
    measure_from = start + WARMUP_S
    stop_at = measure_from + seconds

    async def client(session: aiohttp.ClientSession, token: str) -> None:
        nonlocal sent
        headers = {"Authorization": f"Token {token}"}
        while time.monotonic() < stop_at and sent < MAX_REQUESTS_PER_PHASE:
            sent += 1
            began = time.monotonic()
            async with session.request(method, base + path, json=body, headers=headers) as response:
                await response.read()
                ok = response.status < 300
            if began >= measure_from:
                if ok:
                    phase.latencies.append(time.monotonic() - began)
                else:
                    phase.errors += 1

    connector = aiohttp.TCPConnector(limit=len(tokens))
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        await asyncio.gather(*(client(session, token) for token in tokens))
    phase.elapsed = max(0.0, min(time.monotonic(), stop_at) - measure_from)
    return phase


async def drive(base: str, world: dict, levels: list[int], seconds: float) -> list[Phase]:
    phases = []
    for clients in levels:
        members = world["members"][:clients]
        plan = [
            ("one-row write", "POST", "/api/v1/bench/one-row/", [world["admin"]] * clients, {"task": world["task"]}),
            ("submit", "POST", "/api/v1/tasks/", members, SUBMIT_BODY),
            (f"list ({LIST_TASKS:,} tasks)", "GET", "/api/v1/tasks/", members, None),
        ]
        for endpoint, method, path, tokens, body in plan:
            phases.append(await run_phase(base, endpoint, method, path, tokens, body, seconds))
    return phases


def report(phases: list[Phase], workers: int) -> None:
    floor = {p.clients: p for p in phases if p.endpoint == "one-row write"}
    rows = []
    for p in phases:
        base = floor[p.clients]
        rows.append(
            [
                p.endpoint,
                p.clients,
                len(p.latencies),
                p.errors,
                p.percentile(0.5),
                p.percentile(0.99),
                p.throughput,
                f"{p.percentile(0.5) / base.percentile(0.5):.1f}x",
                f"{p.percentile(0.99) / base.percentile(0.99):.1f}x",
            ]
        )
    print(f"API load: {workers} web worker(s), {os.cpu_count()} CPUs, server, database and clients on one host\n")
    headers = ["endpoint", "clients", "requests", "errors", "p50 ms", "p99 ms", "req/s", "p50 vs 1-row", "p99 vs 1-row"]
    widths = [max(len(h), *(len(_cell(r[i])) for r in rows)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|")
    for r in rows:
        cells = [_cell(v).rjust(w) if i else _cell(v).ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))]
        print("| " + " | ".join(cells) + " |")
    print()
    queries = [[name, count] for name, count in QUERY_COUNTS.items()]
    if queries:
        print_table(["request", "SQL queries"], queries)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


QUERY_COUNTS: dict[str, int] = {}


def count_queries(world: dict) -> None:
    """SQL statements of one submit and one list through the Django test client (token auth included)."""
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_AUTHORIZATION=f"Token {world['members'][0]}")
    for name, call in (
        ("POST /api/v1/tasks/", lambda: client.post("/api/v1/tasks/", SUBMIT_BODY, content_type="application/json")),
        ("GET /api/v1/tasks/", lambda: client.get("/api/v1/tasks/")),
    ):
        call()
        with CaptureQueriesContext(connection) as queries:
            response = call()
        assert response.status_code < 300, response.content
        QUERY_COUNTS[name] = len(queries)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,10,50", help="comma-separated client counts (at most 200)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per endpoint and client count")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("HCS_WEB_WORKERS", 2)))
    parser.add_argument("--database", default="hcs_bench_api", help="database created and dropped on the server")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    if not levels or min(levels) < 1 or max(levels) > 200 or not 0 < args.seconds <= 60 or not 1 <= args.workers <= 32:
        sys.exit("expected 1..200 clients, 0..60 seconds and 1..32 workers")
    server_url, bench_url = _require_services(args.database)
    _recreate_database(server_url, args.database)
    env = {**os.environ, "DATABASE_URL": bench_url, "HCS_BENCH_ENDPOINTS": "true", "DEBUG": "false"}
    os.environ.update({k: env[k] for k in ("DATABASE_URL", "HCS_BENCH_ENDPOINTS", "DEBUG")})
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
    import django

    django.setup()
    from django.db import connections

    proc = None
    try:
        world = seed(max(levels))
        count_queries(world)
        connections.close_all()
        from django.conf import settings

        proc, base = start_server(env, args.workers, Path(settings.VAR_DIR) / "bench-api-server.log")
        phases = asyncio.run(drive(base, world, levels, args.seconds))
        report(phases, args.workers)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        connections.close_all()
        _recreate_database(server_url, args.database, drop_only=True)


if __name__ == "__main__":
    main()
