"""Task parameters and the checkpoint directory as every backend passes them: one naming (``HCS_*``), built
in one place; the Slurm job script and its environment (no cluster needed)."""

from __future__ import annotations

import uuid

from apps.clusters.executors.base import parameter_environment
from apps.clusters.executors.slurm import MAKE_CHECKPOINT_DIR, SlurmExecutor

from .conftest import build_spec

UID = uuid.UUID(int=7).hex


def slurm(**kwargs) -> SlurmExecutor:
    values = {"endpoint": "http://127.0.0.1:9", "token": "t", "user": "hcs", "output_dir": "/shared/out"}
    return SlurmExecutor(**{**values, **kwargs})


def test_only_the_parameters_that_are_set_become_variables():
    spec = build_spec(
        kind="training",
        settings={"framework": "pytorch", "epochs": 3, "batch_size": 64, "model_path": "", "temperature": None},
    )
    assert parameter_environment(spec) == {"HCS_FRAMEWORK": "pytorch", "HCS_EPOCHS": "3", "HCS_BATCH_SIZE": "64"}


def test_services_learn_the_port_they_listen_on_even_when_the_task_left_the_default():
    jupyter = build_spec(kind="dev_env", settings={"ide": "jupyter"})
    assert parameter_environment(jupyter) == {"HCS_IDE": "jupyter", "HCS_PORT": "8888"}
    serve = build_spec(kind="inference", settings={"max_tokens": 512, "temperature": 0.3, "model_path": "/m"})
    assert parameter_environment(serve) == {
        "HCS_MODEL_PATH": "/m",
        "HCS_MAX_TOKENS": "512",
        "HCS_TEMPERATURE": "0.3",
        "HCS_PORT": "8000",
    }
    assert parameter_environment(build_spec(kind="inference", settings={"port": 9000}))["HCS_PORT"] == "9000"


def test_a_tensorboard_dir_comes_with_the_port_tensorboard_is_served_on():
    spec = build_spec(kind="fine_tuning", settings={"tensorboard_dir": "/work/tb"})
    assert parameter_environment(spec) == {"HCS_TENSORBOARD_DIR": "/work/tb", "HCS_TENSORBOARD_PORT": "6006"}


def test_slurm_training_jobs_keep_checkpoints_under_the_clusters_shared_root():
    spec = build_spec(kind="training", project="vision", task_uid=UID, settings={"epochs": 5})
    body = slurm(checkpoint_root="/shared/ckpt").job_description(spec)
    env = body["job"]["environment"]
    assert env["HCS_CHECKPOINT_DIR"] == f"/shared/ckpt/vision/{UID}" and env["HCS_EPOCHS"] == "5"
    lines = body["script"].splitlines()
    # Created by the job itself (the portal host need not reach the nodes), before the command runs.
    assert lines.index(MAKE_CHECKPOINT_DIR) < lines.index("echo hello")


def test_slurm_gang_jobs_create_the_checkpoint_directory_once_before_the_ranks_start():
    spec = build_spec(kind="training", task_uid=UID, instances=2)
    script = slurm(checkpoint_root="/shared/ckpt").job_description(spec)["script"]
    assert script.index(MAKE_CHECKPOINT_DIR) < script.index("srun --kill-on-bad-exit")


def test_slurm_checkpoint_path_is_the_users_own_shared_directory():
    spec = build_spec(kind="training", task_uid=UID, settings={"checkpoint_path": "/home/alice/run1"})
    for executor in (slurm(), slurm(checkpoint_root="/shared/ckpt")):
        assert executor.job_description(spec)["job"]["environment"]["HCS_CHECKPOINT_DIR"] == "/home/alice/run1"


def test_slurm_without_a_checkpoint_root_tells_the_job_of_none():
    body = slurm().job_description(build_spec(kind="training", task_uid=UID))
    assert "HCS_CHECKPOINT_DIR" not in body["job"]["environment"] and "mkdir" not in body["script"]
    inference = slurm(checkpoint_root="/shared/ckpt").job_description(build_spec(kind="inference", task_uid=UID))
    assert "HCS_CHECKPOINT_DIR" not in inference["job"]["environment"]


def test_slurm_removes_a_deleted_tasks_directory_under_the_root_only(tmp_path):
    executor = slurm(checkpoint_root=str(tmp_path))
    kept = tmp_path / "vision" / UID
    (kept / "step-100").mkdir(parents=True)
    (tmp_path / "vision" / "other").mkdir()
    executor.remove_checkpoints(UID, "vision")
    assert not kept.exists() and (tmp_path / "vision" / "other").exists()
    executor.remove_checkpoints(UID, "vision")  # already gone: nothing to do
    slurm().remove_checkpoints(UID, "vision")  # no root: the cluster keeps none
