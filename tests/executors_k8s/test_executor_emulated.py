"""KubernetesExecutor against the kmock API emulator over HTTP, through the official client."""

from __future__ import annotations

import dataclasses

import kmock
import pytest
from kubernetes import client

from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.kubernetes import KubernetesExecutor
from tests.executors_k8s.emulation import ApiServerEmulator, stored
from tests.executors_k8s.specs import A100, ASCEND_910B, HYGON_K100, on_node, spec, volcano_queue

NS = "gpu-jobs"
ALL_RESOURCES = (
    "v1/pods",
    "v1/services",
    "networking.k8s.io/v1/ingresses",
    "autoscaling/v2/horizontalpodautoscalers",
    "batch/v1/jobs",
    "apps/v1/deployments",
    "batch.volcano.sh/v1alpha1/jobs",
)


def labelled_with_task(emulator: ApiServerEmulator, task_id: int) -> list[tuple[str, str]]:
    """(resource, name) of every live object in the emulator labelled with the task."""
    return [
        (f"{res.group}/{res.version}/{res.plural}".lstrip("/"), name)
        for (res, _, name), obj in emulator.objects.items()
        if not obj.deleted and obj.raw.get("metadata", {}).get("labels", {}).get("hcs.io/task-id") == str(task_id)
    ]


def add_pod(emulator: ApiServerEmulator, owner_name: str, pod_name: str, status: dict) -> None:
    """A pod as the Job / Deployment / Volcano controller would make it: the template's labels."""
    labels = {"hcs.io/name": owner_name}
    for resource in ("batch/v1/jobs", "apps/v1/deployments", "batch.volcano.sh/v1alpha1/jobs"):
        owner = stored(emulator, resource).get(owner_name)
        if owner is not None:
            spec = owner["spec"]
            template = spec["tasks"][0]["template"] if "tasks" in spec else spec["template"]
            labels = template["metadata"]["labels"]
    emulator.objects["v1/pods", NS, pod_name] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": NS, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "nodeName": "gpu-node-1"},
        "status": status,
    }


def waiting(reason: str, message: str = "") -> dict:
    return {
        "phase": "Pending",
        "containerStatuses": [
            {
                "name": "main",
                "ready": False,
                "restartCount": 0,
                "image": "busybox",
                "imageID": "",
                "state": {"waiting": {"reason": reason, "message": message}},
            }
        ],
    }


# --- submit: what lands in the API server ---------------------------------------------


def test_dev_env_submit_stores_pod_service_and_ingress(executor, emulator):
    s = spec(kind="dev_env", command="", settings={"ide": "vscode"}, gpus_per_instance=1, gpu_model=A100)
    ext_id = executor.submit(s)
    assert ext_id == f"{NS}/pod/{s.name}"
    pod = stored(emulator, "v1/pods")[s.name]
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 8080
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    service = stored(emulator, "v1/services")[s.name]
    assert service["spec"]["selector"] == {"hcs.io/name": s.name}
    ingress = stored(emulator, "networking.k8s.io/v1/ingresses")[s.name]
    assert ingress["spec"]["rules"][0]["host"] == f"{s.name}.apps.example.org"
    assert ingress["spec"]["ingressClassName"] == "nginx"
    # Dependents are owned by the workload, so the garbage collector removes them with it.
    owner = ingress["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Pod", s.name, pod["metadata"]["uid"])


def test_training_submit_stores_indexed_job_and_headless_service(executor, emulator):
    s = spec(
        instances=2, gpus_per_instance=4, gpu_model=A100, placements=on_node("gpu-node-1", 0, 1, 2, 3, instances=2)
    )
    assert executor.submit(s) == f"{NS}/job/{s.name}"
    job = stored(emulator, "batch/v1/jobs")[s.name]
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 2
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == f"{s.name}-0.{s.name}"
    assert "NVIDIA_VISIBLE_DEVICES" not in env  # the device plugin chooses the cards and sets it
    assert env["NCCL_IB_DISABLE"] == "1"
    assert stored(emulator, "v1/services")[s.name]["spec"]["clusterIP"] == "None"
    assert job["metadata"]["labels"]["hcs.io/workload"] == "job"


