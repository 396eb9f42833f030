"""KubernetesExecutor.instances() against the kmock API emulator: pods, PodMetrics, Service and Ingress."""

from __future__ import annotations

import pytest

from apps.clusters.executors.base import ExecutorError
from apps.clusters.executors.kubernetes import NO_METRICS_NOTE, pod_instances, pod_secret_names, pod_usage
from tests.executors_k8s.emulation import ApiServerEmulator
from tests.executors_k8s.specs import A100, spec
from tests.executors_k8s.test_executor_emulated import NS, add_pod

METRICS = "metrics.k8s.io/v1beta1/pods"


def running(ip: str, restarts: int = 0) -> dict:
    return {
        "phase": "Running",
        "podIP": ip,
        "startTime": "2026-11-23T10:00:00Z",
        "containerStatuses": [
            {
                "name": "main",
                "ready": True,
                "restartCount": restarts,
                "image": "vllm",
                "imageID": "",
                "state": {"running": {"startedAt": "2026-11-23T10:00:05Z"}},
            }
        ],
    }


def serve_metrics(emulator: ApiServerEmulator, pods: dict[str, tuple[str, str]]) -> None:
    """The metrics API as metrics-server serves it: one PodMetrics per pod, labelled like the pod."""
    emulator.resources[METRICS] = {"kind": "PodMetrics", "namespaced": True}
    for pod_name, (cpu, memory) in pods.items():
        labels = emulator.objects["v1/pods", NS, pod_name].raw["metadata"]["labels"]
        emulator.objects[METRICS, NS, pod_name] = {
            "apiVersion": "metrics.k8s.io/v1beta1",
            "kind": "PodMetrics",
            "metadata": {"name": pod_name, "namespace": NS, "labels": labels},
            "timestamp": "2026-11-23T10:05:00Z",
            "window": "15s",
            "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}],
        }


def test_two_replicas_with_their_use_service_ingress_and_secret_names(executor, emulator):
    s = spec(
        kind="inference",
        settings={"replicas": 2, "port": 8000},
        gpus_per_instance=1,
        gpu_model=A100,
        secret_env={"HF_TOKEN": "hf_secret_value"},
    )
    ext_id = executor.submit(s)
    add_pod(emulator, s.name, f"{s.name}-b-22222", running("10.1.0.8", restarts=2))
    add_pod(emulator, s.name, f"{s.name}-a-11111", running("10.1.0.7"))
    # The pods as the Deployment controller makes them: the template's container, reading the task's Secret.
    template = emulator.objects["apps/v1/deployments", NS, s.name].raw["spec"]["template"]["spec"]
    for pod_name in (f"{s.name}-a-11111", f"{s.name}-b-22222"):
        emulator.objects["v1/pods", NS, pod_name].patch({"spec": {"containers": template["containers"]}})
    serve_metrics(emulator, {f"{s.name}-a-11111": ("250m", "512Mi"), f"{s.name}-b-22222": ("1500000000n", "1Gi")})
    emulator.objects["networking.k8s.io/v1/ingresses", NS, s.name].patch(
        {"spec": {"tls": [{"hosts": [f"{s.name}.apps.example.org"], "secretName": "wildcard-tls"}]}}
    )

    first, second = executor.instances(ext_id)

    assert [first.index, second.index] == [0, 1]
    assert first.name == f"{s.name}-a-11111" and first.ip == "10.1.0.7" and first.node == "gpu-node-1"
    assert first.state == "Running" and first.restarts == 0 and second.restarts == 2
    assert (first.cpu_used_cores, first.memory_used_gib) == (0.25, 0.5)
    assert (second.cpu_used_cores, second.memory_used_gib) == (1.5, 1.0)
    assert first.usage_note == "" and first.started_at.isoformat() == "2026-11-23T10:00:00+00:00"
    assert first.service == s.name
    assert first.ports == ({"port": 80, "target_port": 8000, "protocol": "TCP", "name": "http"},)
    assert first.ingress_host == f"{s.name}.apps.example.org" and first.ingress_tls is True
    assert first.secrets == (s.name,)  # the task's Secret, by name
    assert "hf_secret_value" not in repr(first)


def test_without_a_metrics_api_use_is_unknown_and_says_why(executor, emulator):
    s = spec(instances=2)
    ext_id = executor.submit(s)
    add_pod(emulator, s.name, f"{s.name}-1-bbbbb", running("10.1.0.9"))
    add_pod(emulator, s.name, f"{s.name}-0-aaaaa", {"phase": "Pending"})
    for rank in (0, 1):
        pod = f"{s.name}-{rank}-{'ab'[rank] * 5}"
        emulator.objects["v1/pods", NS, pod].patch(
            {"metadata": {"annotations": {"batch.kubernetes.io/job-completion-index": str(rank)}}}
        )

    rank0, rank1 = executor.instances(ext_id)

    assert (rank0.index, rank0.state, rank0.ip) == (0, "Pending", None)
    assert (rank1.index, rank1.state, rank1.ip) == (1, "Running", "10.1.0.9")
    assert rank1.cpu_used_cores is None and rank1.memory_used_gib is None
    assert rank1.usage_note == NO_METRICS_NOTE
    assert rank1.ingress_host is None and rank1.ingress_tls is None  # training jobs get no Ingress
    assert rank1.service == s.name  # the headless Service the ranks find each other through


def test_a_job_without_pods_has_no_instances_and_a_gone_pod_none(executor, emulator):
    s = spec(instances=2)
    assert executor.instances(executor.submit(s)) == []
    assert executor.instances(f"{NS}/pod/hcs-task-0-1") == []


def test_an_unreachable_api_server_is_an_error():
    from apps.clusters.executors.kubernetes import KubernetesExecutor

    executor = KubernetesExecutor(host="http://127.0.0.1:9", namespace=NS)
    with pytest.raises(ExecutorError) as err:
        executor.instances(f"{NS}/job/hcs-task-1-1")
    assert err.value.retryable


def test_parsers_take_real_shaped_objects():
    containers = [
        {"name": "main", "usage": {"cpu": "2", "memory": "2Gi"}},
        {"name": "side", "usage": {"cpu": "500m", "memory": "1Gi"}},
    ]
    metrics = [{"metadata": {"name": "p"}, "containers": containers}]
    assert pod_usage(metrics) == {"p": (2.5, 3.0)}
    pod = {
        "spec": {
            "volumes": [
                {"name": "a", "secret": {"secretName": "tls-a"}},
                {"name": "b", "projected": {"sources": [{"secret": {"name": "proj-b"}}]}},
            ],
            "containers": [
                {
                    "envFrom": [{"secretRef": {"name": "env-c"}}],
                    "env": [
                        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "key-d", "key": "x"}}},
                        {"name": "Y", "value": "plain"},
                    ],
                }
            ],
            "imagePullSecrets": [{"name": "registry-e"}],
        }
    }
    assert pod_secret_names(pod) == ("env-c", "key-d", "proj-b", "registry-e", "tls-a")
    (only,) = pod_instances([{"metadata": {"name": "p"}, "status": {"phase": "Pending"}}], None)
    assert only.ingress_tls is None and only.service is None and only.usage_note == NO_METRICS_NOTE
