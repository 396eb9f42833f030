"""The admission webhook over real HTTPS: uvicorn serving the portal's ASGI app with a certificate made here,
real AdmissionReview v1 payloads, and the returned JSON patch applied with jsonpatch."""

from __future__ import annotations

import base64
import copy
import datetime
import io
import ipaddress
import json
import os
import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path

import httpx
import jsonpatch
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from django.core.management import CommandError, call_command
from django.urls import reverse
from kubernetes import client

from apps.clusters import webhook
from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import GPUModelSpec, JobSpec
from apps.clusters.models import GPUModel
from apps.clusters.webhook import cluster_for_webhook_token, issue_webhook_token, mutate
from apps.control.jobspec import job_spec
from apps.tasks.services import submit_task
from tests.api.base import client_for
from tests.factories import ClusterFactory
from tests.portal.conftest import server_sees_test_db

ENROLLED = "team-a"


@pytest.fixture(autouse=True)
def fresh_catalog_cache(monkeypatch):
    """Each test reads the catalog its own database holds, not one a server process cached before it."""
    monkeypatch.setattr(webhook, "_catalog_cache", None)


def make_tls(directory) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (ca file, cert file, key file)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-webhook-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-portal-webhook")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = (directory / "ca.pem", directory / "tls.crt", directory / "tls.key")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return tuple(str(p) for p in paths)


