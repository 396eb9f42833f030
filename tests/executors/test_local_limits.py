"""Local jobs are held to their request: CPU, memory, processes, /tmp; and they cannot make user namespaces.

Real jobs in the real sandbox and the host's real cgroups (docs/local-jobs.md "Limits"). Each test prints the
figures it measured (``pytest -s``) and records them as test properties. Where cgroups cannot be used at all,
the local cluster refuses jobs: the last tests check that message, and the cgroup v2 settings on a stand-in
hierarchy (this suite also runs on hosts with cgroup v1, like its CI).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from apps.clusters.executors.base import ExecutorError, Failure, JobPhase
from apps.clusters.executors.limits import CPU_PERIOD_US, Cgroups, InstanceLimits, Limits
from apps.clusters.executors.local import LocalExecutor
from apps.clusters.executors.sandbox import Sandbox

from .test_local import FINAL, wait_for, wait_for_log

MIB = 2**20
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@pytest.fixture
def needs_root():
    """Cgroups are the host's: only root creates them (a portal that is not root refuses jobs, tested below)."""
    if os.geteuid() != 0 or not Sandbox().bwrap:
        if IN_CI:
            pytest.fail("the limits of local jobs are tested as root with bubblewrap; CI runs them so")
        pytest.skip("needs root and bubblewrap")


@pytest.fixture
def figure(record_property):
    """Print a measured figure (shown with -s) and keep it in the test report."""

    def record(name: str, value) -> None:
        print(f"\n[limits] {name}: {value}")
        record_property(name, value)

    return record


def executor_for(tmp_path, **limits) -> LocalExecutor:
    sandbox = Sandbox(tmp_gib=limits.pop("tmp_gib", 1.0))
    return LocalExecutor(tmp_path / "jobs", grace_period_s=1.0, sandbox=sandbox, limits=Limits(**limits))


def peak_memory_until_the_end(executor: LocalExecutor, job: str, timeout: float = 60.0) -> int:
    """The most memory the job's cgroup held, watched until the job ended (its cgroups go with it)."""
    job_dir = executor.base_dir / job
    name = "memory.peak" if v2(executor) else "memory.max_usage_in_bytes"
    deadline, peak = time.monotonic() + timeout, 0
    while not (job_dir / "exit_code").exists():
        assert time.monotonic() < deadline, executor.logs(job)
        with contextlib.suppress(OSError, AssertionError):  # not created yet, or being removed
            peak = max(peak, int(cgroup_file(job_dir, name).read_text()))
        time.sleep(0.01)
    return peak


def v2(executor: LocalExecutor) -> bool:
    return executor.cgroups().version == 2


def cgroup_file(job_dir: Path, name: str) -> Path:
    """A file of the job's (first rank's) cgroup, in whichever hierarchy has it."""
    for line in (job_dir / "cgroups").read_text().split():
        if (Path(line) / name).exists():
            return Path(line) / name
    raise AssertionError(f"no {name} in the job's cgroups")


ALLOCATE_2_GIB = """python3 -c '
import time
total = []
for step in range(32):
    total.append(bytearray(64 << 20))
    print((step + 1) * 64, flush=True)
    time.sleep(0.05)
'
"""


def test_a_job_using_more_memory_than_it_asked_for_is_killed_with_the_reason(needs_root, tmp_path, make_spec, figure):
    executor = executor_for(tmp_path)
    started = time.monotonic()
    job = executor.submit(make_spec(command=ALLOCATE_2_GIB, memory_gib=0.5))
    peak = peak_memory_until_the_end(executor, job)
    seconds = time.monotonic() - started

    state = executor.status(job)
    assert (state.phase, state.failure) == (JobPhase.FAILED, Failure.OUT_OF_MEMORY)
    assert state.message.startswith("exceeded its memory limit of 0.5 GiB (out of memory)")
    allocated = [int(line) for line in executor.logs(job).split() if line.isdigit()]
    assert allocated and max(allocated) < 512, executor.logs(job)  # it never got its 2 GiB
    assert 400 * MIB < peak <= 512 * MIB
    job_dir = executor.base_dir / job
    assert not any(Path(d).exists() for d in (job_dir / "cgroups.oom").read_text().split())  # cgroups removed
    figure("memory: asked GiB", 0.5)
    figure("memory: allocated MiB before the kill", max(allocated))
    figure("memory: cgroup peak MiB", round(peak / MIB, 1))
    figure("memory: seconds from submit to the job's end", round(seconds, 2))


def test_a_job_whose_child_runs_out_of_memory_ends_as_a_whole(needs_root, tmp_path, make_spec):
    executor = executor_for(tmp_path)
    command = "python3 -c 'x = bytearray(1 << 30)' & sleep 60; echo survived"
    job = executor.submit(make_spec(command=command, memory_gib=0.25))
    state = wait_for(executor, job, FINAL, timeout=20)
    assert (state.phase, state.failure) == (JobPhase.FAILED, Failure.OUT_OF_MEMORY), state
    assert "exceeded its memory limit of 0.25 GiB" in state.message
    assert "survived" not in executor.logs(job)
    assert (state.finished_at - state.started_at).total_seconds() < 30  # not after its sleep


