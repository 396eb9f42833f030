"""Identity by id on the Kubernetes API emulator: a task follows the workload whose UID it recorded, a launch whose
answer was lost is adopted only through its launch token, and a look-alike is reported, never followed
(docs/control.md, "Identity by id")."""

from __future__ import annotations

import copy

import pytest

from apps.clusters.executors.base import LABEL_LAUNCH_TOKEN
from apps.control.models import BackendObject
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from tests.control.drive import intent, launch
from tests.control.test_kubernetes_control import JOBS, NS, k8s, run, submit  # noqa: F401 - k8s: the fixture
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.executors_k8s.emulation import stored


def copy_job(world, name: str, new_name: str, **label_changes) -> None:
    """A second Job in the namespace made from the stored one (as someone copying its manifest would)."""
    job = copy.deepcopy(stored(world.emulator, JOBS, NS)[name])
    job["metadata"] = {"name": new_name, "namespace": NS, "labels": {**job["metadata"]["labels"], **label_changes}}
    job.pop("status", None)
    world.emulator.objects[JOBS, NS, new_name] = job


def test_a_copied_job_with_the_tasks_labels_and_token_is_reported_not_followed(k8s):  # noqa: F811
    world = k8s
    task = run(world, submit(world, name="real", queue="high", gpu_spec="1(A100)"))
    name = task.external_id.split("/")[-1]
    obj = intent(task)
    assert obj.backend_uid == stored(world.emulator, JOBS, NS)[name]["metadata"]["uid"]  # recorded when first seen
    copy_job(world, name, f"{name}-copy")
    world.emulator.objects[JOBS, NS, f"{name}-copy"].patch({"status": {"succeeded": 1}})
    world.emulator.objects[JOBS, NS, f"{name}-copy"].patch({"status": {"active": 1, "succeeded": 0}})

    result = reconcile_cluster(world.k8s_cluster.pk)
    task.refresh_from_db()
    assert result.look_alikes == 1
    assert task.status == "running" and task.external_id.endswith(f"/{name}")
    assert task.events.filter(kind="backend_error", message__contains=f"{name}-copy").count() == 1
    reconcile_cluster(world.k8s_cluster.pk)
    assert task.events.filter(kind="backend_error", message__contains=f"{name}-copy").count() == 1  # said once
    assert f"{name}-copy" in stored(world.emulator, JOBS, NS)  # not the portal's to cancel


def test_a_workload_replaced_under_the_same_name_is_not_followed(k8s):  # noqa: F811
    """Someone deletes the task's Job and creates another with the same name and labels (a new UID): the task does
    not take the newcomer's state as its own; the job it followed is gone, so the task is requeued."""
    world = k8s
    task = run(world, submit(world, name="replaced", queue="high", gpu_spec="1(A100)"))
    name = task.external_id.split("/")[-1]
    old_uid = intent(task).backend_uid
    job = copy.deepcopy(stored(world.emulator, JOBS, NS)[name])
    world.emulator.objects[JOBS, NS, name].delete()
    job["metadata"] = {"name": name, "namespace": NS, "labels": job["metadata"]["labels"], "uid": "f" * 32}
    job["status"] = {"succeeded": 1}
    world.emulator.objects[JOBS, NS, name] = job
    assert stored(world.emulator, JOBS, NS)[name]["metadata"]["uid"] != old_uid

    reconcile_cluster(world.k8s_cluster.pk)
    task.refresh_from_db()
    assert task.status != "completed"  # the newcomer's success is not the task's
    assert task.status == "preempted" and "requeued" in task.events.values_list("kind", flat=True)


def test_a_launch_whose_answer_was_lost_is_adopted_only_by_its_token(k8s, monkeypatch):  # noqa: F811
    world = k8s
    task = submit(world, name="lost-answer", queue="high", gpu_spec="1(A100)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    from apps.clusters.executors.kubernetes import KubernetesExecutor

    real_submit = KubernetesExecutor.submit

    def submit_then_die(self, spec, **kwargs):
        real_submit(self, spec, **kwargs)
        raise SystemExit("worker killed after the API server accepted the workload")

    monkeypatch.setattr(KubernetesExecutor, "submit", submit_then_die)
    with pytest.raises(SystemExit):
        launch(task)
    monkeypatch.undo()
    obj = intent(task)  # its lease still runs: the dead worker's submit may be in flight
    name = obj.name
    stored_job = stored(world.emulator, JOBS, NS)[name]
    assert stored_job["metadata"]["labels"][LABEL_LAUNCH_TOKEN] == obj.launch_token
    # Without its token the job is not the launch's: a look-alike, not adopted.
    world.emulator.objects[JOBS, NS, name].patch({"metadata": {"labels": {LABEL_LAUNCH_TOKEN: "0" * 32}}})
    result = reconcile_cluster(world.k8s_cluster.pk)
    assert result.adopted == 0 and result.look_alikes == 1
    # With it, the job is adopted.
    world.emulator.objects[JOBS, NS, name].patch({"metadata": {"labels": {LABEL_LAUNCH_TOKEN: obj.launch_token}}})
    BackendObject.objects.filter(task=task).update(lease_until=None)
    result = reconcile_cluster(world.k8s_cluster.pk)
    task.refresh_from_db()
    assert result.adopted == 1 and task.external_id.endswith(f"/{name}")