@pytest.fixture
def https_portal(transactional_db, tmp_path):
    """uvicorn with a TLS listener serving hcsportal.asgi on a free loopback port; yields (url, CA file)."""
    import uvicorn

    from hcsportal.asgi import application

    ca_file, cert_file, key_file = make_tls(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(
        application,
        host="127.0.0.1",
        port=port,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        lifespan="off",
        log_level="warning",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-tls", daemon=True)
    with server_sees_test_db():
        thread.start()
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                pytest.fail("uvicorn did not start its TLS listener within 20 s")
            time.sleep(0.05)
        yield f"https://127.0.0.1:{port}", ca_file
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def cluster(transactional_db):
    return ClusterFactory(
        cluster_type="kubernetes",
        endpoint="https://10.0.0.10:6443",
        webhook_namespaces=[ENROLLED, "research"],
        labels={"runtime-class-nvidia": "nvidia"},
    )


@pytest.fixture
def call(https_portal, cluster):
    """POST a body to the webhook over HTTPS (verifying the listener's certificate) with the cluster's token."""
    url, ca_file = https_portal
    token = issue_webhook_token(cluster)
    context = ssl.create_default_context(cafile=ca_file)
    with httpx.Client(base_url=url, verify=context, timeout=10) as client:

        def post(body, *, path="/k8s/admission/", bearer: str | None = token):
            headers = {"Content-Type": "application/json"}
            if bearer is not None:
                headers["Authorization"] = f"Bearer {bearer}"
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return client.post(path, content=content, headers=headers)

        post.token = token
        yield post


def user_pod(annotations: dict | None = None, limits: dict | None = None, namespace: str = ENROLLED) -> dict:
    """A pod as `kubectl apply` sends it: no namespace in its metadata, a sidecar after the main container."""
    main = {"name": "train", "image": "pytorch/pytorch:2.4.0-cuda12.1", "command": ["python", "train.py"]}
    if limits:
        main["resources"] = {"limits": limits}
    metadata: dict = {"name": "train-1", "labels": {"app": "train"}}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": [main, {"name": "logs", "image": "busybox:1.36"}], "restartPolicy": "Never"},
    }


def admission_review(pod, *, namespace: str = ENROLLED, operation: str = "CREATE", kind: str = "Pod") -> dict:
    """An AdmissionReview v1 request as the API server sends it for a user's pod."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": kind},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "name": pod.get("metadata", {}).get("name", "") if isinstance(pod, dict) else "",
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["team-a-devs", "system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
        },
    }


def answer(http_response, review: dict) -> dict:
    assert http_response.status_code == 200, http_response.text
    body = http_response.json()
    assert body["apiVersion"] == "admission.k8s.io/v1" and body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == review["request"]["uid"]
    return body["response"]


def patched(pod: dict, response: dict) -> dict:
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    return jsonpatch.apply_patch(pod, patch)


NVIDIA_ENV = [
    {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib:/usr/local/cuda/lib64"},
    {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
]


def test_user_pod_in_an_enrolled_namespace_gets_the_vendor_runtime(call):
    pod = user_pod({m.GPU_ANNOTATION: "2(A100-80G)"})
    review = admission_review(pod)
    result = patched(pod, answer(call(review), review))
    expected = copy.deepcopy(pod)
    expected["metadata"]["annotations"][m.INJECTED_ANNOTATION] = "nvidia"
    expected["spec"]["containers"][0].update(
        resources={"limits": {"nvidia.com/gpu": "2"}},
        env=NVIDIA_ENV,
        volumeMounts=[
            {"name": "hcs-nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": True},
            {"name": "hcs-shm", "mountPath": "/dev/shm"},
        ],
    )
    expected["spec"].update(
        volumes=[
            {"name": "hcs-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia", "type": "Directory"}},
            {"name": "hcs-shm", "emptyDir": {"medium": "Memory"}},
        ],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        runtimeClassName="nvidia",
    )
    assert result == expected
    # The sidecar gets nothing: the cards go to the first container unless the pod names another.
    assert result["spec"]["containers"][1] == pod["spec"]["containers"][1]


def test_pod_already_injected_gets_no_patch(call):
    pod = user_pod({m.GPU_ANNOTATION: "2(A100-80G)"})
    first = admission_review(pod)
    injected = patched(pod, answer(call(first), first))
    again = admission_review(injected)
    response = answer(call(again), again)
    assert response["allowed"] is True
    assert "patch" not in response and "patchType" not in response


def test_default_container_annotation_and_a_share_become_hami_limits(call):
    pod = user_pod({m.GPU_ANNOTATION: "1(16G,50%)", m.DEFAULT_CONTAINER_ANNOTATION: "logs"})
    review = admission_review(pod)
    result = patched(pod, answer(call(review), review))
    train, logs = result["spec"]["containers"]
    assert "resources" not in train and "env" not in train
    assert logs["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "16384",
        "nvidia.com/gpucores": "50",
    }
    # HAMi's device plugin picks the card: no visible-devices variable.
    assert [e["name"] for e in logs["env"]] == ["LD_LIBRARY_PATH", "NVIDIA_DRIVER_CAPABILITIES"]


def test_pod_requesting_a_vendor_resource_gets_its_runtime_and_keeps_its_limits(call):
    pod = user_pod(limits={"huawei.com/Ascend910": "8", "memory": "64Gi"})
    review = admission_review(pod)
    result = patched(pod, answer(call(review), review))
    main = result["spec"]["containers"][0]
    assert main["resources"] == {"limits": {"huawei.com/Ascend910": "8", "memory": "64Gi"}}
    assert {e["name"]: e["value"] for e in main["env"]}["ASCEND_DRIVER_PATH"] == "/usr/local/Ascend/driver"
    assert [v["mountPath"] for v in main["volumeMounts"]] == [
        "/usr/local/Ascend/driver",
        "/usr/local/bin/npu-smi",
        "/etc/ascend_install.info",
        "/dev/shm",
    ]
    assert result["metadata"]["annotations"] == {m.INJECTED_ANNOTATION: "huawei"}
    # No RuntimeClass is configured for huawei on this cluster.
    assert "runtimeClassName" not in result["spec"]


def test_user_env_and_shm_mount_are_respected_where_the_vendor_does_not_need_them(call):
    pod = user_pod({m.GPU_ANNOTATION: "1(A100-80G)"})
    pod["spec"]["containers"][0]["env"] = [
        {"name": "LD_LIBRARY_PATH", "value": "/opt/mine"},
        {"name": "A", "value": "1"},
    ]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "big-shm", "mountPath": "/dev/shm"}]
    pod["spec"]["volumes"] = [{"name": "big-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]
    review = admission_review(pod)
    result = patched(pod, answer(call(review), review))
    main = result["spec"]["containers"][0]
    # The vendor's library path wins (a task never runs without its driver), in place; the user's own shm stays.
    assert main["env"][:2] == [NVIDIA_ENV[0], {"name": "A", "value": "1"}]
    assert [v["name"] for v in main["volumeMounts"]] == ["big-shm", "hcs-nvidia-driver"]
    assert [v["name"] for v in result["spec"]["volumes"]] == ["big-shm", "hcs-nvidia-driver"]


@pytest.mark.parametrize(
    "pod, namespace, operation, kind",
    [
        (user_pod({m.GPU_ANNOTATION: "2(A100-80G)"}), "kube-system", "CREATE", "Pod"),
        (user_pod({m.GPU_ANNOTATION: "2(A100-80G)"}), ENROLLED, "UPDATE", "Pod"),
        (user_pod(), ENROLLED, "CREATE", "Pod"),
        ({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, ENROLLED, "CREATE", "ConfigMap"),
    ],
    ids=["outside-enrolled-namespaces", "update", "no-accelerator", "not-a-pod"],
)
def test_pods_outside_enrolled_namespaces_and_other_requests_are_allowed_unchanged(
    call, pod, namespace, operation, kind
):
    review = admission_review(pod, namespace=namespace, operation=operation, kind=kind)
    response = answer(call(review), review)
    assert response == {"uid": review["request"]["uid"], "allowed": True}


def test_malformed_review_gets_a_safe_answer(call):
    # No uid to answer to: a 400 the API server turns into its failurePolicy, with what was expected.
    for body in (
        b"not json",
        b"[]",
        json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(),
    ):
        reply = call(body)
        assert reply.status_code == 400 and "Expected" in reply.json()["detail"]
    no_uid = admission_review(user_pod())
    del no_uid["request"]["uid"]
    assert call(no_uid).status_code == 400
    # A review with a uid whose object is not a usable pod: allowed, nothing injected, a warning says why.
    for broken in ({"metadata": {"name": "x"}}, {"spec": {"containers": []}}, "pod", {"spec": {"containers": ["x"]}}):
        review = admission_review(broken)
        response = answer(call(review), review)
        assert response["allowed"] is True and "patch" not in response
        assert response["warnings"] == ["hcs-portal: not a pod with containers; nothing injected"]
    # Fields of the wrong type (only a caller other than the API server sends them): allowed, nothing injected.
    for field, value in (("resources", "lots"), ("env", "A=1"), ("volumeMounts", {"a": 1})):
        pod = user_pod({m.GPU_ANNOTATION: "1(A100-80G)"})
        pod["spec"]["containers"][0][field] = value
        review = admission_review(pod)
        response = answer(call(review), review)
        assert response["allowed"] is True and "patch" not in response
        assert response["warnings"] == ["hcs-portal: pod fields are not of the Kubernetes types; nothing injected"]


def _nested(depth: int) -> dict:
    value: object = "x"
    for _ in range(depth):
        value = {"a": [value]}
    return value


def test_a_deeply_nested_or_huge_review_is_a_400_that_says_the_bounds(call):
    """What the JSON decoder, the copy of the pod and its diff could not take answers 400, never 500."""
    too_deep = f"nested at most {webhook.MAX_REVIEW_DEPTH} levels deep"
    deep_array = b"[" * 100_000 + b"]" * 100_000
    reply = call(deep_array)
    assert reply.status_code == 400 and too_deep in reply.json()["detail"]
    for depth in (webhook.MAX_REVIEW_DEPTH, 400):
        pod = user_pod({m.GPU_ANNOTATION: "1(A100-80G)"})
        pod["spec"]["containers"][0]["args"] = _nested(depth)
        reply = call(admission_review(pod))
        assert reply.status_code == 400 and too_deep in reply.json()["detail"], reply.text
    # Within the bound, an odd field is only an odd pod: answered.
    pod = user_pod({m.GPU_ANNOTATION: "1(A100-80G)"})
    pod["metadata"]["labels"] = {"deep": _nested(20)}
    review = admission_review(pod)
    assert answer(call(review), review)["allowed"] is True

    huge = admission_review(user_pod({m.GPU_ANNOTATION: "1(A100-80G)", "note": "x" * webhook.MAX_REVIEW_BYTES}))
    reply = call(huge)
    assert reply.status_code == 400, reply.text
    assert f"at most {webhook.MAX_REVIEW_BYTES} bytes" in reply.json()["detail"]


@pytest.mark.parametrize(
    "annotation, message",
    [
        ("2(Z999)", "hcs.io/gpu: "),
        ("1.5(A100-80G)", "expected a whole number of cards or a fraction below 1"),
        ("vram=16Gi", "name the model instead"),
        ("0.5(Ascend910B)", "Fractional GPUs are not supported for vendor 'huawei'"),
        ("2(A100-80G|Ascend910B)", "need different device plugins"),
    ],
)
def test_an_accelerator_request_that_cannot_be_injected_is_denied_with_the_reason(call, annotation, message):
    review = admission_review(user_pod({m.GPU_ANNOTATION: annotation}))
    response = answer(call(review), review)
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 422 and message in response["status"]["message"]


def test_the_endpoint_needs_the_clusters_webhook_token(call, cluster):
    review = admission_review(user_pod({m.GPU_ANNOTATION: "1(A100-80G)"}))
    for bearer in (None, "wrong"):
        reply = call(review, bearer=bearer)
        assert reply.status_code == 401 and "webhook token" in reply.json()["detail"]
    # A token in the path (where access logs keep it) is refused, right or wrong, with what to do instead.
    for path in (f"/k8s/admission/{call.token}/", "/k8s/admission/wrong/", f"/k8s/admission/{call.token}"):
        for bearer in (None, call.token):
            reply = call(review, path=path, bearer=bearer)
            assert reply.status_code == 410, reply.text
            assert "no longer accepted in the URL" in reply.json()["detail"]
            assert "Authorization: Bearer <token>" in reply.json()["detail"]
            assert call.token not in reply.text
    assert answer(call(review), review)["allowed"] is True
    # A new token replaces the old one.
    issue_webhook_token(cluster)
    assert call(review).status_code == 401
    # The calls above carried no session and no CSRF token: the endpoint needs neither.


def _catalog_model(name: str) -> GPUModelSpec:
    row = GPUModel.objects.get(name=name)
    return GPUModelSpec(
        name=row.name,
        vendor=row.vendor,
        resource_name=row.resource_name,
        visible_devices_env=row.visible_devices_env,
        slurm_gres_type=row.slurm_gres_type,
        shareable=row.shareable,
    )


@pytest.mark.parametrize(
    "kind, gpus, model, annotation",
    [
        ("dev_env", 2, "A100-80G", "2(A100-80G)"),
        ("training", 8, "Ascend910B", "8(Ascend910B)"),
        ("inference", 0.5, "T4", "0.5(T4)"),
        ("dev_env", 1, "DCU-Z100", "1(DCU-Z100)"),
        ("training", 4, "MLU370", "4(MLU370)"),
    ],
)
def test_portal_manifests_equal_what_the_webhook_injects(cluster, kind, gpus, model, annotation):
    """The portal's pod for a task equals the same pod built without accelerators and sent through the webhook
    with the task's GPU spec as annotation: both come from one injection."""
    spec = JobSpec(
        task_id=7,
        attempt=1,
        name="hcs-7-abcdef01-a1",
        project="alpha",
        owner="olivia",
        kind=kind,
        image="pytorch/pytorch:2.4.0",
        command="python train.py",
        env={"EPOCHS": "3"},
        gpus_per_instance=gpus,
        gpu_model=_catalog_model(model),
        settings={"runtime_classes": m.runtime_classes(cluster.labels)},
    )
    portal = m.build_manifests(spec, ENROLLED)[0]
    bare = m.build_manifests(replace(spec, gpus_per_instance=0, gpu_model=None), ENROLLED)[0]
    portal_pod = portal if portal["kind"] == "Pod" else portal["spec"]["template"]
    bare_pod = bare if bare["kind"] == "Pod" else bare["spec"]["template"]
    assert bare_pod != portal_pod and m.INJECTED_ANNOTATION not in bare_pod.get("metadata", {}).get("annotations", {})
    bare_pod.setdefault("metadata", {}).setdefault("annotations", {})[m.GPU_ANNOTATION] = annotation
    review = admission_review(bare_pod)
    webhook_pod = patched(bare_pod, mutate(review["request"], cluster)["response"])
    # The portal's own pods, reviewed as they are created in an enrolled namespace, are left alone.
    own = admission_review(portal_pod)
    assert mutate(own["request"], cluster)["response"] == {"uid": own["request"]["uid"], "allowed": True}
    portal_pod["metadata"]["annotations"][m.GPU_ANNOTATION] = annotation
    assert webhook_pod == portal_pod


def test_shipped_registration_with_the_certificate_script_is_valid_and_matches_the_endpoint(tmp_path):
    """webhook-certs.sh renders deploy/kubernetes/webhook.yaml with a CA whose certificate a TLS client accepts
    for the Service's DNS name, and the registration points at the portal's endpoint."""
    script = Path(__file__).resolve().parents[2] / "deploy/kubernetes/webhook-certs.sh"
    env = {**os.environ, "OUT_DIR": str(tmp_path / "tls"), "DRY_RUN": "1"}
    rendered = subprocess.run([str(script), "gpu-portal", "30"], env=env, capture_output=True, text=True, check=True)
    documents = {doc["kind"]: doc for doc in yaml.safe_load_all(rendered.stdout)}
    assert set(documents) == {"Secret", "Deployment", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration"}
    api = client.ApiClient()
    config = documents["MutatingWebhookConfiguration"]
    model = client.V1MutatingWebhookConfiguration.from_dict(config)
    assert api.sanitize_for_serialization(model) == config
    (hook,) = config["webhooks"]
    assert hook["admissionReviewVersions"] == ["v1"] and hook["sideEffects"] == "None"
    assert hook["failurePolicy"] == "Fail" and 1 <= hook["timeoutSeconds"] <= 30
    assert hook["namespaceSelector"] == {"matchLabels": {"hcs.io/webhook": "enabled"}}
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    service = hook["clientConfig"]["service"]
    assert service == {
        "name": "hcs-portal-webhook",
        "namespace": "gpu-portal",
        "port": 443,
        "path": reverse("k8s-admission"),
    }
    assert documents["Service"]["metadata"]["name"] == service["name"]
    # The caBundle's CA signed the Secret's certificate for the Service's DNS name: a TLS handshake proves it.
    ca_pem = base64.b64decode(hook["clientConfig"]["caBundle"])
    (tmp_path / "bundle.pem").write_bytes(ca_pem)
    secret = documents["Secret"]["data"]
    (tmp_path / "tls.crt").write_bytes(base64.b64decode(secret["tls.crt"]))
    (tmp_path / "tls.key").write_bytes(base64.b64decode(secret["tls.key"]))
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    client_context = ssl.create_default_context(cafile=str(tmp_path / "bundle.pem"))
    with socket.create_server(("127.0.0.1", 0)) as listener:

        def serve():
            conn, _ = listener.accept()
            with server_context.wrap_socket(conn, server_side=True) as tls:
                tls.recv(1)

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with (
            socket.create_connection(listener.getsockname()) as raw,
            client_context.wrap_socket(raw, server_hostname="hcs-portal-webhook.gpu-portal.svc") as tls,
        ):
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
            tls.sendall(b"x")
        thread.join(5)
    certificate = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == [
        "hcs-portal-webhook.gpu-portal.svc",
        "hcs-portal-webhook.gpu-portal.svc.cluster.local",
    ]


def test_enrolled_namespaces_are_checked_and_the_token_never_shown(world):
    admin = client_for(world.admin)
    cluster = ClusterFactory(vdc=world.vdc, cluster_type="kubernetes", endpoint="https://10.0.0.10:6443")
    url = f"/api/v1/clusters/{cluster.pk}/"
    refused = admin.patch(url, {"webhook_namespaces": ["team-a", "Team_B"]}, format="json")
    assert refused.status_code == 400 and "'Team_B': expected a DNS label" in str(refused.json())
    assert admin.patch(url, {"webhook_namespaces": ["team-a", "team-a"]}, format="json").status_code == 400
    issue_webhook_token(cluster)
    accepted = admin.patch(url, {"webhook_namespaces": ["team-a", "research"]}, format="json")
    assert accepted.status_code == 200 and accepted.json()["webhook_namespaces"] == ["team-a", "research"]
    cluster.refresh_from_db()
    assert cluster.webhook_namespaces == ["team-a", "research"]
    assert cluster.webhook_token_hash and cluster.webhook_token_hash not in accepted.content.decode()


def test_webhook_token_command_prints_a_token_that_replaces_the_last(world):
    cluster = ClusterFactory(vdc=world.vdc, name="gpu-k8s", cluster_type="kubernetes", endpoint="https://k:6443")
    out = io.StringIO()
    call_command("webhook_token", "gpu-k8s", stdout=out)
    first = out.getvalue().strip()
    assert cluster_for_webhook_token(first) == cluster
    call_command("webhook_token", "gpu-k8s", stdout=io.StringIO())
    assert cluster_for_webhook_token(first) is None
    # Only Kubernetes clusters have a webhook; the error lists the ones that do.
    with pytest.raises(CommandError, match=r"Expected the name of one Kubernetes cluster \(gpu-k8s\), got 'local-1'"):
        call_command("webhook_token", world.cluster.name)


def test_runtime_class_comes_from_the_clusters_vendor_label_and_only_for_that_vendor():
    assert m.runtime_classes({"runtime-class-nvidia": "nvidia", "runtime-class-huawei": "", "region": "north"}) == {
        "nvidia": "nvidia"
    }
    classes = {"nvidia": "nvidia"}
    nvidia = JobSpec(
        task_id=1,
        attempt=1,
        name="t",
        project="p",
        owner="o",
        kind="dev_env",
        image="i",
        gpus_per_instance=1,
        settings={"runtime_classes": classes},
    )
    assert m.build_manifests(nvidia, "ns")[0]["spec"]["runtimeClassName"] == "nvidia"
    ascend = GPUModelSpec("Ascend910B", "huawei", "huawei.com/Ascend910", "ASCEND_VISIBLE_DEVICES")
    assert "runtimeClassName" not in m.build_manifests(replace(nvidia, gpu_model=ascend), "ns")[0]["spec"]
    assert "runtimeClassName" not in m.build_manifests(replace(nvidia, gpus_per_instance=0), "ns")[0]["spec"]


def test_a_tasks_job_spec_carries_its_clusters_runtime_classes(world):
    task = submit_task(world.member, project=world.project, queue="high", kind="training", name="rc", command="echo")
    world.cluster.labels = {"runtime-class-nvidia": "nvidia", "region": "north"}
    task.cluster = world.cluster
    assert job_spec(task, "inst").settings["runtime_classes"] == {"nvidia": "nvidia"}
    world.cluster.labels = {}
    assert "runtime_classes" not in job_spec(task, "inst").settings
