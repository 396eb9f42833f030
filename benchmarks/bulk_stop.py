"""Bulk stop end to end: the admin's "Cancel (stop) selected tasks" over 1,000 queued tasks, and the users' own
"stop selected" service, on PostgreSQL and on the embedded SQLite (each in its own process).

The admin action is posted through Django's test client as an admin does it ("select all" on a filtered list),
so the figure includes the request, the permission checks, the one transaction and the audit log entries.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/test python -m benchmarks.bulk_stop [--tasks 1000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from benchmarks.table import print_table


def _one(backend: str, count: int) -> dict:
    from benchmarks.django_cycle import _setup_django

    _setup_django(backend)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from apps.queues.models import TaskQueue
    from apps.tasks.models import Task
    from apps.tasks.services import stop_tasks
    from apps.vdc.models import VDC, Project

    suffix = str(time.time_ns())
    admin = get_user_model().objects.create_superuser(f"bench-admin-{suffix}", password="bench-pass-123456")
    vdc = VDC.objects.create(name=f"bulk-{suffix}")
    queue = TaskQueue.objects.create(vdc=vdc, name="low", priority_class="low")
    project = Project.objects.create(name=f"bulk-{suffix}")

    def queued(n: int) -> list[int]:
        rows = [
            Task(
                name=f"t{i}",
                project=project,
                owner=admin,
                vdc=vdc,
                queue=queue,
                kind="training",
                command="true",
                status="queued",
            )
            for i in range(n)
        ]
        return [t.pk for t in Task.objects.bulk_create(rows, batch_size=1000)]

    client = Client()
    client.force_login(admin)
    queued(count)
    with CaptureQueriesContext(connection) as queries:
        began = time.perf_counter()
        response = client.post(
            f"/admin/tasks/task/?status__exact=queued&vdc__id__exact={vdc.pk}",
            {"action": "cancel", "select_across": "1", "index": "0", "_selected_action": ["0"]},
        )
        admin_s = time.perf_counter() - began
    assert response.status_code == 302, response.status_code
    stopped = Task.objects.filter(vdc=vdc, status="stopped").count()
    ids = queued(count)
    began = time.perf_counter()
    done, _left = stop_tasks(ids, admin, "benchmark")
    service_s = time.perf_counter() - began
    return {
        "backend": backend,
        "admin_s": admin_s,
        "admin_queries": len(queries.captured_queries),
        "admin_stopped": stopped,
        "service_s": service_s,
        "service_stopped": len(done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--one", choices=("sqlite", "postgresql"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.tasks)))
        return
    rows = []
    for backend in ("postgresql", "sqlite"):
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.bulk_stop", "--one", backend, "--tasks", str(args.tasks)],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode != 0:
            sys.exit(f"{backend}: {out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        rows.append(
            [
                backend,
                r["admin_stopped"],
                r["admin_s"] * 1000,
                r["admin_queries"],
                r["service_stopped"],
                r["service_s"] * 1000,
            ]
        )
    print(f"Stopping {args.tasks:,} queued tasks at once")
    print_table(
        [
            "database",
            "admin action: stopped",
            "admin action ms",
            "SQL statements",
            "stop_tasks: stopped",
            "stop_tasks ms",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
