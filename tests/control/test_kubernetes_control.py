"""The control plane against the Kubernetes API emulator (kmock over HTTP, the official client):
elastic shrink and grow carried to the backend, devices free only once it confirms, HPA replicas read back
into quotas and billing, node conditions and cordons into the snapshot.

The emulator stores objects but runs no controllers: ``controller()`` plays the Job / Deployment
controller (pods follow parallelism / replicas) and the tests play the HPA.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.admin.sites import site as admin_site
from django.test import RequestFactory

from apps.clusters.models import GPUModel
from apps.control import invariants
from apps.control.health import check_cluster_health
from apps.control.models import BackendObject, ObjectState
from apps.control.reconcile import reconcile_cluster
from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import submit_task, update_autoscaling
from apps.vdc.models import ProjectQuota
from tests.api.base import client_for
from tests.control.drive import intent, launch
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.executors_k8s.emulation import stored
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory

NS = "gpu-jobs"
JOBS, DEPLOYMENTS, PODS = "batch/v1/jobs", "apps/v1/deployments", "v1/pods"


@pytest.fixture
def k8s(world, emulator):  # noqa: F811
    """The world's VDC with one Kubernetes cluster (the emulator): one node of 4 x A100."""
    world.cluster.enabled = False
    world.cluster.save()
    cluster = ClusterFactory(
        vdc=world.vdc, name="k8s", cluster_type="kubernetes", endpoint=str(emulator.url).rstrip("/"), namespace=NS
    )
    cluster.set_credentials({"token": "emulated"})
    cluster.save()
    node = NodeFactory(cluster=cluster, name="k8s-node-1", cpu=Decimal(64), memory_gib=Decimal(512))
    for index in range(4):
        DeviceFactory(node=node, index=index, gpu_model=GPUModel.objects.get(name="A100-80G"))
    for name in ("k8s-node-1",):
        emulator.objects["v1/nodes", None, name] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        }
    world.k8s_cluster, world.k8s_node, world.emulator = cluster, node, emulator
    return world


def controller(emulator, name: str, node: str = "k8s-node-1") -> int:  # noqa: F811
    """Make the workload's pods match its parallelism (Job) or replicas (Deployment), highest index leaving first."""
    job = stored(emulator, JOBS, NS).get(name)
    workload = job or stored(emulator, DEPLOYMENTS, NS)[name]
    wanted = workload["spec"].get("parallelism" if job else "replicas", 1)
    labels = workload["spec"]["template"]["metadata"]["labels"]
    for (resource, _namespace, pod_name), obj in list(emulator.objects.items()):
        ours = resource.plural == "pods" and pod_name.startswith(f"{name}-") and not obj.deleted
        if ours and int(pod_name.rsplit("-", 1)[1]) >= wanted:
            obj.delete()
    for index in range(wanted):
        key = (PODS, NS, f"{name}-{index}")
        if key not in emulator.objects or emulator.objects[key].deleted:
            emulator.objects[key] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-{index}", "namespace": NS, "labels": labels},
                "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": node},
                "status": {"phase": "Running"},
            }
    if job:
        emulator.objects[JOBS, NS, name].patch({"status": {"active": wanted}})
    else:
        emulator.objects[DEPLOYMENTS, NS, name].patch({"status": {"replicas": wanted, "availableReplicas": wanted}})
    return wanted


def submit(world, **fields):
    fields.setdefault("kind", "training")
    return submit_task(world.member, project=world.project, image="busybox:1.36", command="sleep 600", **fields)


def run(world, task: Task) -> Task:
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert launch(task) == task.cluster_id
    task.refresh_from_db()
    controller(world.emulator, task.external_id.split("/")[-1])
    reconcile_cluster(world.k8s_cluster.pk)
    task.refresh_from_db()
    assert task.status == "running", task.status_message
    return task


def assert_allocation_agrees(world, cpu: float, gpu: float) -> None:
    """What the cluster holds, as the API stats, /metrics and the admin compute it."""
    from django.utils import timezone

    from apps.billing.monitoring import read_state
    from apps.tasks.api.stats import allocated

    api = allocated(Task.objects.filter(cluster=world.k8s_cluster))
    metrics = next(c for c in read_state(timezone.now()).clusters if c.name == "k8s").allocated
    assert (float(api["cpu"]), float(api["gpu"])) == (cpu, gpu)
    assert (float(metrics["cpu"]), float(metrics["gpu"])) == (cpu, gpu)


