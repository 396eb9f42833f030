"""Submit-to-running through the whole portal on the Slurm path, median of N.

Needs a portal started with `HCS_DEMO_SLURM=1 make run`. Each task is submitted through the REST API with
`required_labels={"backend": "slurm"}`, so it lands on the demo's dev Slurm cluster; the clock stops when
the API first reports it running (polled every 0.1 s). Usage: python scripts/slurm/portal_latency.py [N]
"""

import statistics
import sys
import time

import requests

BASE = "http://127.0.0.1:8000/api/v1"


def main(n: int = 20) -> None:
    token = requests.post(f"{BASE}/auth/token/", data={"username": "alice", "password": "hcs-alice-demo"}).json()[
        "token"
    ]
    session = requests.Session()
    session.headers["Authorization"] = f"Token {token}"
    times = []
    for i in range(n):
        body = {
            "project": "vision",
            "queue": "high",
            "name": f"latency-{i}",
            "kind": "training",
            "cpu": "1",
            "memory_gib": "1",
            "gpu_spec": "1(A100)",
            "command": "sleep 5",
            "required_labels": {"backend": "slurm"},
        }
        t0 = time.monotonic()
        response = session.post(f"{BASE}/tasks/", json=body)
        response.raise_for_status()
        task_id = response.json()["id"]
        while True:
            task = session.get(f"{BASE}/tasks/{task_id}/").json()
            if task["status"] in ("running", "completed", "failed"):
                break
            time.sleep(0.1)
        times.append(time.monotonic() - t0)
        print(f"task {task_id}: {task['status']} after {times[-1]:.2f} s on {task['cluster_name']}")
    print(
        f"submit -> running over {n}: median {statistics.median(times):.2f} s, "
        f"min {min(times):.2f} s, max {max(times):.2f} s"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