def test_volcano_submit_goes_through_custom_objects(executor, emulator):
    s = spec(instances=4, backend_flavour="volcano", settings={"volcano_queue": volcano_queue("gpu-high")})
    assert executor.submit(s) == f"{NS}/vcjob/{s.name}"
    vcjob = stored(emulator, "batch.volcano.sh/v1alpha1/jobs")[s.name]
    assert vcjob["spec"]["minAvailable"] == 4
    assert vcjob["spec"]["queue"] == "gpu-high"
    assert "gpu-high" in stored(emulator, "scheduling.volcano.sh/v1beta1/queues", None)  # made first
    assert vcjob["spec"]["tasks"][0]["replicas"] == 4
    assert stored(emulator, "batch/v1/jobs") == {}


def test_inference_submit_stores_deployment_service_ingress_and_hpa(executor, emulator):
    settings = {"replicas": 2, "max_replicas": 5, "target_gpu_utilization": 70}
    s = spec(kind="inference", settings=settings, gpus_per_instance=1, gpu_model=A100)
    assert executor.submit(s) == f"{NS}/deployment/{s.name}"
    assert stored(emulator, "apps/v1/deployments")[s.name]["spec"]["replicas"] == 2
    assert s.name in stored(emulator, "v1/services")
    assert s.name in stored(emulator, "networking.k8s.io/v1/ingresses")
    hpa = stored(emulator, "autoscaling/v2/horizontalpodautoscalers")[s.name]
    assert hpa["spec"]["maxReplicas"] == 5
    assert hpa["spec"]["metrics"][-1]["pods"]["metric"]["name"] == "DCGM_FI_DEV_GPU_UTIL"


@pytest.mark.parametrize(
    ("gpu_model", "gpus", "placements", "expected_limits", "expected_env", "mount"),
    [
        (
            A100,
            2,
            on_node("n", 4, 5),
            {"nvidia.com/gpu": "2"},
            {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
            "/usr/local/nvidia",
        ),
        (
            ASCEND_910B,
            1,
            on_node("n", 7),
            {"huawei.com/Ascend910": "1"},
            {"ASCEND_DRIVER_PATH": "/usr/local/Ascend/driver"},
            "/usr/local/Ascend/driver",
        ),
        (HYGON_K100, 1, on_node("n", 0), {"hygon.com/dcu": "1"}, {"ROCM_PATH": "/opt/rocm"}, "/dev/kfd"),
        (
            A100,
            0.5,
            on_node("n", 2, vram_gib=20, cores_percent=40),
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20480", "nvidia.com/gpucores": "40"},
            {},
            "/usr/local/nvidia",
        ),
    ],
    ids=["nvidia", "huawei-ascend", "hygon", "fractional-hami"],
)
def test_vendor_injection_as_stored(
    executor, emulator, gpu_model, gpus, placements, expected_limits, expected_env, mount
):
    s = spec(kind="dev_env", command="sleep 1d", gpus_per_instance=gpus, gpu_model=gpu_model, placements=placements)
    executor.submit(s)
    pod = stored(emulator, "v1/pods")[s.name]
    main = pod["spec"]["containers"][0]
    assert expected_limits.items() <= main["resources"]["limits"].items()
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert expected_env.items() <= env.items()
    assert gpu_model.visible_devices_env not in env  # the device plugin's to set, for the cards it chose
    assert mount in {v["hostPath"]["path"] for v in pod["spec"]["volumes"] if "hostPath" in v}
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "n"}


def test_submit_twice_keeps_the_existing_objects(executor, emulator):
    s = spec(kind="inference")
    first = executor.submit(s)
    assert executor.submit(s) == first
    assert len(stored(emulator, "apps/v1/deployments")) == 1
    # Each object was created once; the second round's POSTs answered 409 and changed nothing.
    assert len(emulator.objects["apps/v1/deployments", NS, s.name].history) == 1


def test_a_refused_manifest_surfaces_the_api_servers_message(executor, emulator):
    emulator["post /apis/batch/v1/namespaces/gpu-jobs/jobs"] << kmock.KubernetesError(
        status=422,
        reason="Invalid",
        message='Job.batch "x" is invalid: spec.template.spec.containers[0].image: Required',
    )
    with pytest.raises(ExecutorError) as info:
        executor.submit(spec())
    assert "422" in str(info.value)
    assert "spec.template.spec.containers[0].image: Required" in str(info.value)
    assert info.value.retryable is False


