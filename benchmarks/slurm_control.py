"""The whole portal in front of the real dev Slurm cluster vs raw ``sbatch``, side by side in one run.

Starts the dev Slurm cluster (``scripts/dev_slurm.sh``) and a portal on PostgreSQL and Redis (uvicorn with four
web processes, one Celery worker of four processes, beat) whose Slurm cluster points at a counting proxy in front
of slurmrestd, then measures:

1. submit -> running, one task after another: through the REST API vs ``sbatch`` (alternating);
2. a burst of tasks of 1 s each: first submit to last finished, through the API vs ``sbatch``;
3. slurmrestd calls per minute while tasks run, by endpoint: what status sync costs.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test REDIS_URL=redis://127.0.0.1:6379/0 \\
        python -m benchmarks.slurm_control [--sequential 20] [--burst 200] [--running 20]

It uses (and recreates) a database ``hcs_bench_control`` on that server and Redis database 5 (``--database``
and ``--redis-db`` choose others, so that two checkouts can measure side by side). Needs root (the dev
cluster). The machine is shared and noisy: compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import collections
import http.server
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

from benchmarks.table import print_table

ROOT = Path(__file__).resolve().parents[1]
DB_NAME = "hcs_bench_control"
PASSWORD = "bench-password-2026!"


class CountingProxy(http.server.ThreadingHTTPServer):
    """Forwards every request to slurmrestd and counts them by method and endpoint."""

    daemon_threads = True

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.counts: collections.Counter = collections.Counter()
        self.lock = threading.Lock()
        self.session = requests.Session()
        super().__init__(("127.0.0.1", 0), _ProxyHandler)

    def record(self, method: str, path: str) -> None:
        endpoint = re.sub(r"/\d+$", "/{id}", re.sub(r"^/slurm/v[0-9.]+/", "", path.split("?")[0]))
        with self.lock:
            self.counts[f"{method} {endpoint}"] += 1

    def take(self) -> collections.Counter:
        with self.lock:
            counts, self.counts = self.counts, collections.Counter()
        return counts


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    def _forward(self) -> None:
        proxy: CountingProxy = self.server  # type: ignore[assignment]
        proxy.record(self.command, self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
        upstream = proxy.session.request(self.command, proxy.upstream + self.path, data=body, headers=headers)
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers.get("Content-Type", "application/json"))
        self.send_header("Content-Length", str(len(upstream.content)))
        self.end_headers()
        self.wfile.write(upstream.content)

    do_GET = do_POST = do_DELETE = _forward

    def log_message(self, *args) -> None:
        pass


def _slurm_env() -> dict[str, str]:
    result = subprocess.run(["bash", str(ROOT / "scripts" / "dev_slurm.sh"), "start"], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"dev_slurm.sh start failed:\n{result.stderr[-2000:]}")
    return dict(line.split("=", 1) for line in result.stdout.splitlines() if line.startswith("SLURM_"))


def _setup_django(database_url: str, redis_url: str, database: str) -> None:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {database}")
    os.environ["DATABASE_URL"] = urlunparse(urlparse(database_url)._replace(path=f"/{database}"))
    os.environ["REDIS_URL"] = redis_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _build_portal_data(slurm: dict[str, str], proxy_url: str) -> str:
    """A VDC with the dev Slurm cluster (through the proxy), a high queue and a project with room; returns a token."""
    from decimal import Decimal

    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from apps.clusters.models import Cluster
    from apps.clusters.services import import_slurm_nodes, sync_catalog
    from apps.queues.models import TaskQueue
    from apps.vdc.models import VDC, Membership, Project, ProjectQuota

    sync_catalog()
    vdc = VDC.objects.create(name="bench", is_default=True)
    cluster = Cluster.objects.create(
        vdc=vdc,
        name="slurm-dev",
        cluster_type="slurm",
        endpoint=proxy_url,
        api_version=slurm["SLURM_API_VERSION"],
        namespace=slurm["SLURM_PARTITION"],
        labels={"slurm-gres.A100-80G": "a100", "slurm-gres.V100-32G": "v100"},
        status="healthy",  # checked by the setup, as the first beat would (the figures time work, not the beat)
    )
    cluster.set_credentials(
        {"token": slurm["SLURM_JWT"], "user": slurm["SLURM_USER"], "output_dir": slurm["SLURM_OUTPUT_DIR"]}
    )
    cluster.save()
    import_slurm_nodes(cluster)
    TaskQueue.objects.create(vdc=vdc, name="high", priority_class="high", policy="fifo")
    project = Project.objects.create(name="bench")
    big = Decimal(100_000)
    ProjectQuota.objects.create(project=project, vdc=vdc, limit_cpu=big, limit_memory_gib=big, limit_gpu=big)
    user = get_user_model().objects.create_user("bench", password=PASSWORD)
    Membership.objects.create(project=project, user=user, role="member")
    return Token.objects.create(user=user).key


def _start_portal(port: int, workdir: Path) -> list[subprocess.Popen]:
    python = sys.executable
    env = {**os.environ, "LOG_LEVEL": "WARNING"}
    commands = [
        [
            python,
            "-m",
            "uvicorn",
            "hcsportal.asgi:application",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "4",
            "--no-access-log",
            "--timeout-keep-alive",
            "60",
        ],
        [
            python,
            "-m",
            "celery",
            "-A",
            "celery_app",
            "worker",
            "--concurrency",
            "4",
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "WARNING",
        ],
        [
            python,
            "-m",
            "celery",
            "-A",
            "celery_app",
            "beat",
            "--loglevel",
            "WARNING",
            "--schedule",
            str(workdir / "beat-schedule"),
        ],
    ]
    log = (workdir / "portal.log").open("ab")
    return [subprocess.Popen(c, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT) for c in commands]


def _sbatch(name: str, seconds: float, slurm: dict[str, str]) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"} | {"SLURM_CONF": slurm["SLURM_CONF"]}
    result = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            slurm["SLURM_PARTITION"],
            "-J",
            name,
            "-c",
            "1",
            "--mem",
            "1024",
            "--gres",
            "gpu:a100:1",
            "-o",
            "/dev/null",
            "--wrap",
            f"sleep {seconds}",
        ],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return result.stdout.strip().split(";")[0]


def _squeue(slurm: dict[str, str], *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"} | {"SLURM_CONF": slurm["SLURM_CONF"]}
    return subprocess.run(["squeue", "-h", *args], capture_output=True, text=True, env=env, check=False).stdout


class Portal:
    """The REST API as a script user sees it."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        # A kept-alive connection the server just closed: reads are retried (submits are not, never twice).
        self.session.mount("http://", HTTPAdapter(pool_maxsize=8, max_retries=Retry(total=3, allowed_methods=["GET"])))

    def submit(self, name: str, seconds: float) -> int:
        body = {
            "project": "bench",
            "queue": "high",
            "name": name,
            "kind": "training",
            "cpu": "1",
            "memory_gib": "1",
            "gpu_spec": "1(A100)",
            "command": f"sleep {seconds}",
        }
        response = self.session.post(f"{self.base}/api/v1/tasks/", json=body, timeout=30)
        response.raise_for_status()
        return response.json()["id"]

    def status(self, task_id: int) -> str:
        return self.session.get(f"{self.base}/api/v1/tasks/{task_id}/", timeout=30).json()["status"]

    def count(self, **filters) -> int:
        response = self.session.get(f"{self.base}/api/v1/tasks/", params=filters, timeout=30)
        response.raise_for_status()
        return response.json()["count"]

    def stop_all(self) -> None:
        ids, url = [], f"{self.base}/api/v1/tasks/?status__in=scheduled,starting,running"
        while url:  # every page (the list answers 50 a page)
            page = self.session.get(url, timeout=30).json()
            ids += [task["id"] for task in page["results"]]
            url = page["next"]
        for task_id in ids:
            self.session.post(f"{self.base}/api/v1/tasks/{task_id}/stop/", json={})


