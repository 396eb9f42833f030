"""Start the dev Slurm cluster (scripts/dev_slurm.sh) and read its connection settings.

Plain functions so any test package (executors, the clusters app, end-to-end tests) can reuse them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEV_SLURM = REPO_ROOT / "scripts" / "dev_slurm.sh"


@dataclass(frozen=True)
class SlurmCluster:
    """Connection settings of a running dev cluster, as ``dev_slurm.sh env`` prints them."""

    url: str
    token: str
    user: str
    api_version: str
    partition: str
    output_dir: str
    conf: str

    def executor_kwargs(self) -> dict:
        """Constructor arguments for :class:`SlurmExecutor` against this cluster."""
        return {
            "endpoint": self.url,
            "token": self.token,
            "user": self.user,
            "api_version": self.api_version,
            "partition": self.partition,
            "output_dir": self.output_dir,
        }


class SlurmClusterError(RuntimeError):
    """The dev cluster could not be started."""


def parse_env(text: str) -> SlurmCluster:
    """Read the ``KEY=value`` lines of ``dev_slurm.sh start|env`` into a :class:`SlurmCluster`."""
    values = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.startswith("SLURM_"):
            values[key] = value.strip()
    try:
        return SlurmCluster(
            url=values["SLURM_REST_URL"],
            token=values["SLURM_JWT"],
            user=values["SLURM_USER"],
            api_version=values["SLURM_API_VERSION"],
            partition=values["SLURM_PARTITION"],
            output_dir=values["SLURM_OUTPUT_DIR"],
            conf=values["SLURM_CONF"],
        )
    except KeyError as missing:
        raise SlurmClusterError(f"dev_slurm.sh printed no {missing.args[0]} line:\n{text}")


def start_dev_cluster(timeout_s: float = 900) -> SlurmCluster:
    """Run ``dev_slurm.sh start`` (installs Slurm on first use; idempotent) and parse its output."""
    try:
        result = subprocess.run(
            [str(DEV_SLURM), "start"], capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SlurmClusterError(f"dev_slurm.sh start did not finish within {timeout_s:.0f}s")
    if result.returncode != 0:
        raise SlurmClusterError(f"dev_slurm.sh start exited with {result.returncode}:\n{result.stderr[-3000:]}")
    return parse_env(result.stdout)


def _passwordless_sudo() -> bool:
    if not shutil.which("sudo"):
        return False
    return subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False).returncode == 0


def cannot_run_dev_cluster() -> str:
    """Why this machine cannot run the dev cluster at all ("" when it can)."""
    if os.geteuid() != 0 and not _passwordless_sudo():
        return "the dev Slurm cluster needs root or passwordless sudo"
    if not (shutil.which("slurmctld") and shutil.which("slurmrestd")) and not shutil.which("apt-get"):
        return "Slurm is not installed and there is no apt-get to install it"
    return ""


def dev_cluster_for_tests() -> SlurmCluster:
    """The running dev cluster; fails the test run when it cannot start (always in CI).

    Outside CI, and only when Slurm cannot be installed or started here at all, the tests are skipped.
    """
    in_ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    reason = cannot_run_dev_cluster()
    if reason and not in_ci:
        pytest.skip(reason)
    try:
        return start_dev_cluster()
    except SlurmClusterError as exc:
        pytest.fail(f"the dev Slurm cluster did not start: {exc}", pytrace=False)


STATE_DIR = Path(os.environ.get("HCS_SLURM_DIR", "/var/lib/hcs-slurm"))


def _pid(name: str) -> int | None:
    try:
        return int((STATE_DIR / "run" / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def kill_daemon(name: str, signum: int = 9) -> None:
    """Kill one daemon of the dev cluster, and what it started, by its pid file name (``slurmrestd``,
    ``slurmd-hcs-node-1``). ``start_dev_cluster()`` starts whatever is missing again."""
    pid = _pid(name)
    if pid is None:
        raise SlurmClusterError(f"no pid file for {name} in {STATE_DIR}/run")
    victims = _descendants(pid)
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signum)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [v for v in victims if Path(f"/proc/{v}").exists() and "Z" not in _state(v)]
        if not alive:
            return
        time.sleep(0.05)
    raise SlurmClusterError(f"{name} (pids {victims}) did not end")


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


def scontrol(*args: str) -> str:
    """Run scontrol as root against the dev cluster (munge auth: no JWT in the environment)."""
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
    env["SLURM_CONF"] = str(STATE_DIR / "etc" / "slurm.conf")
    result = subprocess.run(["scontrol", *args], capture_output=True, text=True, env=env, check=False, timeout=30)
    if result.returncode != 0:
        raise SlurmClusterError(f"scontrol {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def forget_all_jobs(timeout: float = 60.0) -> None:
    """Make slurmctld lose every job, as a controller that lost its saved state does (``slurmctld -c``), while
    Slurm accounting keeps their records. New job ids go on from where they were (``FirstJobId`` for the clean
    start, then a graceful restart that saves it), so no id is handed out twice. ``start_dev_cluster()`` after."""
    config = scontrol("show", "config")
    next_id = int(next(line.split("=")[1] for line in config.splitlines() if line.startswith("NEXT_JOB_ID")))
    conf = STATE_DIR / "etc" / "slurm.conf"
    original = conf.read_text()
    kill_daemon("slurmctld", signal.SIGTERM)
    try:
        conf.write_text(original + f"\nFirstJobId={next_id}\n")
        env = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        subprocess.run(["slurmctld", "-c", "-f", str(conf)], env=env, check=True, timeout=30, capture_output=True)
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(SlurmClusterError):
                if "NEXT_JOB_ID" in scontrol("show", "config"):
                    break
            if time.monotonic() > deadline:
                raise SlurmClusterError("slurmctld did not answer after a clean start")
            time.sleep(0.2)
        kill_daemon("slurmctld", signal.SIGTERM)  # a graceful stop saves the (empty) state with the next job id
    finally:
        conf.write_text(original)
