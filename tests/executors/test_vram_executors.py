"""Jobs on part of a card get the VRAM interceptor and their share's limit (local and Slurm; docs/vram.md)."""

from __future__ import annotations

import dataclasses
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pyseccomp
import pytest

from apps.clusters.executors.base import DeviceSlot, ExecutorError, JobPhase, NodePlacement
from apps.clusters.executors.local import LocalExecutor
from apps.clusters.executors.slurm import SlurmExecutor
from apps.clusters.executors.vram import (
    DEFAULT_LIBRARY,
    LIMIT_ENV,
    SANDBOX_LIBRARY,
    SANDBOX_SHARE_FILE,
    SHARE_ENV,
    vram_limit_bytes,
)
from apps.control.jobspec import _device_slot, _share

from .conftest import A100
from .test_vram import SOURCES

GIB = 2**30
EXECUTORS = Path(__file__).resolve().parents[2] / "apps" / "clusters" / "executors"
A100_80G = dataclasses.replace(A100, vram_gib=80.0, shareable=True)


def share_spec(make_spec, *, vram_gib=16.0, fraction=0.5, model=A100_80G, node="hcs-node-1", **overrides):
    """A job on part of card 0, as the scheduler places ``1(16G,50%)`` (or a bare fraction with vram_gib None)."""
    slot = DeviceSlot(index=0, fraction=fraction, vram_gib=vram_gib, cores_percent=50 if vram_gib else None)
    return make_spec(
        gpu_model=model, gpus_per_instance=fraction, placements=(NodePlacement(node, (slot,)),), **overrides
    )


@pytest.fixture(scope="module")
def library():
    """The interceptor as ``make vram`` builds it (what the executors load by default)."""
    subprocess.run(["make", "-s", "vram"], cwd=Path(__file__).resolve().parents[2], check=True)


def test_the_limit_is_the_shares_memory_or_its_part_of_the_card(make_spec):
    assert vram_limit_bytes(share_spec(make_spec)) == 16 * GIB
    assert vram_limit_bytes(share_spec(make_spec, vram_gib=None, fraction=0.25)) == 20 * GIB
    assert vram_limit_bytes(share_spec(make_spec, vram_gib=1.5, fraction=0.1)) == 1536 * 2**20
    whole = make_spec(gpu_model=A100_80G, gpus_per_instance=1, placements=(NodePlacement("n1", (DeviceSlot(0),)),))
    assert vram_limit_bytes(whole) is None
    assert vram_limit_bytes(make_spec()) is None
    # The interceptor speaks the CUDA driver API: other vendors' shares are not limited by it.
    hygon = dataclasses.replace(A100_80G, vendor="hygon")
    assert vram_limit_bytes(share_spec(make_spec, model=hygon)) is None


def test_a_fraction_of_a_model_without_a_memory_size_is_refused(make_spec):
    with pytest.raises(ExecutorError, match="no memory size") as exc:
        vram_limit_bytes(share_spec(make_spec, vram_gib=None, model=A100))
    assert not exc.value.retryable


def test_the_task_spec_gives_the_placed_slot_its_memory_and_cores():
    share = _share(SimpleNamespace(gpu_spec="1(16G,50%)"))
    assert _device_slot({"index": 3, "milli": 500}, share) == DeviceSlot(3, 0.5, vram_gib=16.0, cores_percent=50)
    assert _device_slot({"index": 3, "milli": 1000}, share) == DeviceSlot(3, 1.0)  # the whole card: no share
    assert _share(SimpleNamespace(gpu_spec="0.5(vgpu)")) is None
    assert _share(SimpleNamespace(gpu_spec="2(A100)")) is None
    assert _share(SimpleNamespace(gpu_spec="")) is None


def test_local_job_environment_preloads_the_interceptor_with_the_limit(tmp_path, make_spec):
    executor = LocalExecutor(tmp_path / "jobs")
    env = executor._environment(share_spec(make_spec, env={"LD_PRELOAD": "/opt/mine.so"}), tmp_path / "w")
    assert env["LD_PRELOAD"] == f"{SANDBOX_LIBRARY}:/opt/mine.so"
    assert env[LIMIT_ENV] == str(16 * GIB)
    assert env[SHARE_ENV] == SANDBOX_SHARE_FILE  # the sandbox's own /tmp: one share per instance
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    whole = make_spec(gpu_model=A100_80G, gpus_per_instance=1, placements=(NodePlacement("n1", (DeviceSlot(0),)),))
    assert LIMIT_ENV not in executor._environment(whole, tmp_path / "w")
    assert "LD_PRELOAD" not in executor._environment(whole, tmp_path / "w")