def billed_cards(task: Task) -> float:
    """Cards the metering would charge the task for now."""
    from apps.billing.services import _models_for, holdings

    models = _models_for([task.placement])
    return float(sum(h.units for h in holdings(task, task.placement, models) if h.resource_type == "gpu"))


def assert_consistent(world):
    problems = invariants.check([world.k8s_cluster])
    assert problems == [], [str(p) for p in problems]


def test_a_grown_elastic_task_holds_the_same_everywhere(k8s, client, settings):
    # The API, /metrics, the quota admin and the dashboard once computed a grown task's cpu three ways (32, 32, 16).
    world = k8s
    world.quota.limit_cpu = 64
    world.quota.save()
    elastic = run(
        world,
        submit(
            world, name="grown", queue="low", gpu_spec="1(A100)", cpu=8, memory_gib=16, elastic_min=2, elastic_max=4
        ),
    )
    assert elastic.replicas == 4
    held = {"cpu": Decimal(32), "memory_gib": Decimal(64), "gpu": Decimal(4)}
    assert (elastic.held_cpu, elastic.held_memory_gib, elastic.allocated_gpu) == tuple(held.values())

    api = client_for(world.member).get(f"/api/v1/vdcs/{world.vdc.pk}/resources/").data["allocated"]
    assert {k: Decimal(api[k]) for k in held} == held
    settings.METRICS_TOKEN = "grown"
    metrics = client.get("/metrics", HTTP_AUTHORIZATION="Bearer grown").content.decode()
    for resource, value in held.items():
        line = f'hcs_project_allocated{{project="{world.project.name}",resource="{resource}",vdc="{world.vdc.name}"}}'
        assert f"{line} {float(value)}" in metrics
    request = RequestFactory().get("/admin/vdc/projectquota/")
    request.user = world.admin
    quota = admin_site._registry[ProjectQuota].get_queryset(request).get(pk=world.quota.pk)
    assert (quota.used_cpu, quota.used_memory, quota.used_gpu) == tuple(held.values())
    client.force_login(world.member)
    row = next(r for r in client.get("/").context["quota_rows"] if r["quota"].pk == world.quota.pk)
    assert [meter["used"] for meter in row["resources"]] == list(held.values())


def test_elastic_shrink_reaches_the_backend_and_frees_devices_only_once_it_confirms(k8s):
    world = k8s
    elastic = run(world, submit(world, name="elastic", queue="low", gpu_spec="1(A100)", elastic_min=1, elastic_max=4))
    assert elastic.replicas == 4 and float(elastic.allocated_gpu) == 4.0  # grew into the idle node
    name = elastic.external_id.split("/")[-1]
    assert stored(world.emulator, JOBS, NS)[name]["spec"]["parallelism"] == 4

    high = submit(world, name="urgent", queue="high", gpu_spec="2(A100)")
    run_cycle(world.vdc.pk)
    elastic.refresh_from_db()
    high.refresh_from_db()
    assert high.status == "scheduled"
    # What it gives back leaves its placement and its bill at once, as a preemption's would: no card is counted twice.
    assert len(elastic.placement) == 2 and float(elastic.allocated_gpu) == 2.0 and elastic.replicas == 2
    assert_allocation_agrees(world, cpu=2 + 1, gpu=2 + 2)  # /metrics and the API count the same
    assert billed_cards(elastic) == 2
    assert len(intent(elastic).device_ids) == 4  # its job still holds all four until the backend lets go

    assert launch(high) is None  # its devices are still in use on the backend
    high.refresh_from_db()
    assert "to release its devices" in high.status_message
    reconcile_cluster(world.k8s_cluster.pk)  # pushes the shrink
    job = stored(world.emulator, JOBS, NS)[name]
    assert (job["spec"]["parallelism"], job["spec"]["completions"]) == (2, 2)
    assert launch(high) is None  # requested, not yet confirmed: the pods still run

    controller(world.emulator, name)  # the Job controller removes indexes 2 and 3
    reconcile_cluster(world.k8s_cluster.pk)
    elastic.refresh_from_db()
    assert float(elastic.allocated_gpu) == 2.0 and elastic.replicas == 2 and len(intent(elastic).device_ids) == 2
    assert "the cards it gave back are free" in elastic.events.filter(kind="resized").last().message
    assert launch(high) == world.k8s_cluster.pk  # now it may run on them
    high.refresh_from_db()
    controller(world.emulator, high.external_id.split("/")[-1])
    reconcile_cluster(world.k8s_cluster.pk)
    assert_consistent(world)

    # The high task ends: the elastic one grows back, and the backend is told.
    world.emulator.objects[JOBS, NS, high.external_id.split("/")[-1]].patch(
        {"status": {"conditions": [{"type": "Complete", "status": "True"}], "succeeded": 1}}
    )
    reconcile_cluster(world.k8s_cluster.pk)
    high.refresh_from_db()
    assert high.status == "completed"
    run_cycle(world.vdc.pk)
    elastic.refresh_from_db()
    assert len(elastic.placement) == 4
    reconcile_cluster(world.k8s_cluster.pk)
    assert stored(world.emulator, JOBS, NS)[name]["spec"]["parallelism"] == 4
    controller(world.emulator, name)
    assert_consistent(world)