FORK_BOMB = """python3 -c '
import os, time
forks = 0
try:
    while forks < 1000:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forks += 1
except OSError as error:
    print("forks", forks, error.strerror, flush=True)
'
"""


def test_a_fork_bomb_stops_at_the_process_limit(needs_root, tmp_path, make_spec, figure):
    executor = executor_for(tmp_path, max_pids=64)
    job = executor.submit(make_spec(command=FORK_BOMB))
    state = wait_for(executor, job, FINAL, timeout=60)
    log = executor.logs(job)
    found = re.search(r"^forks (\d+) (.+)$", log, re.MULTILINE)
    assert found, log
    forks = int(found.group(1))
    assert 32 < forks < 64 and found.group(2) == os.strerror(11), log  # EAGAIN: the cgroup's pids.max
    assert state.phase == JobPhase.SUCCEEDED  # the job went on; its forks ended with it
    figure("pids: limit", 64)
    figure("pids: forks that succeeded", forks)
    figure("pids: the failed fork said", found.group(2))


def test_writing_past_the_tmp_size_fails_with_no_space_left(needs_root, tmp_path, make_spec, figure):
    executor = executor_for(tmp_path, tmp_gib=64 / 1024)
    command = (
        "for dir in /tmp /var/tmp; do dd if=/dev/zero of=$dir/fill bs=1M count=200 2>&1 | grep -o 'No space.*'; "
        'echo "$dir $(stat -c %s $dir/fill)"; rm $dir/fill; done'
    )
    job = executor.submit(make_spec(command=command, memory_gib=1))
    assert wait_for(executor, job, FINAL, timeout=30).phase == JobPhase.SUCCEEDED
    lines = executor.logs(job).splitlines()
    assert lines[0] == lines[2] == "No space left on device", lines
    written = {line.split()[0]: int(line.split()[1]) for line in (lines[1], lines[3])}
    assert set(written) == {"/tmp", "/var/tmp"} and all(60 * MIB < n <= 64 * MIB for n in written.values()), lines
    figure("tmp: size MiB", 64)
    figure("tmp: MiB written before ENOSPC", round(written["/tmp"] / MIB, 1))


BUSY_TWO_PROCESSES = """python3 -c '
import resource, subprocess, sys, time
start = time.monotonic()
busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
time.sleep(3)
for process in busy:
    process.kill()
    process.wait()
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print("cores %.3f" % ((used.ru_utime + used.ru_stime) / (time.monotonic() - start)), flush=True)
'; sleep 30
"""


def test_a_job_asking_one_core_gets_about_one_core(needs_root, tmp_path, make_spec, figure):
    executor = executor_for(tmp_path)
    job = executor.submit(make_spec(command=BUSY_TWO_PROCESSES, cpu=1))
    log = wait_for_log(executor, job, "cores ", timeout=30)
    job_dir = executor.base_dir / job
    stat = dict(line.split() for line in cgroup_file(job_dir, "cpu.stat").read_text().splitlines())
    executor.stop(job)
    cores = float(re.search(r"cores ([\d.]+)", log).group(1))
    # Two busy processes, one core's quota: never much above one core (the machine is shared, so little below).
    assert 0.2 < cores < 1.3, log
    figure("cpu: asked cores", 1)
    figure("cpu: cores used by two busy processes", cores)
    figure("cpu: periods throttled / run", f"{stat['nr_throttled']} / {stat['nr_periods']}")
    figure("cpu: host cores", os.cpu_count())