def test_forbidden_is_final_and_server_errors_are_retryable(executor, emulator):
    emulator["get /apis/batch/v1/namespaces/gpu-jobs/jobs/forbidden"] << kmock.KubernetesError(
        status=403, reason="Forbidden", message='jobs.batch "forbidden" is forbidden: User "hcs" cannot get'
    )
    emulator["get /apis/batch/v1/namespaces/gpu-jobs/jobs/flaky"] << kmock.KubernetesError(
        status=503, reason="ServiceUnavailable", message="etcdserver: leader changed"
    )
    with pytest.raises(ExecutorError, match="cannot get") as forbidden:
        executor.status(f"{NS}/job/forbidden")
    assert forbidden.value.retryable is False
    with pytest.raises(ExecutorError, match="leader changed") as flaky:
        executor.status(f"{NS}/job/flaky")
    assert flaky.value.retryable is True


def test_unreachable_api_server_is_a_retryable_error():
    configuration = client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # discard port: nothing listens
    configuration.retries = 0
    executor = KubernetesExecutor(client.ApiClient(configuration))
    with pytest.raises(ExecutorError, match="unreachable") as info:
        executor.health()
    assert info.value.retryable is True


# --- status ----------------------------------------------------------------------------


def test_pod_phases_map_to_job_phases(executor, emulator):
    s = spec(kind="dev_env", command="sleep 1d")
    ext_id = executor.submit(s)
    pod = emulator.objects["v1/pods", NS, s.name]

    pod.patch({"status": waiting("ImagePullBackOff", 'Back-off pulling image "busybox:nope"')})
    state = executor.status(ext_id)
    assert (state.phase, state.message) == (JobPhase.PENDING, 'ImagePullBackOff: Back-off pulling image "busybox:nope"')

    pod.patch(
        {
            "status": {
                "phase": "Pending",
                "containerStatuses": None,
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    }
                ],
            }
        }
    )
    state = executor.status(ext_id)
    assert state.phase == JobPhase.PENDING
    assert state.message == "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."

    pod.patch({"status": {"phase": "Running", "conditions": None, "startTime": "2026-11-21T04:00:00Z"}})
    state = executor.status(ext_id)
    assert state.phase == JobPhase.RUNNING
    assert state.started_at.isoformat() == "2026-11-21T04:00:00+00:00"
    assert state.objects[0] == {"kind": "Pod", "name": s.name, "namespace": NS, "node": ""}
    assert state.objects[-1]["host"] == f"{s.name}.apps.example.org"

    terminated = {"terminated": {"exitCode": 3, "reason": "Error", "finishedAt": "2026-11-21T05:00:00Z"}}
    container_status = {"name": "main", "ready": False, "restartCount": 0, "image": "b", "imageID": ""}
    pod.patch({"status": {"phase": "Failed", "containerStatuses": [{**container_status, "state": terminated}]}})
    state = executor.status(ext_id)
    assert (state.phase, state.exit_code, state.message) == (JobPhase.FAILED, 3, "Error")
    assert state.finished_at.isoformat() == "2026-11-21T05:00:00+00:00"


def test_invalid_image_name_is_a_failure_not_a_wait(executor, emulator):
    s = spec(kind="dev_env", command="true")
    ext_id = executor.submit(s)
    emulator.objects["v1/pods", NS, s.name].patch({"status": waiting("InvalidImageName", "couldn't parse image")})
    assert executor.status(ext_id).phase == JobPhase.FAILED


def test_job_status_follows_conditions_counts_and_pods(executor, emulator):
    s = spec(task_id=501, instances=2)
    ext_id = executor.submit(s)
    job = emulator.objects["batch/v1/jobs", NS, s.name]

    add_pod(emulator, s.name, f"{s.name}-0-abcde", waiting("ErrImagePull", "manifest unknown"))
    state = executor.status(ext_id)
    assert (state.phase, state.message) == (JobPhase.PENDING, "ErrImagePull: manifest unknown")

    job.patch({"status": {"active": 2, "startTime": "2026-11-21T04:00:00Z"}})
    add_pod(emulator, s.name, f"{s.name}-0-abcde", {"phase": "Running"})
    add_pod(emulator, s.name, f"{s.name}-1-fghij", {"phase": "Running"})
    state = executor.status(ext_id)
    assert state.phase == JobPhase.RUNNING
    assert state.message == "2 active, 0 succeeded, 0 failed of 2"
    assert [o["name"] for o in state.objects[1:]] == [f"{s.name}-0-abcde", f"{s.name}-1-fghij"]

    job.patch(
        {
            "status": {
                "active": 0,
                "failed": 1,
                "conditions": [
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastTransitionTime": "2026-11-21T04:30:00Z",
                    }
                ],
            }
        }
    )
    state = executor.status(ext_id)
    assert state.phase == JobPhase.FAILED
    assert state.message == "BackoffLimitExceeded: Job has reached the specified backoff limit"

    job.patch(
        {
            "status": {
                "succeeded": 2,
                "completionTime": "2026-11-21T04:40:00Z",
                "conditions": [{"type": "Complete", "status": "True"}],
            }
        }
    )
    state = executor.status(ext_id)
    assert (state.phase, state.exit_code) == (JobPhase.SUCCEEDED, 0)


