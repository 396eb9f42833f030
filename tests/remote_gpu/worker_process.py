"""A real worker process on loopback for the tests and the benchmark: ``python -m hcs_remote.worker``."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KEY = "5a" * 32  # the test project's key, as the portal would give it in HCS_REMOTE_GPU_KEY
PROJECT = "alpha"


@dataclass
class WorkerProcess:
    """A started worker: its address, process and log file."""

    process: subprocess.Popen
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_worker(
    *options: str, module: str = "tests.remote_gpu.gpufuncs", key: str | None = KEY, project: str = PROJECT
) -> WorkerProcess:
    """Start a worker on a free loopback port and wait for the line saying where it listens."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HCS_")}
    env.update({"PYTHONPATH": str(ROOT), "HCS_PROJECT": project})
    if key is not None:
        env["HCS_REMOTE_GPU_KEY"] = key
    log_path = Path(tempfile.mkstemp(prefix="hcs-remote-worker-", suffix=".log")[1])
    argv = [
        sys.executable,
        "-m",
        "hcs_remote.worker",
        "--module",
        module,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *options,
    ]
    with log_path.open("w") as log:
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    first = []
    reader = threading.Thread(target=lambda: first.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(30)
    line = first[0] if first else ""
    if "listening on " not in line:
        process.kill()
        process.wait()
        raise RuntimeError(f"the worker did not start: {line!r} {log_path.read_text()}")
    address = line.split("listening on ", 1)[1].split(",", 1)[0]
    return WorkerProcess(process, address, log_path)