def test_replicas_an_hpa_adds_or_removes_are_read_back_into_quotas_and_billing(k8s):
    world = k8s
    service = run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            autoscale_min=1,
            autoscale_max=3,
        ),
    )
    name = service.external_id.split("/")[-1]
    assert service.replicas == 1 and float(service.allocated_gpu) == 1.0

    world.emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": 3}})  # the HPA scales up
    controller(world.emulator, name)
    reconcile_cluster(world.k8s_cluster.pk)

    service.refresh_from_db()
    assert service.replicas == 3 and float(service.allocated_gpu) == 3.0
    devices = [d["id"] for p in service.placement for d in p["devices"]]
    assert len(set(devices)) == 3  # three distinct cards of the node
    event = service.events.filter(kind="resized").last()
    assert "runs 3 replicas (was 1)" in event.message and event.data["by"] == "backend"
    assert sorted(intent(service).device_ids) == sorted(devices)
    assert_consistent(world)
    other = submit(world, name="other", queue="high", gpu_spec="2(A100)")
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "queued"  # only one card is left: the engine counts the HPA's replicas

    world.emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": 1}})  # and down again
    controller(world.emulator, name)
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert service.replicas == 1 and float(service.allocated_gpu) == 1.0
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "scheduled"


def test_node_conditions_and_cordons_reach_the_snapshot(k8s):
    world = k8s
    task = run(world, submit(world, name="on-node", queue="high", gpu_spec="1(A100)"))
    node = world.emulator.objects["v1/nodes", None, "k8s-node-1"]

    node.patch({"spec": {"unschedulable": True}})
    check_cluster_health(world.k8s_cluster)
    world.k8s_node.refresh_from_db()
    assert (world.k8s_node.backend_state, world.k8s_node.effective_status) == ("draining", "draining")
    task.refresh_from_db()
    assert task.status == "running"  # a cordon lets what runs finish
    waiting = submit(world, name="later", queue="high", gpu_spec="1(A100)")
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "queued"

    not_ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "PLEG is not healthy"}
    node.patch({"spec": {"unschedulable": False}, "status": {"conditions": [not_ready]}})
    check_cluster_health(world.k8s_cluster)
    task.refresh_from_db()
    assert task.status == "preempted" and "KubeletNotReady" in task.status_message
    assert BackendObject.objects.get(task=task).state == ObjectState.ACTIVE  # its workload is cancelled next
    reconcile_cluster(world.k8s_cluster.pk)
    assert stored(world.emulator, JOBS, NS) == {}

    node.patch({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    check_cluster_health(world.k8s_cluster)
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.status == "scheduled"


def test_discover_nodes_reads_nodes_cores_memory_and_cards_from_the_api(k8s):
    # Kubernetes clusters had no node discovery; their nodes and cards were typed in by hand.
    from apps.clusters.services import discover_nodes

    k8s.emulator.objects["v1/nodes", None, "k8s-node-2"] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "k8s-node-2", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "63500m", "memory": "515437416Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "addresses": [{"type": "InternalIP", "address": "10.0.0.12"}],
        },
    }
    k8s.emulator.objects["v1/nodes", None, "k8s-node-3"] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "k8s-node-3"},
        "status": {"allocatable": {"cpu": "32", "memory": "128Gi", "example.com/npu-x": "4"}},
    }
    found = discover_nodes(k8s.k8s_cluster)
    nodes = {n.name: n for n in found.nodes}
    assert set(nodes) == {"k8s-node-1", "k8s-node-2", "k8s-node-3"} and found.created == 2
    new = nodes["k8s-node-2"]
    assert (new.cpu, round(new.memory_gib)) == (Decimal("63.5"), 492)
    assert [d.gpu_model.name for d in new.devices.order_by("index")] == ["A100-80G"] * 8
    # k8s-node-1 reports no cards any more: its four are marked missing, not deleted.
    missing = [f"k8s-node-1#{i}: not reported by the backend any more: marked missing" for i in range(4)]
    assert found.notes == [
        *missing,
        "k8s-node-3: 4 x example.com/npu-x of a model the catalog does not name "
        "(new model: add it to the GPU catalog or label the cluster)",
    ]
    assert not nodes["k8s-node-3"].devices.exists()
    # Discovered cards take work: an 8-card task fits only on the new node.
    k8s.quota.limit_gpu = 16
    k8s.quota.save()
    task = submit(k8s, gpu_spec="8(A100)", name="big", queue="high")
    run_cycle(k8s.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled" and task.placement[0]["node_name"] == "k8s-node-2"


def test_discovery_marks_cards_the_backend_no_longer_reports_missing_and_keeps_their_rows(k8s):
    # A node reporting fewer cards must not delete card rows: a card that comes back would get a new id, the engine
    # would see it free while a job still uses it, and it would be held twice.
    from apps.clusters.services import discover_nodes

    task = submit(k8s, gpu_spec="2(A100)", name="holder", queue="high")
    run_cycle(k8s.vdc.pk)
    task.refresh_from_db()
    held = {d["id"] for p in task.placement for d in p["devices"]}
    assert task.status == "scheduled" and len(held) == 2
    rows = dict(k8s.k8s_node.devices.values_list("index", "pk"))
    node = k8s.emulator.objects["v1/nodes", None, "k8s-node-1"]
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    status = {"conditions": [{"type": "Ready", "status": "True"}], "allocatable": {"cpu": "64", "memory": "512Gi"}}
    no_cards = {**status["allocatable"], "nvidia.com/gpu": "0"}
    node.patch({"metadata": {"labels": labels}, "status": {**status, "allocatable": no_cards}})
    found = discover_nodes(k8s.k8s_cluster)
    assert dict(k8s.k8s_node.devices.values_list("index", "pk")) == rows
    assert not k8s.k8s_node.devices.present().exists()
    assert sorted(found.notes) == sorted(
        f"k8s-node-1#{i}: not reported by the backend any more: marked missing" for i in rows
    )
    task.refresh_from_db()
    assert task.status == "scheduled" and {d["id"] for p in task.placement for d in p["devices"]} == held

    node.patch({"status": {"allocatable": {**status["allocatable"], "nvidia.com/gpu": "4"}}})
    discover_nodes(k8s.k8s_cluster)
    assert dict(k8s.k8s_node.devices.values_list("index", "pk")) == rows
    present = set(k8s.k8s_node.devices.present().values_list("pk", flat=True))
    assert present == {rows[i] for i in range(4)}
    other = submit(k8s, gpu_spec="2(A100)", name="beside", queue="high")
    run_cycle(k8s.vdc.pk)
    other.refresh_from_db()
    got = {d["id"] for p in other.placement for d in p["devices"]}
    # Two free present cards are enough; the holder's cards are never given out again.
    assert (other.status == "scheduled" and got <= present - held) if len(present - held) >= 2 else not got
    assert not got & held


def test_an_inference_services_autoscaling_reaches_its_hpa_with_the_users_numbers(k8s):
    # A service asked for 1-4 replicas at cpu 60 / gpu 70 got an HPA with min = max = 1 and cpu 80 (the
    # execution service wrote autoscale_* keys, the manifest builder read min_replicas / target_*_utilization).
    world = k8s
    service = run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            autoscale_min=1,
            autoscale_max=4,
            autoscale_cpu_percent=60,
            autoscale_gpu_percent=70,
        ),
    )
    name = service.external_id.split("/")[-1]
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, name]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
    metrics = {m["type"]: m for m in hpa["spec"]["metrics"]}
    assert metrics["Resource"]["resource"] == {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": 60},
    }
    assert metrics["Pods"]["pods"]["target"] == {"type": "AverageValue", "averageValue": "70"}