def test_deployment_runs_when_a_replica_is_available(executor, emulator):
    s = spec(kind="inference", settings={"replicas": 3})
    ext_id = executor.submit(s)
    deployment = emulator.objects["apps/v1/deployments", NS, s.name]
    assert executor.status(ext_id).phase == JobPhase.PENDING
    deployment.patch({"status": {"availableReplicas": 2, "replicas": 3}})
    state = executor.status(ext_id)
    assert (state.phase, state.message) == (JobPhase.RUNNING, "2/3 replicas available")
    deployment.patch(
        {
            "status": {
                "availableReplicas": 0,
                "conditions": [
                    {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded", "message": "slow"}
                ],
            }
        }
    )
    assert executor.status(ext_id).phase == JobPhase.FAILED


@pytest.mark.parametrize(
    ("volcano_phase", "expected"),
    [
        ("Pending", JobPhase.PENDING),
        ("Inqueue", JobPhase.PENDING),
        ("Running", JobPhase.RUNNING),
        ("Completed", JobPhase.SUCCEEDED),
        ("Failed", JobPhase.FAILED),
        ("Aborted", JobPhase.CANCELLED),
    ],
)
def test_volcano_phase_maps_to_job_phase(executor, emulator, volcano_phase, expected):
    s = spec(instances=2, backend_flavour="volcano")
    ext_id = executor.submit(s)
    emulator.objects["batch.volcano.sh/v1alpha1/jobs", NS, s.name].patch(
        {"status": {"state": {"phase": volcano_phase, "reason": "", "message": ""}}}
    )
    assert executor.status(ext_id).phase == expected


def test_a_workload_the_cluster_no_longer_knows_is_lost(executor):
    state = executor.status(f"{NS}/job/hcs-task-404-1")
    assert state.phase == JobPhase.LOST
    assert "not found" in state.message


# --- logs, stop, delete, list ------------------------------------------------------------


def test_logs_tail_every_pod_of_the_task(executor, emulator):
    s = spec(instances=2)
    ext_id = executor.submit(s)
    add_pod(emulator, s.name, f"{s.name}-0-aaaaa", {"phase": "Running"})
    add_pod(emulator, s.name, f"{s.name}-1-bbbbb", {"phase": "Running"})
    emulator[f"get /api/v1/namespaces/{NS}/pods/{s.name}-0-aaaaa/log"] << kmock.text("rank 0: step 10\n")
    emulator[f"get /api/v1/namespaces/{NS}/pods/{s.name}-1-bbbbb/log"] << kmock.text("rank 1: step 10\n")
    text = executor.logs(ext_id, tail=5)
    assert text == (f"==> {s.name}-0-aaaaa <==\nrank 0: step 10\n\n==> {s.name}-1-bbbbb <==\nrank 1: step 10\n")
    log_requests = emulator[f"get /api/v1/namespaces/{NS}/pods/{s.name}-0-aaaaa/log"]
    assert log_requests[0].params["tailLines"] == "5"
    assert log_requests[0].params["container"] == "main"


def test_logs_of_a_single_pod_are_plain_and_none_is_empty(executor, emulator):
    s = spec(kind="dev_env", command="sleep 1d")
    ext_id = executor.submit(s)
    emulator[f"get /api/v1/namespaces/{NS}/pods/{s.name}/log"] << kmock.text("listening on 8888\n")
    assert executor.logs(ext_id) == "listening on 8888\n"
    assert executor.logs(f"{NS}/job/hcs-task-0-1") == ""


def test_stop_deletes_the_workload_with_foreground_propagation(executor, emulator):
    s = spec(kind="inference")
    ext_id = executor.submit(s)
    executor.stop(ext_id)
    assert stored(emulator, "apps/v1/deployments") == {}
    assert s.name in stored(emulator, "v1/services")  # until delete()
    deletes = emulator[kmock.action.DELETE]
    assert deletes[0].params["propagationPolicy"] == "Foreground"
    assert executor.status(ext_id).phase == JobPhase.LOST
    executor.stop(ext_id)  # already gone: no error


@pytest.mark.parametrize(
    "overrides",
    [
        {"kind": "dev_env", "command": "sleep 1d"},
        {"kind": "training", "instances": 2},
        {"kind": "training", "instances": 2, "backend_flavour": "volcano"},
        {"kind": "inference"},
    ],
    ids=["dev_env", "training", "volcano", "inference"],
)
def test_delete_removes_everything_labelled_with_the_task(executor, emulator, overrides):
    s = spec(task_id=777, **overrides)
    other = spec(task_id=778, **overrides)
    ext_id = executor.submit(s)
    executor.submit(other)
    add_pod(emulator, s.name, f"{s.name}-0-zzzzz", {"phase": "Running"})
    assert len(labelled_with_task(emulator, 777)) >= 2
    executor.delete(ext_id)
    assert labelled_with_task(emulator, 777) == []
    assert not [name for (_, _, name), obj in emulator.objects.items() if not obj.deleted and name.startswith(s.name)]
    assert labelled_with_task(emulator, 778) != []
    executor.delete(ext_id)  # nothing left: no error


def test_list_by_owner_finds_workloads_by_label_only(executor, emulator):
    mine = [
        spec(kind="dev_env", project="vision", labels={"hcs/project": "vision"}),
        spec(kind="training", project="vision", labels={"hcs/project": "vision"}),
        spec(kind="inference", project="vision", labels={"hcs/project": "vision"}),
        spec(backend_flavour="volcano", project="vision", labels={"hcs/project": "vision"}),
    ]
    theirs = spec(kind="training", project="speech", labels={"hcs/project": "speech"})
    ids = {executor.submit(s) for s in mine}
    executor.submit(theirs)
    # A Job's pod carries the task labels too, but it is not a workload of its own.
    add_pod(emulator, mine[1].name, f"{mine[1].name}-0-ppppp", {"phase": "Running"})
    states = executor.list_by_owner({"hcs/project": "vision"})
    assert {state.external_id for state in states} == ids
    only_training = executor.list_by_owner({"hcs.io/task-id": str(mine[1].task_id)})
    assert [state.external_id for state in only_training] == [f"{NS}/job/{mine[1].name}"]
    assert only_training[0].phase == JobPhase.RUNNING


def test_health_reports_the_api_server_version(executor):
    assert executor.health().startswith("Kubernetes v1.26.4+k3s1")


def test_executor_from_host_and_token_sends_a_bearer_token(emulator):
    executor = KubernetesExecutor(host=str(emulator.url), token="abc.def", namespace=NS)
    executor.health()
    assert emulator["get /version/"][0].headers["Authorization"] == "Bearer abc.def"


def test_executor_from_kubeconfig_text(emulator):
    kubeconfig = f"""
apiVersion: v1
kind: Config
clusters: [{{name: emu, cluster: {{server: "{str(emulator.url).rstrip("/")}"}}}}]
users: [{{name: hcs, user: {{token: kube-token}}}}]
contexts: [{{name: emu, context: {{cluster: emu, user: hcs, namespace: {NS}}}}}]
current-context: emu
"""
    # The cluster row's endpoint may be filled in too: the kubeconfig carries the credentials, so it wins.
    executor = KubernetesExecutor(host="https://unused.example.org:6443", kubeconfig=kubeconfig, namespace=NS)
    assert executor.health().startswith("Kubernetes v1.26")
    assert emulator["get /version/"][0].headers["Authorization"] == "Bearer kube-token"


def test_unusable_kubeconfig_is_a_final_error(tmp_path):
    with pytest.raises(ExecutorError, match="configuration unusable") as info:
        KubernetesExecutor(kubeconfig=str(tmp_path / "missing"))
    assert info.value.retryable is False


def test_ca_certificate_is_taken_as_pem_text_or_as_a_path():
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    from_text = KubernetesExecutor(host="https://k8s.example.org:6443", token="t", ca_cert=pem)
    assert from_text.api_client.configuration.ca_cert_data == pem
    from_path = KubernetesExecutor(host="https://k8s.example.org:6443", token="t", ca_cert="/etc/hcs/ca.crt")
    assert from_path.api_client.configuration.ssl_ca_cert == "/etc/hcs/ca.crt"


def test_secret_variables_go_into_a_secret_owned_by_the_workload(executor, emulator):
    s = spec(env={"EPOCHS": "3"}, secret_env={"API_TOKEN": "s3cr3t"})
    external_id = executor.submit(s)
    (job,) = stored(emulator, "batch/v1/jobs").values()
    secret = stored(emulator, "v1/secrets")[job["metadata"]["name"]]
    assert secret["stringData"] == {"API_TOKEN": "s3cr3t"}
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "EPOCHS", "value": "3"} in env
    ref = {"name": "API_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret["metadata"]["name"], "key": "API_TOKEN"}}}
    assert ref in env
    assert "s3cr3t" not in str(job)
    executor.delete(external_id)
    assert not stored(emulator, "v1/secrets")


def test_secret_files_go_into_the_attempts_secret_and_are_mounted_owner_read_only(executor, emulator):
    s = spec(secret_env={"HF": "hf-v4lue"}, secret_files={"/run/secrets/registry": "reg-v4lue", "/data/tok": "t"})
    external_id = executor.submit(s)
    (job,) = stored(emulator, "batch/v1/jobs").values()
    name = job["metadata"]["name"]
    secret = stored(emulator, "v1/secrets")[name]
    # Read back from the API server: the values, under keys no variable can have, labelled like the task's objects.
    assert secret["stringData"] == {"HF": "hf-v4lue", "file-0": "t", "file-1": "reg-v4lue"}
    assert secret["metadata"]["labels"]["hcs.io/task-id"] == job["metadata"]["labels"]["hcs.io/task-id"]
    assert secret["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    pod = job["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "hcs-secret-files"]
    assert volume["secret"] == {
        "secretName": name,
        "defaultMode": 0o400,
        "items": [
            {"key": "file-0", "path": "file-0", "mode": 0o400},
            {"key": "file-1", "path": "file-1", "mode": 0o400},
        ],
    }
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "hcs-secret-files"]
    assert mounts == [
        {"name": "hcs-secret-files", "mountPath": "/data/tok", "subPath": "file-0", "readOnly": True},
        {"name": "hcs-secret-files", "mountPath": "/run/secrets/registry", "subPath": "file-1", "readOnly": True},
    ]
    env = pod["containers"][0]["env"]
    assert {"name": "HF", "valueFrom": {"secretKeyRef": {"name": name, "key": "HF"}}} in env
    assert "v4lue" not in str(job)
    executor.delete(external_id)
    assert not stored(emulator, "v1/secrets")


