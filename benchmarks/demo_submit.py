"""Submit to running on the demo: the whole portal as ``make run`` starts it, driven over the REST API.

Starts ``manage.py runportal`` (web, Celery worker and beat, embedded Redis and SQLite, the demo VDC) in a
fresh state directory on a free loopback port, logs in as the demo user ``alice`` with the token login,
then submits a training job to the local cluster (high queue) and measures, per job:

* accept: the ``POST /api/v1/tasks/`` round trip,
* submit to running: from sending the POST until the API first shows ``running`` (polled every 50 ms),

one job after the other (each stops before the next is sent), next to the same command started directly
with ``bwrap`` as the local executor would (the floor: sandbox start-up only). The scheduling loop runs on
its beat (``HCS_SCHEDULER_INTERVAL_S``) and on every submission's trigger.

    python -m benchmarks.demo_submit [--jobs 5]

The machine is shared: compare the two columns, not seconds across runs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from benchmarks.table import print_table

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _wait_up(base: str, proc: subprocess.Popen, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"runportal exited with {proc.returncode} before serving")
        try:
            if requests.get(f"{base}/accounts/login/", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.5)
    sys.exit(f"runportal did not serve {base} within {timeout_s:.0f} s")


def _token(base: str, username: str, password: str) -> str:
    answer = requests.post(f"{base}/api/v1/auth/token/", data={"username": username, "password": password}, timeout=10)
    answer.raise_for_status()
    return answer.json()["token"]


def _submit_and_wait(session: requests.Session, base: str, n: int) -> tuple[float, float]:
    body = {
        "project": "vision",
        "queue": "high",
        "name": f"walk-{n}",
        "kind": "training",
        "gpu_spec": "",
        "cpu": "1",
        "memory_gib": "1",
        "command": "echo started; sleep 30",
    }
    began = time.perf_counter()
    answer = session.post(f"{base}/api/v1/tasks/", json=body, timeout=30)
    accepted = time.perf_counter() - began
    if answer.status_code != 201:
        sys.exit(f"submit refused: {answer.status_code} {answer.text[:500]}")
    task_id = answer.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = session.get(f"{base}/api/v1/tasks/{task_id}/", timeout=30).json()["status"]
        if status == "running":
            running = time.perf_counter() - began
            session.post(f"{base}/api/v1/tasks/{task_id}/stop/", json={"reason": "benchmark"}, timeout=30)
            return accepted, running
        if status in ("failed", "stopped", "completed"):
            sys.exit(f"task {task_id} ended as {status} before running")
        time.sleep(0.05)
    sys.exit(f"task {task_id} did not run within 120 s")


def _raw_start() -> float:
    """The same command started straight in bubblewrap: until its first output line."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return float("nan")
    began = time.perf_counter()
    proc = subprocess.Popen(
        [
            bwrap,
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--unshare-all",
            "--die-with-parent",
            "sh",
            "-c",
            "echo started; sleep 30",
        ],
        stdout=subprocess.PIPE,
    )
    proc.stdout.readline()
    elapsed = time.perf_counter() - began
    proc.kill()
    proc.wait()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=5)
    args = parser.parse_args()
    port = _free_port()
    base = f"http://{HOST}:{port}"
    var_dir = tempfile.mkdtemp(prefix="hcs-demo-")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CI")}
    env.update(HCS_VAR_DIR=var_dir, HCS_WEB_WORKERS="1")
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runportal", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_up(base, proc)
        session = requests.Session()
        session.headers["Authorization"] = f"Token {_token(base, 'alice', 'hcs-alice-demo')}"
        _submit_and_wait(session, base, 0)  # warm-up: first imports, first cycle
        rows = [_submit_and_wait(session, base, n) for n in range(1, args.jobs + 1)]
        raw = [_raw_start() for _ in range(args.jobs)]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(var_dir, ignore_errors=True)
    accepted = [a for a, _r in rows]
    running = [r for _a, r in rows]
    print(f"demo portal (runportal, embedded SQLite + Redis), {args.jobs} jobs one after the other\n")
    print_table(
        ["measure", "median s", "min s", "max s"],
        [
            ["POST /api/v1/tasks/ answered", statistics.median(accepted), min(accepted), max(accepted)],
            ["portal: submit -> running", statistics.median(running), min(running), max(running)],
            ["raw bwrap: start -> first line", statistics.median(raw), min(raw), max(raw)],
        ],
    )


if __name__ == "__main__":
    main()
