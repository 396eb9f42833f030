"""Pure functions that turn a :class:`JobSpec` into Kubernetes manifests (plain dicts).

Nothing here talks to a cluster, so every manifest can be checked without a server.
:func:`build_manifests` returns the objects of one task in creation order, the workload
(Pod, Job, Volcano Job or Deployment) first; docs/kubernetes.md describes them.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

from apps.clusters.executors.base import (
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_PROJECT,
    LABEL_TASK_ID,
    LABEL_TASK_UID,
    DeviceSlot,
    ExecutorError,
    GPUModelSpec,
    JobSpec,
    platform_environment,
)
from apps.clusters.hostpaths import is_approved

MANAGED_BY = "hcs-portal"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_KIND = "hcs.io/kind"
# Unique per task attempt (the object name); every object of a task carries it, so one
# selector finds everything a task created.
LABEL_NAME = "hcs.io/name"
# Only on the workload object itself, so owner listings do not count a Job's pods as jobs.
LABEL_WORKLOAD = "hcs.io/workload"
# On a task's checkpoint volume claim, which outlives its attempts (so it carries no attempt or name label).
LABEL_CHECKPOINT = "hcs.io/checkpoint"
CHECKPOINT_VOLUME = "hcs-checkpoint"

WORKLOAD_POD = "pod"
WORKLOAD_JOB = "job"
WORKLOAD_VCJOB = "vcjob"
WORKLOAD_DEPLOYMENT = "deployment"
WORKLOADS = (WORKLOAD_POD, WORKLOAD_JOB, WORKLOAD_VCJOB, WORKLOAD_DEPLOYMENT)

VOLCANO_GROUP = "batch.volcano.sh"
VOLCANO_VERSION = "v1alpha1"
VOLCANO_PLURAL = "jobs"
VOLCANO_TASK = "worker"
# The portal queue's Volcano Queue (cluster-scoped), made and kept in step by the executor (docs/kubernetes.md).
VOLCANO_QUEUE_GROUP = "scheduling.volcano.sh"
VOLCANO_QUEUE_VERSION = "v1beta1"
VOLCANO_QUEUE_PLURAL = "queues"
# Volcano's own queue, where a Volcano Job built without a portal queue goes.
VOLCANO_DEFAULT_QUEUE = "default"
# The portal queue a Volcano Queue mirrors (its id), beside the managed-by and installation labels.
LABEL_QUEUE_ID = "hcs.io/queue-id"
# Why part of a portal quota is not mirrored by a backend object (a shareable card's count), for people.
NOTES_ANNOTATION = "hcs.io/quota-notes"

JOB_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
# A pod created outside the portal asks for accelerators with this annotation, in the GPU spec grammar
# (apps/clusters/gpuspec.py), e.g. "2(A100-80G)" or "1(16G,50%)"; the admission webhook reads it.
GPU_ANNOTATION = "hcs.io/gpu"
# Set on every pod the injector touched, to the vendor it injected (the portal's own pods included).
INJECTED_ANNOTATION = "hcs.io/injected"
# Which container of a multi-container pod gets the cards (Kubernetes' own convention for kubectl).
DEFAULT_CONTAINER_ANNOTATION = "kubectl.kubernetes.io/default-container"
# Cluster label "runtime-class-<vendor>": the RuntimeClass pods of that vendor run with, e.g. nvidia.
RUNTIME_CLASS_LABEL_PREFIX = "runtime-class-"
SHM_VOLUME = "hcs-shm"
# Variables a container runtime reads to decide which of the node's cards a container sees (the NVIDIA container
# toolkit, Ascend's docker runtime). The device plugin sets them for the cards it allocated; a task's own value is
# dropped, else a pod could see cards it was not given (a pod without any, on a GPU node, all of them).
RUNTIME_DEVICE_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES")
HOSTNAME_LABEL = "kubernetes.io/hostname"
CONTAINER_NAME = "main"
DEFAULT_MASTER_PORT = 29500
DEFAULT_INFERENCE_PORT = 8000
GPU_UTIL_METRIC = "DCGM_FI_DEV_GPU_UTIL"
# A service's request rate per pod, as prometheus-adapter's usual rule names a counter http_requests_total.
REQUESTS_METRIC = "http_requests_per_second"
# A service's requests in flight per pod: a gauge the service exports (or the adapter renames to this; docs/tasks.md).
IN_FLIGHT_METRIC = "http_requests_in_flight"
# A service's mean request time per pod in milliseconds (an adapter rule over its request duration histogram).
LATENCY_METRIC = "http_request_duration_milliseconds"

# Pod names get "-<index>" (Indexed Job) or "-worker-<index>" (Volcano) appended and must stay
# within the 63 characters of a DNS label, so task names are capped below that.
MAX_NAME = 48

TRAINING_KINDS = ("training", "fine_tuning")

_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9._-]+")
_LABEL_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_DNS_BAD = re.compile(r"[^a-z0-9-]+")
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class HostMount:
    """A host path the vendor's user-space driver lives in, mounted read-only at the same path."""

    name: str
    path: str
    type: str = "Directory"


