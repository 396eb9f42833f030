"""Local executor: runs a task's command as a real process on the portal host, in a sandbox.

The sandbox (:mod:`.sandbox`) keeps the job away from the portal's files, processes, environment
and database. Each job lives in ``base_dir/<name>/``: ``output.log`` (stdout and stderr), ``job.json``
(pid, the pid's start time from ``/proc`` so a reused pid is not mistaken for the job, labels,
start time) and, once the command ends, ``exit_code`` written by a small wrapper shell. Because
all state is on disk, a new executor (after a portal restart) re-attaches running processes and
reports the exit code of those that ended while nobody was watching.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from .base import (
    TASK_UID_RE,
    Endpoint,
    Executor,
    ExecutorError,
    Failure,
    InstanceState,
    JobPhase,
    JobSpec,
    JobState,
    Terminal,
    checkpoint_mount,
    platform_environment,
    service_port,
    wants_checkpoints,
)
from .limits import Cgroups, JobCgroup, Limits
from .logfile import LogChunk, read_log_file
from .sandbox import NETWORK_HOST, NETWORK_NONE, TRUSTED_ENV, Sandbox, check_env_names, device_nodes
from .terminal import PtyTerminal
from .vram import (
    DEFAULT_LIBRARY,
    SANDBOX_LIBRARY,
    SANDBOX_SHARE_FILE,
    check_library,
    preload_environment,
    vram_limit_bytes,
)

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
# Under a job's directory: one directory per extra replica of an inference service the portal scales, named by
# its cards ("gpu-0-1") or, without cards, its rank ("r2"), and replicas.json (their order and the desired count).
_REPLICAS = "replicas"
# Under the base directory, beside the job directories (a dot-name is never a job's): one per task.
_CHECKPOINTS = ".checkpoints"

# The wrapper runs, outside the sandbox and as the portal, the sandboxed command line ($3...) and
# records its exit status in $1/exit_code. A stop sends TERM to the job's process group: the command
# gets it, and the wrapper's handler gives the command $2 seconds before it kills the whole group, so
# stop() never waits. Like a Slurm job, the job ends with its command: whatever the command left running
# in the group is killed (the wrapper last), and the sandbox's PID namespace ends every process the job
# started, even those that left the group.
# With limits, $1/cgroups lists the directories of the job's cgroups (one per rank and hierarchy) and
# $1/cgroups.oom the files that count their out-of-memory kills. Once the kernel killed a process of the job
# for memory, a watcher (every second) kills every process of the job's cgroups: the job ends as a whole (cgroup
# v1 kills only one process; v2 kills the whole cgroup by itself). $1/oom says so before exit_code is written.
# The wrapper removes the cgroups when the job ended; what it could not (a killed wrapper, a cgroup still busy
# freeing the job's /tmp) the executor removes (status, delete).
_WRAPPER = (
    'trap : TERM INT HUP; dir="$1"; grace="$2"; shift 2; '
    'oomed() { [ -s "$dir/cgroups.oom" ] && cat $(cat "$dir/cgroups.oom") 2>/dev/null | grep -q "^oom_kill [1-9]"; }; '
    'kill_job() { for cg in $(cat "$dir/cgroups" 2>/dev/null); do kill -KILL $(cat "$cg/cgroup.procs") 2>/dev/null; '
    "done; }; "
    '"$@" & child=$!; '
    '[ -s "$dir/cgroups.oom" ] && while sleep 1 && kill -0 "$child" 2>/dev/null; do '
    'if oomed; then : > "$dir/oom"; kill_job; break; fi; done & '
    "trap '(sleep \"$grace\"; kill -KILL 0) &' TERM INT HUP; "
    'while :; do wait "$child"; code=$?; kill -0 "$child" 2>/dev/null || break; done; '
    'if oomed; then : > "$dir/oom"; fi; kill_job; '
    'for cg in $(cat "$dir/cgroups" 2>/dev/null); do for try in 1 2 3 4 5; do rmdir "$cg" 2>/dev/null && break; '
    "sleep 0.1; done; done; "
    'printf "%s\\n" "$code" > "$dir/exit_code.tmp" && mv "$dir/exit_code.tmp" "$dir/exit_code"; '
    "trap '' TERM; kill -TERM 0 2>/dev/null; kill -9 0"
)
# timeout's exit status when the limit hit: 124 after SIGTERM, 137 when SIGKILL was needed.
_TIMEOUT_EXIT_CODES = (124, 137)

# A gang (instances > 1) runs one sandbox per rank under this launcher, the wrapper's command. $1 is the job
# directory, each further argument one rank's sandboxed command line (shell-quoted; it carries no secret: the
# environment goes through descriptors). Each rank runs under a small watcher shell whose pid goes to $1/ranks (rank
# order; the rank's sandbox hangs under it); the watcher writes the rank's exit status to $1/rank-<n>.exit. The
# first rank to fail (non-zero) records "<rank> <status>" in $1/first-failure/rank (mkdir is the atomic "first")
# and sends TERM to the job's process group: the other ranks are stopped as a stop() would (the wrapper's grace,
# then KILL), like Slurm's --kill-on-bad-exit, instead of holding their cards in a collective that never returns.
# The launcher waits for every rank and exits with the first failure's status, else 0.
_GANG_LAUNCHER = (
    'trap : TERM INT HUP; dir="$1"; shift; pids=""; rank=0; '
    'for cmd do ( trap : TERM INT HUP; eval "$cmd" & p=$!; '
    'while :; do wait "$p"; c=$?; kill -0 "$p" 2>/dev/null || break; done; '
    'printf "%s\\n" "$c" > "$dir/rank-$rank.exit"; '
    'if [ "$c" -ne 0 ] && mkdir "$dir/first-failure" 2>/dev/null; then '
    'printf "%s %s\\n" "$rank" "$c" > "$dir/first-failure/rank"; kill -TERM 0; fi ) & '
    'pids="$pids $!"; rank=$((rank + 1)); done; '
    'printf "%s\\n" $pids > "$dir/ranks.tmp" && mv "$dir/ranks.tmp" "$dir/ranks"; '
    'for p in $pids; do while :; do wait "$p"; kill -0 "$p" 2>/dev/null || break; done; done; '
    'if [ -f "$dir/first-failure/rank" ]; then read r c < "$dir/first-failure/rank"; exit "$c"; fi; exit 0'
)
# How long instances() watches the ranks' processes to tell their CPU use.
_CPU_SAMPLE_S = 0.25

# A submit that created the directory but has not yet written job.json is "starting" this long.
_STARTING_GRACE_S = 30.0


def _proc_start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None when no live process has that pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name (field 2) may contain spaces and parentheses; the rest follows the last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie has finished; it only waits to be reaped
        return None
    return int(fields[19])


def _children_of() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _proc_usage(pid: int) -> tuple[int, int] | None:
    """CPU time (clock ticks, user + system) and resident memory (bytes) of one live process; None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[11]) + int(fields[12]), int(fields[21]) * os.sysconf("SC_PAGE_SIZE")