def test_local_share_without_the_built_library_is_refused_and_leaves_nothing(tmp_path, make_spec):
    executor = LocalExecutor(tmp_path / "jobs", vram_library=tmp_path / "missing.so")
    spec = share_spec(make_spec)
    with pytest.raises(ExecutorError, match="make vram") as exc:
        executor.submit(spec)
    assert not exc.value.retryable
    assert not (tmp_path / "jobs" / spec.name).exists()


# Builds the stub driver and the probe inside the job (the sandbox shows the host's /usr, so gcc), then
# allocates against the share: the job sees the interceptor only through the sandbox's read-only bind.
JOB = """set -e
test -r {library}
echo "interceptor readable"
cat > stub_cuda.c <<'HCS_EOF'
{stub}
HCS_EOF
cat > vram_probe.c <<'HCS_EOF'
{probe}
HCS_EOF
cat > next_a.c <<'HCS_EOF'
{next_a}
HCS_EOF
echo 'int hcs_which(void) {{ return 98; }}' > next_b.c
gcc -O2 -fPIC -shared -Wl,-soname,libcuda.so.1 -Wl,-Bsymbolic -o libcuda.so.1 stub_cuda.c -lpthread
ln -sf libcuda.so.1 libcuda.so
gcc -O2 -fPIC -shared -o libnexta.so next_a.c -ldl
gcc -O2 -fPIC -shared -o libnextb.so next_b.c
gcc -O2 -o vram_probe vram_probe.c -L. -Wl,-rpath,'$ORIGIN' -Wl,--no-as-needed -lnexta -lnextb -lcuda -ldl -lpthread
./vram_probe alloc:{ten} alloc:{ten} getproc:{ten} info
# Two processes of the job at once draw on one share: the first holds 10 GiB while the second asks for 10 more.
mkfifo gate
./vram_probe alloc:{ten} hold < gate > first.out &
exec 3> gate
until grep -qs hold first.out; do sleep 0.1; done
./vram_probe alloc:{ten} info
exec 3>&-
wait
"""


def job_command(library: str) -> str:
    """The job above, checking the interceptor at ``library``."""
    return JOB.format(
        library=library,
        stub=(SOURCES / "stub_cuda.c").read_text(),
        probe=(SOURCES / "vram_probe.c").read_text(),
        next_a=(SOURCES / "next_a.c").read_text(),
        ten=10 * GIB,
    )


def assert_held_to_16_gib(executor, job) -> None:
    """The job ran the probe on its 16 GiB share: the second 10 GiB, by either path and from another process of
    the job, was refused."""
    deadline = time.monotonic() + 120
    while executor.status(job).phase in (JobPhase.PENDING, JobPhase.RUNNING) and time.monotonic() < deadline:
        time.sleep(0.2)
    log = executor.logs(job, tail=1000)
    assert executor.status(job).phase == JobPhase.SUCCEEDED, log
    lines = [line for line in log.splitlines() if not line.startswith("hcsvram:")]
    assert "interceptor readable" in lines
    info = f"info 0 {6 * GIB} {16 * GIB}"
    assert lines[-6:] == ["alloc 0", "alloc 2", "getproc 2", info, "alloc 2", info], log
    assert "hcsvram: refused a GPU allocation of 10737418240 bytes" in log


def test_a_local_job_on_a_share_is_held_to_it_inside_the_sandbox(tmp_path, make_spec, library):
    executor = LocalExecutor(tmp_path / "jobs", grace_period_s=1)
    assert_held_to_16_gib(executor, executor.submit(share_spec(make_spec, command=job_command(SANDBOX_LIBRARY))))


@pytest.mark.slurm
def test_a_slurm_job_on_a_share_is_held_to_it(slurm_cluster, make_spec, library):
    executor = SlurmExecutor(**slurm_cluster.executor_kwargs())
    command = 'cd "$(mktemp -d)"\n' + job_command(str(executor.vram_library))
    job = executor.submit(share_spec(make_spec, command=command))
    try:
        assert_held_to_16_gib(executor, job)
    finally:
        executor.stop(job)


def slurm_executor(library: str = "") -> SlurmExecutor:
    return SlurmExecutor(endpoint="http://slurm.invalid", token="t", user="alice", vram_library=library)


def test_slurm_script_loads_the_interceptor_for_a_share(make_spec):
    script = slurm_executor("/opt/hcs/libhcsvram.so").job_description(share_spec(make_spec))["script"]
    assert f"export {LIMIT_ENV}={16 * GIB}" in script
    assert 'export LD_PRELOAD=/opt/hcs/libhcsvram.so"${LD_PRELOAD:+:$LD_PRELOAD}"' in script
    assert f"export {SHARE_ENV}" in script
    whole = make_spec(gpu_model=A100_80G, gpus_per_instance=1)
    assert "LD_PRELOAD" not in slurm_executor().job_description(whole)["script"]


