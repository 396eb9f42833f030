"""The portal as a multi-process deployment runs it: 2 web + 3 worker processes + 1 beat on PostgreSQL and Redis.

Creates a database on the PostgreSQL server of ``DATABASE_URL`` (dropped at the end) and uses database 15 of the
Redis of ``REDIS_URL`` (flushed first), seeds one VDC with a local cluster of 8 simulated A100s, starts the six
processes as docs/deploy.md describes them, submits tasks (``1(A100)``, ``sleep 1``) from several client threads
through both web processes at once, waits for all of them to complete, and checks afterwards and while it runs:

* every accepted submission exists and completed: nothing lost;
* no card is ever held by two running tasks (sampled every 0.2 s while it runs);
* each run was placed once: one ``scheduled`` event and one backend object per attempt, one job on the backend
  per attempt (the local executor's job directories): no double launch.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        python -m benchmarks.multi_process [--tasks 300] [--clients 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg
import redis
import requests
from cryptography.fernet import Fernet
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
REDIS_DB = 15
CARDS = 8
ACTIVE = ("scheduled", "starting", "running")

SEED = """
from decimal import Decimal
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from apps.clusters.models import Cluster, Device, GPUModel, Node
from apps.clusters.services import sync_catalog
from apps.control.health import check_cluster_health
from apps.queues.services import create_class_queues
from apps.vdc.models import VDC, Membership, Project, ProjectQuota
sync_catalog()
vdc = VDC.objects.create(name="multi", is_default=True)
create_class_queues(vdc)
cluster = Cluster.objects.create(vdc=vdc, name="local", cluster_type="local")
node = Node.objects.create(cluster=cluster, name="host", cpu=Decimal(64), memory_gib=Decimal(256))
model = GPUModel.objects.get(name="A100-80G")
for i in range(%(cards)d):
    Device.objects.create(node=node, index=i, gpu_model=model, vram_gib=model.vram_gib, uuid=f"sim-{i}")
assert check_cluster_health(cluster).status == "healthy", cluster.status_message
project = Project.objects.create(name="multi")
big = Decimal(100000)
ProjectQuota.objects.create(project=project, vdc=vdc, limit_cpu=big, limit_memory_gib=big, limit_gpu=big)
user = get_user_model().objects.create_user("multi", password="multi-pass-123456")
Membership.objects.create(project=project, user=user, role="member")
print("TOKEN=" + Token.objects.create(user=user).key)
"""


@dataclass
class Figures:
    submitted: int = 0
    submit_s: float = 0.0
    latencies: list[float] = field(default_factory=list)
    drain_s: float = 0.0
    cycles: int = 0
    cycle_mean_ms: float = 0.0
    samples: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def submits_per_s(self) -> float:
        return self.submitted / self.submit_s if self.submit_s else 0.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _environment(database_url: str, redis_url: str, var_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "DJANGO_SETTINGS_MODULE")}
    env.update(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        HCS_VAR_DIR=str(var_dir),
        HCS_WEB_WORKERS="1",
        SECRET_KEY="multi-process-" + "k" * 40,
        HCS_CREDENTIALS_KEY=Fernet.generate_key().decode(),
        HCS_SCHEDULER_INTERVAL_S="1",
        LOG_LEVEL="WARNING",
    )
    return env


class Deployment:
    """The six processes of a small multi-process deployment, in their own process groups."""

    def __init__(self, env: dict[str, str], var_dir: Path, webs: int = 2, workers: int = 3):
        self.env, self.var_dir = env, var_dir
        self.ports = [_free_port() for _ in range(webs)]
        self.workers = workers
        self.procs: list[subprocess.Popen] = []

    def _start(self, args: list[str], name: str) -> None:
        log = open(self.var_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process group
        self.procs.append(
            subprocess.Popen(
                [sys.executable, *args],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def start(self) -> None:
        for i, port in enumerate(self.ports):
            self._start(
                [
                    "-m",
                    "uvicorn",
                    "hcsportal.asgi:application",
                    "--host",
                    HOST,
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                ],
                f"web{i}",
            )
        for i in range(self.workers):
            self._start(
                [
                    "-m",
                    "celery",
                    "-A",
                    "celery_app",
                    "worker",
                    "--loglevel",
                    "WARNING",
                    "--concurrency",
                    "2",
                    "--without-gossip",
                    "-n",
                    f"worker{i}@%h",
                ],
                f"worker{i}",
            )
        self._start(
            [
                "-m",
                "celery",
                "-A",
                "celery_app",
                "beat",
                "--loglevel",
                "WARNING",
                "--schedule",
                str(self.var_dir / "celerybeat-schedule"),
            ],
            "beat",
        )
        deadline = time.monotonic() + 120
        for port in self.ports:
            while True:
                try:
                    if requests.get(f"http://{HOST}:{port}/readyz", timeout=2).status_code == 200:
                        break
                except requests.RequestException:
                    pass
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                    self.stop()
                    raise RuntimeError(f"the deployment did not become ready; logs in {self.var_dir}")
                time.sleep(0.3)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def _watch_devices(conn_url: str, stop: threading.Event, figures: Figures) -> None:
    """Sample the running tasks' placements: a card share over 1000 milli is a double allocation."""
    with psycopg.connect(conn_url, autocommit=True) as conn:
        while not stop.is_set():
            held: dict[int, int] = {}
            rows = conn.execute("SELECT id, placement FROM tasks_task WHERE status = ANY(%s)", [list(ACTIVE)])
            for task_id, placement in rows:
                for instance in placement or ():
                    for device in instance.get("devices", ()):
                        held[device["id"]] = held.get(device["id"], 0) + int(device.get("milli", 1000))
                        if held[device["id"]] > 1000:
                            figures.violations.append(f"device {device['id']} over-allocated (task {task_id})")
            figures.samples += 1
            stop.wait(0.2)


