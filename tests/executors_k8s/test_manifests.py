"""Pure manifest builders: no server, just the dicts a JobSpec becomes."""

from __future__ import annotations

import pytest
from kubernetes import client

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import DeviceSlot, ExecutorError, NodePlacement
from tests.executors_k8s.specs import A100, ASCEND_910B, HYGON_K100, MLU370, on_node, spec


def env_of(manifest_container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in manifest_container["env"]}


def pod_template(workload: dict) -> dict:
    if workload["kind"] == "Pod":
        return workload["spec"]
    if workload["apiVersion"].startswith("batch.volcano.sh"):
        return workload["spec"]["tasks"][0]["template"]["spec"]
    return workload["spec"]["template"]["spec"]


def main_container(workload: dict) -> dict:
    return pod_template(workload)["containers"][0]


def test_every_object_carries_the_task_labels_and_the_specs_own_sanitised():
    s = spec(kind="inference", task_id=41, attempt=3, labels={"hcs/task-id": "41", "team": "Vision Lab!"})
    objects = m.build_manifests(s, "ns", ingress_domain="apps.example.org")
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "Ingress", "HorizontalPodAutoscaler"]
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert labels["hcs.io/task-id"] == "41"
        assert labels["hcs.io/attempt"] == "3"
        assert labels["hcs.io/project"] == "vision"
        assert labels["app.kubernetes.io/managed-by"] == "hcs-portal"
        assert labels["hcs/task-id"] == "41"
        assert labels["team"] == "Vision-Lab"
        assert obj["metadata"]["namespace"] == "ns"
    assert objects[0]["spec"]["template"]["metadata"]["labels"]["hcs.io/name"] == s.name


@pytest.mark.parametrize(
    ("raw", "clean"),
    [("ok.value-1", "ok.value-1"), ("-bad start_", "bad-start"), ("ä" * 80, ""), ("x" * 80, "x" * 63)],
)
def test_label_values_are_sanitised(raw, clean):
    assert m.sanitize_label_value(raw) == clean


def test_label_keys_with_invalid_prefix_are_dropped():
    assert m.sanitize_label_key("Example.COM/tier") == "example.com/tier"
    assert m.sanitize_label_key("bad prefix!/tier") is None
    assert m.sanitize_label_key("!!!") is None


def test_long_or_odd_names_become_short_dns_labels():
    long_name = m.object_name(spec(name="Task_" + "x" * 90))
    assert len(long_name) <= m.MAX_NAME
    assert long_name.startswith("task-xxx")
    assert m.object_name(spec(name="42-train")) == "hcs-42-train"


def test_dev_env_jupyter_gets_port_and_command_service_and_ingress():
    s = spec(kind="dev_env", command="", settings={"ide": "jupyter", "ide_secret": "s3cret"}, time_limit_s=3600)
    pod, service, ingress = m.build_manifests(s, "ns", ingress_domain="apps.example.org", ingress_class="nginx")
    main = main_container(pod)
    assert pod["kind"] == "Pod"
    assert pod["spec"]["restartPolicy"] == "Always"
    assert pod["spec"]["activeDeadlineSeconds"] == 3600
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert main["ports"] == [{"name": "http", "containerPort": 8888, "protocol": "TCP"}]
    assert main["command"][:2] == ["/bin/sh", "-c"]
    assert "jupyter lab" in main["command"][2] and "--port=8888" in main["command"][2]
    assert env_of(main)["HCS_IDE_TOKEN"] == "s3cret"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8888, "targetPort": 8888}]
    assert service["spec"]["selector"] == {"hcs.io/name": s.name}
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == f"{s.name}.apps.example.org"
    assert rule["http"]["paths"][0]["backend"]["service"] == {"name": s.name, "port": {"number": 8888}}
    assert ingress["spec"]["ingressClassName"] == "nginx"


def test_dev_env_vscode_runs_code_server_and_the_specs_command_wins():
    vscode = spec(kind="dev_env", command="", settings={"ide": "vscode"})
    pod, service = m.build_manifests(vscode, "ns")  # no ingress domain, no Ingress
    assert "code-server --bind-addr 0.0.0.0:8080" in main_container(pod)["command"][2]
    assert service["spec"]["ports"][0]["port"] == 8080
    own = spec(kind="dev_env", command="sleep infinity", settings={"ide": "vscode", "port": 9000})
    pod, _ = m.build_manifests(own, "ns")
    assert main_container(pod)["command"] == ["/bin/sh", "-c", "sleep infinity"]
    assert main_container(pod)["ports"][0]["containerPort"] == 9000


