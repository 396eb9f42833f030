"""CPU, memory and process limits of local jobs, through the host's cgroups (docs/local-jobs.md "Limits").

Each instance (rank, replica) of a local job runs in a cgroup of its own, ``hcs-jobs/<name>``: its CPU time is
held to the cores it asked for (a CFS quota per 100 ms period), its memory to the GiB it asked for (a hard limit,
no swap), and its processes and threads to a count. The host's cgroups are found at run time: cgroup v2 (one
unified hierarchy, the common case) when it offers the cpu, memory and pids controllers, else cgroup v1 (one
hierarchy per controller, as on older hosts and some VMs). Where neither can be used (a portal that is not root
cannot create cgroups), :meth:`Cgroups.detect` says why and the local cluster refuses jobs rather than run them
unlimited, unless limits were turned off on purpose (``HCS_LOCAL_JOB_LIMITS=off``).

A job that uses more memory than it asked for meets the kernel's out-of-memory killer inside its cgroup. The
job then ends as a whole: on cgroup v2 the kernel kills every process of the cgroup at once
(``memory.oom.group``); on v1, which kills one process, the job's wrapper kills the rest (the local executor's
``_WRAPPER``). Either way the cgroup's count of such kills (``oom_kill`` in ``memory.events`` or
``memory.oom_control``) tells the job's wrapper why the job ended.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .base import ExecutorError

# Where jobs' cgroups go, under the root of each hierarchy.
PARENT = "hcs-jobs"
CONTROLLERS = ("cpu", "memory", "pids")
CPU_PERIOD_US = 100_000
MIN_CPU_QUOTA_US = 1_000  # the kernel's smallest quota
MOUNTINFO = Path("/proc/self/mountinfo")

# Runs the rest of its arguments in the cgroups whose cgroup.procs files come before "--" (the sandbox then
# starts inside them, and everything it starts stays there); exits 125 when one cannot be entered.
_ENTER = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class Limits:
    """How the local executor limits each instance of a job: in a cgroup with the CPU and memory of its request and
    at most ``max_pids`` processes and threads, unless ``cgroups`` is False (then it runs without these limits)."""

    cgroups: bool = True
    max_pids: int = 4096

    def __post_init__(self):
        if self.max_pids < 16:
            raise ValueError(f"expected a process limit of at least 16 for local jobs, got {self.max_pids}")

    def instance(self, cpu: float, memory_gib: float) -> InstanceLimits:
        """The limits of one instance that asked for ``cpu`` cores and ``memory_gib`` GiB."""
        return InstanceLimits(cpu=cpu, memory_bytes=int(memory_gib * 2**30), pids=self.max_pids)


@dataclass(frozen=True)
class InstanceLimits:
    """What one instance of a job may use: cores (a fraction is a share of one), bytes of memory, processes."""

    cpu: float
    memory_bytes: int
    pids: int

    def cpu_quota_us(self) -> int:
        """The CFS quota per ``CPU_PERIOD_US`` that holds the instance to its cores."""
        return max(MIN_CPU_QUOTA_US, round(self.cpu * CPU_PERIOD_US))


@dataclass(frozen=True)
class JobCgroup:
    """One instance's cgroup: its directory in each hierarchy (one on cgroup v2), and the file that counts its
    out-of-memory kills (a line ``oom_kill N``)."""

    dirs: tuple[Path, ...]
    oom_events: Path

    @property
    def procs(self) -> tuple[Path, ...]:
        """The files a process writes its pid to, to enter the cgroup."""
        return tuple(d / "cgroup.procs" for d in self.dirs)

    def enter_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` started inside this cgroup (the process enters it before it execs, so all it starts stays)."""
        return ["/bin/sh", "-c", _ENTER, "hcs-cgroup", *map(str, self.procs), "--", *argv]