def _check(conn_url: str, accepted: list[int], jobs_dir: Path, figures: Figures) -> None:
    with psycopg.connect(conn_url, autocommit=True) as conn:
        rows = dict(conn.execute("SELECT id, status FROM tasks_task WHERE id = ANY(%s)", [accepted]).fetchall())
        lost = sorted(set(accepted) - set(rows))
        if lost:
            figures.violations.append(f"{len(lost)} accepted submissions missing: {lost[:5]}")
        unfinished = {k: v for k, v in rows.items() if v != "completed"}
        if unfinished:
            figures.violations.append(f"{len(unfinished)} tasks did not complete: {list(unfinished.items())[:5]}")
        twice = conn.execute(
            "SELECT task_id, data->>'attempt', count(*) FROM tasks_taskevent WHERE kind = 'scheduled' "
            "GROUP BY task_id, data->>'attempt' HAVING count(*) > 1"
        ).fetchall()
        figures.violations += [f"task {t} placed {n} times in attempt {a}" for t, a, n in twice]
        objects = conn.execute(
            "SELECT task_id, attempt, count(*) FROM control_backendobject GROUP BY task_id, attempt HAVING count(*) > 1"
        ).fetchall()
        figures.violations += [f"task {t} attempt {a}: {n} backend objects" for t, a, n in objects]
        attempts = dict(conn.execute("SELECT id, attempt FROM tasks_task WHERE id = ANY(%s)", [accepted]).fetchall())
    launched: dict[int, int] = {}
    for job in jobs_dir.glob("hcs-*") if jobs_dir.exists() else ():
        task_id = int(job.name.split("-")[1])
        launched[task_id] = launched.get(task_id, 0) + 1
    for task_id, attempt in attempts.items():
        if launched.get(task_id, 0) != attempt:
            figures.violations.append(f"task {task_id}: {launched.get(task_id, 0)} jobs for {attempt} attempt(s)")


def _own_redis_db(url: str) -> str:
    """Database 15 of the same Redis server (a TCP or a unix-socket URL)."""
    if url.startswith("unix://"):
        return f"{url.split('?')[0]}?db={REDIS_DB}"
    return urlunparse(urlparse(url)._replace(path=f"/{REDIS_DB}"))


