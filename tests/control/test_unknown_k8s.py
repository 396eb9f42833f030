"""An unreachable Kubernetes API server (the emulator's address changed to a closed port): running tasks are unknown
within the cluster's grace period and requeued once it ends (docs/control.md, "Cluster health and node state")."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from apps.clusters.models import Cluster
from apps.control.health import check_cluster_health
from tests.control.test_kubernetes_control import k8s, run, submit  # noqa: F401 - k8s: the fixture
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture

CLOSED = "http://127.0.0.1:9"  # discard: nothing answers there


def cut_off(cluster: Cluster) -> str:
    endpoint = cluster.endpoint
    Cluster.objects.filter(pk=cluster.pk).update(endpoint=CLOSED)
    statuses = [check_cluster_health(cluster).status for _ in range(3)]
    assert statuses == ["degraded", "degraded", "unavailable"], statuses
    return endpoint


def test_running_tasks_are_unknown_within_the_grace_period_and_followed_when_it_answers(k8s):  # noqa: F811
    world = k8s
    task = run(world, submit(world, name="kept", queue="high", gpu_spec="1(A100)"))
    assert check_cluster_health(world.k8s_cluster).status == "healthy"
    held, job = task.allocated_gpu, task.external_id
    endpoint = cut_off(world.k8s_cluster)
    task.refresh_from_db()
    assert (task.status, task.allocated_gpu, task.external_id, task.attempt) == ("unknown", held, job, 1)

    Cluster.objects.filter(pk=world.k8s_cluster.pk).update(endpoint=endpoint)
    assert check_cluster_health(world.k8s_cluster).status == "healthy"
    task.refresh_from_db()
    assert (task.status, task.external_id, task.attempt) == ("running", job, 1)
    kinds = list(task.events.values_list("kind", flat=True))
    assert "requeued" not in kinds and kinds.count("started") == 1  # "answers again" is a status entry


def test_running_tasks_are_requeued_once_the_grace_period_has_passed(k8s):  # noqa: F811
    world = k8s
    task = run(world, submit(world, name="moved", queue="high", gpu_spec="1(A100)"))
    assert check_cluster_health(world.k8s_cluster).status == "healthy"
    cut_off(world.k8s_cluster)
    task.refresh_from_db()
    assert task.status == "unknown"
    last_answer = timezone.now() - timedelta(seconds=world.k8s_cluster.unknown_grace_s + 1)
    Cluster.objects.filter(pk=world.k8s_cluster.pk).update(last_heartbeat=last_answer)
    check_cluster_health(world.k8s_cluster)
    task.refresh_from_db()
    assert task.status == "preempted" and task.cluster is None
    assert f"for more than {world.k8s_cluster.unknown_grace_s} s" in task.status_message