def test_following_logs_reads_from_the_last_timestamp_seen_and_drops_what_was_seen(executor, emulator):
    s = spec(kind="dev_env", command="sleep 1d")
    ext_id = executor.submit(s)
    answer = ["2026-11-23T10:00:00.5Z step 1\n2026-11-23T10:00:01Z step 2\n2026-11-23T10:00:01Z step 2b\n"]
    log = emulator[f"get /api/v1/namespaces/{NS}/pods/{s.name}/log"]
    log << (lambda: answer[0])
    first = executor.read_logs(ext_id, tail=10)
    assert first.text == "step 1\nstep 2\nstep 2b\n" and not first.more
    assert (log[0].params["timestamps"], log[0].params["tailLines"]) == ("true", "10")

    # The API answers from since_seconds on: the lines at and before the last timestamp seen come again.
    answer[0] = "2026-11-23T10:00:01Z step 2\n2026-11-23T10:00:01Z step 2b\n2026-11-23T10:00:01.000000001Z step 3\n"
    second = executor.read_logs(ext_id, after=first.cursor)
    assert second.text == "step 3\n"
    assert "tailLines" not in log[1].params and int(log[1].params["sinceSeconds"]) >= 60
    answer[0] = "2026-11-23T10:00:01.000000001Z step 3\n"
    assert executor.read_logs(ext_id, after=second.cursor).text == ""
    answer[0] = "2026-11-23T10:00:00.5Z step 1\n"
    assert executor.read_logs(ext_id, after="").text == "step 1\n"  # from the start: no since_seconds
    assert "sinceSeconds" not in log[3].params and "tailLines" not in log[3].params
    with pytest.raises(ValueError):
        executor.read_logs(ext_id, after="o12")