@dataclass(frozen=True)
class VendorProfile:
    """What the runtime injector adds for one accelerator vendor (docs/rules.md#backends, vendor injection)."""

    mounts: tuple[HostMount, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    # Collective-communication hints, only for jobs with more than one instance.
    comm_env: dict[str, str] = field(default_factory=dict)
    # HAMi resource names for a share of one card: (count, memory MiB, memory percent, cores percent).
    hami: tuple[str, str, str, str] | None = None


_NCCL_HINTS = {
    # Pods have no RDMA devices unless an RDMA device plugin adds them (settings["rdma"]).
    "NCCL_IB_DISABLE": "1",
    "NCCL_DEBUG": "WARN",
    # NCCL_SOCKET_IFNAME stays unset on purpose: NCCL picks the pod's interface itself, and
    # interface names differ between CNIs.
}

VENDOR_PROFILES: dict[str, VendorProfile] = {
    "nvidia": VendorProfile(
        mounts=(HostMount("hcs-nvidia-driver", "/usr/local/nvidia"),),
        env={
            "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib:/usr/local/cuda/lib64",
            "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        },
        comm_env=_NCCL_HINTS,
        hami=("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"),
    ),
    "huawei": VendorProfile(
        mounts=(
            HostMount("hcs-ascend-driver", "/usr/local/Ascend/driver"),
            HostMount("hcs-ascend-npu-smi", "/usr/local/bin/npu-smi", "File"),
            HostMount("hcs-ascend-install-info", "/etc/ascend_install.info", "File"),
        ),
        env={
            "LD_LIBRARY_PATH": (
                "/usr/local/Ascend/driver/lib64:/usr/local/Ascend/driver/lib64/common"
                ":/usr/local/Ascend/driver/lib64/driver"
            ),
            "ASCEND_DRIVER_PATH": "/usr/local/Ascend/driver",
            # Runtime logs go to stdout so that the task's log view shows them.
            "ASCEND_SLOG_PRINT_TO_STDOUT": "1",
            "ASCEND_GLOBAL_LOG_LEVEL": "3",
        },
        comm_env={
            # Ranks on different nodes start seconds apart; HCCL's default link setup wait is short.
            "HCCL_CONNECT_TIMEOUT": "1200",
            # Pod IPs are not in a static whitelist.
            "HCCL_WHITELIST_DISABLE": "1",
        },
    ),
    "hygon": VendorProfile(
        mounts=(
            HostMount("hcs-rocm", "/opt/rocm"),
            HostMount("hcs-hyhal", "/opt/hyhal"),
            HostMount("hcs-kfd", "/dev/kfd", "CharDevice"),
            HostMount("hcs-dri", "/dev/dri"),
        ),
        env={"ROCM_PATH": "/opt/rocm", "LD_LIBRARY_PATH": "/opt/rocm/lib:/opt/hyhal/lib"},
        comm_env=_NCCL_HINTS,  # RCCL reads the NCCL_* variables
        hami=("hygon.com/dcunum", "hygon.com/dcumem", "", "hygon.com/dcucores"),
    ),
    "amd": VendorProfile(
        mounts=(
            HostMount("hcs-rocm", "/opt/rocm"),
            HostMount("hcs-kfd", "/dev/kfd", "CharDevice"),
            HostMount("hcs-dri", "/dev/dri"),
        ),
        env={"ROCM_PATH": "/opt/rocm", "LD_LIBRARY_PATH": "/opt/rocm/lib"},
        comm_env=_NCCL_HINTS,
    ),
    "cambricon": VendorProfile(
        mounts=(HostMount("hcs-neuware", "/usr/local/neuware"),),
        env={"NEUWARE_HOME": "/usr/local/neuware", "LD_LIBRARY_PATH": "/usr/local/neuware/lib64"},
    ),
    "intel": VendorProfile(),
}

# "1" (any model) on a cluster whose catalog entry was not resolved: the common case is NVIDIA.
DEFAULT_GPU_MODEL = GPUModelSpec(
    name="gpu", vendor="nvidia", resource_name="nvidia.com/gpu", visible_devices_env="NVIDIA_VISIBLE_DEVICES"
)

# IDE -> (port, command, env variable that carries settings["ide_secret"]). Without a secret both
# IDEs generate their own token / password (printed in the pod log), never an open server.
IDE_PROFILES = {
    "jupyter": (
        8888,
        "exec jupyter lab --ip=0.0.0.0 --port={port} --no-browser --allow-root"
        ' ${{HCS_IDE_TOKEN:+--ServerApp.token="$HCS_IDE_TOKEN"}}',
        "HCS_IDE_TOKEN",
    ),
    "vscode": (8080, "exec code-server --bind-addr 0.0.0.0:{port} --auth password", "PASSWORD"),
}


# --- names and labels -------------------------------------------------------------------


def object_name(spec: JobSpec) -> str:
    """DNS-1035 name of every object of this task attempt (lowercase, starts with a letter, <= 48)."""
    name = _DNS_BAD.sub("-", spec.name.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"hcs-{name}".strip("-")
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(spec.name.encode()).hexdigest()[:6]
        name = f"{name[: MAX_NAME - 7].rstrip('-')}-{digest}"
    return name


def sanitize_label_value(value: object) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], alphanumeric at both ends, or empty."""
    text = _LABEL_VALUE_BAD.sub("-", str(value))[:63]
    return _LABEL_EDGE.sub("", text)


def sanitize_label_key(key: str) -> str | None:
    """A valid label key (``prefix/name``), or None when nothing valid is left of it."""
    prefix, _, name = key.rpartition("/")
    name = sanitize_label_value(name)
    if not name:
        return None
    if prefix:
        prefix = prefix.lower()
        if len(prefix) > 253 or not _SUBDOMAIN.match(prefix):
            return None
        return f"{prefix}/{name}"
    return name


def task_labels(spec: JobSpec) -> dict[str, str]:
    """Labels on every object of the task: the spec's own (sanitised), then ours, which win."""
    labels: dict[str, str] = {}
    for key, value in spec.labels.items():
        clean_key = sanitize_label_key(key)
        if clean_key:
            labels[clean_key] = sanitize_label_value(value)
    labels.update(
        {
            LABEL_MANAGED_BY: MANAGED_BY,
            LABEL_TASK_ID: str(spec.task_id),
            LABEL_PROJECT: sanitize_label_value(spec.project),
            LABEL_ATTEMPT: str(spec.attempt),
            LABEL_KIND: sanitize_label_value(spec.kind),
            LABEL_NAME: object_name(spec),
        }
    )
    return labels


def selector_for(labels: dict[str, str]) -> str:
    """An equality label selector, sanitised the same way the labels were written."""
    parts = []
    for key, value in labels.items():
        clean_key = sanitize_label_key(key)
        if clean_key:
            parts.append(f"{clean_key}={sanitize_label_value(value)}")
    return ",".join(parts)


def external_id(namespace: str, workload: str, name: str) -> str:
    return f"{namespace}/{workload}/{name}"


def parse_external_id(value: str) -> tuple[str, str, str]:
    """``<namespace>/<workload>/<name>`` back into its parts; ExecutorError when malformed."""
    parts = value.split("/")
    if len(parts) != 3 or parts[1] not in WORKLOADS or not parts[0] or not parts[2]:
        raise ExecutorError(
            f"Not a Kubernetes job id: {value!r} (expected <namespace>/<{'|'.join(WORKLOADS)}>/<name>)",
            retryable=False,
        )
    return parts[0], parts[1], parts[2]


def _metadata(name: str, namespace: str, labels: dict[str, str]) -> dict:
    return {"name": name, "namespace": namespace, "labels": dict(labels)}


# --- accelerators -----------------------------------------------------------------------


def _first_slot(spec: JobSpec) -> DeviceSlot | None:
    for placement in spec.placements:
        for slot in placement.devices:
            return slot
    return None


def is_fractional(spec: JobSpec) -> bool:
    """A share of one card: a fraction below one, or a memory / cores slice chosen by the scheduler."""
    if 0 < spec.gpus_per_instance < 1:
        return True
    slot = _first_slot(spec)
    return bool(
        spec.gpus_per_instance > 0
        and slot is not None
        and (slot.fraction < 1 or slot.vram_gib is not None or slot.cores_percent is not None)
    )


def gpu_model(spec: JobSpec) -> GPUModelSpec:
    return spec.gpu_model or DEFAULT_GPU_MODEL


def vendor_profile(spec: JobSpec) -> VendorProfile:
    return VENDOR_PROFILES.get(gpu_model(spec).vendor.lower(), VendorProfile())


def gpu_limits(spec: JobSpec) -> dict[str, str]:
    """Extended-resource limits for the accelerator part of one instance (none without GPUs)."""
    gpus = spec.gpus_per_instance
    if gpus <= 0:
        return {}
    model = gpu_model(spec)
    if not is_fractional(spec):
        if gpus != int(gpus):
            raise ExecutorError(
                f"{gpus} GPUs per instance: Kubernetes takes whole cards or a share of one card",
                retryable=False,
            )
        return {model.resource_name: str(int(gpus))}
    hami = vendor_profile(spec).hami
    if hami is None:
        raise ExecutorError(
            f"Fractional GPUs are not supported for vendor {model.vendor!r} on Kubernetes "
            "(HAMi sharing covers nvidia and hygon)",
            retryable=False,
        )
    count_res, mem_res, mem_pct_res, cores_res = hami
    slot = _first_slot(spec)
    fraction = gpus if gpus < 1 else (slot.fraction if slot else 1.0)
    percent = max(1, min(100, round(fraction * 100)))
    limits = {count_res: "1"}
    if slot is not None and slot.vram_gib is not None:
        limits[mem_res] = str(math.ceil(slot.vram_gib * 1024))
    elif mem_pct_res:
        limits[mem_pct_res] = str(percent)
    cores = slot.cores_percent if slot is not None and slot.cores_percent is not None else percent
    limits[cores_res] = str(cores)
    return limits


def accelerator_env(spec: JobSpec) -> dict[str, str]:
    """Vendor env: driver paths and communication hints for gangs.

    Never the visible-devices variable: the node's device plugin chooses the cards of the resource the pod asks
    for and sets it itself (the portal reads its choice back: docs/kubernetes.md "Which cards a pod got").
    """
    if spec.gpus_per_instance <= 0:
        return {}
    profile = vendor_profile(spec)
    env = dict(profile.env)
    if spec.instances > 1 and spec.kind in TRAINING_KINDS:
        env.update(profile.comm_env)
        if spec.settings.get("rdma") and "NCCL_IB_DISABLE" in env:
            env["NCCL_IB_DISABLE"] = "0"
    return env


def runtime_classes(cluster_labels: dict) -> dict[str, str]:
    """Vendor -> RuntimeClass name from a cluster's ``runtime-class-<vendor>`` labels (none set: none used)."""
    return {
        key[len(RUNTIME_CLASS_LABEL_PREFIX) :].lower(): str(value)
        for key, value in (cluster_labels or {}).items()
        if key.startswith(RUNTIME_CLASS_LABEL_PREFIX) and value
    }


@dataclass(frozen=True)
class Injection:
    """The vendor runtime one pod gets (docs/rules.md#backends, vendor injection), applied by :func:`inject`.

    Built from a JobSpec by :func:`accelerator_injection`, for the portal's own manifests and for pods the
    admission webhook (apps/clusters/webhook.py) reviews alike: one source of truth.
    """

    vendor: str
    limits: dict[str, str]
    env: dict[str, str]
    volumes: tuple[dict, ...]
    mounts: tuple[dict, ...]
    tolerations: tuple[dict, ...]
    runtime_class: str = ""


def _vendor_volumes(spec: JobSpec) -> tuple[tuple[dict, ...], tuple[dict, ...]]:
    """The vendor's driver host paths (read-only, same path inside) and a memory-backed /dev/shm."""
    volumes = [{"name": h.name, "hostPath": {"path": h.path, "type": h.type}} for h in vendor_profile(spec).mounts]
    mounts = [{"name": h.name, "mountPath": h.path, "readOnly": True} for h in vendor_profile(spec).mounts]
    # Data loader workers share tensors through /dev/shm; the container default is 64 MiB.
    volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}})
    mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    return tuple(volumes), tuple(mounts)


