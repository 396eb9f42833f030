"""Measure submit-to-running latency of SlurmExecutor against the dev cluster.

Usage: .venv/bin/python scripts/slurm/submit_latency.py [count]   (starts the cluster if needed)
Each job is submitted, polled every 20 ms until Slurm reports it RUNNING, then cancelled; a random
pause between jobs keeps submits from falling into step with slurmctld's one-second scheduling tick.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from apps.clusters.executors.base import JobPhase, JobSpec  # noqa: E402
from apps.clusters.executors.slurm import SlurmExecutor  # noqa: E402
from tests.executors.slurm_cluster import start_dev_cluster  # noqa: E402


def main(count: int) -> None:
    cluster = start_dev_cluster()
    executor = SlurmExecutor(**cluster.executor_kwargs())
    run = int(time.time())
    submit_s, running_s = [], []
    rng = random.Random(0)
    for i in range(count):
        spec = JobSpec(
            task_id=i,
            attempt=1,
            name=f"hcs-latency-{run}-{i}",
            project="bench",
            owner="bench",
            kind="training",
            command="sleep 30",
            labels={"hcs/task-id": str(i), "hcs/project": "bench"},
        )
        began = time.perf_counter()
        job_id = executor.submit(spec)
        submitted = time.perf_counter()
        while executor.status(job_id).phase != JobPhase.RUNNING:
            time.sleep(0.02)
        submit_s.append(submitted - began)
        running_s.append(time.perf_counter() - began)
        executor.stop(job_id)
        time.sleep(rng.uniform(0.2, 1.2))
    print(f"{count} jobs: submit() median {statistics.median(submit_s) * 1000:.0f} ms")
    print(
        f"submit -> RUNNING: median {statistics.median(running_s) * 1000:.0f} ms, "
        f"min {min(running_s) * 1000:.0f} ms, max {max(running_s) * 1000:.0f} ms"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