def test_a_concurrency_target_reaches_the_hpa_at_launch_and_when_edited(executor, emulator):
    s = spec(kind="inference", settings={"min_replicas": 1, "max_replicas": 3, "target_requests_in_flight": 16})
    external_id = executor.submit(s)
    hpa = stored(emulator, "autoscaling/v2/horizontalpodautoscalers")[s.name]
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": "http_requests_in_flight"},
                "target": {"type": "AverageValue", "averageValue": "16"},
            },
        }
    ]
    edited = dataclasses.replace(s, settings={"min_replicas": 1, "max_replicas": 3, "target_requests_in_flight": 4})
    executor.update_autoscaling(external_id, edited)
    hpa = stored(emulator, "autoscaling/v2/horizontalpodautoscalers")[s.name]
    assert [metric["pods"]["target"]["averageValue"] for metric in hpa["spec"]["metrics"]] == ["4"]


def test_new_autoscaling_settings_patch_the_running_services_hpa(executor, emulator):
    s = spec(
        kind="inference",
        settings={"min_replicas": 1, "max_replicas": 2, "target_gpu_utilization": 70},
        gpus_per_instance=1,
        gpu_model=A100,
    )
    external_id = executor.submit(s)
    edited = dataclasses.replace(s, settings={"min_replicas": 2, "max_replicas": 6, "target_requests_per_second": 30})
    executor.update_autoscaling(external_id, edited)
    hpa = stored(emulator, "autoscaling/v2/horizontalpodautoscalers")[s.name]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    assert [metric["pods"]["metric"]["name"] for metric in hpa["spec"]["metrics"]] == ["http_requests_per_second"]
    assert stored(emulator, "apps/v1/deployments")[s.name]["spec"]["replicas"] == 1  # the HPA, not the patch, scales


