"""Every Kubernetes object the portal writes, and every object of its deploy manifests, against the schemas a real
API server checks it with: the official OpenAPI schemas of the oldest and the newest supported Kubernetes
(kubernetes-validate, strict), and the published CRD schemas of Volcano and cert-manager (tests/executors_k8s/crds).

Three sources: the manifest builders across the variants of every task kind (vendors, shares, MIG, gangs, spread,
secrets, volumes, checkpoints, Volcano, autoscaling targets); whatever the executor left in the API emulator after
submitting, resizing, re-targeting autoscaling, ensuring project namespaces and quotas and Volcano queues (patches
included, as the emulator applied them); and the YAML under deploy/kubernetes and in docs/kubernetes.md.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import DeviceSlot, GPUModelSpec, NodePlacement
from apps.clusters.executors.kubernetes import KubernetesExecutor
from tests.executors_k8s import schemas
from tests.executors_k8s.specs import A100, ASCEND_910B, HYGON_K100, MLU370, on_node, spec, volcano_queue

ROOT = Path(__file__).resolve().parents[2]
NS = "gpu-jobs"
A100_MIG = GPUModelSpec(
    "A100-80G-1g.10gb", "nvidia", "nvidia.com/mig-1g.10gb", "NVIDIA_VISIBLE_DEVICES", partition="mig"
)
HOST_PATH = {"name": "scratch", "mount_path": "/scratch", "host_path": "/mnt/scratch"}
CLAIM = {"name": "models", "mount_path": "/models", "claim_name": "models", "read_only": True}
SPREAD = (NodePlacement("n1", (DeviceSlot(0),)), NodePlacement("n2", (DeviceSlot(1),)))
SHARE = on_node("n1", 2, fraction=0.25, vram_gib=16.0, cores_percent=30)
ALL_TARGETS = {
    "min_replicas": 1,
    "max_replicas": 6,
    "target_cpu_utilization": 70,
    "target_memory_utilization": 80,
    "target_gpu_utilization": 60,
    "target_requests_per_second": 25,
    "target_requests_in_flight": 8,
    "health_path": "/ready",
    "port": 9000,
}
# Each task kind in its variants: name -> JobSpec fields.
VARIANTS = {
    "dev_env-jupyter": {"kind": "dev_env", "command": "", "settings": {"ide_secret": "s3cret"}, "time_limit_s": 3600},
    "dev_env-vscode-port": {"kind": "dev_env", "command": "", "settings": {"ide": "vscode", "port": 9443}},
    "dev_env-nvidia-runtime-class": {
        "kind": "dev_env",
        "gpus_per_instance": 2,
        "gpu_model": A100,
        "placements": on_node("n1", 0, 1),
        "settings": {"runtime_classes": {"nvidia": "nvidia"}},
    },
    "dev_env-hami-share": {"kind": "dev_env", "gpus_per_instance": 0.25, "gpu_model": A100, "placements": SHARE},
    "dev_env-secrets-volumes": {
        "kind": "dev_env",
        "env": {"A": "1"},
        "secret_env": {"TOKEN": "t"},
        "secret_files": {"/etc/creds/key": "k"},
        "volumes": (HOST_PATH, CLAIM),
        "settings": {"allowed_host_paths": ["/mnt"]},
    },
    "training-cpu": {},
    "training-gang-nccl-rdma": {
        "instances": 4,
        "gpus_per_instance": 8,
        "gpu_model": A100,
        "placements": on_node("n1", *range(8), instances=4),
        "settings": {"rdma": True, "retries": 2, "master_port": 23456},
    },
    "training-spread-over-nodes": {"instances": 2, "gpus_per_instance": 1, "gpu_model": A100, "placements": SPREAD},
    "training-ascend-gang": {
        "instances": 2,
        "gpus_per_instance": 8,
        "gpu_model": ASCEND_910B,
        "placements": on_node("npu-1", *range(8), instances=2),
    },
    "training-hygon-share": {"gpus_per_instance": 0.5, "gpu_model": HYGON_K100, "placements": SHARE},
    "training-cambricon": {"gpus_per_instance": 4, "gpu_model": MLU370, "time_limit_s": 7200},
    "training-mig": {"gpus_per_instance": 1, "gpu_model": A100_MIG},
    "fine_tuning-checkpoint": {"kind": "fine_tuning", "task_uid": "a" * 32, "settings": {"checkpoint_path": "/ckpt"}},
    "training-volcano": {
        "instances": 3,
        "gpus_per_instance": 1,
        "gpu_model": A100,
        "backend_flavour": "volcano",
        "settings": {"volcano_queue": volcano_queue(), "retries": 1},
    },
    "training-volcano-no-retries": {"instances": 2, "backend_flavour": "volcano"},
    "inference-all-targets": {
        "kind": "inference",
        "gpus_per_instance": 1,
        "gpu_model": A100,
        "settings": ALL_TARGETS,
        "secret_env": {"HF_TOKEN": "t"},
    },
    "inference-cpu-default-target": {"kind": "inference", "settings": {"replicas": 2}},
}


def _objects_of(s, *, checkpoint: bool = False) -> list[dict]:
    objects = m.build_manifests(s, NS, ingress_domain="apps.example.org", ingress_class="nginx")
    secret = m.secret_manifest(s, NS)
    objects += [secret] if secret else []
    if checkpoint:
        objects.append(m.checkpoint_claim_manifest(s, NS, 100, "fast-ssd"))
    if (s.settings.get("volcano_queue") or {}).get("weight"):
        objects.append(m.volcano_queue_manifest(s.settings["volcano_queue"]))
    return objects


@pytest.mark.parametrize("name", VARIANTS)
def test_every_object_built_for_a_task_is_valid_for_every_supported_kubernetes(name):
    s = spec(**VARIANTS[name])
    for manifest in _objects_of(s, checkpoint=s.kind in m.TRAINING_KINDS):
        schemas.validate(manifest)


def test_a_misspelt_field_fails_in_both_schema_families():
    job, _ = m.build_manifests(spec(), NS)
    job["spec"]["template"]["spec"]["containers"][0]["resource"] = {}
    with pytest.raises(Exception, match="resource"):
        schemas.validate(job)
    (vcjob,) = m.build_manifests(spec(instances=2, backend_flavour="volcano"), NS)
    vcjob["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(Exception, match="imagePullPolice"):
        schemas.validate(vcjob)


EXPECTED_KINDS = {
    ("v1", "Pod"),
    ("v1", "Service"),
    ("v1", "Secret"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "Namespace"),
    ("v1", "ResourceQuota"),
    ("networking.k8s.io/v1", "Ingress"),
    ("batch/v1", "Job"),
    ("apps/v1", "Deployment"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"),
    ("batch.volcano.sh/v1alpha1", "Job"),
    ("scheduling.volcano.sh/v1beta1", "Queue"),
}


def test_everything_the_executor_leaves_on_the_api_server_is_valid(api_client, emulator):
    executor = KubernetesExecutor(
        api_client,
        namespace=NS,
        ingress_domain="apps.example.org",
        ingress_class="nginx",
        checkpoint_size_gib=50,
        checkpoint_storage_class="fast-ssd",
    )
    isolation = {
        "namespace": "hcs-vision",
        "labels": {"app.kubernetes.io/managed-by": "hcs-portal"},
        "quota": {"requests.cpu": "64", "requests.memory": "256Gi", "requests.cambricon.com/mlu": "22"},
        "annotations": {m.NOTES_ANNOTATION: "nvidia.com/gpu: not limited"},
    }
    ids = {}
    for name, fields in VARIANTS.items():
        fields = {**fields, "task_uid": "b" * 32} if "checkpoint" in name else fields
        ids[name] = executor.submit(spec(**fields))
    executor.submit(spec(settings={"isolation": isolation}, namespace="hcs-vision"))
    # What changes objects later: a quota that changed (a limit dropped), a resized Job and Deployment, new
    # autoscaling targets, a Volcano queue whose limits changed.
    executor.ensure_project({**isolation, "quota": {"requests.cpu": "32500m", "requests.memory": "100Gi"}})
    executor.resize(ids["training-spread-over-nodes"], 3)
    executor.resize(ids["inference-cpu-default-target"], 4)
    executor.update_autoscaling(
        ids["inference-all-targets"], spec(kind="inference", settings={**ALL_TARGETS, "max_replicas": 9})
    )
    executor.ensure_volcano_queue(volcano_queue(weight=300, capability={}, guarantee={"cambricon.com/mlu": "5"}))
    seen = set()
    for (resource, _namespace, name), obj in emulator.objects.items():
        if obj.deleted:
            continue
        raw = obj.raw
        seen.add((raw["apiVersion"], raw["kind"]))
        try:
            schemas.validate(raw)
        except Exception as exc:  # the object's name says which one failed
            raise AssertionError(f"{resource} {name}: {exc}") from exc
    assert seen == EXPECTED_KINDS


def _deploy_documents() -> list[dict]:
    documents = []
    for name in ("portal.yaml", "webhook-cert-manager.yaml"):
        documents += [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes" / name).read_text()) if d]
    return documents


def _rendered_webhook(tmp_path: Path) -> list[dict]:
    """webhook.yaml as webhook-certs.sh applies it (its caBundle filled), with the Secret the script makes."""
    env = {**os.environ, "OUT_DIR": str(tmp_path / "tls"), "DRY_RUN": "1"}
    script = ROOT / "deploy/kubernetes/webhook-certs.sh"
    rendered = subprocess.run([str(script)], env=env, capture_output=True, text=True, check=True).stdout
    return [d for d in yaml.safe_load_all(rendered) if d]


# Files the API server reads from disk (admission configuration, kubeconfigs): no API objects, no schema.
_NOT_API_OBJECTS = {"AdmissionConfiguration", "Config"}


def _docs_documents() -> list[dict]:
    text = (ROOT / "docs/kubernetes.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    documents = [d for block in blocks for d in yaml.safe_load_all(block) if isinstance(d, dict) and "kind" in d]
    return [d for d in documents if d["kind"] not in _NOT_API_OBJECTS]


def test_the_deploy_manifests_and_the_documented_objects_are_valid(tmp_path):
    documents = [*_deploy_documents(), *_rendered_webhook(tmp_path), *_docs_documents()]
    kinds = set()
    for document in documents:
        kinds.add(document["kind"])
        schemas.validate(document)
    assert {
        "ConfigMap",
        "Job",
        "Deployment",
        "Service",
        "Ingress",
        "Secret",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
        "Issuer",
        "Certificate",
        "Role",
        "ClusterRole",
        "ClusterRoleBinding",
        "ResourceQuota",
    } <= kinds