def accelerator_injection(spec: JobSpec) -> Injection | None:
    """Everything the injector adds for the spec's accelerators; None without any.

    Refuses (non-retryable ExecutorError) what Kubernetes cannot run, as :func:`gpu_limits` says.
    """
    if spec.gpus_per_instance <= 0:
        return None
    limits = gpu_limits(spec)
    vendor = gpu_model(spec).vendor.lower()
    volumes, mounts = _vendor_volumes(spec)
    return Injection(
        vendor=vendor,
        limits=limits,
        env=accelerator_env(spec),
        volumes=volumes,
        mounts=mounts,
        # GPU nodes are usually tainted with the resource name.
        tolerations=({"key": next(iter(limits)), "operator": "Exists", "effect": "NoSchedule"},),
        runtime_class=str((spec.settings.get("runtime_classes") or {}).get(vendor, "")),
    )


def _set_env(container_body: dict, env: dict[str, str]) -> None:
    """Set variables by name: an existing entry (a value or a reference) is replaced where it stands."""
    if not env:
        return
    entries = container_body.setdefault("env", [])
    positions = {entry.get("name"): i for i, entry in enumerate(entries)}
    for name, value in env.items():
        entry = {"name": name, "value": str(value)}
        if name in positions:
            entries[positions[name]] = entry
        else:
            entries.append(entry)


