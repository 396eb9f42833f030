"""One scheduling cycle through Django at the reference scale, on PostgreSQL and on the embedded SQLite.

Builds the synthetic VDC of ``benchmarks.synthetic`` (2,000 nodes, 16,000 GPUs, mixed models) as rows in a
dedicated database ``hcs_bench`` on the server of ``DATABASE_URL``, queues 10,000 tasks of the same mixed
workload (classes, gangs, fractions, model constraints) and times ``apps.control.scheduling.run_cycle``:
snapshot load, engine, and the atomic apply. It runs the same cycle at two task counts to show that the
number of SQL statements does not grow with tasks.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test python -m benchmarks.django_cycle

``--compare 1200`` instead runs a cycle of that many queued tasks on both databases, each in its own process
(the embedded default's SQLite in a fresh state directory, and PostgreSQL), and prints them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from decimal import Decimal
from unittest import mock
from urllib.parse import urlparse, urlunparse

from benchmarks import synthetic
from benchmarks.table import print_table

CATALOG_NAMES = {"A100-80G": "A100-80G", "H100": "H100", "V100": "V100-32G", "T4": "T4", "Ascend910B": "Ascend910B"}


def _setup_django(backend: str = "postgresql") -> None:
    if backend == "sqlite":
        # The embedded default: SQLite (WAL) in a fresh state directory.
        os.environ.pop("DATABASE_URL", None)
        os.environ["HCS_VAR_DIR"] = tempfile.mkdtemp(prefix="hcs-bench-sqlite-")
    else:
        url = os.environ.get("DATABASE_URL", "")
        if not url.startswith(("postgres://", "postgresql://")):
            sys.exit("set DATABASE_URL=postgres://... (the benchmark creates and uses a database hcs_bench there)")
        import psycopg

        parsed = urlparse(url)
        with psycopg.connect(url, autocommit=True) as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'hcs_bench'").fetchone():
                conn.execute("CREATE DATABASE hcs_bench")
        os.environ["DATABASE_URL"] = urlunparse(parsed._replace(path="/hcs_bench"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def _spec(request) -> str:
    if request is None:
        return ""
    models = [CATALOG_NAMES[m] for m in request.models]
    count = f"{request.count:g}"
    if not models:
        return f"{count}(vgpu)" if request.count < 1 else count
    return f"{count}({'|'.join(models)})"


def build(task_count: int):
    """Replace the benchmark database's contents with the reference VDC and ``task_count`` queued tasks."""
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from apps.clusters.models import Cluster, Device, GPUModel, Node
    from apps.clusters.services import sync_catalog
    from apps.queues.models import TaskQueue
    from apps.tasks.models import Task
    from apps.vdc.models import VDC, Project, ProjectQuota

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            tables = ", ".join(
                m._meta.db_table for m in (Task, ProjectQuota, Project, TaskQueue, Device, Node, Cluster, VDC)
            )
            cursor.execute(f"TRUNCATE {tables}, tasks_taskevent, tasks_task_preferred_clusters CASCADE")
    sync_catalog()
    models = {m.name: m for m in GPUModel.objects.all()}
    vdc = VDC.objects.create(name="bench", node_scorer="best_fit", cluster_selection_strategy="load_balancing")
    clusters = Cluster.objects.bulk_create(
        [
            Cluster(vdc=vdc, name=f"c{i}", cluster_type="kubernetes", endpoint="https://k8s.invalid", status="healthy")
            for i in range(4)
        ]
    )
    synthetic_nodes = synthetic.nodes()
    nodes = Node.objects.bulk_create(
        [
            Node(cluster=clusters[i % 4], name=n.id, cpu=Decimal(int(n.cpu)), memory_gib=Decimal(int(n.memory_gib)))
            for i, n in enumerate(synthetic_nodes)
        ],
        batch_size=1000,
    )
    devices = []
    for node, sn in zip(nodes, synthetic_nodes, strict=True):
        for d in sn.devices:
            model = models[CATALOG_NAMES[d.model]]
            links = [{"peer": link.peer_index, "type": link.kind, "bandwidth_gbps": 600} for link in d.links]
            devices.append(Device(node=node, index=d.index, gpu_model=model, vram_gib=model.vram_gib, links=links))
    Device.objects.bulk_create(devices, batch_size=2000)
    queues = {
        q.name: q
        for q in TaskQueue.objects.bulk_create(
            [TaskQueue(vdc=vdc, name=n, priority_class=n, policy=p) for n, p in synthetic.QUEUES_POLICIES]
        )
    }
    owner, _ = get_user_model().objects.get_or_create(username="bench")
    projects = Project.objects.bulk_create([Project(name=f"p{i}") for i in range(16)])
    ProjectQuota.objects.bulk_create(
        [
            ProjectQuota(
                project=p, vdc=vdc, limit_cpu=100_000, limit_memory_gib=1_000_000, limit_gpu=100_000, guaranteed_gpu=500
            )
            for p in projects
        ]
    )
    rnd = random.Random(7)
    now = timezone.now()
    rows = []
    for i, t in enumerate(synthetic.tasks(task_count)):
        rows.append(
            Task(
                name=f"bench-{i}",
                project=projects[int(t.project_id[1:])],
                owner=owner,
                vdc=vdc,
                queue=queues[t.queue_id],
                kind=t.kind,
                cpu=Decimal(int(t.cpu)),
                memory_gib=Decimal(int(t.memory_gib)),
                gpu_spec=_spec(t.gpu),
                instances=t.instances,
                expected_duration=timedelta(seconds=t.expected_duration_s),
                status="queued",
                image="busybox:1.36",  # a task Kubernetes can run: a container image
                command="true",
            )
        )
    Task.objects.bulk_create(rows, batch_size=2000)
    # Submit times spread like the synthetic workload's (one second apart), oldest first.
    Task.objects.filter(vdc=vdc).update(submitted_at=now - timedelta(seconds=task_count))
    del rnd
    return vdc