def test_slurm_script_fails_at_once_on_a_node_without_the_interceptor(tmp_path, make_spec, library):
    def run(path: str, **spec_fields) -> subprocess.CompletedProcess:
        command = (
            f'echo "preload=$LD_PRELOAD limit=${LIMIT_ENV}"; ls -l "${SHARE_ENV}" | cut -c1-10; echo "${SHARE_ENV}"'
        )
        spec = share_spec(make_spec, command=command, **spec_fields)
        script = slurm_executor(path).job_description(spec)["script"]
        return subprocess.run(
            ["bash", "-c", script],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin:/bin", "LD_PRELOAD": "", "TMPDIR": str(tmp_path)},
        )

    missing = run(str(tmp_path / "absent.so"))
    assert missing.returncode == 1
    assert "not readable on" in missing.stderr and "make vram" in missing.stderr
    for fields in ({}, {"secret_files": {"/run/secrets/key": "s3cret"}}):  # the secret files' trap keeps removing it
        built = run(str(slurm_executor().vram_library), **fields)
        assert built.returncode == 0, built.stderr
        preload, mode, share = built.stdout.strip().splitlines()
        assert preload == f"preload={slurm_executor().vram_library} limit={16 * GIB}"
        # A share file of the job's own (0600, made in $TMPDIR), removed when the job ends.
        assert mode == "-rw-------" and share.startswith(f"{tmp_path}/hcs-vram-share.")
        assert not Path(share).exists()


# A portal running as a normal user (no job user to switch to: bubblewrap in a user namespace) starts one
# job on a share; the driver prints the job's phase and log as JSON.
UNPRIVILEGED_DRIVER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from executors.base import DeviceSlot, GPUModelSpec, JobPhase, JobSpec, NodePlacement
from executors.limits import Limits
from executors.local import LocalExecutor

# No cgroups to create as a normal user (test_local_isolation checks that such a portal refuses jobs by default).
executor = LocalExecutor(os.path.join(sys.argv[2], "jobs"), grace_period_s=1, vram_library=sys.argv[3],
                         limits=Limits(cgroups=False))
model = GPUModelSpec("A100-80G", "nvidia", "nvidia.com/gpu", "NVIDIA_VISIBLE_DEVICES", vram_gib=80.0)
slot = DeviceSlot(index=0, fraction=0.5, vram_gib=16.0, cores_percent=50)
job = executor.submit(JobSpec(task_id=1, attempt=1, name="job-1", project="p", owner="o", kind="training",
                              command=sys.stdin.read(), gpu_model=model, gpus_per_instance=0.5,
                              placements=(NodePlacement("n1", (slot,)),)))
deadline = time.monotonic() + 120
while executor.status(job).phase in (JobPhase.PENDING, JobPhase.RUNNING) and time.monotonic() < deadline:
    time.sleep(0.2)
print(json.dumps({"phase": executor.status(job).phase.value, "log": executor.logs(job, tail=1000)}))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a portal as another, unprivileged user")
def test_a_share_is_held_when_the_portal_runs_as_a_normal_user(library):
    account = pwd.getpwnam("nobody")
    root = Path(tempfile.mkdtemp(prefix="hcs-vram-unprivileged-"))
    try:
        package = root / "pkg" / "executors"
        package.mkdir(parents=True)
        for module in EXECUTORS.glob("*.py"):
            shutil.copy(module, package / module.name)
        shutil.copy(pyseccomp.__file__, package.parent)  # the sandbox's seccomp filter, for the system's python
        shutil.copy(DEFAULT_LIBRARY, root / "libhcsvram.so")
        home = root / "portal-home"
        home.mkdir(mode=0o700)
        os.chown(home, account.pw_uid, account.pw_gid)
        os.chmod(root, 0o755)
        result = subprocess.run(
            [
                "setpriv",
                f"--reuid={account.pw_uid}",
                f"--regid={account.pw_gid}",
                "--clear-groups",
                "/usr/bin/python3",
                "-c",
                UNPRIVILEGED_DRIVER,
                str(root / "pkg"),
                str(home),
                str(root / "libhcsvram.so"),
            ],
            input=job_command(SANDBOX_LIBRARY),
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["phase"] == "succeeded", report["log"]
    lines = [line for line in report["log"].splitlines() if not line.startswith("hcsvram:")]
    info = f"info 0 {6 * GIB} {16 * GIB}"
    assert lines[-6:] == ["alloc 0", "alloc 2", "getproc 2", info, "alloc 2", info], report["log"]