def _add_mounts(container_body: dict, mounts: tuple[dict, ...]) -> set[str]:
    """Add mounts by name; a path the container already mounts from a volume of its own is left to it.
    Returns the names of the volumes mounted."""
    existing = container_body.get("volumeMounts") or []
    names = {m.get("name") for m in existing}
    paths = {m.get("mountPath") for m in existing}
    added = [dict(m) for m in mounts if m["name"] not in names and m["mountPath"] not in paths]
    if added:
        container_body["volumeMounts"] = [*existing, *added]
    return {m["name"] for m in mounts if m["name"] in names} | {m["name"] for m in added}


def inject(
    pod: dict, injection: Injection, containers: tuple[str, ...] = (CONTAINER_NAME,), *, limits: bool = True
) -> dict:
    """Apply an injection in place to a pod or pod template (``{"metadata", "spec"}``) and return it.

    The named containers get the environment and the mounts, the first of them also the resource limits
    (``limits=False`` leaves limits as they are: a pod that already requests the vendor's resource).
    Idempotent: applying the same injection again changes nothing.
    """
    pod.setdefault("metadata", {}).setdefault("annotations", {})[INJECTED_ANNOTATION] = injection.vendor
    body = pod.setdefault("spec", {})
    used: set[str] = set()
    for container_body in body.get("containers", []):
        name = container_body.get("name")
        if name not in containers:
            continue
        if limits and name == containers[0]:
            resources = container_body.setdefault("resources", {})
            resources.setdefault("limits", {}).update(injection.limits)
            # Extended resources need requests equal to limits where requests name them.
            requests = resources.get("requests") or {}
            for key in injection.limits.keys() & requests.keys():
                requests[key] = injection.limits[key]
        _set_env(container_body, injection.env)
        used |= _add_mounts(container_body, injection.mounts)
    volumes = body.setdefault("volumes", [])
    present = {v.get("name") for v in volumes}
    volumes.extend(dict(v) for v in injection.volumes if v["name"] in used and v["name"] not in present)
    if not volumes:
        del body["volumes"]
    tolerations = body.setdefault("tolerations", [])
    tolerations.extend(dict(t) for t in injection.tolerations if t not in tolerations)
    if injection.runtime_class:
        body["runtimeClassName"] = injection.runtime_class
    return pod