def cycle(vdc) -> dict:
    """Time one run_cycle; Celery hand-offs queued on commit are counted, not sent (no broker needed)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from apps.control.scheduling import run_cycle

    handoffs = []
    with (
        mock.patch("apps.control.triggers.enqueue", side_effect=lambda *a, **k: handoffs.append(a)),
        mock.patch("apps.control.triggers.request_reconcile", side_effect=lambda *a: handoffs.append(a)),
        mock.patch("apps.queues.stats.record_cycle"),
        CaptureQueriesContext(connection) as queries,
    ):
        t0 = time.perf_counter()
        result = run_cycle(vdc.pk)
        wall = time.perf_counter() - t0
    return {"result": result, "wall": wall, "queries": len(queries.captured_queries), "handoffs": len(handoffs)}


def run(task_counts: tuple[int, ...] = (2_000, 10_000)) -> list[list]:
    """A cycle at each task count; prints the table and returns its rows."""
    _setup_django()
    rows = []
    for count in task_counts:
        vdc = build(count)
        c = cycle(vdc)
        r = c["result"]
        in_transaction = r.load_s + r.engine_s + r.apply_s
        timings = [r.load_s, r.engine_s, r.apply_s, in_transaction, c["wall"] - in_transaction]
        rows.append([count, r.started, r.waiting, *(t * 1000 for t in timings), c["queries"], c["handoffs"]])
    print("VDC: 2,000 nodes, 16,000 GPUs (A100 / H100 / V100 / T4 / Ascend 910B), 4 clusters; PostgreSQL")
    print_table(
        [
            "queued tasks",
            "started",
            "left waiting",
            "load ms",
            "engine ms",
            "apply ms",
            "cycle ms",
            "commit+notify ms",
            "SQL statements",
            "Celery hand-offs",
        ],
        rows,
    )
    print("Target: cycle (load + engine + apply) <= 3,000 ms at 10,000 tasks; SQL statements independent of the")
    print("task count (4 fewer at 2,000 tasks: no task is left waiting, so that bulk write is skipped).")
    print("commit+notify: the commit and the on-commit live-update and billing receivers (Celery sends stubbed).")
    return rows


def _one(backend: str, count: int) -> None:
    """Child process of ``--compare``: one cycle of ``count`` tasks on ``backend``, as a JSON line."""
    _setup_django(backend)
    c = cycle(build(count))
    r = c["result"]
    print(
        json.dumps(
            {
                "backend": backend,
                "started": r.started,
                "waiting": r.waiting,
                "load": r.load_s,
                "engine": r.engine_s,
                "apply": r.apply_s,
                "queries": c["queries"],
            }
        )
    )


def compare(count: int) -> list[list]:
    """The same cycle on SQLite and PostgreSQL, each in a fresh process; prints the table and returns its rows."""
    rows = []
    for backend in ("sqlite", "postgresql"):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.django_cycle", "--one", backend, "--tasks", str(count)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            sys.exit(f"{backend}: {out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        total = r["load"] + r["engine"] + r["apply"]
        rows.append(
            [
                backend,
                r["started"],
                r["waiting"],
                r["load"] * 1000,
                r["engine"] * 1000,
                r["apply"] * 1000,
                total * 1000,
                r["queries"],
            ]
        )
    print(f"One cycle of {count:,} queued tasks, VDC of 2,000 nodes / 16,000 GPUs; each database in its own process")
    print_table(
        ["database", "started", "left waiting", "load ms", "engine ms", "apply ms", "cycle ms", "SQL statements"],
        rows,
    )
    print(f"SQLite / PostgreSQL cycle: {rows[0][6] / rows[1][6]:.2f}x (target: within 3x)")
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=int, metavar="TASKS", help="SQLite and PostgreSQL side by side")
    parser.add_argument("--one", choices=("sqlite", "postgresql"), help=argparse.SUPPRESS)
    parser.add_argument("--tasks", type=int, default=1200, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        _one(args.one, args.tasks)
    elif args.compare:
        compare(args.compare)
    else:
        run()
