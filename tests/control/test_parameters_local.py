"""Parameters and checkpoints reach the job on the local cluster, with real processes: a training task
sees its settings as HCS_* variables, resumes from its checkpoint directory after a preemption, and the
directory goes when the task is deleted."""

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError
from apps.control.models import CheckpointStore
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import delete_task, stop_task, submit_task
from tests.control.drive import launch, reconcile_all, wait_objects_ended, wait_status


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def started(world, queue, **fields) -> Task:
    fields.setdefault("kind", "training")
    fields.setdefault("gpu_spec", "1(A100)")
    task = submit_task(world.member, project=world.project, queue=queue, **fields)
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled", (task.pending_reason, task.pending_message)
    launch(task)
    return task


def log_of(task: Task) -> str:
    task.refresh_from_db()
    return executor_for(task.cluster).logs(task.external_id, tail=1000)


def wait_log(task: Task, text: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while text not in (log := log_of(task)):
        assert time.monotonic() < deadline, f"{text!r} never appeared in the log: {log!r}"
        reconcile_all()
        time.sleep(0.1)
    return log


def test_every_declared_training_parameter_reaches_the_job_as_a_variable(world):
    task = started(
        world,
        "high",
        name="params",
        framework="pytorch",
        model_path="/models/llama-7b",
        epochs=3,
        batch_size=64,
        tensorboard_dir="/hcs/checkpoint/tb",
        command='env | grep "^HCS_" | sort; echo "cwd=$(pwd)"',
    )
    wait_status(task, "completed")
    variables = dict(line.split("=", 1) for line in log_of(task).splitlines() if line.startswith("HCS_"))
    assert {k: variables.get(k) for k in ("HCS_FRAMEWORK", "HCS_MODEL_PATH", "HCS_EPOCHS", "HCS_BATCH_SIZE")} == {
        "HCS_FRAMEWORK": "pytorch",
        "HCS_MODEL_PATH": "/models/llama-7b",
        "HCS_EPOCHS": "3",
        "HCS_BATCH_SIZE": "64",
    }
    assert variables["HCS_CHECKPOINT_DIR"] == "/hcs/checkpoint"
    assert (variables["HCS_TENSORBOARD_DIR"], variables["HCS_TENSORBOARD_PORT"]) == ("/hcs/checkpoint/tb", "6006")
    # Only what is set: a training task has no port, token limit or temperature.
    assert not {"HCS_PORT", "HCS_MAX_TOKENS", "HCS_TEMPERATURE", "HCS_IDE"} & set(variables)
    # The per-attempt working directory stays apart from the checkpoint directory.
    assert variables["HCS_JOB_DIR"] != variables["HCS_CHECKPOINT_DIR"]


def test_inference_parameters_reach_the_job(world):
    task = started(
        world,
        "high",
        name="serve",
        kind="inference",
        model_path="/models/qwen",
        port=9000,
        max_tokens=512,
        temperature="0.30",
        command='env | grep "^HCS_" | sort',
    )
    wait_status(task, "completed")
    log = log_of(task)
    for line in ("HCS_MODEL_PATH=/models/qwen", "HCS_PORT=9000", "HCS_MAX_TOKENS=512", "HCS_TEMPERATURE=0.3"):
        assert line in log.splitlines(), log
    assert "HCS_CHECKPOINT_DIR" not in log  # checkpoints are for training and fine-tuning


# Resumes from the epoch it finds in its checkpoint directory, and records each epoch it finishes there.
TRAIN = """
start=$(cat "$HCS_CHECKPOINT_DIR/epoch" 2>/dev/null || echo 0)
echo "attempt $HCS_ATTEMPT resumes after epoch $start"
i=$start
while [ "$i" -lt "$HCS_EPOCHS" ]; do
  sleep 0.2
  i=$((i + 1))
  echo "$i" > "$HCS_CHECKPOINT_DIR/epoch.tmp" && mv "$HCS_CHECKPOINT_DIR/epoch.tmp" "$HCS_CHECKPOINT_DIR/epoch"
  echo "epoch $i done"
done
echo "trained $HCS_EPOCHS epochs"
"""


def test_a_preempted_training_task_resumes_from_its_checkpoint_directory(world):
    low = started(world, "low", name="resumable", gpu_spec="8(A100)", epochs=40, command=TRAIN)
    wait_status(low, "running")
    wait_log(low, "epoch 3 done")
    first_attempt = low.attempt
    executor = executor_for(world.cluster)
    kept = executor.checkpoint_dir(low.uid.hex)
    if os.geteuid() == 0:  # the job runs as the unprivileged job user, who owns its checkpoint directory
        assert kept.stat().st_uid != 0 and kept.stat().st_mode & 0o777 == 0o700

    high = submit_task(
        world.outsider,
        project=world.other_project,
        queue="high",
        kind="training",
        name="urgent",
        gpu_spec="8(A100)",
        command="sleep 60",
    )
    run_cycle(world.vdc.pk)  # the high task takes the node: the low one is suspended, its job cancelled
    low.refresh_from_db()
    assert low.status == "suspended"
    wait_objects_ended_for(low, first_attempt)
    reached = int((kept / "epoch").read_text())
    assert 3 <= reached < 40

    stop_task(high, world.outsider)  # nothing high waits any more: the low task may run again
    reconcile_all()
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    assert low.attempt == first_attempt + 1 and low.status == "scheduled"
    low = wait_status(low, "completed", timeout=60)
    second = log_of(low)
    assert f"attempt {low.attempt} resumes after epoch {reached}" in second
    assert f"epoch {reached + 1} done" in second and "epoch 1 done" not in second.splitlines()
    assert "trained 40 epochs" in second and (kept / "epoch").read_text().strip() == "40"


def wait_objects_ended_for(task: Task, attempt: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while task.backend_objects.filter(attempt=attempt).exclude(state="ended").exists():
        assert time.monotonic() < deadline, "the preempted job was never confirmed gone"
        reconcile_all()
        time.sleep(0.1)


def test_the_checkpoint_directory_goes_when_the_task_is_deleted_and_not_before(world):
    task = started(world, "high", name="short", epochs=2, command=TRAIN)
    wait_status(task, "completed")
    kept = executor_for(world.cluster).checkpoint_dir(task.uid.hex)
    store = CheckpointStore.objects.get(task=task)
    assert (store.cluster_id, store.project) == (world.cluster.pk, "alpha")
    reconcile_all()
    assert (kept / "epoch").read_text().strip() == "2"  # a finished task keeps it until it is deleted

    delete_task(task, world.member)
    wait_objects_ended(world.cluster)
    reconcile_all()
    assert not kept.exists()
    assert not CheckpointStore.objects.filter(task_uid=task.uid).exists()


def test_a_checkpoint_path_names_where_the_job_finds_the_directory(world):
    task = started(
        world,
        "high",
        name="custom",
        checkpoint_path="/workspace/ckpt",
        command='echo "dir=$HCS_CHECKPOINT_DIR"; echo saved > "$HCS_CHECKPOINT_DIR/state"',
    )
    wait_status(task, "completed")
    assert "dir=/workspace/ckpt" in log_of(task)
    assert (executor_for(world.cluster).checkpoint_dir(task.uid.hex) / "state").read_text() == "saved\n"


@pytest.mark.parametrize(("logdir", "kept"), [("/hcs/tb", False), ("/hcs/checkpoint/tb", True), ("runs/tb", False)])
def test_a_tensorboard_log_dir_is_writable_wherever_the_task_puts_it(world, logdir, kept):
    """The sandbox's root is read-only: an absolute log dir outside the checkpoint directory is a directory of the
    job's own mounted there; inside the checkpoint directory it is kept with the checkpoints."""
    task = started(
        world,
        "high",
        name="tb",
        tensorboard_dir=logdir,
        command='mkdir -p "$HCS_TENSORBOARD_DIR" && echo event > "$HCS_TENSORBOARD_DIR/events.out" && echo wrote',
    )
    task = wait_status(task, "completed")
    assert "wrote" in log_of(task)
    checkpoints = executor_for(world.cluster).checkpoint_dir(task.uid.hex)
    assert (checkpoints / "tb" / "events.out").exists() is kept


def test_a_failed_removal_is_kept_on_the_store_and_tried_again_a_minute_later(world, monkeypatch):
    task = started(world, "high", name="stuck", epochs=1, command=TRAIN)
    wait_status(task, "completed")
    executor = executor_for(world.cluster)
    kept = executor.checkpoint_dir(task.uid.hex)
    calls = []

    def refuse(task_uid, project):
        calls.append(task_uid)
        raise ExecutorError("permission denied (test)")

    monkeypatch.setattr(executor, "remove_checkpoints", refuse)
    delete_task(task, world.member)
    reconcile_all()
    reconcile_all()  # within the minute: not tried again
    store = CheckpointStore.objects.get(task_uid=task.uid)
    assert calls == [task.uid.hex] and "permission denied" in store.message and store.failed_at is not None

    monkeypatch.undo()
    CheckpointStore.objects.filter(pk=store.pk).update(failed_at=timezone.now() - timedelta(minutes=2))
    reconcile_all()
    assert not kept.exists() and not CheckpointStore.objects.filter(pk=store.pk).exists()