def _injected(spec: JobSpec, pod: dict) -> dict:
    """The portal's own pod (template) with the spec's accelerators injected into its main container."""
    injection = accelerator_injection(spec)
    return inject(pod, injection) if injection is not None else pod


# --- pods -------------------------------------------------------------------------------


def _cpu_quantity(cores: float) -> str:
    return str(int(cores)) if cores == int(cores) else f"{math.ceil(cores * 1000)}m"


def _memory_quantity(gib: float) -> str:
    return f"{math.ceil(gib * 1024)}Mi"


def _env_list(env: dict[str, str]) -> list[dict]:
    return [{"name": key, "value": str(value)} for key, value in env.items()]


# The pod volume of the task's secret files, and the mode of each file (owner read only).
SECRET_FILES_VOLUME = "hcs-secret-files"
SECRET_FILE_MODE = 0o400


def secret_file_keys(spec: JobSpec) -> dict[str, str]:
    """The key of each secret file in the task's Secret, by path: ``file-0``, ``file-1`` ... (a variable name
    never has a dash, so they never meet the variables' keys)."""
    return {path: f"file-{index}" for index, path in enumerate(sorted(spec.secret_files))}


def secret_manifest(spec: JobSpec, namespace: str) -> dict | None:
    """The Secret that holds the task's secret variables and files (same name as its workload); None without any.

    The values never appear in the workload: its container reads variables by reference (``secretKeyRef``) and
    files from a secret volume (:func:`_volumes`).
    """
    if not spec.secret_env and not spec.secret_files:
        return None
    data = dict(spec.secret_env)
    data.update({key: spec.secret_files[path] for path, key in secret_file_keys(spec).items()})
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(object_name(spec), namespace, task_labels(spec)),
        "type": "Opaque",
        "stringData": data,
    }


def checkpoint_claim_name(task_uid: str) -> str:
    """The name of a task's checkpoint volume claim: one per task (not per attempt) in the namespace."""
    return f"hcs-ckpt-{task_uid}"


def checkpoint_claim_manifest(spec: JobSpec, namespace: str, size_gib: int, storage_class: str = "") -> dict:
    """The PersistentVolumeClaim that keeps a training task's checkpoints across its attempts on the cluster.

    It is owned by no workload, so deleting an attempt's objects leaves it; the portal deletes it with the
    task. Several instances (possibly on several nodes) share it, which needs ReadWriteMany.
    """
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_CHECKPOINT: "true",
        LABEL_TASK_ID: str(spec.task_id),
        LABEL_PROJECT: sanitize_label_value(spec.project),
    }
    for key in (LABEL_INSTALLATION, LABEL_TASK_UID):
        if key in spec.labels:
            labels[key] = sanitize_label_value(spec.labels[key])
    claim: dict = {
        "accessModes": ["ReadWriteMany" if spec.instances > 1 else "ReadWriteOnce"],
        "resources": {"requests": {"storage": f"{int(size_gib)}Gi"}},
    }
    if storage_class:
        claim["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(checkpoint_claim_name(spec.task_uid), namespace, labels),
        "spec": claim,
    }


def _volume_source(number: int, volume: object, approved: tuple[str, ...]) -> dict:
    """The Kubernetes source of one of the task's volumes; a host path only under an approved prefix.

    Submission checks the same, so a refusal here means the cluster's approvals changed since: the
    task fails with the reason instead of being relaunched.
    """
    if not isinstance(volume, dict) or not isinstance(volume.get("mount_path"), str):
        raise ExecutorError(
            f"volume {number}: expected an object with a mount_path and a claim_name or host_path, got {volume!r}",
            retryable=False,
        )
    if volume.get("claim_name"):
        return {"persistentVolumeClaim": {"claimName": volume["claim_name"]}}
    host = volume.get("host_path")
    if not isinstance(host, str):
        raise ExecutorError(f"volume {number}: expected a claim_name or a host_path", retryable=False)
    if not is_approved(host, approved):
        raise ExecutorError(
            f"volume {number}: host path {host!r} is not approved on this cluster "
            f"(approved: {', '.join(approved) or 'none'})",
            retryable=False,
        )
    return {"hostPath": {"path": host}}


def _volumes(spec: JobSpec) -> tuple[list[dict], list[dict]]:
    """The pod's volumes and the container's mounts of the task's own volumes (:func:`inject` adds the vendor's).

    A task's host paths must lie under ``spec.settings["allowed_host_paths"]``, the cluster's approved
    prefixes; without that setting no host path of the task is mounted.
    """
    volumes: list[dict] = []
    mounts: list[dict] = []
    approved = tuple(spec.settings.get("allowed_host_paths") or ())
    for index, volume in enumerate(spec.volumes):
        source = _volume_source(index + 1, volume, approved)
        name = _DNS_BAD.sub("-", str(volume.get("name") or "").lower()).strip("-")[:40] or f"vol-{index}"
        volumes.append({"name": name, **source})
        mount = {"name": name, "mountPath": volume["mount_path"]}
        if volume.get("read_only"):
            mount["readOnly"] = True
        mounts.append(mount)
    if spec.secret_files:
        # Each secret file of the task's Secret at its own path, owner-read-only, mounted read-only.
        keys = secret_file_keys(spec)
        items = [{"key": key, "path": key, "mode": SECRET_FILE_MODE} for key in keys.values()]
        secret = {"secretName": object_name(spec), "items": items, "defaultMode": SECRET_FILE_MODE}
        volumes.append({"name": SECRET_FILES_VOLUME, "secret": secret})
        mounts += [
            {"name": SECRET_FILES_VOLUME, "mountPath": path, "subPath": key, "readOnly": True}
            for path, key in keys.items()
        ]
    return volumes, mounts


