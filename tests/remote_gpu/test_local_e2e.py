"""End to end on the local cluster, with real processes: the GPU worker is an ordinary portal task (an inference
task on a card, with a port), a CPU task of the same project calls its functions, and a task of another project
is refused. The jobs run in the bubblewrap sandbox on the host's network; they see the system's Python, not
the checkout, so each command carries hcs_remote and its worker module as a zip (as an image would carry an
installed package)."""

import base64
import io
import socket
import time
import zipfile

import pytest

from apps.clusters.backends import executor_for
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task
from tests.control.drive import launch, reconcile_all, wait_status
from tests.remote_gpu.worker_process import ROOT

FUNCTIONS = '''
from hcs_remote import Tensor, expose

@expose
def saxpy(a: float, x: Tensor, y: Tensor) -> Tensor:
    """a * x + y, element by element."""
    return Tensor.from_values([a * u + v for u, v in zip(x.flat(), y.flat())], dtype=x.dtype, shape=x.shape)
'''

CLIENT = """
import os, sys
from hcs_remote import RemoteError, RemoteGPU, Tensor

project = sys.argv[1] if len(sys.argv) > 1 else None
try:
    with RemoteGPU(project=project) as gpu:  # the address from REMOTE_GPU_ADDRESS, the key from the portal
        x = Tensor.from_values([1, 2, 3, 4], "float32", (2, 2))
        y = Tensor.from_values([10, 20, 30, 40], "float32", (2, 2))
        print("functions:", sorted(gpu.functions))
        print("result:", gpu.saxpy(2.0, x, y).tolist())
except RemoteError as exc:
    print(f"refused: {exc.kind}: {exc}")
    sys.exit(3)
"""


def bundle_command(script: str) -> str:
    """A shell command that unpacks hcs_remote with the test's modules and runs ``script`` with its arguments."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as bundle:
        for path in sorted((ROOT / "hcs_remote").glob("*.py")):
            bundle.write(path, f"hcs_remote/{path.name}")
        bundle.writestr("rgpu_functions.py", FUNCTIONS)
        bundle.writestr("rgpu_client.py", CLIENT)
    packed = base64.b64encode(buffer.getvalue()).decode()
    return f"printf %s '{packed}' | base64 -d > rgpu.zip && PYTHONPATH=rgpu.zip exec /usr/bin/python3 {script}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_of(task: Task) -> str:
    task.refresh_from_db()
    return executor_for(task.cluster).logs(task.external_id, tail=200)


def wait_log(task: Task, text: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in log_of(task):
        assert time.monotonic() < deadline, f"{text!r} never appeared in the log: {log_of(task)!r}"
        reconcile_all()
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def host_network_jobs(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    settings.HCS_LOCAL_JOB_NETWORK = "host"  # tasks reach each other's ports on the host's loopback


def started(world, owner, project, **fields) -> Task:
    task = submit_task(owner, project=project, queue="high", **fields)
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled", (task.pending_reason, task.pending_message)
    launch(task)
    return task


def test_a_cpu_task_calls_the_gpu_worker_task_of_its_project_and_another_project_is_refused(world):
    port = free_port()
    worker = started(
        world,
        world.member,
        world.project,
        kind="inference",
        name="rgpu-worker",
        gpu_spec="1(A100)",
        port=port,
        command=bundle_command("-m hcs_remote.worker --module rgpu_functions"),
    )
    worker = wait_status(worker, "running")
    assert worker.cluster_id == world.cluster.pk and worker.placement  # placed on a card like any GPU task
    wait_log(worker, f"hcs_remote worker listening on 0.0.0.0:{port}, serving saxpy")

    address = {"REMOTE_GPU_ADDRESS": f"127.0.0.1:{port}"}
    caller = started(
        world,
        world.member,
        world.project,
        kind="training",
        name="cpu-caller",
        gpu_spec="",
        command=bundle_command("-m rgpu_client"),
        env=address,
    )
    caller = wait_status(caller, "completed", timeout=60)
    assert not caller.placement or not any(p.get("devices") for p in caller.placement)  # no card for the caller
    log = log_of(caller)
    assert "functions: ['saxpy']" in log and "result: [[12.0, 24.0], [36.0, 48.0]]" in log, log

    outsider = started(
        world,
        world.outsider,
        world.other_project,
        kind="training",
        name="foreign",
        gpu_spec="",
        command=bundle_command("-m rgpu_client"),
        env=address,
    )
    outsider = wait_status(outsider, "failed", timeout=60)
    assert "refused: auth: this worker serves project 'alpha', not 'beta'" in log_of(outsider)
    # Claiming the worker's project does not help: beta's key cannot answer alpha's challenge.
    liar = started(
        world,
        world.outsider,
        world.other_project,
        kind="training",
        name="liar",
        gpu_spec="",
        command=bundle_command("-m rgpu_client alpha"),
        env=address,
    )
    liar = wait_status(liar, "failed", timeout=60)
    assert f"refused: auth: the worker at 127.0.0.1:{port} could not prove" in log_of(liar)

    worker_log = log_of(worker)  # the worker's own log says whom it served and whom it refused
    assert "authenticated" in worker_log and "this worker serves project 'alpha', not 'beta'" in worker_log
    # Two sandboxes on one host's network: the caller moved to the worker's unix socket and shared memory.
    assert "authenticated (shared memory)" in worker_log
    stop_task(worker, world.member)
    wait_status(worker, "stopped", timeout=60)
