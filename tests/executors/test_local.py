"""LocalExecutor against real processes on this host."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from apps.clusters.executors.base import ExecutorError, Failure, JobPhase
from apps.clusters.executors.local import LocalExecutor, job_command

from .conftest import A100

FINAL = {JobPhase.SUCCEEDED, JobPhase.FAILED, JobPhase.CANCELLED, JobPhase.LOST}


def wait_for(executor, external_id, phases, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        state = executor.status(external_id)
        if state.phase in phases or time.monotonic() > deadline:
            return state
        time.sleep(0.05)


def wait_for_log(executor, external_id, text, timeout=10.0):
    deadline = time.monotonic() + timeout
    while text not in executor.logs(external_id) and time.monotonic() < deadline:
        time.sleep(0.05)
    return executor.logs(external_id)


def group_is_gone(pgid, timeout=5.0):
    """True once no process of the group is left (killed orphans are reaped by init shortly after)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def executor(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs", grace_period_s=1.0)
    yield ex
    for state in ex.list_by_owner({}):
        ex.stop(state.external_id)


def test_command_runs_to_success_and_its_output_is_readable(executor, make_spec):
    spec = make_spec(command="echo hello from $HCS_TASK_ID; echo second line")
    job_id = executor.submit(spec)

    state = wait_for(executor, job_id, FINAL)

    assert job_id == spec.name
    assert state.phase == JobPhase.SUCCEEDED
    assert state.exit_code == 0
    assert state.started_at is not None and state.finished_at >= state.started_at
    assert executor.logs(job_id) == f"hello from {spec.task_id}\nsecond line\n"
    assert executor.logs(job_id, tail=1) == "second line\n"
    assert (executor.base_dir / spec.name / "output.log").is_file()


def test_failing_command_reports_its_exit_code(executor, make_spec):
    job_id = executor.submit(make_spec(command="echo oops >&2; exit 3"))

    state = wait_for(executor, job_id, FINAL)

    assert state.phase == JobPhase.FAILED
    assert state.exit_code == 3
    assert state.message == "exit code 3"
    assert executor.logs(job_id) == "oops\n"


def test_logs_tail_reads_only_the_end_of_a_large_log(executor, make_spec):
    job_id = executor.submit(make_spec(command="seq 1 200000"))
    wait_for(executor, job_id, FINAL)

    assert executor.logs(job_id, tail=3) == "199998\n199999\n200000\n"
    assert executor.logs(job_id, tail=0) == ""


def test_placed_devices_are_exported_in_the_models_visible_devices_variable(executor, make_spec, gpu_placement):
    spec = make_spec(
        command='echo "nv=$NVIDIA_VISIBLE_DEVICES cuda=$CUDA_VISIBLE_DEVICES extra=$EXTRA rank=$HCS_RANK"',
        gpu_model=A100,
        gpus_per_instance=2,
        placements=gpu_placement("local", 1, 3),
        env={"EXTRA": "x"},
    )
    job_id = executor.submit(spec)
    wait_for(executor, job_id, FINAL)

    assert executor.logs(job_id) == "nv=1,3 cuda=1,3 extra=x rank=0\n"


def test_portal_environment_does_not_leak_into_jobs(executor, make_spec, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://secret")
    job_id = executor.submit(make_spec(command='echo "db=${DATABASE_URL:-unset} path=${PATH:+set}"'))
    wait_for(executor, job_id, FINAL)

    assert executor.logs(job_id) == "db=unset path=set\n"


def test_second_submit_of_the_same_name_starts_no_second_process(executor, make_spec):
    spec = make_spec(command='echo run >> "$HCS_JOB_DIR/runs"; sleep 1')

    first = executor.submit(spec)
    second = executor.submit(spec)
    again = LocalExecutor(executor.base_dir).submit(spec)
    wait_for(executor, first, FINAL)

    assert first == second == again == spec.name
    assert (executor.work_dir(first) / "runs").read_text() == "run\n"


def test_stop_ends_a_running_job_with_sigterm_and_reports_cancelled(executor, make_spec):
    job_id = executor.submit(make_spec(command="echo started; sleep 60"))
    wait_for_log(executor, job_id, "started")
    assert executor.status(job_id).phase == JobPhase.RUNNING

    began = time.monotonic()
    executor.stop(job_id)
    returned = time.monotonic() - began
    state = wait_for(executor, job_id, FINAL)

    assert returned < 0.5  # stop only asks; the reconciler confirms later
    assert time.monotonic() - began < executor.grace_period_s
    assert state.phase == JobPhase.CANCELLED
    assert state.exit_code == 128 + signal.SIGTERM


def test_stop_kills_a_job_that_ignores_sigterm_after_the_grace_period(executor, make_spec):
    command = "trap 'echo got TERM' TERM; echo ready; while true; do sleep 0.1; done"
    job_id = executor.submit(make_spec(command=command))
    wait_for_log(executor, job_id, "ready")

    began = time.monotonic()
    executor.stop(job_id)
    executor.stop(job_id)  # repeated by every reconciliation until the job is gone: no harm
    state = wait_for(executor, job_id, FINAL, timeout=executor.grace_period_s + 5)
    elapsed = time.monotonic() - began

    assert elapsed >= executor.grace_period_s
    assert "got TERM" in executor.logs(job_id)
    assert state.phase == JobPhase.CANCELLED
    meta = json.loads((executor.base_dir / job_id / "job.json").read_text())
    assert group_is_gone(meta["pid"])


def test_stop_of_a_finished_job_keeps_its_result(executor, make_spec):
    job_id = executor.submit(make_spec(command="true"))
    wait_for(executor, job_id, FINAL)

    executor.stop(job_id)

    assert executor.status(job_id).phase == JobPhase.SUCCEEDED


def test_new_executor_reattaches_a_running_process(executor, make_spec):
    job_id = executor.submit(make_spec(command="echo up; sleep 60"))
    wait_for_log(executor, job_id, "up")

    restarted = LocalExecutor(executor.base_dir, grace_period_s=1.0)

    assert restarted.status(job_id).phase == JobPhase.RUNNING
    restarted.stop(job_id)
    assert wait_for(restarted, job_id, FINAL).phase == JobPhase.CANCELLED
    assert executor.status(job_id).phase == JobPhase.CANCELLED


def test_job_that_ended_while_the_portal_was_down_reports_its_exit_code(executor, make_spec):
    job_id = executor.submit(make_spec(command="sleep 0.3; exit 7"))
    del executor._children[job_id]  # the portal that started it is gone
    time.sleep(0.8)

    state = LocalExecutor(executor.base_dir).status(job_id)

    assert state.phase == JobPhase.FAILED
    assert state.exit_code == 7


def test_process_that_vanished_without_an_exit_code_is_lost(executor, make_spec):
    job_id = executor.submit(make_spec(command="echo up; sleep 60"))
    wait_for_log(executor, job_id, "up")
    meta = json.loads((executor.base_dir / job_id / "job.json").read_text())

    os.killpg(meta["pid"], signal.SIGKILL)  # e.g. the OOM killer or a host reboot
    state = wait_for(LocalExecutor(executor.base_dir), job_id, FINAL)

    assert state.phase == JobPhase.LOST
    assert "vanished" in state.message


def test_reused_pid_is_not_mistaken_for_the_job(executor, make_spec):
    job_id = executor.submit(make_spec(command="sleep 60"))
    job_json = executor.base_dir / job_id / "job.json"
    meta = json.loads(job_json.read_text())
    real_pid = meta["pid"]
    meta["pid_start"] -= 1  # same pid, different process
    job_json.write_text(json.dumps(meta))

    assert LocalExecutor(executor.base_dir).status(job_id).phase == JobPhase.LOST
    os.killpg(real_pid, signal.SIGKILL)


def test_list_by_owner_filters_on_labels(executor, make_spec):
    mine = executor.submit(make_spec(project="vision", labels={"hcs/project": "vision"}))
    other = executor.submit(make_spec(project="nlp", labels={"hcs/project": "nlp"}))
    wait_for(executor, mine, FINAL)
    wait_for(executor, other, FINAL)

    assert [s.external_id for s in executor.list_by_owner({"hcs/project": "vision"})] == [mine]
    task_id = other.split("-")[2]
    assert [s.external_id for s in executor.list_by_owner({"hcs/task-id": task_id})] == [other]
    assert {s.external_id for s in executor.list_by_owner({})} == {mine, other}


def test_delete_stops_the_job_and_removes_its_directory(executor, make_spec):
    job_id = executor.submit(make_spec(command="sleep 60"))

    executor.delete(job_id)

    assert not (executor.base_dir / job_id).exists()
    assert executor.status(job_id).phase == JobPhase.LOST


def test_unknown_job_is_lost_and_bad_names_are_refused(executor):
    assert executor.status("hcs-task-1-1").phase == JobPhase.LOST
    assert executor.logs("hcs-task-1-1") == ""
    with pytest.raises(ExecutorError) as err:
        executor.status("../etc")
    assert err.value.retryable is False


def test_a_job_without_instances_is_refused_with_a_clear_error(executor, make_spec):
    with pytest.raises(ExecutorError, match="at least one instance") as err:
        executor.submit(make_spec(instances=0))
    assert err.value.retryable is False


def test_health_checks_that_the_job_directory_is_writable(executor, tmp_path):
    assert "ready" in executor.health()

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(ExecutorError, match="not writable"):
        LocalExecutor(blocker / "jobs").health()


def test_job_over_its_time_limit_is_ended_and_fails_with_the_reason(executor, make_spec):
    job_id = executor.submit(make_spec(command="echo started; sleep 30", time_limit_s=1))

    state = wait_for(executor, job_id, FINAL, timeout=5)

    assert (state.phase, state.message, state.exit_code) == (JobPhase.FAILED, "wall-time limit reached", 124)
    assert state.failure == "wall_time"
    assert executor.logs(job_id) == "started\n"


def test_command_exiting_124_on_its_own_is_not_a_time_limit(executor, make_spec):
    job_id = executor.submit(make_spec(command="exit 124", time_limit_s=60))

    state = wait_for(executor, job_id, FINAL)

    assert (state.phase, state.message) == (JobPhase.FAILED, "exit code 124")


def test_processes_left_behind_by_the_command_end_with_the_job(executor, make_spec):
    # One plain background process and one that left the job's session: both end with the job.
    # (Durations no other test uses: Slurm jobs of the dev cluster run on this host too, and "sleep 300" is common.)
    job_id = executor.submit(make_spec(command="sleep 307 & setsid sleep 308 & echo main done"))

    assert wait_for(executor, job_id, FINAL).phase == JobPhase.SUCCEEDED
    assert executor.logs(job_id) == "main done\n"
    deadline = time.monotonic() + 5
    while _sleepers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sleepers() == []


def _sleepers() -> list[str]:
    """Command lines of the background sleeps of the test above that are still alive."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            if cmdline in ("sleep 307", "sleep 308"):
                found.append(cmdline)
    return found


def test_dev_env_without_the_ide_installed_fails_at_once_and_says_what_an_admin_installs(executor, make_spec):
    spec = make_spec(
        kind="dev_env",
        command="",
        settings={"ide": "jupyter", "port": 8899, "ide_secret": "s3cret"},
        env={"PATH": "/nonexistent:/usr/bin:/bin"},
    )
    job_id = executor.submit(spec)

    state = wait_for(executor, job_id, FINAL)

    assert state.phase == JobPhase.FAILED and state.failure == Failure.LAUNCH
    assert state.message.startswith("jupyter is not installed on the cluster's host")
    assert "python3 -m pip install jupyterlab" in state.message
    logs = executor.logs(job_id)
    assert "jupyter on" in logs and "port 8899" in logs
    assert "jupyter is not installed" in logs


def test_jupyter_is_started_at_the_root_of_its_origin(make_spec):
    script = job_command(make_spec(kind="dev_env", command="", settings={"ide": "jupyter"}))
    assert "jupyter lab --no-browser --ip=0.0.0.0 --port=8888 --ServerApp.base_url=/ " in script


def test_dev_env_command_replaces_the_ide_and_gets_the_ide_secret(executor, make_spec):
    spec = make_spec(
        kind="dev_env", command='echo "password=$PASSWORD"', settings={"ide": "vscode", "ide_secret": "pw"}
    )
    job_id = executor.submit(spec)

    assert wait_for(executor, job_id, FINAL).phase == JobPhase.SUCCEEDED
    assert executor.logs(job_id) == "password=pw\n"


def test_unknown_ide_is_refused(executor, make_spec):
    with pytest.raises(ExecutorError, match="Unknown IDE 'emacs'") as err:
        executor.submit(make_spec(kind="dev_env", command="", settings={"ide": "emacs"}))
    assert err.value.retryable is False


# -- replicas of an inference service the portal scales ----------------------------------------------------------


def service_spec(make_spec, gpu_placement, *cards):
    placements = tuple(p for c in cards for p in gpu_placement("local", c))
    return make_spec(
        kind="inference",
        command='echo "cards=$CUDA_VISIBLE_DEVICES"; exec sleep 60',
        gpu_model=A100,
        gpus_per_instance=1,
        instances=len(placements),
        placements=placements,
        settings={"min_replicas": 1, "max_replicas": 4, "port": 8000},
    )


def replica_log(executor, job_id, key) -> str:
    return (executor.base_dir / job_id / "replicas" / key / "output.log").read_text()


def wait_replicas(executor, job_id, n, timeout=10.0):
    deadline = time.monotonic() + timeout
    while executor.status(job_id).replicas != n and time.monotonic() < deadline:
        time.sleep(0.05)
    return executor.status(job_id)


def test_a_service_grows_and_shrinks_replica_by_replica_each_on_its_cards(executor, make_spec, gpu_placement):
    job_id = executor.submit(service_spec(make_spec, gpu_placement, 0))
    assert executor.status(job_id).replicas is None  # a plain job until it has replicas
    executor.resize(job_id, 3, spec=service_spec(make_spec, gpu_placement, 0, 2, 3))
    state = wait_replicas(executor, job_id, 3)
    assert (state.phase, state.replicas, state.desired_replicas) == (JobPhase.RUNNING, 3, 3)
    assert wait_for_log(executor, job_id, "cards=0").startswith("cards=0")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
        f"cards={card}" in replica_log(executor, job_id, f"gpu-{card}") for card in (2, 3)
    ):
        time.sleep(0.05)
    assert replica_log(executor, job_id, "gpu-2") == "cards=2\n"
    assert replica_log(executor, job_id, "gpu-3") == "cards=3\n"
    # Its instances are the service's own process and each replica, numbered as the terminal and Connect use.
    shown = [(i.index, i.name, i.state) for i in executor.instances(job_id)]
    assert shown == [(0, job_id, "running"), (1, f"{job_id}/gpu-2", "running"), (2, f"{job_id}/gpu-3", "running")]
    assert all(i.cpu_used_cores is not None for i in executor.instances(job_id))
    # The engine takes back the middle replica (card 2): that one stops, the one on card 3 keeps running.
    pid_3 = json.loads((executor.base_dir / job_id / "replicas" / "gpu-3" / "job.json").read_text())["pid"]
    executor.resize(job_id, 2, spec=service_spec(make_spec, gpu_placement, 0, 3))
    assert wait_replicas(executor, job_id, 2).replicas == 2
    assert [(i.index, i.name) for i in executor.instances(job_id)] == [(0, job_id), (1, f"{job_id}/gpu-3")]
    assert json.loads((executor.base_dir / job_id / "replicas" / "gpu-3" / "job.json").read_text())["pid"] == pid_3
    executor.stop(job_id)
    assert wait_for(executor, job_id, FINAL).phase == JobPhase.CANCELLED
    assert not Path(f"/proc/{pid_3}").exists()  # the replica ended with the job (and the executor reaped it)


def test_a_replica_that_died_is_started_again_by_the_next_resize(executor, make_spec, gpu_placement):
    spec = service_spec(make_spec, gpu_placement, 0, 1)
    job_id = executor.submit(spec)
    assert wait_replicas(executor, job_id, 2).replicas == 2
    meta = json.loads((executor.base_dir / job_id / "replicas" / "gpu-1" / "job.json").read_text())
    os.killpg(meta["pid"], signal.SIGKILL)
    assert wait_replicas(executor, job_id, 1).replicas == 1
    executor.resize(job_id, 2, spec=spec)
    assert wait_replicas(executor, job_id, 2).replicas == 2


def test_only_inference_services_are_resized_and_never_without_their_spec(executor, make_spec, gpu_placement):
    job_id = executor.submit(make_spec(command="sleep 30"))
    with pytest.raises(ExecutorError, match="resizes only inference services"):
        executor.resize(job_id, 2)
    gang = executor.submit(
        make_spec(
            name="gang",
            command="sleep 30",
            instances=2,
            placements=gpu_placement("local", 0) + gpu_placement("local", 1),
        )
    )
    with pytest.raises(ExecutorError, match="resizes only inference services"):  # a gang's ranks are fixed
        executor.resize(gang, 1)