def _placement(spec: JobSpec) -> dict:
    """nodeSelector for one node, a required node affinity when instances spread over several."""
    nodes = sorted({p.node for p in spec.placements if p.node})
    if not nodes:
        return {}
    if len(nodes) == 1:
        return {"nodeSelector": {HOSTNAME_LABEL: nodes[0]}}
    return {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": HOSTNAME_LABEL, "operator": "In", "values": nodes}]}
                    ]
                }
            }
        }
    }


def container(
    spec: JobSpec,
    *,
    command: str = "",
    ports: tuple[tuple[str, int], ...] = (),
    extra_env: tuple[dict, ...] = (),
    env_before: dict[str, str] | None = None,
) -> dict:
    """The task's one container: resources, then env: the defaults a task may change (rendezvous), the task's
    own, the platform's (``HCS_*``: identity, parameters, checkpoint directory). The vendor's variables and
    accelerator limits come from :func:`inject` on the pod, over these; a task's own value of a variable the
    container runtime reads to choose the cards (:data:`RUNTIME_DEVICE_VARIABLES`) is dropped, so a task never
    widens the cards it sees. Secret variables are references to the task's Secret (:func:`secret_manifest`),
    never values."""
    vendor = accelerator_env(spec)
    secret_names = [key for key in spec.secret_env if key not in vendor and key not in RUNTIME_DEVICE_VARIABLES]
    env = {**(env_before or {}), **spec.env, **platform_environment(spec)}
    for key in (*secret_names, *RUNTIME_DEVICE_VARIABLES):
        env.pop(key, None)
    secret = object_name(spec)
    secret_refs = [{"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}} for key in secret_names]
    limits = {"cpu": _cpu_quantity(spec.cpu), "memory": _memory_quantity(spec.memory_gib)}
    requests = {"cpu": limits["cpu"], "memory": limits["memory"]}
    _, mounts = _volumes(spec)
    result: dict = {
        "name": CONTAINER_NAME,
        "image": spec.image,
        "env": [*extra_env, *_env_list(env), *secret_refs],
        "resources": {"limits": limits, "requests": requests},
    }
    command = command or spec.command
    if command:
        result["command"] = ["/bin/sh", "-c", command]
    if ports:
        result["ports"] = [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in ports]
    if mounts:
        result["volumeMounts"] = mounts
    return result


def pod_spec(spec: JobSpec, main: dict, *, restart_policy: str) -> dict:
    volumes, _ = _volumes(spec)
    result: dict = {
        "restartPolicy": restart_policy,
        "containers": [main],
        # Task code has no business with the cluster API.
        "automountServiceAccountToken": False,
        **_placement(spec),
    }
    if volumes:
        result["volumes"] = volumes
    return result


def _service(name: str, namespace: str, labels: dict, ports: list[dict], *, headless: bool = False) -> dict:
    spec: dict = {"selector": {LABEL_NAME: labels[LABEL_NAME]}, "ports": ports}
    if headless:
        spec["clusterIP"] = "None"
        # Ranks resolve each other before they are ready: rendezvous happens during startup.
        spec["publishNotReadyAddresses"] = True
    else:
        spec["type"] = "ClusterIP"
    return {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, namespace, labels), "spec": spec}


def ingress_host(name: str, ingress_domain: str) -> str:
    return f"{name}.{ingress_domain.strip('.')}"


def _ingress(
    name: str, namespace: str, labels: dict, port: int, ingress_domain: str, ingress_class: str | None
) -> dict:
    spec: dict = {
        "rules": [
            {
                "host": ingress_host(name, ingress_domain),
                "http": {
                    "paths": [
                        {
                            "path": "/",
                            "pathType": "Prefix",
                            "backend": {"service": {"name": name, "port": {"number": port}}},
                        }
                    ]
                },
            }
        ]
    }
    if ingress_class:
        spec["ingressClassName"] = ingress_class
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": _metadata(name, namespace, labels),
        "spec": spec,
    }


def _workload_labels(labels: dict, workload: str) -> dict:
    return {**labels, LABEL_WORKLOAD: workload}


# --- per kind ---------------------------------------------------------------------------


def dev_env_manifests(
    spec: JobSpec, namespace: str, ingress_domain: str | None = None, ingress_class: str | None = None
) -> list[dict]:
    """Pod + Service (+ Ingress): an IDE (jupyter / vscode) or the spec's own command."""
    name = object_name(spec)
    labels = task_labels(spec)
    ide = spec.settings.get("ide", "jupyter")
    if ide not in IDE_PROFILES:
        raise ExecutorError(f"Unknown IDE {ide!r}: expected one of {', '.join(IDE_PROFILES)}", retryable=False)
    default_port, ide_command, secret_env = IDE_PROFILES[ide]
    port = int(spec.settings.get("port", default_port))
    command = "" if spec.command else ide_command.format(port=port)
    secret = {secret_env: str(spec.settings["ide_secret"])} if spec.settings.get("ide_secret") else {}
    main = container(spec, command=command, ports=(("http", port),), env_before=secret)
    pod_body = pod_spec(spec, main, restart_policy="Always")
    if spec.time_limit_s:
        pod_body["activeDeadlineSeconds"] = int(spec.time_limit_s)
    pod = _injected(
        spec,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": _metadata(name, namespace, _workload_labels(labels, WORKLOAD_POD)),
            "spec": pod_body,
        },
    )
    objects = [pod, _service(name, namespace, labels, [{"name": "http", "port": port, "targetPort": port}])]
    if ingress_domain:
        objects.append(_ingress(name, namespace, labels, port, ingress_domain, ingress_class))
    return objects