def _tree_usage(root: int, children: dict[int, list[int]]) -> tuple[int, int]:
    """CPU ticks and resident memory of ``root`` and every descendant (a rank's sandbox and what runs in it)."""
    ticks = rss = 0
    todo = [root]
    while todo:
        pid = todo.pop()
        usage = _proc_usage(pid)
        if usage is not None:
            ticks, rss = ticks + usage[0], rss + usage[1]
        todo += children.get(pid, ())
    return ticks, rss


def _host_address() -> str:
    """This host's primary address (the source address of its default route; nothing is sent), else loopback."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks a route
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _job_stem(job_dir: Path) -> str:
    """A short name that is this job directory's alone: its forwarder sockets and its cgroups start with it."""
    return hashlib.sha256(str(job_dir).encode()).hexdigest()[:24]


def _listening(socket_path: Path) -> bool:
    """Whether a forwarder answers on ``socket_path``."""
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(socket_path))
        except OSError:
            return False
    return True


def _first_failure(job_dir: Path) -> tuple[int, int] | None:
    """(rank, exit status) of a gang's first rank to fail, as the launcher recorded it; None for other jobs."""
    try:
        rank, code = (job_dir / "first-failure" / "rank").read_text().split()
        return int(rank), int(code)
    except (OSError, ValueError):
        return None


def _sampled_usage(pids: list[int]) -> dict[int, tuple[float, float]]:
    """The CPU cores and resident GiB of each process tree, CPU watched for ``_CPU_SAMPLE_S`` (all at once)."""
    if not pids:
        return {}
    before = _children_of()
    first = [_tree_usage(pid, before) for pid in pids]
    started = time.monotonic()
    time.sleep(_CPU_SAMPLE_S)
    after = _children_of()
    second = [_tree_usage(pid, after) for pid in pids]
    elapsed = time.monotonic() - started
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        pid: (max(0.0, (t1 - t0) / ticks / elapsed), rss / 2**30)
        for pid, (t0, _), (t1, rss) in zip(pids, first, second, strict=True)
    }


def _sandboxed_process(pid: int) -> int | None:
    """A descendant of the job's wrapper that lives inside the job's sandbox (another PID namespace)."""
    own = os.readlink("/proc/self/ns/pid")
    children = _children_of()
    todo = list(children.get(pid, ()))
    while todo:
        candidate = todo.pop(0)
        try:
            if os.readlink(f"/proc/{candidate}/ns/pid") != own:
                return candidate
        except OSError:
            continue
        todo += children.get(candidate, ())
    return None


def _visible_id(spec: JobSpec, slot) -> str:
    """How the job's runtime names a placed card: its index, or a MIG instance's uuid (a time-sliced replica is
    its card's index: replicas share the card with no memory isolation unless the VRAM interceptor limits it)."""
    if spec.gpu_model.partition != "mig":
        return str(slot.index)
    if not slot.uuid:
        raise ExecutorError(
            f"MIG instance on card {slot.index} has no uuid: run the node agent on the node so it reports the "
            "instances (CUDA selects a MIG instance only by its MIG-... uuid)",
            retryable=False,
        )
    return slot.uuid


def tail_lines(path: Path, tail: int) -> str:
    """The last ``tail`` lines of a file, read from its end so large logs stay cheap."""
    if tail <= 0:
        return ""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            end = fh.tell()
            block = 8192
            data = b""
            pos = end
            while pos > 0 and data.count(b"\n") <= tail:
                step = min(block, pos)
                pos -= step
                fh.seek(pos)
                data = fh.read(step) + data
    except FileNotFoundError:
        return ""
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    return "".join(lines[-tail:])


# The same IDEs, ports and secret variables as Kubernetes dev environments:
# name -> (default port, program, launch command, variable that carries settings["ide_secret"]).
# Connect serves a task's port at the root of an origin of its own (docs/console.md), so JupyterLab's base URL is
# "/", said outright so that a site-wide Jupyter configuration cannot move it under a prefix Connect does not use.
_IDES = {
    "jupyter": (
        8888,
        "jupyter",
        "jupyter lab --no-browser --ip=0.0.0.0 --port={port} --ServerApp.base_url=/"
        ' ${{HCS_IDE_TOKEN:+--ServerApp.token="$HCS_IDE_TOKEN"}}',
        "HCS_IDE_TOKEN",
    ),
    "vscode": (8080, "code-server", "code-server --bind-addr 0.0.0.0:{port} --auth password", "PASSWORD"),
}
_IDE_ALIASES = {"jupyterlab": "jupyter", "code-server": "vscode"}
# How an admin puts each IDE's program on the hosts, for the message of a dev environment that finds it missing.
_IDE_INSTALL = {
    "jupyter": "python3 -m pip install jupyterlab",
    "code-server": "the code-server package of its release page, or its install.sh",
}
# The exit status of a dev environment whose IDE program is missing (the shell's own "command not found").
IDE_MISSING_EXIT = 127


def ide_port(ide: str) -> int | None:
    """The port an IDE listens on unless the task sets one (the same on every backend); None for no IDE."""
    name = _IDE_ALIASES.get((ide or "").lower(), (ide or "").lower())
    return _IDES[name][0] if name in _IDES else None


def _ide(spec: JobSpec) -> tuple[int, str, str, str]:
    name = str(spec.settings.get("ide", "jupyter")).lower()
    name = _IDE_ALIASES.get(name, name)
    if name not in _IDES:
        raise ExecutorError(f"Unknown IDE {name!r}: expected one of {', '.join(_IDES)}", retryable=False)
    return _IDES[name]