def test_a_forecast_that_earns_its_place_reaches_the_hpa_as_its_minimum(k8s):
    import time

    from apps.control import autoscaling
    from apps.queues.engine.forecast import Backtest
    from apps.tasks.models import ServiceLoadSample

    world = k8s
    service = run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            autoscale_min=1,
            autoscale_max=4,
            autoscale_rps=10,
            autoscale_predictive=True,
        ),
    )
    name = service.external_id.split("/")[-1]
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, name]
    assert hpa["spec"]["minReplicas"] == 1
    bucket = autoscaling.bucket_start(time.time())
    ServiceLoadSample.objects.bulk_create(
        ServiceLoadSample(task=service, start=bucket + timedelta(seconds=autoscaling.BUCKET_S * i), forecast_rps=25.0)
        for i in range(3)
    )
    autoscaling._keep_backtest(service.pk, bucket, Backtest(24, 0.05, 0.2, 0.3))
    autoscaling.apply_to_backend(service.pk)
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, name]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 4)  # ceil(25 / 10)
    autoscaling._keep_backtest(service.pk, bucket, Backtest(24, 0.5, 0.2, 0.3))  # no longer beats last value
    autoscaling.apply_to_backend(service.pk)
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, name]
    assert hpa["spec"]["minReplicas"] == 1


