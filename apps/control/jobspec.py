"""The one mapping of a task attempt onto the backend-neutral JobSpec executors run."""

from __future__ import annotations

from django.utils import timezone

from apps.clusters.choices import ClusterType
from apps.clusters.executors.base import (
    LABEL_ATTEMPT,
    LABEL_INSTALLATION,
    LABEL_LAUNCH_TOKEN,
    LABEL_PROJECT,
    LABEL_TASK_ID,
    LABEL_TASK_UID,
    DeviceSlot,
    ExecutorError,
    GPUModelSpec,
    JobSpec,
    NodePlacement,
)
from apps.clusters.executors.k8s_manifests import runtime_classes
from apps.clusters.gpuspec import GPURequest, GPUSpecError, parse_gpu_spec
from apps.clusters.isolation import isolation_settings
from apps.clusters.models import GPUModel
from apps.clusters.volcano import volcano_queue
from apps.queues.choices import BackendFlavour
from apps.queues.engine import autoscale as rules
from apps.remotegpu.keys import remote_gpu_secrets
from apps.tasks import schedule
from apps.tasks.models import Task
from apps.vdc.models import ProjectSecret


def job_name(task: Task) -> str:
    """Unique per attempt, carries the task id, valid as a Kubernetes name and a Slurm job name."""
    return f"hcs-{task.pk}-{task.uid.hex[:8]}-a{task.attempt}"


def owner_labels(task: Task, installation: str) -> dict[str, str]:
    """The identity every backend object of this attempt carries (installation, task uid, attempt) and,
    for people reading the backend's own tools, the task id and project."""
    return {
        LABEL_INSTALLATION: installation,
        LABEL_TASK_UID: task.uid.hex,
        LABEL_ATTEMPT: str(task.attempt),
        LABEL_TASK_ID: str(task.pk),
        LABEL_PROJECT: task.project.name,
    }


def _share(task: Task) -> GPURequest | None:
    """The task's memory/compute share (the ``1(16G,50%)`` form), or None for other GPU requests."""
    try:
        req = parse_gpu_spec(task.gpu_spec)
    except GPUSpecError:  # validated at submit; a spec the grammar no longer reads carries no share
        return None
    return req if req.vram_gib is not None or req.cores_percent is not None else None


def _device_slot(device: dict, share: GPURequest | None) -> DeviceSlot:
    """One placed card; a part of a card carries the share's memory and cores, which backends enforce."""
    milli = device.get("milli", 1000)
    if share is None or milli >= 1000:
        return DeviceSlot(index=device["index"], fraction=milli / 1000, uuid=device.get("uuid") or "")
    vram = float(share.vram_gib) if share.vram_gib is not None else None
    return DeviceSlot(index=device["index"], fraction=milli / 1000, vram_gib=vram, cores_percent=share.cores_percent)


def _autoscaling(task: Task) -> dict:
    """Replica bounds and utilisation targets of an inference service; nothing a task did not set."""
    if task.kind != "inference":
        return {}
    settings = {
        # A scheduled minimum holding now raises it (pushed again when that changes: apps.control.autoscaling).
        "min_replicas": (
            schedule.minimum_at(task.autoscale_min, task.autoscale_max, task.autoscale_schedule, timezone.now())
            if task.autoscale_min and task.autoscale_schedule
            else task.autoscale_min
        ),
        "max_replicas": task.autoscale_max,
        "target_cpu_utilization": task.autoscale_cpu_percent,
        "target_gpu_utilization": task.autoscale_gpu_percent,
        "target_memory_utilization": task.autoscale_memory_percent,
        "health_path": task.readiness_path or None,
        "target_requests_per_second": task.autoscale_rps,
        "target_requests_in_flight": task.autoscale_concurrency,
        "target_latency_ms": task.autoscale_latency_ms,
    }
    if task.autoscale_max:
        # The same stabilisation as the portal's own autoscaler, so a service scales alike on every backend.
        settings |= {
            "scale_up_window_s": int(rules.DEFAULT.up_window_s),
            "scale_down_window_s": int(rules.DEFAULT.down_window_s),
        }
    return {key: value for key, value in settings.items() if value is not None}


def project_secrets(task: Task) -> tuple[dict[str, str], dict[str, str]]:
    """The project secrets the task refers to, decrypted now (so a rotated value reaches the next attempt):
    (variable -> value, file path -> value).

    Raises a non-retryable ExecutorError naming a secret that no longer exists or cannot be decrypted.
    """
    refs = [ref for ref in task.secret_refs or () if isinstance(ref, dict)]
    if not refs:
        return {}, {}
    names = {ref.get("secret") for ref in refs}
    secrets = {s.name: s for s in ProjectSecret.objects.filter(project_id=task.project_id, name__in=names)}
    env: dict[str, str] = {}
    files: dict[str, str] = {}
    for ref in refs:
        secret = secrets.get(ref.get("secret"))
        if secret is None:
            raise ExecutorError(
                f"project {task.project.name} has no secret {ref.get('secret')} any more; the task refers to it",
                retryable=False,
            )
        try:
            value = secret.get_value()
        except ValueError as exc:
            raise ExecutorError(f"secret {secret.name}: {exc}", retryable=False)
        if "env" in ref:
            env[str(ref["env"])] = value
        else:
            files[str(ref["file"])] = value
    return env, files