def ide_program(spec: JobSpec) -> str | None:
    """The IDE program a dev environment without a command starts; None for any other job."""
    if spec.kind != "dev_env" or spec.command.strip():
        return None
    return _ide(spec)[1]


def missing_ide_message(program: str) -> str:
    """Why a dev environment failed when its IDE program is not on the host, and how an admin installs it."""
    how = _IDE_INSTALL.get(program, f"install {program}")
    return (
        f"{program} is not installed on the cluster's host, so the dev environment could not start its IDE. "
        f"An admin installs it there for the jobs' user, on the PATH jobs get ({how}); "
        "or give the dev environment a command of its own."
    )


def job_command(spec: JobSpec) -> str:
    """What a job runs: the task's command, or for a dev environment without one, its IDE.

    When the IDE is not installed the log says so and the job ends at once with :data:`IDE_MISSING_EXIT`: the task
    fails with a message saying what is missing (``missing_ide_message``) instead of holding its resources.
    """
    program = ide_program(spec)
    if program is None:
        return spec.command
    default_port, program, launch, _ = _ide(spec)
    port = int(spec.settings.get("port", default_port))
    return (
        f'echo "hcs: {program} on $(hostname) port {port}"\n'
        f"if command -v {program} >/dev/null 2>&1; then\n"
        f"  exec {launch.format(port=port)}\n"
        "fi\n"
        f'echo "hcs: {program} is not installed on $(hostname); the dev environment cannot start its IDE" >&2\n'
        f"exit {IDE_MISSING_EXIT}\n"
    )


def job_secrets(spec: JobSpec) -> dict[str, str]:
    """Environment that carries a dev environment's IDE password or token, if one was set."""
    if spec.kind != "dev_env" or not spec.settings.get("ide_secret"):
        return {}
    return {_ide(spec)[3]: str(spec.settings["ide_secret"])}