def test_a_job_cannot_make_user_namespaces(needs_root, tmp_path, make_spec):
    # Without the sandbox's filter the job user could: this host allows unprivileged user namespaces.
    plain = subprocess.run(
        ["setpriv", "--reuid=hcs-job", "--regid=hcs-job", "--clear-groups", "unshare", "-U", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert plain.returncode == 0, plain.stderr
    executor = executor_for(tmp_path)
    command = (
        'unshare -U true 2>&1; echo "unshare $?"; unshare -Ur true 2>&1; echo "unshare-root $?"; '
        'bwrap --ro-bind / / true 2>/dev/null; echo "bwrap $?"; echo "control $(id -un)"'
    )
    job = executor.submit(make_spec(command=command))
    assert wait_for(executor, job, FINAL, timeout=20).phase == JobPhase.SUCCEEDED
    log = executor.logs(job)
    assert "unshare: unshare failed: Operation not permitted" in log
    assert "unshare 1" in log and "unshare-root 1" in log and "bwrap 1" in log
    assert "control hcs-job" in log  # it ran, as the job user


def test_the_web_console_of_a_job_cannot_make_user_namespaces_either(needs_root, tmp_path, make_spec):
    executor = executor_for(tmp_path)
    job = executor.submit(make_spec(command="sleep 60"))
    deadline = time.monotonic() + 10
    while True:
        try:
            terminal = executor.open_terminal(job)
            break
        except ExecutorError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    try:
        terminal.write(b'unshare -U true; echo "rc=$?"; exit\n')
        output = b""
        deadline = time.monotonic() + 15
        while not re.search(rb"rc=\d", output) and time.monotonic() < deadline:
            output += terminal.read(0.5) or b""
    finally:
        terminal.close()
        executor.stop(job)
    assert b"Operation not permitted" in output and b"rc=1" in output, output


def test_every_instance_of_a_gang_has_its_own_cgroup_with_the_request(needs_root, tmp_path, make_spec):
    executor = executor_for(tmp_path, max_pids=128)
    job = executor.submit(make_spec(command="echo up; sleep 30", instances=2, cpu=0.5, memory_gib=0.75))
    wait_for_log(executor, job, "up\nup\n")
    job_dir = executor.base_dir / job
    dirs = [Path(line) for line in (job_dir / "cgroups").read_text().split()]
    names = ("memory.max", "cpu.max") if v2(executor) else ("memory.limit_in_bytes", "cpu.cfs_quota_us")
    try:
        assert sorted({d.name[-3:] for d in dirs}) == ["-r0", "-r1"]
        for rank in ("-r0", "-r1"):
            mine = [d for d in dirs if d.name.endswith(rank)]
            values = {
                f.name: f.read_text().split()[0] for d in mine for f in d.iterdir() if f.name in (*names, "pids.max")
            }
            assert [values[name] for name in (*names, "pids.max")] == [
                str(int(0.75 * 2**30)),
                str(CPU_PERIOD_US // 2),
                "128",
            ]
            assert any((d / "cgroup.procs").read_text().split() for d in mine)  # the rank's sandbox runs in it
    finally:
        executor.stop(job)
    wait_for(executor, job, FINAL)
    assert not any(d.exists() for d in dirs)


def test_cgroups_without_the_controllers_are_refused_with_the_reason(tmp_path):
    mountinfo = "30 25 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw\n"
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory\n")
    with pytest.raises(ExecutorError) as refused:
        Cgroups.detect(mountinfo.replace("/sys/fs/cgroup", str(root)))
    assert refused.value.retryable is False
    assert "lacks the pids controller" in str(refused.value) and "HCS_LOCAL_JOB_LIMITS=off" in str(refused.value)
    v1_memory_only = "31 25 0:27 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    with pytest.raises(ExecutorError, match="cgroup v1 has no hierarchy for cpu, pids"):
        Cgroups.detect(v1_memory_only)


def test_cgroup_v2_gets_the_request_as_its_limits(tmp_path):
    """The settings written on a cgroup v2 host, on a stand-in hierarchy (the files the kernel would offer)."""
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory\n")
    (root / "hcs-jobs").mkdir()
    (root / "hcs-jobs" / "cgroup.subtree_control").write_text("")
    cgroups = Cgroups.detect(f"30 25 0:26 / {root} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n")
    assert cgroups.version == 2 and cgroups.hierarchies == dict.fromkeys(("cpu", "memory", "pids"), root)
    assert (root / "cgroup.subtree_control").read_text() == "+pids"  # added to what was enabled
    assert (root / "hcs-jobs" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"

    cgroup = cgroups.create("job-r0", InstanceLimits(cpu=1.5, memory_bytes=512 * MIB, pids=4096))
    job = root / "hcs-jobs" / "job-r0"
    assert cgroup.dirs == (job,) and cgroup.oom_events == job / "memory.events"
    written = {name: (job / name).read_text() for name in ("memory.max", "memory.oom.group", "cpu.max", "pids.max")}
    assert written == {
        "memory.max": str(512 * MIB),
        "memory.oom.group": "1",
        "cpu.max": "150000 100000",
        "pids.max": "4096",
    }
    assert cgroup.enter_argv(["bwrap", "x"]) == [
        "/bin/sh",
        "-c",
        cgroup.enter_argv([])[2],
        "hcs-cgroup",
        str(job / "cgroup.procs"),
        "--",
        "bwrap",
        "x",
    ]


def test_the_health_check_sweeps_away_cgroups_no_job_uses(needs_root):
    cgroups = Cgroups.detect()
    limits = InstanceLimits(cpu=1, memory_bytes=256 * MIB, pids=64)
    stale, busy = (
        cgroups.create(f"sweep-test-{os.getpid()}-a", limits),
        cgroups.create(f"sweep-test-{os.getpid()}-b", limits),
    )
    sleeper = subprocess.Popen(busy.enter_argv(["sleep", "30"]))
    try:
        deadline = time.monotonic() + 5
        while not all(p.read_text().strip() for p in busy.procs):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        # Only this test's cgroups: a sweep of everything empty at age 0 would take other tests' jobs' cgroups in
        # the moment between their creation and their job entering them.
        mine = f"sweep-test-{os.getpid()}-"
        cgroups.sweep(older_than_s=60, prefix=mine)
        assert all(d.exists() for d in stale.dirs)  # too young to go: a job may be about to enter it
        cgroups.sweep(older_than_s=0, prefix=mine)
        assert not any(d.exists() for d in stale.dirs)  # empty: a job's wrapper that was killed left it
        assert all(d.exists() for d in busy.dirs)  # in use
    finally:
        sleeper.kill()
        sleeper.wait()
        Cgroups.remove(busy.dirs)