def job_spec(task: Task, installation: str, launch_token: str = "") -> JobSpec:
    """Map a scheduled task and its placement onto the backend-neutral JobSpec (carrying the launch intent's
    ``launch_token`` among its labels when given).

    Raises a non-retryable ExecutorError when the task's secret variables cannot be decrypted.
    """
    try:
        secret_env = task.get_secret_env()
    except ValueError as exc:
        raise ExecutorError(str(exc), retryable=False)
    # Every task of a project may serve or call remote-GPU functions of that project (docs/remote-gpu.md).
    secret_env.update(remote_gpu_secrets(task.project))
    project_env, secret_files = project_secrets(task)
    secret_env.update(project_env)
    placements = task.placement or []
    model_name = next((p.get("gpu_model") for p in placements if p.get("gpu_model")), None)
    gpu_model = None
    if model_name:
        m = GPUModel.objects.get(name=model_name)
        gpu_model = GPUModelSpec(
            name=m.name,
            vendor=m.vendor,
            resource_name=m.resource_name,
            visible_devices_env=m.visible_devices_env,
            slurm_gres_type=m.slurm_gres_type,
            shareable=m.shareable,
            vram_gib=float(m.vram_gib or 0),
            partition=m.partition,
        )
    share = _share(task)
    first = placements[0]["devices"] if placements else []
    gpus = sum(d.get("milli", 1000) for d in first) / 1000
    kubernetes = task.cluster.cluster_type == ClusterType.KUBERNETES
    volcano = kubernetes and task.queue.backend_flavour == BackendFlavour.VOLCANO
    settings = {
        "ide": task.ide_type,
        "framework": task.framework,
        "model_path": task.model_path,
        "epochs": task.epochs,
        "batch_size": task.batch_size,
        "checkpoint_path": task.checkpoint_path,
        "retries": task.max_retries,
        "tensorboard_dir": task.tensorboard_dir,
        "port": task.port,
        "max_tokens": task.max_tokens,
        "temperature": float(task.temperature) if task.temperature is not None else None,
        # A sweep element's values, HCS_PARAM_<NAME> in the job (docs/tasks.md, "Parameter sweeps").
        "sweep_values": task.sweep_values or None,
        # An inference service's autoscaling, under the names the backends read (the HPA on Kubernetes).
        **_autoscaling(task),
        "queue": task.queue.name,
        # Host paths a task may mount there (Kubernetes); none approved means none mounted.
        "allowed_host_paths": list(task.cluster.allowed_host_paths or ()),
        # Kubernetes: the RuntimeClass per vendor (cluster labels runtime-class-<vendor>), none by default.
        "runtime_classes": runtime_classes(task.cluster.labels) or None,
        # Per-project clusters: the project's namespace / account, ensured by the executor before it submits.
        "isolation": isolation_settings(task.cluster, task.project, installation),
        # The portal queue's Volcano Queue, likewise ensured before a Volcano Job is submitted.
        "volcano_queue": volcano_queue(task.cluster, task.queue, installation) if volcano else None,
    }
    namespace = task.cluster.namespace
    if settings["isolation"] and kubernetes:
        namespace = settings["isolation"]["namespace"]
    return JobSpec(
        task_id=task.pk,
        attempt=task.attempt,
        name=job_name(task),
        project=task.project.name,
        owner=task.owner.username,
        kind=task.kind,
        image=task.image,
        command=task.command,
        env={str(k): str(v) for k, v in (task.env or {}).items()},
        secret_env=secret_env,
        secret_files=secret_files,
        volumes=tuple(task.volumes or ()),
        cpu=float(task.cpu),
        memory_gib=float(task.memory_gib),
        gpus_per_instance=gpus,
        gpu_model=gpu_model,
        instances=max(task.replicas, 1),
        placements=tuple(
            NodePlacement(
                node=p["node_name"],
                devices=tuple(_device_slot(d, share) for d in p["devices"]),
            )
            for p in placements
        ),
        namespace=namespace,
        time_limit_s=int(task.wall_time.total_seconds()) if task.wall_time else None,
        labels={**owner_labels(task, installation), **({LABEL_LAUNCH_TOKEN: launch_token} if launch_token else {})},
        settings={k: v for k, v in settings.items() if v not in (None, "")},
        backend_flavour=task.queue.backend_flavour,
        task_uid=task.uid.hex,
    )
