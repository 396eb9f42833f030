"""A VDC of all three cluster types: each task is placed only on a cluster whose type can run it, and runs there.

The VDC picks clusters by priority, Kubernetes (the emulator) first, then the local cluster, then the dev Slurm
cluster; without matching what a task needs to what each type runs, every task below would go to Kubernetes.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.clusters.backends import executor_for
from apps.clusters.models import GPUModel
from apps.control.reconcile import installation_label
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.control.drive import launch, wait_status
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.executors_k8s.emulation import stored
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory

NS = "gpu-jobs"


@pytest.fixture
def mixed(world, slurm, emulator, settings, tmp_path):  # noqa: F811
    """local-1 (one node, 8 x A100), slurm-dev (A100 and V100 nodes) and k8s (the emulator: 4 x A100, 4 x V100)."""
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"
    world.vdc.cluster_selection_strategy = "priority_weight"
    world.vdc.save()
    world.cluster.priority = 5
    world.cluster.save()
    a100, v100 = GPUModel.objects.get(name="A100-80G"), GPUModel.objects.get(name="V100-32G")
    kube = ClusterFactory(
        vdc=world.vdc,
        name="k8s",
        cluster_type="kubernetes",
        priority=9,
        endpoint=str(emulator.url).rstrip("/"),
        namespace=NS,
    )
    kube.set_credentials({"token": "emulated"})
    kube.save()
    node = NodeFactory(cluster=kube, name="k8s-node-1", cpu=Decimal(64), memory_gib=Decimal(512))
    for index in range(8):
        DeviceFactory(node=node, index=index, gpu_model=a100 if index < 4 else v100)
    slurm_cluster = ClusterFactory(
        vdc=world.vdc,
        name="slurm-dev",
        cluster_type="slurm",
        priority=1,
        endpoint=slurm.url,
        api_version=slurm.api_version,
        namespace=slurm.partition,
        labels={"slurm-gres.A100-80G": "a100", "slurm-gres.V100-32G": "v100"},
    )
    slurm_cluster.set_credentials({"token": slurm.token, "user": slurm.user, "output_dir": slurm.output_dir})
    slurm_cluster.save()
    for n, (model, count) in enumerate([(a100, 8), (a100, 8), (v100, 4), (v100, 4)], start=1):
        slurm_node = NodeFactory(cluster=slurm_cluster, name=f"hcs-node-{n}", cpu=Decimal(4), memory_gib=Decimal(8))
        for index in range(count):
            DeviceFactory(node=slurm_node, index=index, gpu_model=model)
    world.quota.limit_gpu, world.quota.limit_cpu = Decimal(32), Decimal(32)
    world.quota.save()
    world.kube, world.slurm_cluster, world.emulator = kube, slurm_cluster, emulator
    yield world
    executor = executor_for(slurm_cluster)  # its jobs on the shared dev cluster must not outlive the test
    for state in executor.list_by_owner(installation_label()):
        executor.stop(state.external_id)


def placed(world, **fields) -> Task:
    fields.setdefault("name", "job")
    fields.setdefault("kind", "training")
    task = submit_task(world.member, project=world.project, queue="high", **fields)
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled", (task.pending_reason, task.pending_message)
    return task


def test_a_command_without_an_image_runs_on_the_local_cluster(mixed):
    task = placed(mixed, command="echo from-$HCS_TASK_ID", cpu=Decimal(1))
    assert task.cluster == mixed.cluster
    assert launch(task) == mixed.cluster.pk
    task = wait_status(task, "completed", timeout=60)
    assert f"from-{task.pk}" in executor_for(task.cluster).logs(task.external_id)


def test_a_command_without_an_image_on_cards_only_slurm_holds_runs_on_slurm(mixed):
    # Kubernetes holds V100s too, but runs containers only; the local node holds none.
    task = placed(mixed, command="echo gpus=$CUDA_VISIBLE_DEVICES", gpu_spec="1(V100)", cpu=Decimal(1))
    assert task.cluster == mixed.slurm_cluster
    launch(task)
    task = wait_status(task, "completed", timeout=90)
    assert "gpus=" in executor_for(task.cluster).logs(task.external_id)


def test_an_image_run_by_its_entrypoint_and_an_elastic_task_run_on_kubernetes(mixed):
    mixed.cluster.priority = mixed.slurm_cluster.priority = 20  # now ahead of Kubernetes
    mixed.cluster.save()
    mixed.slurm_cluster.save()
    entrypoint = placed(mixed, image="registry.local/train:1", command="", gpu_spec="1(A100)")
    elastic = placed(
        mixed, name="elastic", image="registry.local/train:1", command="python train.py", elastic_min=1, elastic_max=2
    )
    assert entrypoint.cluster == elastic.cluster == mixed.kube
    assert launch(entrypoint) == mixed.kube.pk
    entrypoint.refresh_from_db()
    container = stored(mixed.emulator, "batch/v1/jobs", NS)[entrypoint.external_id.rsplit("/", 1)[1]]
    container = container["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "registry.local/train:1" and "command" not in container and "args" not in container
    # The same image-only task with Kubernetes out of service waits and says why, instead of failing elsewhere.
    mixed.kube.status = "unavailable"
    mixed.kube.save()
    waiting = submit_task(
        mixed.member,
        project=mixed.project,
        queue="high",
        kind="training",
        name="waits",
        image="registry.local/train:1",
        command="",
    )
    run_cycle(mixed.vdc.pk)
    waiting.refresh_from_db()
    assert (waiting.status, waiting.pending_reason) == ("queued", "no_eligible_cluster")
    assert "can run what it needs: container image" in waiting.pending_message


def test_a_task_no_cluster_type_of_the_vdc_can_run_is_refused_with_each_reason(mixed):
    # Elastic resizing is Kubernetes' alone, and Kubernetes runs containers: without an image nothing can run it.
    with pytest.raises(ValidationError) as refused:
        submit_task(
            mixed.member,
            project=mixed.project,
            queue="high",
            kind="training",
            name="x",
            command="python train.py",
            elastic_min=1,
            elastic_max=2,
        )
    message = refused.value.message_dict["elastic_min"][0]
    for reason in (
        "k8s: Kubernetes runs containers: an image is required",
        "local-1: Local processes cannot grow or shrink a running job",
        "slurm-dev: Slurm cannot grow or shrink a running job",
    ):
        assert reason in message, message
    assert not Task.objects.filter(name="x").exists()