def _wait(predicate, timeout: float, step: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def sequential(portal: Portal, slurm: dict[str, str], n: int) -> tuple[list[float], list[float]]:
    """Submit -> running, alternating one portal task and one sbatch job."""
    ours, raw = [], []
    for i in range(n):
        t0 = time.monotonic()
        task_id = portal.submit(f"seq-{i}", 2)
        _wait(lambda tid=task_id: portal.status(tid) in ("running", "completed", "failed"), 60, 0.02)
        ours.append(time.monotonic() - t0)
        t0 = time.monotonic()
        job = _sbatch(f"seqraw-{i}", 2, slurm)
        _wait(lambda j=job: _squeue(slurm, "-j", j, "-o", "%T").strip() in ("RUNNING", "COMPLETING", ""), 60, 0.02)
        raw.append(time.monotonic() - t0)
    return ours, raw


def burst(portal: Portal, slurm: dict[str, str], n: int) -> tuple[float, float]:
    """First submit to last finished, n tasks of 1 s: through the API (4 clients) vs sbatch."""
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: portal.submit(f"burst-{i}", 1), range(n)))

    def ended() -> int:
        # Every task of the burst, counted to the last one (a filter the list has: an unknown one is a 400).
        return portal.count(name__icontains="burst-", status__in="completed,failed,stopped")

    if not _wait(lambda: ended() >= n, 900, 0.5):
        raise SystemExit(f"the burst did not end within 900 s: {ended()} of {n} tasks ended")
    ours = time.monotonic() - t0
    t0 = time.monotonic()
    for _ in range(n):
        _sbatch("burstraw", 1, slurm)
    _wait(lambda: not _squeue(slurm, "-n", "burstraw", "-o", "%i").strip(), 900, 0.5)
    return ours, time.monotonic() - t0