def _cgroup_mounts(mountinfo: str) -> tuple[list[Path], dict[str, Path]]:
    """The cgroup v2 mount points, and each v1 controller's mount point, from /proc/self/mountinfo."""
    unified: list[Path] = []
    v1: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if not sep or len(parts) < 5 or len(rest) < 3:
            continue
        mount_point = Path(parts[4].replace("\\040", " "))
        if rest[0] == "cgroup2":
            unified.append(mount_point)
        elif rest[0] == "cgroup":
            for option in rest[2].split(","):
                if option in CONTROLLERS:
                    v1.setdefault(option, mount_point)
    return unified, v1


@dataclass(frozen=True)
class Cgroups:
    """The host's cgroups as local jobs use them: ``version`` 2 (one hierarchy) or 1 (one per controller)."""

    version: int
    hierarchies: dict[str, Path]  # controller -> the root of its hierarchy (on v2 the same for all)

    @classmethod
    def detect(cls, mountinfo: str | None = None) -> Cgroups:
        """The cgroups of this host, with ``hcs-jobs`` created in them; ExecutorError (not retryable) saying why
        when jobs cannot be limited here."""
        if mountinfo is None:
            try:
                mountinfo = MOUNTINFO.read_text()
            except OSError as exc:
                raise ExecutorError(f"cannot read {MOUNTINFO} to find the cgroups: {exc}", retryable=False)
        unified, v1 = _cgroup_mounts(mountinfo)
        problems = []
        for mount in unified:
            try:
                available = set((mount / "cgroup.controllers").read_text().split())
            except OSError as exc:
                problems.append(f"cgroup v2 at {mount} cannot be read ({exc})")
                continue
            missing = [c for c in CONTROLLERS if c not in available]
            if not missing:
                return cls(2, dict.fromkeys(CONTROLLERS, mount))._prepared()
            problems.append(f"cgroup v2 at {mount} lacks the {', '.join(missing)} controller(s)")
        if all(c in v1 for c in CONTROLLERS):
            return cls(1, {c: v1[c] for c in CONTROLLERS})._prepared()
        missing = [c for c in CONTROLLERS if c not in v1]
        problems.append(f"cgroup v1 has no hierarchy for {', '.join(missing)}")
        raise ExecutorError(
            f"local jobs cannot be held to their CPU, memory and process limits: {'; '.join(problems)}. Expected "
            "cgroup v2 with the cpu, memory and pids controllers, or cgroup v1 hierarchies for them "
            "(or HCS_LOCAL_JOB_LIMITS=off to run local jobs without these limits)",
            retryable=False,
        )

    def _parents(self) -> list[Path]:
        return sorted({root / PARENT for root in self.hierarchies.values()})

    def _prepared(self) -> Cgroups:
        """Create ``hcs-jobs`` in each hierarchy and, on v2, hand the controllers down to it and to its children."""
        try:
            for parent in self._parents():
                if self.version == 2:
                    _enable_controllers(parent.parent)
                parent.mkdir(exist_ok=True)
                if self.version == 2:
                    _enable_controllers(parent)
                if not os.access(parent, os.W_OK):
                    raise PermissionError(f"{parent} is not writable")
        except OSError as exc:
            who = "" if os.geteuid() == 0 else " (the portal does not run as root)"
            raise ExecutorError(
                f"local jobs cannot be held to their CPU, memory and process limits: cannot set up cgroup "
                f"{self._parents()[0]}{who}: {exc}. Run the portal as root, or set HCS_LOCAL_JOB_LIMITS=off to run "
                "local jobs without these limits",
                retryable=False,
            )
        return self

    def describe(self) -> str:
        return f"cgroup v{self.version} limits (cpu, memory, pids)"

    def create(self, name: str, limits: InstanceLimits) -> JobCgroup:
        """The cgroup ``hcs-jobs/<name>`` with ``limits``; ExecutorError (nothing left behind) when it cannot be set."""
        dirs = tuple(sorted({root / PARENT / name for root in self.hierarchies.values()}))
        memory_dir = self.hierarchies["memory"] / PARENT / name
        quota = limits.cpu_quota_us()
        if self.version == 2:
            settings = [
                (memory_dir, "memory.max", str(limits.memory_bytes)),
                (memory_dir, "memory.swap.max", "0"),
                (memory_dir, "memory.oom.group", "1"),
                (memory_dir, "cpu.max", f"{quota} {CPU_PERIOD_US}"),
                (memory_dir, "pids.max", str(limits.pids)),
            ]
            oom_events = memory_dir / "memory.events"
        else:
            cpu_dir, pids_dir = (self.hierarchies[c] / PARENT / name for c in ("cpu", "pids"))
            settings = [
                (memory_dir, "memory.limit_in_bytes", str(limits.memory_bytes)),
                (memory_dir, "memory.memsw.limit_in_bytes", str(limits.memory_bytes)),  # no swap beyond it
                (cpu_dir, "cpu.cfs_period_us", str(CPU_PERIOD_US)),
                (cpu_dir, "cpu.cfs_quota_us", str(quota)),
                (pids_dir, "pids.max", str(limits.pids)),
            ]
            oom_events = memory_dir / "memory.oom_control"
        try:
            for directory in dirs:
                directory.mkdir(exist_ok=True)
            for directory, file_name, value in settings:
                path = directory / file_name
                if file_name in ("memory.swap.max", "memory.memsw.limit_in_bytes") and not path.exists():
                    continue  # the kernel accounts no swap here (none configured, or swap accounting off)
                path.write_text(value)
        except OSError as exc:
            self.remove(dirs)
            raise ExecutorError(f"cannot set up the job's cgroup {dirs[0]}: {exc}", retryable=False)
        return JobCgroup(dirs, oom_events)

    @staticmethod
    def remove(dirs: Iterable[Path], timeout_s: float = 2.0) -> bool:
        """Kill what is left in the cgroups ``dirs`` and remove them; False when one is still there after
        ``timeout_s`` (a process that has not been reaped yet)."""
        remaining = [Path(d) for d in dirs if Path(d).is_dir()]
        deadline = time.monotonic() + timeout_s
        while remaining:
            for directory in remaining:
                kill_all(directory)
                with contextlib.suppress(OSError):
                    directory.rmdir()
            remaining = [d for d in remaining if d.is_dir()]
            if not remaining or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        return not remaining

    def sweep(self, older_than_s: float = 60.0, prefix: str = "") -> int:
        """Remove the empty cgroups under ``hcs-jobs`` made more than ``older_than_s`` ago (whose names start with
        ``prefix``): those of jobs whose wrapper was killed before the job's end and that nobody asked about since.
        Returns how many went.

        A running job always has its processes in its cgroups, and a new one enters them within moments, so an
        old empty cgroup belongs to no job (a cgroup with processes cannot be removed anyway)."""
        removed = 0
        now = time.time()
        for parent in self._parents():
            for directory in parent.iterdir():
                if not directory.name.startswith(prefix):
                    continue
                with contextlib.suppress(OSError):
                    old = directory.is_dir() and now - directory.stat().st_mtime > older_than_s
                    if old and not (directory / "cgroup.procs").read_text().strip():
                        directory.rmdir()
                        removed += 1
        return removed


def kill_all(directory: Path) -> None:
    """SIGKILL every process in the cgroup ``directory``."""
    kill_file = directory / "cgroup.kill"  # cgroup v2, Linux 5.14 and later: the whole cgroup at once
    if kill_file.exists():
        with contextlib.suppress(OSError):
            kill_file.write_text("1")
            return
    try:
        pids = (directory / "cgroup.procs").read_text().split()
    except OSError:
        return
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def _enable_controllers(directory: Path) -> None:
    """Make the cpu, memory and pids controllers available to the children of a cgroup v2 ``directory``."""
    control = directory / "cgroup.subtree_control"
    enabled = set(control.read_text().split())
    wanted = [c for c in CONTROLLERS if c not in enabled]
    if wanted:
        control.write_text(" ".join(f"+{c}" for c in wanted))