def _rendezvous_env(spec: JobSpec, master_addr: str) -> dict[str, str]:
    port = str(spec.settings.get("master_port", DEFAULT_MASTER_PORT))
    world = str(spec.instances)
    return {"WORLD_SIZE": world, "NNODES": world, "MASTER_ADDR": master_addr, "MASTER_PORT": port}


def training_manifests(spec: JobSpec, namespace: str) -> list[dict]:
    """Indexed Job (one pod per rank) + headless Service that gives every rank a DNS name."""
    name = object_name(spec)
    labels = task_labels(spec)
    index_ref = {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{JOB_INDEX_ANNOTATION}']"}}}
    port = int(spec.settings.get("master_port", DEFAULT_MASTER_PORT))
    main = container(
        spec,
        extra_env=({"name": "RANK", **index_ref}, {"name": "NODE_RANK", **index_ref}),
        env_before=_rendezvous_env(spec, f"{name}-0.{name}"),
        ports=(("master", port),),
    )
    body = pod_spec(spec, main, restart_policy="Never")
    # Pods of an Indexed Job are named <job>-<index> as hostnames under this subdomain.
    body["subdomain"] = name
    job_spec: dict = {
        "completionMode": "Indexed",
        "completions": spec.instances,
        "parallelism": spec.instances,
        "backoffLimit": int(spec.settings.get("retries", 0)),
        "template": _injected(spec, {"metadata": {"labels": dict(labels)}, "spec": body}),
    }
    if spec.time_limit_s:
        job_spec["activeDeadlineSeconds"] = int(spec.time_limit_s)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(name, namespace, _workload_labels(labels, WORKLOAD_JOB)),
        "spec": job_spec,
    }
    service = _service(name, namespace, labels, [{"name": "master", "port": port, "targetPort": port}], headless=True)
    return [job, service]


def volcano_manifests(spec: JobSpec, namespace: str) -> list[dict]:
    """Volcano Job: one task of ``instances`` replicas, gang-scheduled (minAvailable = instances).

    Volcano's ``svc`` plugin makes the headless Service and the ``<job>-worker-<i>.<job>``
    host names; its ``env`` plugin sets ``VC_TASK_INDEX``, which becomes ``RANK``.
    """
    name = object_name(spec)
    labels = task_labels(spec)
    command = spec.command
    if command:
        # The env plugin's variables are appended after ours, so $(VC_TASK_INDEX) cannot be
        # referenced in the env list; the shell reads it at start instead.
        command = f'export RANK="${{VC_TASK_INDEX:-0}}" NODE_RANK="${{VC_TASK_INDEX:-0}}"; {command}'
    port = int(spec.settings.get("master_port", DEFAULT_MASTER_PORT))
    main = container(
        spec,
        command=command,
        env_before=_rendezvous_env(spec, f"{name}-{VOLCANO_TASK}-0.{name}"),
        ports=(("master", port),),
    )
    body = pod_spec(spec, main, restart_policy="Never")
    if spec.time_limit_s:
        body["activeDeadlineSeconds"] = int(spec.time_limit_s)
    retries = int(spec.settings.get("retries", 0))
    return [
        {
            "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
            "kind": "Job",
            "metadata": _metadata(name, namespace, _workload_labels(labels, WORKLOAD_VCJOB)),
            "spec": {
                "schedulerName": "volcano",
                "queue": (spec.settings.get("volcano_queue") or {}).get("name", VOLCANO_DEFAULT_QUEUE),
                "minAvailable": spec.instances,
                "maxRetry": retries,
                "plugins": {"env": [], "svc": []},
                # A gang is all or nothing: a lost or failed rank restarts (or ends) the whole job.
                "policies": [
                    {"event": "PodEvicted", "action": "RestartJob"},
                    {"event": "PodFailed", "action": "RestartJob" if retries else "TerminateJob"},
                ],
                "tasks": [
                    {
                        "name": VOLCANO_TASK,
                        "replicas": spec.instances,
                        "template": _injected(spec, {"metadata": {"labels": dict(labels)}, "spec": body}),
                    }
                ],
            },
        }
    ]


def volcano_queue_manifest(queue: dict) -> dict:
    """The Volcano ``Queue`` of a portal queue, from its description (``apps.clusters.volcano.volcano_queue``):
    ``name``, ``labels``, ``annotations``, ``weight``, ``reclaimable`` and the ``capability`` / ``guarantee``
    resource lists (empty: none)."""
    spec: dict = {"weight": int(queue["weight"]), "reclaimable": bool(queue["reclaimable"])}
    if queue.get("capability"):
        spec["capability"] = dict(queue["capability"])
    if queue.get("guarantee"):
        spec["guarantee"] = {"resource": dict(queue["guarantee"])}
    metadata: dict = {"name": queue["name"], "labels": dict(queue.get("labels") or {})}
    if queue.get("annotations"):
        metadata["annotations"] = dict(queue["annotations"])
    return {
        "apiVersion": f"{VOLCANO_QUEUE_GROUP}/{VOLCANO_QUEUE_VERSION}",
        "kind": "Queue",
        "metadata": metadata,
        "spec": spec,
    }