class LocalExecutor(Executor):
    """Runs each job as ``/bin/sh -c command`` in a sandbox (:mod:`.sandbox`), in its own session on this host.

    ``base_dir/<name>/`` belongs to the portal (job.json, output.log, exit_code); the job sees only
    ``base_dir/<name>/work/``, its working directory and HOME, and for a training task
    ``base_dir/.checkpoints/<task uid>/``, its checkpoint directory, kept across the task's attempts.
    """

    runs_host_commands = True  # in a sandbox on this host; the task's image is not used
    share_vendors = None  # the card's index is made visible; NVIDIA shares are held to their memory (docs/vram.md)

    def __init__(
        self,
        base_dir: Path | str,
        grace_period_s: float = 10.0,
        sandbox: Sandbox | None = None,
        vram_library: Path | str = DEFAULT_LIBRARY,
        limits: Limits | None = None,
    ):
        """``vram_library``: the interceptor (``make vram``) that holds jobs on part of a card to their VRAM;
        ``limits``: how each instance is held to its request (:mod:`.limits`), cgroups unless told otherwise."""
        self.base_dir = Path(base_dir)
        self.grace_period_s = grace_period_s
        self.sandbox = sandbox or Sandbox()
        self.vram_library = Path(vram_library)
        self.limits = limits or Limits()
        self._cgroups: Cgroups | None = None
        # Processes this instance started, so they can be reaped instead of lingering as zombies.
        self._children: dict[str, subprocess.Popen] = {}

    # -- paths and state files ------------------------------------------------------------------

    def _job_dir(self, external_id: str) -> Path:
        if not _NAME_RE.match(external_id):
            raise ExecutorError(f"invalid local job name: {external_id!r}", retryable=False)
        return self.base_dir / external_id

    def work_dir(self, external_id: str) -> Path:
        """The job's working directory (HOME, ``$HCS_JOB_DIR``): the only part of the host it may write."""
        return self._job_dir(external_id) / "work"

    def checkpoint_dir(self, task_uid: str) -> Path:
        """The host directory of a task's checkpoints, kept across its attempts until the task is deleted."""
        if not TASK_UID_RE.match(task_uid):
            raise ExecutorError(f"invalid task uid: {task_uid!r}", retryable=False)
        return self.base_dir / _CHECKPOINTS / task_uid

    @staticmethod
    def _read_meta(job_dir: Path) -> dict | None:
        try:
            return json.loads((job_dir / "job.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None

    @staticmethod
    def _write_meta(job_dir: Path, meta: dict) -> None:
        tmp = job_dir / "job.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1))
        tmp.replace(job_dir / "job.json")

    def _is_alive(self, external_id: str, meta: dict) -> bool:
        child = self._children.get(external_id)
        if child is not None and child.poll() is not None:
            self._children.pop(external_id, None)
        return _proc_start_time(meta["pid"]) == meta["pid_start"]

    # -- limits ---------------------------------------------------------------------------------

    def cgroups(self) -> Cgroups | None:
        """The host's cgroups jobs are limited through; None when limits are off. ExecutorError (not retryable)
        when they are on and the host cannot give them: jobs are refused rather than run unlimited."""
        if not self.limits.cgroups:
            return None
        if self._cgroups is None:
            self._cgroups = Cgroups.detect()
        return self._cgroups

    def _create_cgroups(self, job_dir: Path, spec: JobSpec) -> list[JobCgroup | None]:
        """One cgroup per rank, with the request's cores and memory, listed in the job directory for the wrapper
        (``cgroups``, ``cgroups.oom``); [None] * ranks when limits are off."""
        hierarchies = self.cgroups()
        if hierarchies is None:
            return [None] * spec.instances
        stem = _job_stem(job_dir)
        limits = self.limits.instance(spec.cpu, spec.memory_gib)
        created: list[JobCgroup] = []
        try:
            for rank in range(spec.instances):
                created.append(hierarchies.create(f"{stem}-r{rank}", limits))
        except ExecutorError:
            hierarchies.remove(d for cgroup in created for d in cgroup.dirs)
            raise
        (job_dir / "cgroups").write_text("".join(f"{d}\n" for cgroup in created for d in cgroup.dirs))
        (job_dir / "cgroups.oom").write_text("".join(f"{cgroup.oom_events}\n" for cgroup in created))
        return [*created]

    @staticmethod
    def _release_cgroups(job_dir: Path) -> None:
        """Remove an ended job's cgroups (killing what is left in them); those still busy (a process of the job
        not yet reaped, its /tmp still being freed) are tried again at the next call."""
        listing = job_dir / "cgroups"
        try:
            dirs = [Path(line) for line in listing.read_text().split()]
        except OSError:
            return
        if Cgroups.remove(dirs, timeout_s=0.5):
            listing.unlink(missing_ok=True)

    # -- environment ----------------------------------------------------------------------------

    def _environment(self, spec: JobSpec, work_dir: Path, rank: int = 0) -> dict[str, str]:
        """The variables of rank ``rank``: a plain base, then the task's own, then the platform's, which win."""
        env = self.sandbox.job_environment(work_dir, {**spec.env, **spec.secret_env})
        env.update(job_secrets(spec))
        env.update(platform_environment(spec))
        env.update({"HCS_JOB_DIR": str(work_dir), "HCS_RANK": str(rank), "HCS_WORLD_SIZE": str(spec.instances)})
        if spec.instances > 1:
            env["HCS_MASTER_ADDR"] = "127.0.0.1"  # every rank runs on this host
        if spec.gpu_model is not None:
            visible = ",".join(_visible_id(spec, slot) for slot in self._devices(spec, rank))
            env[spec.gpu_model.visible_devices_env] = visible
            # NVIDIA_VISIBLE_DEVICES is read by the container runtime; a bare process needs CUDA's own.
            if spec.gpu_model.vendor == "nvidia":
                env["CUDA_VISIBLE_DEVICES"] = visible
        if (limit := vram_limit_bytes(spec)) is not None:
            env.update(preload_environment(SANDBOX_LIBRARY, limit, env, SANDBOX_SHARE_FILE))
        return env

    def _grace(self) -> str:
        return str(max(1, math.ceil(self.grace_period_s)))

    @staticmethod
    def _devices(spec: JobSpec, rank: int = 0):
        """The cards of rank ``rank``: its own placement's (one per instance), else the first placement's."""
        if not spec.placements:
            return ()
        return spec.placements[rank if rank < len(spec.placements) else 0].devices

    def _command_line(
        self,
        spec: JobSpec,
        work_dir: Path,
        env_fd: int,
        seccomp_fd: int,
        cgroup: JobCgroup | None,
        rank: int = 0,
        secret_fds: dict[str, int] | None = None,
    ) -> list[str]:
        """The sandboxed command, entering its cgroup first: the job's shell under ``timeout`` when it has a time
        limit."""
        command = ["/bin/sh", "-c", job_command(spec)]
        if spec.time_limit_s:
            command = ["timeout", "--foreground", "-k", self._grace(), str(spec.time_limit_s), *command]
        indexes = [slot.index for slot in self._devices(spec, rank)] if spec.gpu_model is not None else []
        devices = device_nodes(spec.gpu_model.vendor, indexes) if indexes else []
        binds = [(self.checkpoint_dir(spec.task_uid), spec.checkpoint_dir)] if spec.checkpoint_dir else []
        if (logdir := self._tensorboard_dir(spec, work_dir)) is not None:
            binds.append(logdir)
        ro_files = [(check_library(self.vram_library), SANDBOX_LIBRARY)] if vram_limit_bytes(spec) is not None else []
        secret_files = [(fd, path) for path, fd in (secret_fds or {}).items()]
        argv = self.sandbox.argv(work_dir, devices, env_fd, seccomp_fd, command, binds, ro_files, secret_files)
        return cgroup.enter_argv(argv) if cgroup is not None else argv

    def _tensorboard_dir(self, spec: JobSpec, work_dir: Path) -> tuple[Path, str] | None:
        """A TensorBoard log dir at an absolute path outside the checkpoint directory: the sandbox's root is
        read-only, so a directory of the job's own (next to its working directory, gone with the job) is bound
        there. Inside the checkpoint directory it is kept with the checkpoints; a relative one is in the working
        directory already."""
        path = spec.settings.get("tensorboard_dir")
        if not isinstance(path, str) or not path.startswith("/"):
            return None
        if spec.checkpoint_dir and (
            path == spec.checkpoint_dir or path.startswith(spec.checkpoint_dir.rstrip("/") + "/")
        ):
            return None
        host = work_dir.parent / "tensorboard"
        self.sandbox.prepare_kept(host)
        return host, path

    def _with_checkpoints(self, spec: JobSpec) -> JobSpec:
        """The spec with its checkpoint directory (created when missing) where the job sees it."""
        if not wants_checkpoints(spec):
            return spec
        self.sandbox.prepare_kept(self.checkpoint_dir(spec.task_uid))
        return dataclasses.replace(spec, checkpoint_dir=checkpoint_mount(spec))

    # -- Executor interface ---------------------------------------------------------------------

    def submit(self, spec: JobSpec, *, fresh: bool = False) -> str:
        """Start the command unless a job of this name exists; the job's name is its id."""
        if spec.instances < 1:
            raise ExecutorError(f"a job needs at least one instance; {spec.instances} requested", retryable=False)
        # Several instances are a gang (one sandbox per rank, one job), or the replicas of a service the portal
        # scales (each its own process and network, started and stopped one by one: docs/tasks.md "Autoscaling").
        replicas = spec.instances > 1 and self._serves_replicas(spec)
        if replicas and len(spec.placements) != spec.instances:
            raise ExecutorError(
                f"{spec.instances} replicas asked for with {len(spec.placements)} placements", retryable=False
            )
        if not job_command(spec).strip():
            raise ExecutorError("the task has no command to run", retryable=False)
        self.sandbox.check()
        check_env_names({**spec.env, **spec.secret_env})
        job_dir = self._job_dir(spec.name)
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            job_dir.mkdir(mode=0o700)
        except FileExistsError:
            return spec.name  # mkdir is atomic, so only one submit of a name ever starts a process
        except OSError as exc:
            raise ExecutorError(f"cannot create {job_dir}: {exc}")

        first = dataclasses.replace(spec, instances=1, placements=spec.placements[:1]) if replicas else spec
        try:
            self._start_process(job_dir, spec.name, first)
        except ExecutorError:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        if replicas:
            self._sync_replicas(job_dir, spec)
        return spec.name

    def _start_process(self, job_dir: Path, key: str, spec: JobSpec) -> None:
        """Start the sandboxed command in ``job_dir`` (the job's, or one of its replicas') and record it."""
        started_at = datetime.now(UTC)
        work_dir = job_dir / "work"
        secret_fds: list[dict[str, int]] = []  # per rank: bwrap reads each descriptor to its end
        try:
            spec = self._with_checkpoints(spec)
            self.sandbox.prepare(work_dir)
            cgroups = self._create_cgroups(job_dir, spec)
            # The task's secret files: memory-only descriptors the sandbox copies from (:meth:`Sandbox.argv`).
            for _rank in range(spec.instances):
                secret_fds.append({})
                for path, value in spec.secret_files.items():
                    secret_fds[-1][path] = self.sandbox.secret_file(value)
            with contextlib.ExitStack() as files:
                log = files.enter_context((job_dir / "output.log").open("ab"))
                # One sandbox per rank, each with its own environment (HCS_RANK) and cards, all in the job's group.
                envs = [
                    files.enter_context(self.sandbox.env_file(self._environment(spec, work_dir, rank)))
                    for rank in range(spec.instances)
                ]
                filters = [files.enter_context(self.sandbox.seccomp_file()) for _rank in range(spec.instances)]
                argvs = [
                    self._command_line(spec, work_dir, env.fileno(), seccomp.fileno(), cgroup, rank, secret_fds[rank])
                    for rank, (env, seccomp, cgroup) in enumerate(zip(envs, filters, cgroups, strict=True))
                ]
                argv = (
                    argvs[0]
                    if len(argvs) == 1
                    else ["/bin/sh", "-c", _GANG_LAUNCHER, "hcs-local-gang", str(job_dir), *map(shlex.join, argvs)]
                )
                child = subprocess.Popen(
                    ["/bin/sh", "-c", _WRAPPER, "hcs-local-job", str(job_dir), self._grace(), *argv],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=job_dir,
                    env=TRUSTED_ENV,
                    start_new_session=True,
                    pass_fds=(
                        *(file.fileno() for file in (*envs, *filters)),
                        *(fd for fds in secret_fds for fd in fds.values()),
                    ),
                )
        except (OSError, ExecutorError) as exc:
            self._release_cgroups(job_dir)
            if isinstance(exc, ExecutorError):
                raise
            raise ExecutorError(f"cannot start the job process: {exc}")
        finally:
            for fds in secret_fds:
                for fd in fds.values():
                    os.close(fd)
        self._children[key] = child
        pid_start = _proc_start_time(child.pid)
        self._write_meta(
            job_dir,
            {
                "name": spec.name,
                "task_id": spec.task_id,
                "pid": child.pid,
                # A command that ended before we looked gets a start time that never matches.
                "pid_start": pid_start if pid_start is not None else -1,
                "labels": dict(spec.labels),
                "started_at": started_at.isoformat(),
                "time_limit_s": spec.time_limit_s,
                "memory_gib": spec.memory_gib,
                "instances": spec.instances,
                "port": service_port(spec),
                "ide": ide_program(spec),  # the IDE program a dev environment starts, or None
                "secret_names": sorted(spec.secret_env),  # names only, for the monitoring page
            },
        )

    def status(self, external_id: str) -> JobState:
        job_dir = self._job_dir(external_id)
        if not job_dir.is_dir():
            return JobState(external_id, JobPhase.LOST, message="no such local job")
        meta = self._read_meta(job_dir)
        if meta is None:
            age = time.time() - job_dir.stat().st_mtime
            if age < _STARTING_GRACE_S:
                return JobState(external_id, JobPhase.PENDING, message="starting")
            return JobState(external_id, JobPhase.LOST, message="the job never recorded its process")

        started_at = datetime.fromisoformat(meta["started_at"])
        stop_file = job_dir / "stopped"
        exit_file = job_dir / "exit_code"
        if exit_file.exists():
            self._signal_replicas(external_id, job_dir, signal.SIGKILL)  # a service ends with its first replica
            # A stop that raced with the command's own end does not turn a result into a cancel.
            stopped = stop_file.exists() and stop_file.stat().st_mtime_ns <= exit_file.stat().st_mtime_ns
            exit_code = int(exit_file.read_text().strip())
            finished_at = datetime.fromtimestamp(exit_file.stat().st_mtime, UTC)
            self._release_cgroups(job_dir)
            failure = ""
            if stopped:
                phase, message = JobPhase.CANCELLED, "stopped"
            elif (job_dir / "oom").exists():  # the wrapper saw the kernel kill a process of the job for memory
                phase, failure = JobPhase.FAILED, Failure.OUT_OF_MEMORY
                limit = f" of {meta['memory_gib']:g} GiB" if meta.get("memory_gib") else ""
                message = f"exceeded its memory limit{limit} (out of memory): every process of the job was killed"
            elif exit_code == 0:
                phase, message = JobPhase.SUCCEEDED, ""
            elif self._hit_time_limit(meta, exit_code, started_at, finished_at):
                phase, message, failure = JobPhase.FAILED, "wall-time limit reached", Failure.WALL_TIME
            elif exit_code == IDE_MISSING_EXIT and meta.get("ide"):
                phase, failure = JobPhase.FAILED, Failure.LAUNCH
                message = missing_ide_message(meta["ide"])
            elif (first := _first_failure(job_dir)) is not None:
                rank, exit_code = first
                phase, failure = JobPhase.FAILED, Failure.EXIT_CODE
                message = f"rank {rank} failed with exit code {exit_code}; the other ranks were stopped"
            else:
                phase, message, failure = JobPhase.FAILED, f"exit code {exit_code}", Failure.EXIT_CODE
            return JobState(external_id, phase, message, started_at, finished_at, exit_code, failure=failure)
        if self._is_alive(external_id, meta):
            running, desired = self._replica_counts(external_id, job_dir)
            return JobState(
                external_id, JobPhase.RUNNING, started_at=started_at, replicas=running, desired_replicas=desired
            )
        if exit_file.exists():  # the command ended between the two checks above
            return self.status(external_id)
        self._signal_replicas(external_id, job_dir, signal.SIGKILL)  # a service ends with its first replica
        self._release_cgroups(job_dir)
        if stop_file.exists():
            finished_at = datetime.fromtimestamp(stop_file.stat().st_mtime, UTC)
            return JobState(external_id, JobPhase.CANCELLED, "stopped", started_at, finished_at)
        return JobState(
            external_id,
            JobPhase.LOST,
            message="the process vanished without an exit code",
            started_at=started_at,
        )

    @staticmethod
    def _hit_time_limit(meta: dict, exit_code: int, started_at: datetime, finished_at: datetime) -> bool:
        limit = meta.get("time_limit_s")
        if not limit or exit_code not in _TIMEOUT_EXIT_CODES:
            return False
        # A command may exit 124 by itself; only a run as long as the limit was cut off by it.
        return (finished_at - started_at).total_seconds() >= limit - 1

    def logs(self, external_id: str, tail: int = 200) -> str:
        return tail_lines(self._job_dir(external_id) / "output.log", tail)

    def read_logs(self, external_id: str, *, after: str | None = None, tail: int = 200) -> LogChunk:
        """From a byte offset in ``output.log``: a follower reads only what was written since."""
        return read_log_file(self._job_dir(external_id) / "output.log", after=after, tail=tail)

    def stop(self, external_id: str) -> None:
        """SIGTERM the job's process group and return; the wrapper SIGKILLs what is left after the grace period."""
        job_dir = self._job_dir(external_id)
        meta = self._read_meta(job_dir)
        if meta is None or not self._is_alive(external_id, meta):
            return
        if not (job_dir / "stopped").exists():
            (job_dir / "stopped").touch()
        self._signal_replicas(external_id, job_dir, signal.SIGTERM)
        self._signal_group(meta["pid"], signal.SIGTERM)  # the job runs in its own session: pid = group id

    def kill(self, external_id: str) -> None:
        """SIGKILL whatever is left of the job at once (delete, or a stop that must not wait)."""
        job_dir = self._job_dir(external_id)
        meta = self._read_meta(job_dir)
        if meta is None:
            return
        if self._is_alive(external_id, meta) and not (job_dir / "stopped").exists():
            (job_dir / "stopped").touch()
        self._signal_replicas(external_id, job_dir, signal.SIGKILL)
        self._signal_group(meta["pid"], signal.SIGKILL)
        while self._is_alive(external_id, meta):
            time.sleep(0.01)
        for directory in (job_dir, *(job_dir / _REPLICAS).glob("*/")):  # their wrappers were killed with them
            self._release_cgroups(directory)

    @staticmethod
    def _signal_group(pgid: int, signum: int) -> None:
        try:
            os.killpg(pgid, signum)
        except ProcessLookupError:
            pass
        except PermissionError as exc:
            raise ExecutorError(f"cannot signal process group {pgid}: {exc}", retryable=False)

    def delete(self, external_id: str) -> None:
        job_dir = self._job_dir(external_id)
        self.kill(external_id)
        self._children.pop(external_id, None)
        shutil.rmtree(job_dir, ignore_errors=True)
        # The forwarders ended with the job's namespaces; their sockets are left behind.
        with contextlib.suppress(ExecutorError, OSError):
            for socket_path in self._socket_dir().glob(f"{_job_stem(job_dir)}-*.sock"):
                socket_path.unlink(missing_ok=True)

    def remove_checkpoints(self, task_uid: str, project: str) -> None:
        directory = self.checkpoint_dir(task_uid)
        shutil.rmtree(directory, ignore_errors=True)
        if directory.exists():
            raise ExecutorError(f"cannot remove the checkpoint directory {directory}")

    def list_by_owner(self, labels: dict[str, str]) -> list[JobState]:
        if not self.base_dir.is_dir():
            return []
        states = []
        for job_dir in sorted(self.base_dir.iterdir()):
            if not job_dir.is_dir() or not _NAME_RE.match(job_dir.name):
                continue
            meta = self._read_meta(job_dir)
            if meta is None:
                continue
            job_labels = meta.get("labels", {})
            if all(job_labels.get(key) == value for key, value in labels.items()):
                state = self.status(job_dir.name)
                states.append(dataclasses.replace(state, name=job_dir.name, labels=dict(job_labels)))
        return states

    def _inside_sandbox(self, external_id: str, instance: int) -> int:
        """A process inside the running sandbox of rank ``instance``, whose namespaces a shell joins."""
        job_dir = self._job_dir(external_id)
        meta = self._read_meta(job_dir)
        if meta is None or not self._is_alive(external_id, meta):
            raise ExecutorError("the job is not running", retryable=False)
        inside = _sandboxed_process(self._rank_pid(job_dir, meta, instance))
        if inside is None:
            raise ExecutorError("the job's sandbox is not up yet; try again in a moment")
        return inside

    def open_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """A shell inside the sandbox of rank ``instance`` (its namespaces, user, files and environment), on a PTY."""
        return PtyTerminal(self.sandbox.enter_argv(self._inside_sandbox(external_id, instance)), rows, cols)

    visitor_terminals = True

    def open_visitor_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """A shell in the sandbox of rank ``instance`` as an unprivileged visitor (``Sandbox.visit_argv``): the job's
        processes and shared files, none of its secrets."""
        return PtyTerminal(self.sandbox.visit_argv(self._inside_sandbox(external_id, instance)), rows, cols)

    def port_endpoint(self, external_id: str, instance: int, port: int) -> Endpoint:
        """The job's port: on the host's loopback when jobs share its network, else through a unix socket that
        a forwarder inside the job's network namespace (started on first use, ending with the job) serves.
        Instance k > 0 of a service the portal scales is its k-th extra replica (in placement order)."""
        job_dir = self._job_dir(external_id)
        key, rank = external_id, instance
        order = self._replica_order(job_dir) if instance != 0 else []
        if order:  # a service the portal scales; a gang's instances are ranks of its one job
            if not 0 < instance <= len(order):
                raise ExecutorError(f"the job has no instance {instance}", retryable=False)
            job_dir, key = job_dir / _REPLICAS / order[instance - 1], f"{external_id}/{order[instance - 1]}"
            rank = 0
        meta = self._read_meta(job_dir)
        if meta is None or not self._is_alive(key, meta):
            raise ExecutorError("the job is not running", retryable=False)
        rank_pid = self._rank_pid(job_dir, meta, rank)
        if self.sandbox.network == NETWORK_HOST:
            return Endpoint("127.0.0.1", port)
        stem = _job_stem(job_dir) + (f"-r{instance}" if instance else "")
        socket_path = self._socket_dir() / f"{stem}-{int(port)}.sock"
        if not _listening(socket_path):
            socket_path.unlink(missing_ok=True)  # a forwarder that is gone left its socket behind
            self._start_forwarder(rank_pid, socket_path, port)
        return Endpoint("127.0.0.1", port, uds=str(socket_path))

    @staticmethod
    def _rank_pids(job_dir: Path, meta: dict) -> list[int] | None:
        """The pid each rank's sandbox hangs under, in rank order: the wrapper's for a one-instance job, the
        launcher's record for a gang; None while a gang's launcher has not recorded them yet."""
        if int(meta.get("instances") or 1) == 1:
            return [meta["pid"]]
        try:
            return [int(line) for line in (job_dir / "ranks").read_text().split()]
        except (FileNotFoundError, ValueError):
            return None

    def _rank_pid(self, job_dir: Path, meta: dict, instance: int) -> int:
        pids = self._rank_pids(job_dir, meta)
        if pids is None:
            raise ExecutorError("the job's ranks are not up yet; try again in a moment")
        if not 0 <= instance < len(pids):
            raise ExecutorError(f"the job has instances 0 to {len(pids) - 1}, not {instance}", retryable=False)
        return pids[instance]

    def instances(self, external_id: str) -> list[InstanceState]:
        """Each instance: a rank of the job (a gang has several), then the extra replicas of a service the portal
        scales (instance k is its k-th replica in placement order, as for ``port_endpoint`` and the terminal),
        with its state, this host, its address, and the CPU cores and resident memory its process tree uses,
        watched for a quarter of a second (a rank's sandbox and everything it started)."""
        job_dir = self._job_dir(external_id)
        meta = self._read_meta(job_dir)
        if meta is None:
            return []
        # (instance name, directory, meta, ranks) of the job itself and of each replica of a scaled service.
        units: list[tuple[str, Path, dict | None, int]] = [
            (external_id, job_dir, meta, int(meta.get("instances") or 1))
        ]
        for key in self._replica_order(job_dir):
            replica_dir = job_dir / _REPLICAS / key
            units.append((f"{external_id}/{key}", replica_dir, self._read_meta(replica_dir), 1))
        running = [unit_meta is not None and self._is_alive(name, unit_meta) for name, _, unit_meta, _ in units]
        pids = [
            (self._rank_pids(unit_dir, unit_meta) or []) if alive else []
            for (_, unit_dir, unit_meta, _), alive in zip(units, running, strict=True)
        ]
        usage = _sampled_usage([pid for unit_pids in pids for pid in unit_pids])
        phase = None if running[0] else self.status(external_id)
        node = os.uname().nodename or "localhost"
        address = _host_address() if self.sandbox.network == NETWORK_HOST else "127.0.0.1"
        port = meta.get("port")
        ports = ({"port": port, "target_port": port, "protocol": "TCP", "name": "connect"},) if port else ()
        out = []
        for number, ((name, unit_dir, unit_meta, count), alive, unit_pids) in enumerate(
            zip(units, running, pids, strict=True)
        ):
            for rank in range(count):
                pid = unit_pids[rank] if rank < len(unit_pids) else None
                exit_file = unit_dir / f"rank-{rank}.exit"
                if pid is not None and _proc_start_time(pid) is not None:
                    state, message = "running", ""
                elif count > 1 and exit_file.exists():
                    state, message = f"exited {exit_file.read_text().strip()}", ""
                elif number > 0:  # a replica: starting until its process is recorded, else it has ended
                    state, message = ("starting", "") if unit_meta is None else ("exited", "")
                elif alive:
                    state, message = ("exited", "") if unit_pids else ("starting", "")
                else:
                    state, message = phase.phase.value, phase.message
                cpu, memory = usage.get(pid, (None, None)) if state == "running" else (None, None)
                out.append(
                    InstanceState(
                        index=number + rank,
                        name=f"{name}/rank-{rank}" if count > 1 else name,
                        state=state,
                        node=node,
                        ip=address,
                        restarts=0,
                        cpu_used_cores=round(cpu, 3) if cpu is not None else None,
                        memory_used_gib=round(memory, 4) if memory is not None else None,
                        started_at=datetime.fromisoformat((unit_meta or meta)["started_at"]),
                        message=message,
                        usage_note="" if cpu is not None else "measured only while the instance runs",
                        ports=ports,
                        secrets=tuple(meta.get("secret_names") or ()),
                    )
                )
        return out

    @staticmethod
    def _socket_dir() -> Path:
        """A private directory with a short path for forwarder sockets (unix socket paths are limited to 107
        bytes, which a job directory may exceed); only the portal's user may enter it."""
        path = Path(tempfile.gettempdir()) / f"hcs-ports-{os.geteuid()}"
        with contextlib.suppress(FileExistsError):
            path.mkdir(mode=0o700)
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ExecutorError(f"{path} is not a private directory of the portal's user", retryable=False)
        return path

    def _start_forwarder(self, job_pid: int, socket_path: Path, port: int) -> None:
        inside = _sandboxed_process(job_pid)
        if inside is None:
            raise ExecutorError("the job's sandbox is not up yet; try again in a moment")
        if not shutil.which("socat", path=TRUSTED_ENV["PATH"]):
            raise ExecutorError("reaching a local job's port needs socat: apt-get install socat", retryable=False)
        subprocess.Popen(
            self.sandbox.forward_argv(inside, str(socket_path), port),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=TRUSTED_ENV,
            start_new_session=True,
        )
        deadline = time.monotonic() + 5
        while not socket_path.exists():  # another worker's forwarder may win the bind; either serves
            if time.monotonic() > deadline:
                raise ExecutorError(f"the forwarder to port {port} of the job did not start")
            time.sleep(0.02)

    # -- replicas of an inference service the portal scales (docs/tasks.md "Autoscaling") --------------------

    @property
    def scales_services(self) -> bool:
        """Extra replicas of a service need a network of their own each (they all listen on the service's port)."""
        return self.sandbox.network == NETWORK_NONE

    def _serves_replicas(self, spec: JobSpec) -> bool:
        return self.scales_services and spec.kind == "inference" and spec.settings.get("min_replicas") is not None

    def resize(self, external_id: str, replicas: int, keep_nodes: tuple[str, ...] = (), spec: JobSpec | None = None):
        """Run ``replicas`` instances of a service from now on: ``spec.placements`` are the live instances in
        order (the first is the job's own process). A replica keeps running while its cards stay in the placement;
        replicas whose cards left it get SIGTERM (and SIGKILL after the grace period); new placements start."""
        if spec is None or not self._serves_replicas(spec):
            raise ExecutorError("the local executor resizes only inference services it scales", retryable=False)
        if len(spec.placements) != replicas:
            raise ExecutorError(
                f"{replicas} replicas asked for with {len(spec.placements)} placements", retryable=False
            )
        job_dir = self._job_dir(external_id)
        meta = self._read_meta(job_dir)
        if meta is None or not self._is_alive(external_id, meta):
            raise ExecutorError("the job is not running")
        self._sync_replicas(job_dir, spec)

    @staticmethod
    def _replica_key(placement, rank: int) -> str:
        return "gpu-" + "-".join(str(d.index) for d in placement.devices) if placement.devices else f"r{rank}"

    @staticmethod
    def _replica_order(job_dir: Path) -> list[str]:
        try:
            return list(json.loads((job_dir / _REPLICAS / "replicas.json").read_text())["order"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
            return []

    def _sync_replicas(self, job_dir: Path, spec: JobSpec) -> None:
        """Start the replicas ``spec`` places that do not run, stop those it no longer places."""
        wanted = {self._replica_key(p, rank): p for rank, p in enumerate(spec.placements[1:], start=1)}
        root = job_dir / _REPLICAS
        root.mkdir(mode=0o700, exist_ok=True)
        state = {"order": list(wanted), "desired": len(spec.placements)}
        tmp = root / "replicas.json.tmp"
        tmp.write_text(json.dumps(state))
        tmp.replace(root / "replicas.json")
        for replica_dir in [d for d in root.iterdir() if d.is_dir()]:
            key = f"{job_dir.name}/{replica_dir.name}"
            meta = self._read_meta(replica_dir)
            alive = meta is not None and self._is_alive(key, meta)
            if replica_dir.name not in wanted:
                if alive:
                    (replica_dir / "stopped").touch()
                    self._signal_group(meta["pid"], signal.SIGTERM)
                else:
                    self._release_cgroups(replica_dir)
                    shutil.rmtree(replica_dir, ignore_errors=True)
            elif not alive and meta is not None:
                self._release_cgroups(replica_dir)
                shutil.rmtree(replica_dir, ignore_errors=True)  # it ended: started again below
        for name, placement in wanted.items():
            replica_dir = root / name
            try:
                replica_dir.mkdir(mode=0o700)
            except FileExistsError:
                continue
            one = dataclasses.replace(spec, instances=1, placements=(placement,))
            try:
                self._start_process(replica_dir, f"{job_dir.name}/{name}", one)
            except ExecutorError:
                shutil.rmtree(replica_dir, ignore_errors=True)
                raise

    def _replica_counts(self, external_id: str, job_dir: Path) -> tuple[int | None, int | None]:
        """(instances running, instances asked for) of a service with replicas; (None, None) for other jobs."""
        root = job_dir / _REPLICAS
        if not root.is_dir():
            return None, None
        try:
            desired = int(json.loads((root / "replicas.json").read_text())["desired"])
        except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError, ValueError):
            desired = None
        running = 1
        for replica_dir in (d for d in root.iterdir() if d.is_dir()):
            meta = self._read_meta(replica_dir)
            if meta is not None and self._is_alive(f"{external_id}/{replica_dir.name}", meta):
                running += 1
        return running, desired

    def _signal_replicas(self, external_id: str, job_dir: Path, signum: int) -> None:
        """Signal every live replica of the job; after SIGKILL, wait (briefly) until they are gone and reaped."""
        root = job_dir / _REPLICAS
        if not root.is_dir():
            return
        signalled = []
        for replica_dir in (d for d in root.iterdir() if d.is_dir()):
            key, meta = f"{external_id}/{replica_dir.name}", self._read_meta(replica_dir)
            if meta is not None and self._is_alive(key, meta):
                if not (replica_dir / "stopped").exists():
                    (replica_dir / "stopped").touch()
                self._signal_group(meta["pid"], signum)
                signalled.append((key, meta))
        if signum == signal.SIGKILL:
            deadline = time.monotonic() + 2.0
            while any(self._is_alive(key, meta) for key, meta in signalled) and time.monotonic() < deadline:
                time.sleep(0.01)

    def nodes(self) -> list[dict]:
        """This host: its cores and memory. Its cards come from the node agent (NVML), not from here."""
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        return [
            {
                "name": os.uname().nodename or "localhost",
                "address": "127.0.0.1",
                "cpus": os.cpu_count() or 1,
                "memory_gib": round(memory, 2),
                "gpus": None,
                "labels": {},
            }
        ]

    def health(self) -> str:
        probe = self.base_dir / ".health-probe"
        try:
            self.base_dir.mkdir(parents=True, exist_ok=True)
            probe.write_text("ok")
            probe.unlink()
        except OSError as exc:
            raise ExecutorError(f"local job directory {self.base_dir} is not writable: {exc}")
        self.sandbox.probe(self.base_dir)
        cgroups = self.cgroups()
        if cgroups is not None:
            cgroups.sweep()
        limits = cgroups.describe() if cgroups is not None else "NO CPU, memory or process limits (turned off)"
        jobs = sum(1 for entry in self.base_dir.iterdir() if entry.is_dir() and _NAME_RE.match(entry.name))
        return f"local executor ready: {self.base_dir} ({jobs} job directories), {self.sandbox.describe()}, {limits}"