def test_autoscaling_edited_while_the_service_runs_patches_its_hpa(
    k8s, settings, monkeypatch, django_capture_on_commit_callbacks
):
    from celery_app.app import app as celery

    # The job the edit queues on commit runs at once. Set on the Celery app itself: once an earlier test of the
    # session set (and restored) the key there, the Django setting is no longer read.
    monkeypatch.setitem(celery.conf, "task_always_eager", True)
    settings.CELERY_TASK_ALWAYS_EAGER = True
    world = k8s
    service = run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            autoscale_min=1,
            autoscale_max=2,
            autoscale_gpu_percent=70,
        ),
    )
    with django_capture_on_commit_callbacks(execute=True):
        update_autoscaling(service, world.member, autoscale_min=2, autoscale_max=3, autoscale_rps=40)
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, service.external_id.split("/")[-1]]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 3)
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300
    names = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert names == {"DCGM_FI_DEV_GPU_UTIL", "http_requests_per_second"}
    assert not service.events.filter(kind="backend_error").exists()

    with django_capture_on_commit_callbacks(execute=True):
        update_autoscaling(service, world.member, autoscale_gpu_percent=None, autoscale_concurrency=12)
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, service.external_id.split("/")[-1]]
    pods = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert pods == {
        "http_requests_per_second": {"type": "AverageValue", "averageValue": "40"},
        "http_requests_in_flight": {"type": "AverageValue", "averageValue": "12"},
    }


def test_a_readiness_path_becomes_the_probe_and_ready_replicas_follow_the_backend(k8s, client):
    # The inference readiness probe had no field feeding it, so every replica counted as ready at once.
    world = k8s
    service = run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            instances=2,
            readiness_path="/health?full=1",
            autoscale_memory_percent=75,
        ),
    )
    name = service.external_id.split("/")[-1]
    deployment = world.emulator.objects[DEPLOYMENTS, NS, name]
    probe = deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"] == {"path": "/health?full=1", "port": 8080}
    hpa = world.emulator.objects["autoscaling/v2/horizontalpodautoscalers", NS, name]
    memory = [m for m in hpa["spec"]["metrics"] if m.get("resource", {}).get("name") == "memory"]
    assert memory[0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 75}

    deployment.patch({"status": {"readyReplicas": 0}})  # both replicas run; neither answers its probe yet
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert (service.status, service.replicas, service.ready_replicas) == ("running", 2, 0)
    deployment.patch({"status": {"readyReplicas": 2}})
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert service.ready_replicas == 2
    assert client_for(world.member).get(f"/api/v1/tasks/{service.pk}/").data["ready_replicas"] == 2
    client.force_login(world.member)
    page = client.get(f"/task-monitoring/{service.pk}/").content.decode()
    assert "<code>GET /health?full=1</code> · 2 of 2 replicas ready" in page