def _hpa_metrics(settings: dict) -> list[dict]:
    metrics = []
    for resource, key in (("cpu", "target_cpu_utilization"), ("memory", "target_memory_utilization")):
        if settings.get(key) is not None:
            target = {"type": "Utilization", "averageUtilization": int(settings[key])}
            metrics.append({"type": "Resource", "resource": {"name": resource, "target": target}})
    if settings.get("target_gpu_utilization") is not None:
        metrics.append(
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": GPU_UTIL_METRIC},
                    "target": {"type": "AverageValue", "averageValue": str(int(settings["target_gpu_utilization"]))},
                },
            }
        )
    for name, key in (
        (REQUESTS_METRIC, "target_requests_per_second"),
        (IN_FLIGHT_METRIC, "target_requests_in_flight"),
        (LATENCY_METRIC, "target_latency_ms"),
    ):
        if settings.get(key) is not None:
            target = {"type": "AverageValue", "averageValue": str(int(settings[key]))}
            metrics.append({"type": "Pods", "pods": {"metric": {"name": name}, "target": target}})
    if not metrics:
        metrics.append(
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
            }
        )
    return metrics


def inference_manifests(
    spec: JobSpec, namespace: str, ingress_domain: str | None = None, ingress_class: str | None = None
) -> list[dict]:
    """Deployment + Service (+ Ingress with a domain) + autoscaling/v2 HorizontalPodAutoscaler."""
    name = object_name(spec)
    labels = task_labels(spec)
    settings = spec.settings
    port = int(settings.get("port", DEFAULT_INFERENCE_PORT))
    replicas = int(settings.get("replicas", spec.instances))
    min_replicas = int(settings.get("min_replicas", replicas))
    max_replicas = max(min_replicas, int(settings.get("max_replicas", replicas)))
    main = container(spec, ports=(("http", port),))
    if settings.get("health_path"):
        main["readinessProbe"] = {"httpGet": {"path": settings["health_path"], "port": port}, "periodSeconds": 10}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, namespace, _workload_labels(labels, WORKLOAD_DEPLOYMENT)),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {LABEL_NAME: name}},
            "template": _injected(
                spec, {"metadata": {"labels": dict(labels)}, "spec": pod_spec(spec, main, restart_policy="Always")}
            ),
        },
    }
    objects = [deployment, _service(name, namespace, labels, [{"name": "http", "port": 80, "targetPort": port}])]
    if ingress_domain:
        objects.append(_ingress(name, namespace, labels, 80, ingress_domain, ingress_class))
    objects.append(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": _metadata(name, namespace, labels),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": min_replicas,
                "maxReplicas": max_replicas,
                "metrics": _hpa_metrics(settings),
                "behavior": _hpa_behaviour(settings),
            },
        }
    )
    return objects


def _hpa_behaviour(settings: dict) -> dict:
    """The HPA's scaling behaviour set to the portal autoscaler's rules (docs/tasks.md "Autoscaling"): scale up at
    once by at most max(2 x replicas, replicas + 4) per step, scale down to the highest recommendation of the
    down window. Written out, not left to the cluster's defaults, so every backend behaves alike."""
    up = int(settings.get("scale_up_window_s", 0))
    down = int(settings.get("scale_down_window_s", 300))
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": up,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Percent", "value": 100, "periodSeconds": 15},
                {"type": "Pods", "value": 4, "periodSeconds": 15},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": down,
            "selectPolicy": "Max",
            "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
        },
    }


def workload_of(spec: JobSpec) -> str:
    """Which workload object a spec becomes (the middle part of its external id)."""
    if spec.kind == "dev_env":
        return WORKLOAD_POD
    if spec.kind in TRAINING_KINDS:
        return WORKLOAD_VCJOB if spec.backend_flavour == "volcano" else WORKLOAD_JOB
    if spec.kind == "inference":
        return WORKLOAD_DEPLOYMENT
    raise ExecutorError(f"Unknown task kind {spec.kind!r} for Kubernetes", retryable=False)


def build_manifests(
    spec: JobSpec, namespace: str, *, ingress_domain: str | None = None, ingress_class: str | None = None
) -> list[dict]:
    """Every object of the task in creation order; the workload comes first."""
    if spec.instances < 1:
        raise ExecutorError(f"instances must be at least 1, got {spec.instances}", retryable=False)
    if not spec.image:
        raise ExecutorError("Kubernetes tasks need an image", retryable=False)
    workload = workload_of(spec)
    if workload == WORKLOAD_POD:
        return dev_env_manifests(spec, namespace, ingress_domain, ingress_class)
    if workload == WORKLOAD_JOB:
        return training_manifests(spec, namespace)
    if workload == WORKLOAD_VCJOB:
        return volcano_manifests(spec, namespace)
    return inference_manifests(spec, namespace, ingress_domain, ingress_class)
