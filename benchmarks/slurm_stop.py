"""What stopping tasks costs slurmrestd: REST calls and bytes received for stopping N running jobs one by one with the
Slurm executor's ``stop``, after a burst of short jobs has filled the job listing (as on a busy cluster).

    python -m benchmarks.slurm_stop [--jobs 20] [--burst 200] [--code /path/to/another/checkout]

``--code`` imports the executor from another checkout (to compare with an earlier version). Needs the dev Slurm
cluster (``make slurm-up``); no database.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--code", default=str(ROOT))
    args = parser.parse_args()
    sys.path.insert(0, args.code)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
    import django

    django.setup()
    from apps.clusters.executors.base import JobPhase, JobSpec
    from apps.clusters.executors.slurm import SlurmExecutor
    from tests.executors.slurm_cluster import start_dev_cluster

    cluster = start_dev_cluster()
    executor = SlurmExecutor(**cluster.executor_kwargs())
    stamp = time.strftime("%H%M%S")

    def spec(name: str, command: str) -> JobSpec:
        return JobSpec(
            task_id=0,
            attempt=1,
            name=name,
            project="bench",
            owner="bench",
            kind="training",
            command=command,
            cpu=0.1,
            memory_gib=0.1,
            labels={"hcs.io/installation": "bench" + stamp},
        )

    for i in range(args.burst):
        executor.submit(spec(f"bench-burst-{stamp}-{i}", "true"), fresh=True)
    running = [executor.submit(spec(f"bench-stop-{stamp}-{i}", "sleep 600"), fresh=True) for i in range(args.jobs)]
    deadline = time.monotonic() + 120
    while any(executor.status(j).phase != JobPhase.RUNNING for j in running) and time.monotonic() < deadline:
        time.sleep(1)
    executor._jobs()  # a sync's listing, as the reconciler had one before the stops

    calls: collections.Counter = collections.Counter()
    received = collections.Counter()

    def count(response, *_, **__):
        endpoint = response.request.method + " " + response.request.path_url.split("?")[0].rsplit("/", 1)[0]
        calls[endpoint] += 1
        received[endpoint] += len(response.content)

    executor._session.hooks["response"].append(count)
    started = time.monotonic()
    for job in running:
        executor.stop(job)
    elapsed = time.monotonic() - started
    print(f"code: {args.code}")
    print(
        f"stopping {args.jobs} jobs after a burst of {args.burst}: {sum(calls.values())} calls, "
        f"{sum(received.values()) / 1e6:.2f} MB received, {elapsed:.2f} s"
    )
    for endpoint, n in sorted(calls.items()):
        print(f"  {endpoint}: {n} calls, {received[endpoint] / 1e3:.1f} kB")


if __name__ == "__main__":
    main()
