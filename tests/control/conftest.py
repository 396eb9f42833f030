"""Fixtures of the control-plane tests: the world with the real dev Slurm cluster in its VDC."""

import contextlib
import time
from decimal import Decimal

import pytest
from rest_framework.test import APIClient

from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.models import GPUModel
from apps.control.reconcile import installation_label
from apps.tasks.models import Task
from tests.executors.slurm_cluster import SlurmClusterError, dev_cluster_for_tests, scontrol, start_dev_cluster
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory


@pytest.fixture(scope="session")
def slurm():
    return dev_cluster_for_tests()


@pytest.fixture
def slurm_world(world, slurm, settings, monkeypatch):
    """The world's VDC gets the dev Slurm cluster: hcs-node-1/2 with 8 x A100, hcs-node-3/4 with 4 x V100-32G."""
    from celery_app.app import app as celery

    # On the Celery app itself: once an earlier test set (and restored) the key there, the Django setting is
    # no longer read, and a reconcile asked for by a cycle would wait for a worker that never comes.
    monkeypatch.setitem(celery.conf, "task_always_eager", True)
    settings.CELERY_TASK_ALWAYS_EAGER = True
    world.cluster.enabled = False  # only Slurm takes tasks here
    world.cluster.save()
    cluster = ClusterFactory(
        vdc=world.vdc,
        name="slurm-dev",
        cluster_type="slurm",
        endpoint=slurm.url,
        api_version=slurm.api_version,
        namespace=slurm.partition,
        labels={"slurm-gres.A100-80G": "a100", "slurm-gres.V100-32G": "v100"},
    )
    cluster.set_credentials({"token": slurm.token, "user": slurm.user, "output_dir": slurm.output_dir})
    cluster.save()
    a100, v100 = GPUModel.objects.get(name="A100-80G"), GPUModel.objects.get(name="V100-32G")
    for n, (model, count) in enumerate([(a100, 8), (a100, 8), (v100, 4), (v100, 4)], start=1):
        node = NodeFactory(cluster=cluster, name=f"hcs-node-{n}", cpu=Decimal(4), memory_gib=Decimal(8))
        for index in range(count):
            DeviceFactory(node=node, index=index, gpu_model=model)
    world.quota.limit_gpu = Decimal(32)
    world.quota.limit_cpu = Decimal(16)
    world.quota.save()
    world.slurm_cluster = cluster
    yield world
    # The test's database goes away; its jobs on the shared dev cluster must not outlive it.
    try:
        executor = executor_for(cluster)
        for state in executor.list_by_owner(installation_label()):
            if state.phase in (JobPhase.PENDING, JobPhase.RUNNING):
                executor.stop(state.external_id)
    except ExecutorError:
        pass  # slurmrestd still down after a failed test: the next start cancels nothing, jobs end on their own


def api_submit(world, **data):
    client = APIClient()
    client.force_authenticate(world.member)
    body = {"project": world.project.pk, "kind": "training", "cpu": "1", "memory_gib": "1", **data}
    response = client.post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    return Task.objects.get(pk=response.json()["id"])


@pytest.fixture
def restore_cluster():
    """Whatever a test kills or marks down, the dev cluster is whole again afterwards."""
    touched_nodes: list[str] = []
    yield touched_nodes
    start_dev_cluster()
    for node in touched_nodes:
        for _ in range(60):
            with contextlib.suppress(SlurmClusterError):  # "already idle", or not registered yet: look again
                scontrol("update", f"nodename={node}", "state=resume")
            shown = scontrol("show", "node", node)
            if "State=IDLE" in shown and "NOT_RESPONDING" not in shown:
                break
            time.sleep(1)
