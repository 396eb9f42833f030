"""Builds the executor of a cluster row: the one place that maps Cluster settings to executor constructors."""

from __future__ import annotations

import threading

from django.conf import settings

from apps.clusters.choices import ClusterType
from apps.clusters.executors.base import Executor, ExecutorError
from apps.clusters.models import Cluster

_local_executors: dict[str, Executor] = {}
_lock = threading.Lock()


def executor_for(cluster: Cluster) -> Executor:
    """The executor that runs tasks on ``cluster``; ExecutorError (not retryable) when misconfigured."""
    if cluster.cluster_type == ClusterType.LOCAL:
        # One instance per process: it keeps the handles of the processes it started, to reap them.
        base_dir = str(settings.HCS_LOCAL_EXECUTOR_DIR / cluster.name)
        with _lock:
            if base_dir not in _local_executors:
                from apps.clusters.executors.local import LocalExecutor  # noqa: PLC0415

                _local_executors[base_dir] = LocalExecutor(base_dir)
            return _local_executors[base_dir]
    try:
        credentials = cluster.get_credentials()
    except ValueError as exc:
        raise ExecutorError(str(exc), retryable=False)
    if cluster.cluster_type == ClusterType.SLURM:
        from apps.clusters.executors.slurm import SlurmExecutor  # noqa: PLC0415

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
        )
    if cluster.cluster_type == ClusterType.KUBERNETES:
        from apps.clusters.executors.kubernetes import KubernetesExecutor  # noqa: PLC0415

        return KubernetesExecutor(
            host=cluster.endpoint or None,
            token=credentials.get("token"),
            kubeconfig=credentials.get("kubeconfig"),
            namespace=cluster.namespace or "default",
            ingress_domain=cluster.labels.get("ingress-domain") if cluster.labels else None,
            ca_cert=credentials.get("ca_cert"),
            verify_ssl=bool(credentials.get("verify_ssl", True)),
        )
    raise ExecutorError(f"cluster {cluster.name}: unknown cluster type {cluster.cluster_type!r}", retryable=False)
