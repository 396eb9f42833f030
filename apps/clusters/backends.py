"""Builds the executor of a cluster row: the one place that maps Cluster settings to executor constructors."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict

from django.conf import settings

from apps.clusters.choices import ClusterType, ProjectIsolation
from apps.clusters.executors.base import Executor, ExecutorError
from apps.clusters.models import Cluster

_local_executors: dict[str, Executor] = {}
# Remote executors keep a connection pool; one per cluster configuration, reused by every call of a process.
_remote_executors: OrderedDict[tuple, Executor] = OrderedDict()
_REMOTE_CACHE_SIZE = 64
_lock = threading.Lock()


def can_scale_services(cluster: Cluster) -> bool:
    """Whether the portal's autoscaler runs more replicas of inference services there (local clusters whose
    jobs have networks of their own, and Slurm clusters: a job per replica); Kubernetes scales them with its HPA."""
    if cluster.cluster_type not in (ClusterType.LOCAL, ClusterType.SLURM):
        return False
    try:
        return executor_for(cluster).scales_services
    except ExecutorError:
        return False


def backend_scales_services(cluster: Cluster | None) -> bool:
    """Whether the backend scales inference services itself (the Kubernetes HPA decides the replica count; the
    portal grants it and reads it back)."""
    return cluster is not None and cluster.cluster_type == ClusterType.KUBERNETES


def executor_for(cluster: Cluster) -> Executor:
    """The executor that runs tasks on ``cluster``; ExecutorError (not retryable) when misconfigured."""
    if cluster.cluster_type == ClusterType.LOCAL:
        # One instance per process: it keeps the handles of the processes it started, to reap them.
        base_dir = str(settings.HCS_LOCAL_EXECUTOR_DIR / cluster.name)
        with _lock:
            if base_dir not in _local_executors:
                from apps.clusters.executors.limits import Limits
                from apps.clusters.executors.local import LocalExecutor
                from apps.clusters.executors.sandbox import Sandbox

                sandbox = Sandbox(
                    job_user=settings.HCS_LOCAL_JOB_USER,
                    network=settings.HCS_LOCAL_JOB_NETWORK,
                    hidden=(str(settings.BASE_DIR), str(settings.VAR_DIR)),
                    tmp_gib=settings.HCS_LOCAL_JOB_TMP_GIB,
                )
                limits = Limits(
                    cgroups=settings.HCS_LOCAL_JOB_LIMITS == "enforce", max_pids=settings.HCS_LOCAL_JOB_MAX_PIDS
                )
                _local_executors[base_dir] = LocalExecutor(base_dir, sandbox=sandbox, limits=limits)
            return _local_executors[base_dir]
    key = (
        cluster.pk,
        cluster.cluster_type,
        cluster.endpoint,
        cluster.api_version,
        cluster.namespace,
        cluster.credentials_encrypted,
        json.dumps(cluster.labels or {}, sort_keys=True),
        cluster.checkpoint_root,
        cluster.checkpoint_storage_class,
        cluster.checkpoint_size_gib,
        cluster.project_isolation,
    )
    with _lock:
        cached = _remote_executors.get(key)
        if cached is not None:
            _remote_executors.move_to_end(key)
            return cached
    executor = _remote_executor(cluster)
    with _lock:
        _remote_executors[key] = executor
        while len(_remote_executors) > _REMOTE_CACHE_SIZE:
            _remote_executors.popitem(last=False)
    return executor


def _remote_executor(cluster: Cluster) -> Executor:
    labels = cluster.labels or {}
    try:
        credentials = cluster.get_credentials()
    except ValueError as exc:
        raise ExecutorError(str(exc), retryable=False)
    if cluster.cluster_type == ClusterType.SLURM:
        from apps.clusters.executors.slurm import SlurmExecutor

        missing = [k for k in ("token", "user") if not credentials.get(k)]
        if missing:
            raise ExecutorError(
                f"cluster {cluster.name}: expected credentials with {' and '.join(missing)} (slurmrestd JWT and user)",
                retryable=False,
            )
        return SlurmExecutor(
            endpoint=cluster.endpoint,
            token=credentials["token"],
            user=credentials["user"],
            api_version=cluster.api_version or "v0.0.38",
            partition=cluster.namespace,
            output_dir=credentials.get("output_dir", ""),
            working_dir=credentials.get("working_dir", ""),
            slurm_conf=credentials.get("slurm_conf", ""),
            # A Slurm site names its gres types itself: the cluster label slurm-gres.<MODEL> overrides the catalog.
            gres_types={k.removeprefix("slurm-gres."): v for k, v in labels.items() if k.startswith("slurm-gres.")},
            checkpoint_root=cluster.checkpoint_root,
            vram_library=labels.get("vram-library", ""),  # where the nodes have the VRAM interceptor
            per_project=cluster.project_isolation == ProjectIsolation.PER_PROJECT,
            cluster_name=labels.get("slurm-cluster", ""),  # its name in Slurm accounting, when slurmdbd has several
        )
    if cluster.cluster_type == ClusterType.KUBERNETES:
        from apps.clusters.executors.kubernetes import KubernetesExecutor

        return KubernetesExecutor(
            host=cluster.endpoint or None,
            token=credentials.get("token"),
            kubeconfig=credentials.get("kubeconfig"),
            namespace=cluster.namespace or "default",
            ingress_domain=cluster.labels.get("ingress-domain") if cluster.labels else None,
            ca_cert=credentials.get("ca_cert"),
            verify_ssl=bool(credentials.get("verify_ssl", True)),
            checkpoint_storage_class=cluster.checkpoint_storage_class,
            checkpoint_size_gib=cluster.checkpoint_size_gib,
            per_project=cluster.project_isolation == ProjectIsolation.PER_PROJECT,
        )
    raise ExecutorError(f"cluster {cluster.name}: unknown cluster type {cluster.cluster_type!r}", retryable=False)