def _allocated(resource: str, *ids: str) -> dict:
    """A container status as the kubelet writes it with its ResourceHealthStatus feature on."""
    return {
        "name": "main",
        "ready": True,
        "restartCount": 0,
        "image": "busybox:1.36",
        "imageID": "",
        "allocatedResourcesStatus": [
            {"name": resource, "resources": [{"resourceID": i, "health": "Healthy"} for i in ids]}
        ],
    }


def test_the_cards_the_kubelet_reports_for_each_pod_are_read_back(executor, emulator):
    s = spec(instances=2, gpus_per_instance=2, gpu_model=A100, placements=on_node("gpu-1", 0, 1, instances=2))
    ext_id = executor.submit(s)
    template = stored(emulator, "batch/v1/jobs")[s.name]["spec"]["template"]
    reports = {
        0: (
            "gpu-1",
            [
                _allocated("nvidia.com/gpu", "GPU-b", "GPU-a"),
                # Another resource of the container (an RDMA device) is not a card.
                {"name": "rdma/hca", "resources": [{"resourceID": "mlx5_0"}]},
            ],
        ),
        1: ("gpu-2", [_allocated("nvidia.com/gpu", "GPU-c", "GPU-d")]),
    }
    for index, (node, statuses) in reports.items():
        allocated = [
            {**statuses[0], "allocatedResourcesStatus": statuses[0]["allocatedResourcesStatus"] + statuses[1:]}
        ]
        emulator.objects["v1/pods", NS, f"{s.name}-{index}"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{s.name}-{index}", "namespace": NS, **template["metadata"]},
            "spec": {**template["spec"], "nodeName": node},
            "status": {"phase": "Running", "containerStatuses": allocated},
        }
    expected = (("gpu-1", ("GPU-a", "GPU-b")), ("gpu-2", ("GPU-c", "GPU-d")))
    assert executor.status(ext_id).devices == expected
    (listed,) = executor.list_by_owner({"hcs.io/task-id": str(s.task_id)})
    assert listed.devices == expected
    # A kubelet that reports nothing (older Kubernetes, the feature off): nothing is read back.
    emulator.objects["v1/pods", NS, f"{s.name}-1"].patch({"status": {"containerStatuses": []}})
    assert executor.status(ext_id).devices == expected[:1]