def run(
    tasks: int = 300, clients: int = 10, drain_timeout_s: float = 300.0, server_url: str = "", base_redis: str = ""
) -> Figures:
    """The whole run; figures and every invariant violation found (none expected)."""
    server_url = server_url or os.environ.get("DATABASE_URL", "")
    if not server_url.startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL=postgres://... (a database is created there and dropped at the end)")
    base_redis = base_redis or os.environ.get("REDIS_URL", "")
    if not base_redis.startswith(("redis://", "unix://")):
        raise SystemExit("set REDIS_URL=redis://... (database 15 of that server is flushed and used)")
    database = f"hcs_multi_{os.getpid()}"
    db_url = urlunparse(urlparse(server_url)._replace(path=f"/{database}"))
    redis_url = _own_redis_db(base_redis)
    redis.Redis.from_url(redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="hcs-multi-"))
    os.chmod(var_dir, 0o755)  # the local jobs' user walks into its job directories
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))
    env = _environment(db_url, redis_url, var_dir)
    deployment = Deployment(env, var_dir)
    figures = Figures()
    try:
        seed = ["manage.py", "shell", "-c", SEED % {"cards": CARDS}]
        for args in (["manage.py", "migrate", "--noinput", "-v", "0"], seed):
            out = subprocess.run(
                [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise RuntimeError(f"{args[1]} failed: {out.stderr[-2000:]}")
        token = next(line[6:] for line in out.stdout.splitlines() if line.startswith("TOKEN="))
        deployment.start()
        stop = threading.Event()
        watcher = threading.Thread(target=_watch_devices, args=(db_url, stop, figures), daemon=True)
        watcher.start()
        accepted: list[int] = []
        lock = threading.Lock()
        local = threading.local()

        def submit(n: int) -> None:
            session = getattr(local, "session", None)
            if session is None:
                session = local.session = requests.Session()
                session.headers["Authorization"] = f"Token {token}"
            port = deployment.ports[n % len(deployment.ports)]
            body = {
                "project": "multi",
                "queue": "high",
                "name": f"m{n}",
                "kind": "training",
                "gpu_spec": "1(A100)",
                "cpu": "1",
                "memory_gib": "1",
                "command": "sleep 1",
            }
            began = time.perf_counter()
            answer = session.post(f"http://{HOST}:{port}/api/v1/tasks/", json=body, timeout=60)
            elapsed = time.perf_counter() - began
            with lock:
                if answer.status_code == 201:
                    accepted.append(answer.json()["id"])
                    figures.latencies.append(elapsed)
                else:
                    figures.violations.append(f"submit {n} refused: {answer.status_code} {answer.text[:200]}")

        began = time.perf_counter()
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(submit, range(tasks)))
        figures.submit_s = time.perf_counter() - began
        figures.submitted = len(accepted)
        deadline = time.monotonic() + drain_timeout_s
        with psycopg.connect(db_url, autocommit=True) as conn:
            while time.monotonic() < deadline:
                left = conn.execute("SELECT count(*) FROM tasks_task WHERE status <> 'completed'").fetchone()[0]
                if left == 0:
                    break
                time.sleep(0.5)
        figures.drain_s = time.perf_counter() - began
        stop.set()
        watcher.join(5)
        stats = redis.Redis.from_url(redis_url, decode_responses=True).hgetall("hcs:stats:scheduler:multi")
        figures.cycles = int(float(stats.get("cycles", 0)))
        figures.cycle_mean_ms = 1000 * float(stats.get("cycle_seconds_sum", 0)) / max(figures.cycles, 1)
        _check(db_url, accepted, var_dir / "local-jobs" / "local", figures)
    finally:
        deployment.stop()
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database)))
        if not figures.violations:
            shutil.rmtree(var_dir, ignore_errors=True)
    return figures


def main() -> None:
    from benchmarks.table import print_table

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    f = run(args.tasks, args.clients)
    lat = sorted(f.latencies) or [0.0]
    print(f"2 web + 3 worker (2 each) + 1 beat on PostgreSQL and Redis; {args.clients} clients; {CARDS} cards\n")
    print_table(
        [
            "tasks accepted",
            "submits/s",
            "submit p50 ms",
            "submit p95 ms",
            "all completed after s",
            "cycles",
            "cycle mean ms",
            "device samples",
            "invariant violations",
        ],
        [
            [
                f.submitted,
                f.submits_per_s,
                statistics.median(lat) * 1000,
                lat[int(0.95 * (len(lat) - 1))] * 1000,
                f.drain_s,
                f.cycles,
                f.cycle_mean_ms,
                f.samples,
                len(f.violations),
            ]
        ],
    )
    for v in f.violations[:20]:
        print("VIOLATION:", v)
    print(json.dumps({"violations": len(f.violations)}))


if __name__ == "__main__":
    main()