def test_a_malformed_readiness_path_is_refused_with_what_was_expected(k8s):
    response = client_for(k8s.member).post(
        "/api/v1/tasks/",
        {
            "project": k8s.project.pk,
            "queue": "high",
            "name": "serve",
            "kind": "inference",
            "gpu_spec": "1(A100)",
            "image": "busybox:1.36",
            "command": "serve",
            "port": 8080,
            "readiness_path": "http://evil/health",
        },
        format="json",
    )
    assert response.status_code == 400
    assert "Expected an HTTP path starting with / (e.g. /health)" in str(response.data["readiness_path"])
    assert not Task.objects.filter(name="serve").exists()


def hpa_scales(emulator, name: str, replicas: int) -> None:  # noqa: F811
    """Play the HPA and the Deployment controller without free cards: the Deployment is set to ``replicas`` and the
    pods it adds wait unscheduled (Pending, no node), as the cards they need are held by others."""
    emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": replicas}})
    labels = stored(emulator, DEPLOYMENTS, NS)[name]["spec"]["template"]["metadata"]["labels"]
    for index in range(replicas):
        key = (PODS, NS, f"{name}-{index}")
        if key not in emulator.objects or emulator.objects[key].deleted:
            emulator.objects[key] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-{index}", "namespace": NS, "labels": labels},
                "spec": {"containers": [{"name": "main", "image": "busybox"}]},
                "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False"}]},
            }


def pods_find_cards(emulator, name: str, node: str = "k8s-node-1") -> None:  # noqa: F811
    """Play the Kubernetes scheduler once cards are free: the waiting pods are bound and run."""
    for (resource, _namespace, pod_name), obj in list(emulator.objects.items()):
        ours = resource.plural == "pods" and pod_name.startswith(f"{name}-") and not obj.deleted
        if ours and not obj["spec"].get("nodeName"):
            obj.patch({"spec": {"nodeName": node}, "status": {"phase": "Running", "conditions": []}})
    replicas = stored(emulator, DEPLOYMENTS, NS)[name]["spec"]["replicas"]
    emulator.objects[DEPLOYMENTS, NS, name].patch({"status": {"replicas": replicas, "availableReplicas": replicas}})


def high_service(world) -> Task:
    return run(
        world,
        submit(
            world,
            name="serve",
            kind="inference",
            queue="high",
            gpu_spec="1(A100)",
            port=8080,
            autoscale_min=1,
            autoscale_max=3,
        ),
    )


