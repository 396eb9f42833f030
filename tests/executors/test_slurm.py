"""SlurmExecutor: mapping unit tests, then jobs on the real dev cluster (scripts/dev_slurm.sh)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from apps.clusters.executors.base import ExecutorError, GPUModelSpec, JobPhase, NodePlacement
from apps.clusters.executors.slurm import (
    SlurmExecutor,
    accounting_state,
    decode_exit_code,
    job_state,
    slurm_phase,
    time_limit_minutes,
)

from .conftest import A100
from .slurm_cluster import parse_env

V100 = GPUModelSpec(
    name="V100-32G",
    vendor="nvidia",
    resource_name="nvidia.com/gpu",
    visible_devices_env="NVIDIA_VISIBLE_DEVICES",
    slurm_gres_type="v100",
)
ASCEND = GPUModelSpec(
    name="Ascend-910B",
    vendor="huawei",
    resource_name="huawei.com/Ascend910",
    visible_devices_env="ASCEND_VISIBLE_DEVICES",
    slurm_gres_type="a100",  # the dev cluster has no NPUs; reuse its a100 gres to see the variable
)
FINAL = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED, JobPhase.LOST, JobPhase.PREEMPTED}


def offline_executor(**kwargs) -> SlurmExecutor:
    values = {"endpoint": "http://127.0.0.1:9", "token": "t", "user": "hcs", "output_dir": "/shared/out"}
    values.update(kwargs)
    return SlurmExecutor(**values)


# -- mapping (no cluster needed) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slurm_state", "phase"),
    [
        ("PENDING", JobPhase.PENDING),
        ("CONFIGURING", JobPhase.PENDING),
        ("RUNNING", JobPhase.RUNNING),
        ("COMPLETING", JobPhase.RUNNING),
        ("COMPLETED", JobPhase.SUCCEEDED),
        ("FAILED", JobPhase.FAILED),
        ("OUT_OF_MEMORY", JobPhase.FAILED),
        ("BOOT_FAIL", JobPhase.FAILED),
        ("DEADLINE", JobPhase.FAILED),
        ("TIMEOUT", JobPhase.FAILED),
        ("NODE_FAIL", JobPhase.LOST),
        ("CANCELLED", JobPhase.CANCELLED),
        ("PREEMPTED", JobPhase.PREEMPTED),
        ("RUNNING+COMPLETING", JobPhase.RUNNING),
        ("SOMETHING_NEW", JobPhase.UNKNOWN),
    ],
)
def test_slurm_states_map_onto_job_phases(slurm_state, phase):
    assert slurm_phase(slurm_state) == phase


def test_timeout_and_out_of_memory_say_why_the_job_failed():
    timeout = job_state({"job_id": 5, "job_state": "TIMEOUT", "exit_code": 15, "end_time": 100})
    oom = job_state({"job_id": 6, "job_state": "OUT_OF_MEMORY", "exit_code": 9})

    assert (timeout.phase, timeout.message, timeout.exit_code) == (JobPhase.FAILED, "wall-time limit reached", 143)
    assert (oom.phase, oom.message) == (
        JobPhase.FAILED,
        "exceeded its memory limit (out of memory): Slurm's cgroup killed it",
    )
    with_memory = job_state({"job_id": 6, "job_state": "OUT_OF_MEMORY", "exit_code": 9, "memory_per_node": 256})
    assert with_memory.message.startswith("exceeded its memory limit of 0.25 GiB (out of memory)")
    accounted = accounting_state({"job_id": 6, "state": {"current": "OUT_OF_MEMORY"}, "required": {"memory": 1536}})
    assert accounted.failure == "out_of_memory"
    assert accounted.message.startswith("exceeded its memory limit of 1.5 GiB")
    assert (timeout.failure, oom.failure) == ("wall_time", "out_of_memory")
    assert job_state({"job_id": 7, "job_state": "FAILED", "exit_code": 2}).failure == "exit_code"
    assert job_state({"job_id": 8, "job_state": "COMPLETED", "exit_code": 0}).failure == ""


@pytest.mark.parametrize(
    ("state", "exit_code", "phase", "code"),
    [
        ("COMPLETED", {"status": "SUCCESS", "return_code": 0}, JobPhase.SUCCEEDED, 0),
        ("FAILED", {"status": "FAILED", "return_code": 3}, JobPhase.FAILED, 3),
        (
            "FAILED",
            {"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 9, "name": "KILL"}},
            JobPhase.FAILED,
            137,
        ),
        ("CANCELLED", {"status": "SIGNALED", "return_code": 0, "signal": {"signal_id": 15}}, JobPhase.CANCELLED, 143),
        ("TIMEOUT", {"status": "FAILED", "return_code": 0}, JobPhase.FAILED, 0),
        ("FAILED", {"status": "SUCCESS", "return_code": 0}, JobPhase.FAILED, None),  # slurmrestd 22.05's answer
        ("RUNNING", {"status": "PENDING", "return_code": 0}, JobPhase.RUNNING, None),
    ],
)
def test_accounting_records_map_like_the_controllers(state, exit_code, phase, code):
    # Slurm accounting's job record (slurmdbd, after slurmctld forgot the job) has other field names.
    record = {
        "job_id": 41,
        "name": "hcs-task-7-1",
        "state": {"current": state, "reason": "None"},
        "exit_code": exit_code,
        "time": {"start": 1795773073, "end": 1795773074},
        "nodes": "hcs-node-1",
    }
    got = accounting_state(record)
    assert (got.external_id, got.name, got.phase, got.exit_code) == ("41", "hcs-task-7-1", phase, code)
    if phase != JobPhase.RUNNING:
        assert got.finished_at is not None and got.started_at is not None
    if state == "TIMEOUT":
        assert got.failure == "wall_time", got


def test_pending_job_reports_slurms_reason_and_no_times():
    state = job_state({"job_id": 7, "job_state": "PENDING", "state_reason": "Resources", "start_time": 1795235909})
    assert (state.phase, state.message, state.started_at, state.exit_code) == (
        JobPhase.PENDING,
        "waiting: Resources",
        None,
        None,
    )


@pytest.mark.parametrize(("seconds", "minutes"), [(None, None), (1, 1), (60, 1), (61, 2), (3600, 60)])
def test_time_limit_is_rounded_up_to_whole_minutes(seconds, minutes):
    assert time_limit_minutes(seconds) == minutes


@pytest.mark.parametrize(("wait_status", "exit_code"), [(0, 0), (768, 3), (15, 143), (9, 137), (None, None)])
def test_raw_wait_status_becomes_a_shell_exit_code(wait_status, exit_code):
    assert decode_exit_code(wait_status) == exit_code


def test_job_description_maps_resources_gang_and_placement(make_spec):
    spec = make_spec(
        namespace="gpu",
        cpu=3.5,
        memory_gib=1.5,
        gpus_per_instance=2,
        gpu_model=A100,
        instances=2,
        placements=(NodePlacement("n1"), NodePlacement("n2")),
        time_limit_s=5400,
        env={"FOO": "bar"},
    )

    body = offline_executor(partition="default").job_description(spec)
    job = body["job"]

    assert job["partition"] == "gpu"
    assert job["gres"] == "gpu:a100:2"
    assert (job["nodes"], job["tasks"], job["tasks_per_node"]) == ([2, 2], 2, 1)
    assert (job["cpus_per_task"], job["memory_per_node"]) == (4, 1536)
    assert job["nodelist"] == "n1,n2"
    assert job["time_limit"] == 90
    assert job["name"] == spec.name
    assert json.loads(job["comment"]) == spec.labels
    assert job["standard_output"] == f"/shared/out/{spec.name}.out"
    assert job["environment"]["FOO"] == "bar"
    assert job["environment"]["HCS_TASK_ID"] == str(spec.task_id)
    assert body["script"].startswith("#!/bin/bash\n")
    assert "srun --kill-on-bad-exit=1" in body["script"]


def test_job_description_uses_the_default_partition_and_rounds_gpu_shares_up(make_spec):
    spec = make_spec(gpus_per_instance=0.5, gpu_model=None, command="python train.py")
    body = offline_executor(partition="batch").job_description(spec)

    assert body["job"]["partition"] == "batch"
    assert body["job"]["gres"] == "gpu:1"
    assert "time_limit" not in body["job"]
    assert body["script"].endswith("python train.py\n")


def test_dev_env_script_starts_the_ide_with_its_secret(make_spec):
    spec = make_spec(kind="dev_env", command="", settings={"ide": "vscode", "port": 9000, "ide_secret": "pw"})

    body = offline_executor().job_description(spec)

    assert "exec code-server --bind-addr 0.0.0.0:9000 --auth password" in body["script"]
    assert body["job"]["environment"]["PASSWORD"] == "pw"


def test_unknown_ide_is_refused_before_any_network_call(make_spec):
    with pytest.raises(ExecutorError, match="Unknown IDE") as err:
        offline_executor().submit(make_spec(kind="dev_env", command="", settings={"ide": "emacs"}))
    assert err.value.retryable is False


def test_unreachable_endpoint_is_a_retryable_error(make_spec):
    executor = offline_executor(timeout=2)
    with pytest.raises(ExecutorError, match="cannot reach slurmrestd") as err:
        executor.health()
    assert err.value.retryable is True
    with pytest.raises(ExecutorError):
        executor.submit(make_spec())


def test_dev_slurm_env_output_is_parsed():
    cluster = parse_env(
        "SLURM_REST_URL=http://127.0.0.1:6820\nSLURM_JWT=abc.def.ghi\nSLURM_USER=hcs\n"
        "SLURM_API_VERSION=v0.0.38\nSLURM_PARTITION=hcs\nSLURM_OUTPUT_DIR=/o\nSLURM_CONF=/c\n"
    )
    assert cluster.executor_kwargs() == {
        "endpoint": "http://127.0.0.1:6820",
        "token": "abc.def.ghi",
        "user": "hcs",
        "api_version": "v0.0.38",
        "partition": "hcs",
        "output_dir": "/o",
    }


# -- the real dev cluster -------------------------------------------------------------------------


def wait_for(executor, job_id, phases, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        state = executor.status(job_id)
        if state.phase in phases or time.monotonic() > deadline:
            return state
        time.sleep(0.2)


def wait_for_log(executor, job_id, text, timeout=30.0):
    deadline = time.monotonic() + timeout
    while text not in executor.logs(job_id) and time.monotonic() < deadline:
        time.sleep(0.2)
    return executor.logs(job_id)


@pytest.fixture
def slurm(slurm_cluster):
    executor = SlurmExecutor(**slurm_cluster.executor_kwargs())
    submitted = []
    original_submit = executor.submit

    def submit(spec):
        job_id = original_submit(spec)
        submitted.append(job_id)
        return job_id

    executor.submit = submit
    yield executor
    for job_id in submitted:
        executor.stop(job_id)


@pytest.mark.slurm
def test_health_pings_the_controller(slurm):
    assert "Slurm 22.05" in slurm.health()
    assert "UP" in slurm.health()


@pytest.mark.slurm
def test_bad_token_is_reported_by_health(slurm_cluster):
    executor = SlurmExecutor(**{**slurm_cluster.executor_kwargs(), "token": "not-a-jwt"})
    with pytest.raises(ExecutorError, match="rejected the token of user hcs"):
        executor.health()


@pytest.mark.slurm
def test_gpu_job_runs_to_success_with_readable_logs(slurm, make_spec):
    spec = make_spec(
        command='echo "task=$HCS_TASK_ID gpus=$CUDA_VISIBLE_DEVICES nv=$NVIDIA_VISIBLE_DEVICES user=$(id -un)"',
        gpu_model=A100,
        gpus_per_instance=2,
    )
    job_id = slurm.submit(spec)

    state = wait_for(slurm, job_id, FINAL)

    assert state.phase == JobPhase.SUCCEEDED, state
    assert state.exit_code == 0
    assert state.started_at is not None and state.finished_at is not None
    assert state.objects[0]["nodes"] in ("hcs-node-1", "hcs-node-2")  # only they have a100s
    logs = wait_for_log(slurm, job_id, "task=")
    assert f"task={spec.task_id} gpus=0,1 nv=0,1 user={slurm.user}" in logs
    assert Path(slurm.output_dir, f"{spec.name}.out").is_file()


@pytest.mark.slurm
def test_a_command_that_waits_for_its_own_background_work_ends_with_it(slurm, make_spec):
    """The fencing watchdog runs beside the command, disowned: a bare ``wait`` waits for the command's children
    only, not for the watchdog (which would keep the job running until its time limit)."""
    job_id = slurm.submit(make_spec(command="sleep 0.5 & wait; echo waited"))
    state = wait_for(slurm, job_id, FINAL, timeout=30)
    assert state.phase == JobPhase.SUCCEEDED, slurm.logs(job_id)
    assert "waited" in wait_for_log(slurm, job_id, "waited")


@pytest.mark.slurm
def test_vendor_visible_devices_variable_is_set_from_slurms_allocation(slurm, make_spec):
    job_id = slurm.submit(
        make_spec(command='echo "npu=$ASCEND_VISIBLE_DEVICES"', gpu_model=ASCEND, gpus_per_instance=1)
    )
    assert wait_for(slurm, job_id, FINAL).phase == JobPhase.SUCCEEDED
    assert "npu=0" in wait_for_log(slurm, job_id, "npu=")


@pytest.mark.slurm
def test_a_job_using_more_memory_than_it_asked_for_is_killed_by_slurms_cgroup_with_the_reason(slurm, make_spec):
    allocate = (
        "python3 -c 'import time\nkept = []\nfor step in range(16):\n    kept.append(bytearray(64 << 20)); "
        "print((step + 1) * 64, flush=True); time.sleep(0.05)'"
    )
    job_id = slurm.submit(make_spec(command=allocate, memory_gib=0.25))

    state = wait_for(slurm, job_id, FINAL)

    assert (state.phase, state.failure) == (JobPhase.FAILED, "out_of_memory"), state
    assert state.message.startswith("exceeded its memory limit of 0.25 GiB (out of memory)"), state
    allocated = [int(line) for line in wait_for_log(slurm, job_id, "Killed").splitlines() if line.isdigit()]
    assert allocated and max(allocated) < 256  # it never got its 1 GiB


@pytest.mark.slurm
def test_failing_job_reports_its_exit_code(slurm, make_spec):
    job_id = slurm.submit(make_spec(command="echo failing; exit 3"))

    state = wait_for(slurm, job_id, FINAL)

    assert (state.phase, state.exit_code, state.message) == (JobPhase.FAILED, 3, "exit code 3")


@pytest.mark.slurm
def test_accounting_keeps_how_a_job_ended_for_after_slurmctld_forgets_it(slurm, make_spec):
    submitted = time.time()
    ok, failing = make_spec(command="echo fine"), make_spec(command="exit 3", name="hcs-task-acct-2")
    ok_id, failing_id = slurm.submit(ok), slurm.submit(failing)
    for job_id in (ok_id, failing_id):
        wait_for(slurm, job_id, FINAL)
    deadline = time.monotonic() + 60
    while (done := slurm.final_state(failing_id, failing.name, submitted)) is None:  # slurmdbd writes a moment later
        assert time.monotonic() < deadline, "accounting never recorded the end of the job"
        time.sleep(0.5)
    # sacct says 3:0; slurmrestd 22.05's dbv0.0.38 answers "SUCCESS", 0 for it, which is read as unknown.
    assert done.phase == JobPhase.FAILED and done.exit_code in (3, None), done
    ok_state = slurm.final_state(ok_id, ok.name, submitted)
    assert ok_state is not None and (ok_state.phase, ok_state.exit_code) == (JobPhase.SUCCEEDED, 0)
    # Only that job: another name, a job submitted before the portal's submit, or an id accounting never saw.
    assert slurm.final_state(ok_id, "hcs-task-someone-else", submitted) is None
    assert slurm.final_state(ok_id, ok.name, time.time() + 3600) is None
    assert slurm.final_state("999999999", ok.name, submitted) is None


@pytest.mark.slurm
def test_secret_files_and_variables_reach_every_rank_and_their_files_go_with_the_job(slurm, make_spec):
    value = "slurm-secret-3f9b\nline two"
    digest = hashlib.sha256(value.encode()).hexdigest()
    spec = make_spec(
        command='echo "rank=$HCS_RANK api=$(printf %s "$API_KEY" | sha256sum | cut -c1-8) '
        'file=$(sha256sum < "$HCS_SECRETS_DIR/token" | cut -c1-64) mode=$(stat -c %a "$HCS_SECRETS_DIR/token") '
        'carriers=$(env | grep -c HCS_SECRET_FILE) dir=$HCS_SECRETS_DIR"',
        instances=2,
        secret_env={"API_KEY": "k"},
        secret_files={"/run/secrets/token": value},
    )
    job_id = slurm.submit(spec)
    assert wait_for(slurm, job_id, FINAL).phase == JobPhase.SUCCEEDED
    logs = wait_for_log(slurm, job_id, "rank=1")
    lines = sorted(line for line in logs.splitlines() if line.startswith("rank="))
    api = hashlib.sha256(b"k").hexdigest()[:8]
    assert [line.split(" dir=")[0] for line in lines] == [
        f"rank={rank} api={api} file={digest} mode=400 carriers=0" for rank in (0, 1)
    ]
    assert value.splitlines()[0] not in logs
    for line in lines:  # the nodes of the dev cluster share this host's file system
        assert not Path(line.split(" dir=")[1]).exists()


@pytest.mark.slurm
def test_gang_job_runs_one_rank_per_node(slurm, make_spec):
    spec = make_spec(
        command='echo "rank=$HCS_RANK/$HCS_WORLD_SIZE node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES"',
        instances=2,
        gpu_model=A100,
        gpus_per_instance=1,
    )
    job_id = slurm.submit(spec)

    state = wait_for(slurm, job_id, FINAL)

    assert state.phase == JobPhase.SUCCEEDED, state
    assert state.objects[0]["nodes"] == "hcs-node-[1-2]"
    logs = wait_for_log(slurm, job_id, "rank=1/2")
    assert sorted(line for line in logs.splitlines() if line.startswith("rank=")) == [
        "rank=0/2 node=hcs-node-1 gpus=0",
        "rank=1/2 node=hcs-node-2 gpus=0",
    ]


@pytest.mark.slurm
def test_placement_pins_the_job_to_the_scheduled_node(slurm, make_spec):
    spec = make_spec(
        command="echo on=$SLURMD_NODENAME",
        gpu_model=V100,
        gpus_per_instance=1,
        placements=(NodePlacement("hcs-node-4"),),
    )
    job_id = slurm.submit(spec)

    assert wait_for(slurm, job_id, FINAL).phase == JobPhase.SUCCEEDED
    assert "on=hcs-node-4" in wait_for_log(slurm, job_id, "on=")


@pytest.mark.slurm
def test_stopping_a_long_job_cancels_it(slurm, make_spec):
    job_id = slurm.submit(make_spec(command="echo started; sleep 600"))
    assert wait_for(slurm, job_id, {JobPhase.RUNNING} | FINAL).phase == JobPhase.RUNNING
    wait_for_log(slurm, job_id, "started")

    slurm.stop(job_id)
    state = wait_for(slurm, job_id, FINAL, timeout=30)

    assert state.phase == JobPhase.CANCELLED
    assert state.exit_code == 143  # SIGTERM first; SIGKILL only after KillWait
    slurm.stop(job_id)  # stopping an ended job is no error


@pytest.mark.slurm
def test_unknown_partition_is_a_non_retryable_error_with_slurms_message(slurm, make_spec):
    with pytest.raises(ExecutorError) as err:
        slurm.submit(make_spec(namespace="nosuch"))
    assert str(err.value) == "Slurm refused the job (partition nosuch): Invalid partition name specified"
    assert err.value.retryable is False


@pytest.mark.slurm
def test_unsatisfiable_gres_is_a_non_retryable_error(slurm, make_spec):
    with pytest.raises(ExecutorError) as err:
        slurm.submit(make_spec(gpu_model=A100, gpus_per_instance=16))
    assert err.value.retryable is False


@pytest.mark.slurm
def test_submit_is_idempotent_per_name(slurm, make_spec):
    spec = make_spec(command="sleep 30")

    first = slurm.submit(spec)
    second = slurm.submit(spec)

    assert first == second
    assert [s.external_id for s in slurm.list_by_owner({"hcs/task-id": str(spec.task_id)})] == [first]


@pytest.mark.slurm
def test_cancelled_job_does_not_block_a_new_submit_of_its_name(slurm, make_spec):
    spec = make_spec(command="sleep 30")
    first = slurm.submit(spec)
    slurm.stop(first)
    wait_for(slurm, first, FINAL, timeout=30)

    assert slurm.submit(spec) != first


@pytest.mark.slurm
def test_list_by_owner_finds_jobs_by_label(slurm, make_spec):
    project = f"vision-{time.time_ns()}"  # finished jobs of earlier runs stay listed for an hour
    mine = make_spec(command="sleep 30", labels={"hcs/project": project})
    other = make_spec(command="sleep 30", labels={"hcs/project": f"nlp-{time.time_ns()}"})
    mine_id = slurm.submit(mine)
    slurm.submit(other)

    by_task = slurm.list_by_owner({"hcs/task-id": str(mine.task_id)})
    by_project = slurm.list_by_owner({"hcs/project": project})

    assert [s.external_id for s in by_task] == [mine_id]
    assert [s.external_id for s in by_project] == [mine_id]
    assert by_task[0].phase in (JobPhase.PENDING, JobPhase.RUNNING)


@pytest.mark.slurm
def test_time_limit_reaches_slurm_in_minutes(slurm, make_spec):
    job_id = slurm.submit(make_spec(command="true", time_limit_s=90))

    assert slurm.status(job_id).objects[0]["time_limit_min"] == 2


@pytest.mark.slurm
def test_dev_env_without_the_ide_ends_at_once_and_says_why(slurm, make_spec):
    spec = make_spec(
        kind="dev_env",
        command="",
        settings={"ide": "jupyter", "port": 8899},
        env={"PATH": "/usr/bin:/bin"},  # no jupyter on this PATH, whatever the host has
    )
    job_id = slurm.submit(spec)

    state = wait_for(slurm, job_id, FINAL)

    assert state.phase == JobPhase.FAILED and state.exit_code == 127
    logs = slurm.logs(job_id)
    assert "jupyter is not installed" in logs
    assert "port 8899" in logs


@pytest.mark.slurm
def test_unknown_job_is_lost_and_delete_removes_the_output(slurm, make_spec):
    assert slurm.status("999999").phase == JobPhase.LOST
    spec = make_spec(command="echo bye")
    job_id = slurm.submit(spec)
    wait_for(slurm, job_id, FINAL)
    output = Path(slurm.output_dir, f"{spec.name}.out")
    assert output.exists()

    slurm.delete(job_id)

    assert not output.exists()
    assert slurm.logs(job_id) == ""


@pytest.mark.slurm
def test_job_waiting_for_gpus_is_pending_with_slurms_reason(slurm, make_spec):
    every_a100 = slurm.submit(make_spec(command="sleep 60", instances=2, gpu_model=A100, gpus_per_instance=8))
    assert wait_for(slurm, every_a100, {JobPhase.RUNNING} | FINAL).phase == JobPhase.RUNNING

    waiting = slurm.submit(make_spec(command="true", gpu_model=A100, gpus_per_instance=1))
    deadline = time.monotonic() + 30  # the reason is set once the scheduler has looked at the job
    while not (state := slurm.status(waiting)).message and time.monotonic() < deadline:
        time.sleep(0.2)

    assert state.phase == JobPhase.PENDING
    assert state.message in ("waiting: Resources", "waiting: Priority")
    assert state.started_at is None
    slurm.stop(every_a100)
    assert wait_for(slurm, waiting, FINAL).phase == JobPhase.SUCCEEDED