def test_unknown_ide_is_refused_for_good():
    with pytest.raises(ExecutorError, match="Unknown IDE") as info:
        m.build_manifests(spec(kind="dev_env", settings={"ide": "emacs"}), "ns")
    assert info.value.retryable is False


def test_training_is_an_indexed_job_with_rank_env_and_a_headless_service():
    s = spec(instances=4, gpus_per_instance=8, gpu_model=A100, settings={"retries": 2, "master_port": 23456})
    job, service = m.build_manifests(s, "ns")
    assert job["apiVersion"] == "batch/v1"
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 4
    assert job["spec"]["backoffLimit"] == 2
    body = pod_template(job)
    assert body["subdomain"] == s.name
    assert body["restartPolicy"] == "Never"
    env = env_of(body["containers"][0])
    index_ref = {"fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["RANK"] == index_ref
    assert env["WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == f"{s.name}-0.{s.name}"
    assert env["MASTER_PORT"] == "23456"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["ports"][0]["port"] == 23456


def test_fine_tuning_builds_the_same_job_as_training():
    job, _ = m.build_manifests(spec(kind="fine_tuning", instances=2), "ns")
    assert job["spec"]["completionMode"] == "Indexed"


def test_volcano_flavour_builds_a_gang_scheduled_volcano_job():
    s = spec(instances=3, backend_flavour="volcano", settings={"volcano_queue": {"name": "research"}, "retries": 1})
    (vcjob,) = m.build_manifests(s, "ns")
    assert vcjob["apiVersion"] == "batch.volcano.sh/v1alpha1"
    assert vcjob["kind"] == "Job"
    assert vcjob["spec"]["minAvailable"] == 3
    assert vcjob["spec"]["queue"] == "research"
    assert vcjob["spec"]["schedulerName"] == "volcano"
    assert vcjob["spec"]["maxRetry"] == 1
    assert vcjob["spec"]["plugins"] == {"env": [], "svc": []}
    assert {"event": "PodFailed", "action": "RestartJob"} in vcjob["spec"]["policies"]
    (task,) = vcjob["spec"]["tasks"]
    assert task["replicas"] == 3
    main = task["template"]["spec"]["containers"][0]
    assert main["command"][2].startswith('export RANK="${VC_TASK_INDEX:-0}"')
    assert main["command"][2].endswith("echo hello")
    assert env_of(main)["MASTER_ADDR"] == f"{s.name}-worker-0.{s.name}"


def test_inference_has_deployment_service_ingress_and_hpa_with_gpu_metric():
    settings = {
        "replicas": 2,
        "min_replicas": 1,
        "max_replicas": 6,
        "target_cpu_utilization": 70,
        "target_memory_utilization": 75,
        "target_gpu_utilization": 60,
        "port": 9000,
        "health_path": "/healthz",
    }
    s = spec(kind="inference", settings=settings, gpus_per_instance=1, gpu_model=A100)
    deployment, service, ingress, hpa = m.build_manifests(s, "ns", ingress_domain="apps.example.org")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {"matchLabels": {"hcs.io/name": s.name}}
    assert main_container(deployment)["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 9000}
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": 9000}]
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"] == {"number": 80}
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": s.name}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 6)
    # The portal's own rules, written out: up at once by max(2n, n + 4), down after 300 s of lower readings.
    behaviour = hpa["spec"]["behavior"]
    assert behaviour["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert {(p["type"], p["value"]) for p in behaviour["scaleUp"]["policies"]} == {("Percent", 100), ("Pods", 4)}
    assert behaviour["scaleUp"]["selectPolicy"] == "Max"
    assert behaviour["scaleDown"]["stabilizationWindowSeconds"] == 300
    metrics = hpa["spec"]["metrics"]
    assert metrics[0]["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}
    assert metrics[1]["resource"]["name"] == "memory"
    assert metrics[2] == {
        "type": "Pods",
        "pods": {
            "metric": {"name": "DCGM_FI_DEV_GPU_UTIL"},
            "target": {"type": "AverageValue", "averageValue": "60"},
        },
    }


def test_inference_without_targets_scales_on_cpu():
    *_, hpa = m.build_manifests(spec(kind="inference"), "ns")
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"


def test_nvidia_injection_resource_visible_devices_and_driver_mount():
    s = spec(gpus_per_instance=2, gpu_model=A100, placements=on_node("gpu-node-1", 0, 1))
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "2"
    env = env_of(main)
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin chooses the two cards and sets it
    assert env["LD_LIBRARY_PATH"].startswith("/usr/local/nvidia/lib64")
    body = pod_template(job)
    assert {"name": "hcs-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia", "type": "Directory"}} in body[
        "volumes"
    ]
    assert {"name": "hcs-nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": True} in main["volumeMounts"]
    assert {"name": "hcs-shm", "mountPath": "/dev/shm"} in main["volumeMounts"]
    assert body["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    assert body["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def test_huawei_ascend_injection_and_hccl_hints_for_a_gang():
    s = spec(
        instances=2, gpus_per_instance=8, gpu_model=ASCEND_910B, placements=on_node("npu-1", *range(8), instances=2)
    )
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["limits"]["huawei.com/Ascend910"] == "8"
    env = env_of(main)
    assert "ASCEND_VISIBLE_DEVICES" not in env
    assert "/usr/local/Ascend/driver/lib64" in env["LD_LIBRARY_PATH"]
    assert env["HCCL_CONNECT_TIMEOUT"] == "1200"
    assert env["HCCL_WHITELIST_DISABLE"] == "1"
    assert "NCCL_IB_DISABLE" not in env
    paths = {v["hostPath"]["path"] for v in pod_template(job)["volumes"] if "hostPath" in v}
    assert {"/usr/local/Ascend/driver", "/usr/local/bin/npu-smi"} <= paths


def test_hygon_dcu_injection_mounts_rocm_and_kfd():
    s = spec(gpus_per_instance=1, gpu_model=HYGON_K100)
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["limits"]["hygon.com/dcu"] == "1"
    assert env_of(main)["ROCM_PATH"] == "/opt/rocm"
    volumes = {v["hostPath"]["path"]: v["hostPath"]["type"] for v in pod_template(job)["volumes"] if "hostPath" in v}
    assert volumes["/opt/rocm"] == "Directory"
    assert volumes["/dev/kfd"] == "CharDevice"


def test_cambricon_injection_mounts_neuware():
    job, _ = m.build_manifests(spec(gpus_per_instance=4, gpu_model=MLU370), "ns")
    assert main_container(job)["resources"]["limits"]["cambricon.com/mlu"] == "4"
    assert env_of(main_container(job))["NEUWARE_HOME"] == "/usr/local/neuware"


def test_nccl_hints_only_for_multi_instance_training_and_rdma_turns_ib_on():
    single, _ = m.build_manifests(spec(gpus_per_instance=1, gpu_model=A100), "ns")
    assert "NCCL_IB_DISABLE" not in env_of(main_container(single))
    gang, _ = m.build_manifests(spec(instances=2, gpus_per_instance=1, gpu_model=A100), "ns")
    env = env_of(main_container(gang))
    assert env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_SOCKET_IFNAME" not in env
    rdma, _ = m.build_manifests(spec(instances=2, gpus_per_instance=1, gpu_model=A100, settings={"rdma": True}), "ns")
    assert env_of(main_container(rdma))["NCCL_IB_DISABLE"] == "0"


def test_fraction_of_a_card_uses_hami_memory_percentage_and_cores():
    job, _ = m.build_manifests(spec(gpus_per_instance=0.5, gpu_model=A100), "ns")
    limits = main_container(job)["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert limits["nvidia.com/gpumem-percentage"] == "50"
    assert limits["nvidia.com/gpucores"] == "50"


def test_device_slot_with_vram_and_cores_uses_hami_gpumem_in_mib():
    placements = (NodePlacement("gpu-node-1", (DeviceSlot(index=3, fraction=0.25, vram_gib=16, cores_percent=30),)),)
    s = spec(kind="dev_env", gpus_per_instance=1, gpu_model=A100, placements=placements)
    pod, *_ = m.build_manifests(s, "ns")
    main = main_container(pod)
    assert main["resources"]["limits"] == {
        "cpu": "1",
        "memory": "1024Mi",
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "16384",
        "nvidia.com/gpucores": "30",
    }
    # HAMi picks the card and sets the visible devices itself.
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(main)


def test_hygon_fraction_uses_hami_dcu_resources():
    placements = on_node("dcu-1", 0, vram_gib=8, cores_percent=50)
    job, _ = m.build_manifests(spec(gpus_per_instance=0.5, gpu_model=HYGON_K100, placements=placements), "ns")
    limits = main_container(job)["resources"]["limits"]
    assert (limits["hygon.com/dcunum"], limits["hygon.com/dcumem"], limits["hygon.com/dcucores"]) == ("1", "8192", "50")


def test_fraction_on_a_vendor_without_sharing_is_refused():
    with pytest.raises(ExecutorError, match="Fractional GPUs are not supported for vendor 'huawei'"):
        m.build_manifests(spec(gpus_per_instance=0.5, gpu_model=ASCEND_910B), "ns")


def test_non_integer_card_counts_above_one_are_refused():
    with pytest.raises(ExecutorError, match="whole cards"):
        m.build_manifests(spec(gpus_per_instance=1.5, gpu_model=A100), "ns")


def test_instances_spread_over_nodes_get_a_node_affinity():
    placements = (NodePlacement("node-b"), NodePlacement("node-a"))
    job, _ = m.build_manifests(spec(instances=2, placements=placements), "ns")
    body = pod_template(job)
    assert "nodeSelector" not in body
    term = body["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a", "node-b"]}
    ]


def test_cpu_memory_volumes_and_user_env_override_injected_env():
    volumes = (
        {"name": "data", "mount_path": "/data", "claim_name": "datasets", "read_only": True},
        {"name": "scratch", "mount_path": "/scratch", "host_path": "/mnt/scratch"},
        {"name": "Ümlaut_Dir", "mount_path": "/u", "host_path": "/mnt/u"},
        {"name": "", "mount_path": "/anon", "host_path": "/mnt/anon"},
    )
    s = spec(
        cpu=2.5, memory_gib=1.5, volumes=volumes, env={"MASTER_PORT": "1234"}, settings={"allowed_host_paths": ["/mnt"]}
    )
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["requests"] == {"cpu": "2500m", "memory": "1536Mi"}
    assert env_of(main)["MASTER_PORT"] == "1234"
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}} in pod_template(job)["volumes"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in main["volumeMounts"]
    assert {"name": "scratch", "hostPath": {"path": "/mnt/scratch"}} in pod_template(job)["volumes"]
    assert [v["name"] for v in pod_template(job)["volumes"]][2:] == ["mlaut-dir", "vol-3"]


@pytest.mark.parametrize("gpus", [1, 0], ids=["with-a-card", "without-cards"])
def test_a_tasks_env_never_widens_the_cards_it_sees(gpus):
    """The container runtime reads NVIDIA_VISIBLE_DEVICES: the device plugin sets it for the cards it gave, and a
    task's own "all" (as a variable or a secret) is dropped, with or without cards."""
    s = spec(
        gpu_model=A100,
        gpus_per_instance=gpus,
        placements=on_node("gpu-1", 3) if gpus else (),
        env={"NVIDIA_VISIBLE_DEVICES": "all", "EPOCHS": "3"},
        secret_env={"ASCEND_VISIBLE_DEVICES": "all"},
    )
    job, _ = m.build_manifests(s, "ns")
    env = {entry["name"] for entry in main_container(job)["env"]}
    assert "EPOCHS" in env and not env & {"NVIDIA_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"}


SCRATCH = {"name": "scratch", "mount_path": "/scratch", "host_path": "/mnt/scratch"}


@pytest.mark.parametrize(
    ("approved", "path"),
    [
        (None, "/mnt/scratch"),
        ([], "/mnt/scratch"),
        (["/mnt/scratch"], "/mnt/scratch2"),
        (["/mnt"], "/"),
        (["/mnt"], "/mnt/../etc"),
        (["/"], "/etc"),
    ],
    ids=["no-setting", "none-approved", "sibling-of-a-prefix", "root", "dotdot", "root-prefix"],
)
def test_host_paths_outside_the_clusters_approved_prefixes_are_refused_for_good(approved, path):
    settings = {} if approved is None else {"allowed_host_paths": approved}
    s = spec(volumes=({**SCRATCH, "host_path": path},), settings=settings)
    with pytest.raises(ExecutorError, match="not approved on this cluster") as info:
        m.build_manifests(s, "ns")
    assert info.value.retryable is False


def test_host_paths_under_an_approved_prefix_are_mounted():
    s = spec(volumes=(SCRATCH,), settings={"allowed_host_paths": ["/mnt/scratch"]})
    job, _ = m.build_manifests(s, "ns")
    assert {"name": "scratch", "hostPath": {"path": "/mnt/scratch"}} in pod_template(job)["volumes"]


@pytest.mark.parametrize(
    "volume",
    [1, "a", {"name": "data"}, {"name": "data", "mount_path": "/data"}, {"mount_path": "/d", "host_path": 7}],
    ids=["number", "string", "no-mount-path", "no-source", "host-path-not-text"],
)
def test_malformed_volumes_are_refused_for_good_instead_of_crashing_the_launch(volume):
    with pytest.raises(ExecutorError, match="volume 1") as info:
        m.build_manifests(spec(volumes=(volume,), settings={"allowed_host_paths": ["/data"]}), "ns")
    assert info.value.retryable is False


def test_cpu_only_task_has_no_accelerator_parts():
    job, _ = m.build_manifests(spec(), "ns")
    body = pod_template(job)
    assert set(body["containers"][0]["resources"]["limits"]) == {"cpu", "memory"}
    assert "volumes" not in body and "tolerations" not in body


@pytest.mark.parametrize(
    ("overrides", "message"),
    [({"kind": "notebook"}, "Unknown task kind"), ({"image": ""}, "need an image"), ({"instances": 0}, "at least 1")],
)
def test_unbuildable_specs_are_refused_for_good(overrides, message):
    with pytest.raises(ExecutorError, match=message) as info:
        m.build_manifests(spec(**overrides), "ns")
    assert info.value.retryable is False


def test_external_ids_round_trip_and_garbage_is_refused():
    assert m.parse_external_id(m.external_id("ns", "job", "x")) == ("ns", "job", "x")
    with pytest.raises(ExecutorError, match="Not a Kubernetes job id"):
        m.parse_external_id("ns/statefulset/x")


_MODELS = {
    "Pod": "V1Pod",
    "Service": "V1Service",
    "Ingress": "V1Ingress",
    "HorizontalPodAutoscaler": "V2HorizontalPodAutoscaler",
    "Job": "V1Job",
    "Deployment": "V1Deployment",
}


@pytest.mark.parametrize(
    "overrides",
    [
        {"kind": "dev_env", "gpus_per_instance": 1, "gpu_model": ASCEND_910B, "placements": on_node("n", 1)},
        {"instances": 2, "gpus_per_instance": 0.5, "gpu_model": A100, "time_limit_s": 600},
        {
            "kind": "inference",
            "gpus_per_instance": 1,
            "gpu_model": HYGON_K100,
            "volumes": ({"name": "models", "mount_path": "/models", "claim_name": "models", "read_only": True},),
            "settings": {"target_gpu_utilization": 50, "target_memory_utilization": 70, "health_path": "/ready"},
        },
    ],
    ids=["dev_env", "training", "inference"],
)
def test_manifests_use_only_fields_of_the_official_models(overrides):
    """The client's models drop unknown fields, so a misspelt field makes the round trip differ."""
    api = client.ApiClient()
    for manifest in m.build_manifests(spec(**overrides), "ns", ingress_domain="apps.example.org"):
        model = getattr(client, _MODELS[manifest["kind"]]).from_dict(manifest)
        assert api.sanitize_for_serialization(model) == manifest


def test_secret_variables_are_references_never_values_in_the_workload():
    s = spec(env={"EPOCHS": "3"}, secret_env={"API_TOKEN": "s3cr3t"})
    workload = m.build_manifests(s, "gpu-jobs")[0]
    env = workload["spec"]["template"]["spec"]["containers"][0]["env"]
    name = m.object_name(s)
    assert {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": name, "key": "API_TOKEN"}}} in env
    assert "s3cr3t" not in str(workload)
    secret = m.secret_manifest(s, "gpu-jobs")
    assert secret["kind"] == "Secret" and secret["metadata"]["name"] == name
    assert secret["stringData"] == {"API_TOKEN": "s3cr3t"}
    assert m.secret_manifest(spec(), "gpu-jobs") is None


def test_inference_concurrency_target_is_a_pods_metric_of_the_hpa_beside_the_request_rate():
    targets = {"target_requests_per_second": 25, "target_requests_in_flight": 8}
    s = spec(kind="inference", settings={"min_replicas": 1, "max_replicas": 4, **targets})
    hpa = m.build_manifests(s, "ns")[-1]
    pods = {metric["pods"]["metric"]["name"]: metric["pods"]["target"] for metric in hpa["spec"]["metrics"]}
    assert pods == {
        "http_requests_per_second": {"type": "AverageValue", "averageValue": "25"},
        "http_requests_in_flight": {"type": "AverageValue", "averageValue": "8"},
    }


def test_inference_latency_target_is_a_pods_metric_of_the_hpa():
    s = spec(kind="inference", settings={"min_replicas": 1, "max_replicas": 4, "target_latency_ms": 250})
    hpa = m.build_manifests(s, "ns")[-1]
    pods = {metric["pods"]["metric"]["name"]: metric["pods"]["target"] for metric in hpa["spec"]["metrics"]}
    assert pods == {"http_request_duration_milliseconds": {"type": "AverageValue", "averageValue": "250"}}


def test_inference_request_rate_target_is_a_pods_metric_of_the_hpa():
    s = spec(kind="inference", settings={"min_replicas": 1, "max_replicas": 4, "target_requests_per_second": 25})
    hpa = m.build_manifests(s, "ns")[-1]
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "http_requests_per_second"},
                "target": {"type": "AverageValue", "averageValue": "25"},
            },
        }
    ]