def test_an_hpa_scale_up_of_a_high_service_preempts_low_work_holding_the_cards(
    k8s, client, django_capture_on_commit_callbacks
):
    from apps.control import triggers

    # The HPA of a high service asked for 3 replicas while a low task held the cards: its pods waited unscheduled,
    # the service stayed at 1 replica, the low task kept its cards, and nothing said so.
    world = k8s
    service = high_service(world)
    low = run(world, submit(world, name="batch", queue="low", gpu_spec="3(A100)"))
    name = service.external_id.split("/")[-1]

    hpa_scales(world.emulator, name, 3)
    with django_capture_on_commit_callbacks() as callbacks:
        reconcile_cluster(world.k8s_cluster.pk)
    assert triggers.request_cycle in callbacks  # the wish asks for a cycle
    service.refresh_from_db()
    assert service.autoscale_desired == 3 and service.replicas == 1  # the wish, not yet granted
    wish = service.events.filter(kind="autoscaled").last()
    assert wish.message == f"The HPA of {world.k8s_cluster.name} asks for 3 replicas (more; runs 1)"
    assert wish.data["by"] == "backend"
    client.force_login(world.member)
    assert "its HPA asks for 3" in client.get(f"/task-monitoring/{service.pk}/").content.decode()

    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    service.refresh_from_db()
    assert low.status == "suspended" and low.placement == []
    suspended = low.events.filter(kind="suspended").last()
    assert suspended is not None and suspended.data["by_task"] == service.pk
    assert service.replicas == 3 and float(service.allocated_gpu) == 3.0
    granted = {d["id"] for p in service.placement for d in p["devices"]}
    assert len(granted) == 3

    reconcile_cluster(world.k8s_cluster.pk)  # the low task's Job is cancelled
    assert stored(world.emulator, JOBS, NS) == {}
    pods_find_cards(world.emulator, name)
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert service.replicas == 3 and {d["id"] for p in service.placement for d in p["devices"]} == granted
    assert stored(world.emulator, DEPLOYMENTS, NS)[name]["spec"]["replicas"] == 3
    assert intent(service).replicas == 3 and sorted(intent(service).device_ids) == sorted(granted)
    assert "on the cards the portal granted" in service.events.filter(kind="resized").last().message
    assert_consistent(world)

    # The HPA scales down: the wish follows and the cards are given back once the pods are gone.
    world.emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": 1}})
    controller(world.emulator, name)
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert (service.autoscale_desired, service.replicas, float(service.allocated_gpu)) == (1, 1, 1.0)
    assert "asks for 1 replicas (fewer; runs 3)" in service.events.filter(kind="autoscaled").last().message
    run_cycle(world.vdc.pk)
    low.refresh_from_db()
    service.refresh_from_db()
    assert service.replicas == 1 and low.status == "scheduled"  # the freed cards take the low task again
    assert_consistent(world)


def test_an_hpa_scale_up_does_not_preempt_a_medium_task_inside_its_window_and_alerts_after_the_hold(k8s):
    from datetime import timedelta

    from django.utils import timezone

    from apps.billing import project_alerts
    from apps.billing.models import ProjectAlert

    world = k8s
    service = high_service(world)
    medium = run(
        world,
        submit(world, name="guaranteed", queue="medium", gpu_spec="3(A100)", expected_duration=timedelta(hours=2)),
    )
    assert medium.window is not None  # inside its guaranteed window
    name = service.external_id.split("/")[-1]

    hpa_scales(world.emulator, name, 3)
    reconcile_cluster(world.k8s_cluster.pk)
    run_cycle(world.vdc.pk)
    medium.refresh_from_db()
    service.refresh_from_db()
    assert medium.status == "running" and len(medium.placement) == 1
    assert (service.autoscale_desired, service.replicas) == (3, 1)  # the service waits

    now = timezone.now()
    project_alerts.refresh(now)
    alert = ProjectAlert.objects.get(key=f"service-grant:{service.pk}")
    assert alert.fired_at is None  # not before it held
    project_alerts.refresh(now + timedelta(minutes=11))
    alert.refresh_from_db()
    assert alert.fired_at is not None and "runs 1 of the 3 replicas its autoscaler asks for" in alert.message


def test_an_hpa_scale_down_gives_the_cards_back_once_its_pods_are_gone(k8s):
    world = k8s
    service = high_service(world)
    name = service.external_id.split("/")[-1]
    world.emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": 3}})  # the HPA scales up
    controller(world.emulator, name)  # free cards: the pods run at once
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert (service.autoscale_desired, service.replicas) == (3, 3)

    # The HPA scales down; the Deployment controller has not removed the pods yet.
    world.emulator.objects[DEPLOYMENTS, NS, name].patch({"spec": {"replicas": 1}})
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert (service.autoscale_desired, service.replicas) == (1, 3)
    run_cycle(world.vdc.pk)  # the engine gives back what the HPA no longer wants
    service.refresh_from_db()
    assert service.replicas == 1 and float(service.allocated_gpu) == 1.0
    assert len(intent(service).device_ids) == 3  # its pods still hold them

    other = submit(world, name="other", queue="high", gpu_spec="3(A100)")
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "queued"  # nothing is placed on cards the backend has not given back

    controller(world.emulator, name)  # the pods go
    reconcile_cluster(world.k8s_cluster.pk)
    service.refresh_from_db()
    assert service.replicas == 1 and len(intent(service).device_ids) == 1
    run_cycle(world.vdc.pk)
    other.refresh_from_db()
    assert other.status == "scheduled"
    assert launch(other) == world.k8s_cluster.pk
    assert_consistent(world)