def rest_calls(portal: Portal, proxy: CountingProxy, running: int, seconds: float) -> collections.Counter:
    """slurmrestd calls during ``seconds`` with ``running`` long tasks running."""
    ids = [portal.submit(f"steady-{i}", 3600) for i in range(running)]
    _wait(lambda: all(portal.status(t) == "running" for t in ids), 120, 1)
    time.sleep(10)  # launch followers done
    proxy.take()
    time.sleep(seconds)
    counts = proxy.take()
    portal.stop_all()
    return counts


def main() -> None:
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # retried reads while the portal starts are expected
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--running", type=int, default=20)
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which REST calls are counted")
    parser.add_argument("--database", default=DB_NAME, help="the database recreated for the portal")
    parser.add_argument("--redis-db", type=int, default=5, help="the Redis database emptied for the portal")
    args = parser.parse_args()
    database_url = os.environ.get("DATABASE_URL", "")
    if not database_url.startswith(("postgres://", "postgresql://")):
        sys.exit("set DATABASE_URL=postgres://... and REDIS_URL=redis://...")
    redis_url = urlunparse(
        urlparse(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))._replace(path=f"/{args.redis_db}")
    )
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    slurm = _slurm_env()
    proxy = CountingProxy(slurm["SLURM_REST_URL"])
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    workdir = Path(tempfile.mkdtemp(prefix="hcs-bench-control-"))
    os.environ["HCS_VAR_DIR"] = str(workdir / "var")  # one credentials key for this process and the portal's
    _setup_django(database_url, redis_url, args.database)
    token = _build_portal_data(slurm, f"http://127.0.0.1:{proxy.server_address[1]}")
    port = 18765
    processes = _start_portal(port, workdir)
    try:
        portal = Portal(f"http://127.0.0.1:{port}", token)
        if not _wait(lambda: _answers(portal), 60, 0.5):
            sys.exit(f"the portal did not start; see {workdir / 'portal.log'}")
        portal.submit("warm-up", 1)
        time.sleep(5)

        ours, raw = sequential(portal, slurm, args.sequential)
        print(f"== submit -> running, {args.sequential} each, alternating ==")
        print_table(
            ["path", "median s", "p90 s", "min s", "max s"],
            [
                ["portal (REST API)", statistics.median(ours), _p90(ours), min(ours), max(ours)],
                ["raw sbatch", statistics.median(raw), _p90(raw), min(raw), max(raw)],
                ["ratio portal / sbatch", statistics.median(ours) / statistics.median(raw), "", "", ""],
            ],
        )
        time.sleep(5)
        portal_burst, raw_burst = burst(portal, slurm, args.burst)
        print(f"== burst of {args.burst} tasks of 1 s: first submit to last finished ==")
        print_table(
            ["path", "seconds"],
            [
                ["portal (REST API, 4 clients)", portal_burst],
                ["raw sbatch", raw_burst],
                ["ratio portal / sbatch", portal_burst / raw_burst],
            ],
        )
        counts = rest_calls(portal, proxy, args.running, args.window)
        idle = rest_calls(portal, proxy, 0, args.window)
        per_minute = 60 / args.window
        print(f"== slurmrestd calls per minute, {args.running} tasks running vs none ==")
        endpoints = sorted(set(counts) | set(idle))
        rows = [[e, idle[e] * per_minute, counts[e] * per_minute] for e in endpoints]
        total, total_idle = sum(counts.values()) * per_minute, sum(idle.values()) * per_minute
        rows.append(["all", total_idle, total])
        rows.append(["per running task", "", (total - total_idle) / max(args.running, 1)])
        print_table(["endpoint", "0 running", f"{args.running} running"], rows)
        print(f"portal log: {workdir / 'portal.log'}")
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(20)
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"} | {"SLURM_CONF": slurm["SLURM_CONF"]}
        subprocess.run(["scancel", "-p", slurm["SLURM_PARTITION"]], env=env, check=False)
        proxy.shutdown()


def _answers(portal: Portal) -> bool:
    try:
        return portal.session.get(f"{portal.base}/api/v1/tasks/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


if __name__ == "__main__":
    main()
