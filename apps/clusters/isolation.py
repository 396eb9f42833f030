"""Per-project isolation on Kubernetes and Slurm clusters (``Cluster.project_isolation``).

On a per-project cluster each project gets its own namespace (Kubernetes) or account (Slurm), named
``<isolation_prefix><project>``, carrying a ResourceQuota or GrpTRES that mirrors the project's quota in the
cluster's VDC. Executors make and update those objects (``ensure_project``) before every submit, from the
description built here; :func:`sync_project` does the same when the quota changes.

What is mirrored, and why (docs/kubernetes.md, docs/slurm.md):

- the quota's **limit** (not its guarantee): the portal schedules up to the limit, so the backend's ceiling is
  the limit; the quota covers the whole VDC, so one cluster's share of it can reach all of it;
- only an **enforced** quota: an advisory one (or none) limits nothing in the portal, so nothing is mirrored
  and an earlier ResourceQuota is removed (Slurm: GrpTRES is cleared);
- GPUs as **whole cards per resource**: the portal counts GPU-equivalents (cards x exchange rate), backends count
  cards, so the mirror allows ``floor(limit / lowest exchange rate)`` cards of each resource among the models
  this cluster's nodes have: never fewer than the portal allows. Shareable models (HAMi) count one card per
  share on Kubernetes, which no card count can bound, so their resource gets no count (a note says so).
"""

from __future__ import annotations

import math
from decimal import Decimal

from django.db.models import Q

from apps.clusters.backends import executor_for
from apps.clusters.capabilities import capabilities
from apps.clusters.choices import ClusterType, ProjectIsolation
from apps.clusters.executors.base import LABEL_INSTALLATION, LABEL_PROJECT
from apps.clusters.executors.k8s_manifests import NOTES_ANNOTATION, sanitize_label_value
from apps.clusters.executors.projects import (
    LABEL_MANAGED_BY,
    LABEL_PROJECT_ID,
    MANAGED_BY,
    ProjectLimits,
    project_backend_name,
    resource_quota_hard,
    slurm_grp_tres,
)
from apps.clusters.models import Cluster, GPUModel
from apps.vdc.models import Project, ProjectQuota

# The portal's own tolerance on quota sums (engine EPS): 1.9999999 equivalents of 1.0 cards is 2 cards.
_EPS = Decimal("1e-6")
SLURM_GPU_TRES = "gres/gpu"


def is_per_project(cluster: Cluster) -> bool:
    """Whether jobs of ``cluster`` go to a namespace / account of their project."""
    return cluster.project_isolation == ProjectIsolation.PER_PROJECT and cluster.cluster_type in (
        ClusterType.KUBERNETES,
        ClusterType.SLURM,
    )


def backend_name(cluster: Cluster, project: Project) -> str:
    """The project's namespace (Kubernetes) or account (Slurm) on ``cluster``."""
    return project_backend_name(cluster.isolation_prefix, project.name)


def _cards(limit: Decimal, rate: Decimal) -> int:
    return int(math.floor((limit + _EPS) / rate))


def project_limits(cluster: Cluster, project: Project) -> ProjectLimits | None:
    """What ``cluster`` mirrors of the project's quota in its VDC; None when the quota is missing or advisory."""
    quota = ProjectQuota.objects.filter(project=project, vdc_id=cluster.vdc_id).first()
    if quota is None or not quota.enforce:
        return None
    gpus: dict[str, int] = {}
    notes: tuple[str, ...] = ()
    if cluster.cluster_type == ClusterType.SLURM:
        # One gres/gpu count for every type: a share takes a whole card on Slurm, so no model escapes it.
        rates = list(
            GPUModel.objects.filter(devices__node__cluster=cluster, exchange_rate__isnull=False)
            .values_list("exchange_rate", flat=True)
            .distinct()
        )
        if rates:
            gpus[SLURM_GPU_TRES] = _cards(quota.limit_gpu, min(rates))
    else:
        gpus, notes = card_limits(cluster, quota.limit_gpu)
    return ProjectLimits(cpu=float(quota.limit_cpu), memory_gib=float(quota.limit_memory_gib), gpus=gpus, notes=notes)


def card_limits(cluster: Cluster, equivalents: Decimal) -> tuple[dict[str, int], tuple[str, ...]]:
    """Whole cards per Kubernetes resource that ``equivalents`` GPU-equivalents allow among the models of the
    cluster's nodes (the lowest exchange rate of each resource's models: never fewer than the portal allows), and
    notes on the resources left without a count: those with a model the cluster shares (HAMi asks one card per
    share, so no card count bounds them)."""
    models = (
        GPUModel.objects.filter(devices__node__cluster=cluster, exchange_rate__isnull=False)
        .values_list("resource_name", "exchange_rate", "shareable", "vendor")
        .distinct()
    )
    caps = capabilities(cluster.cluster_type)
    by_resource: dict[str, tuple[Decimal, bool]] = {}
    for resource, rate, shareable, vendor in models:
        low, shared = by_resource.get(resource, (rate, False))
        by_resource[resource] = (min(low, rate), shared or (shareable and caps.shares(vendor)))
    gpus: dict[str, int] = {}
    notes: list[str] = []
    for resource, (rate, shared) in sorted(by_resource.items()):
        if shared:
            notes.append(f"{resource}: not limited (a shareable model counts one card per share)")
        else:
            gpus[resource] = _cards(equivalents, rate)
    return gpus, tuple(notes)


def kubernetes_isolation(cluster: Cluster, project: Project, installation: str) -> dict:
    """The project's namespace as ``KubernetesExecutor.ensure_project`` takes it."""
    limits = project_limits(cluster, project)
    labels = {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_INSTALLATION: installation,
        LABEL_PROJECT: sanitize_label_value(project.name),
        LABEL_PROJECT_ID: str(project.pk),
    }
    annotations = {NOTES_ANNOTATION: "; ".join(limits.notes)} if limits is not None and limits.notes else {}
    return {
        "namespace": backend_name(cluster, project),
        "labels": labels,
        "quota": resource_quota_hard(limits) if limits is not None else None,
        "annotations": annotations,
    }


def slurm_isolation(cluster: Cluster, project: Project, installation: str) -> dict:
    """The project's account as ``SlurmExecutor.ensure_project`` takes it."""
    limits = project_limits(cluster, project)
    return {
        "account": backend_name(cluster, project),
        "description": f"HCS project {project.name}",
        # Whose account it is: an account of that name with another organisation is never taken over.
        "organization": f"hcs-{installation[:12]}-p{project.pk}",
        "grp_tres": slurm_grp_tres(limits) if limits is not None else None,
    }


def isolation_settings(cluster: Cluster, project: Project, installation: str) -> dict | None:
    """The ``isolation`` entry of a job's settings on ``cluster``; None on a shared cluster."""
    if not is_per_project(cluster):
        return None
    if cluster.cluster_type == ClusterType.KUBERNETES:
        return kubernetes_isolation(cluster, project, installation)
    return slurm_isolation(cluster, project, installation)


def sync_project(cluster: Cluster, project: Project, installation: str) -> None:
    """Bring the project's namespace / account on ``cluster`` in step with its quota now (ExecutorError when
    the backend fails; the next submit of the project ensures it again)."""
    isolation = isolation_settings(cluster, project, installation)
    if isolation is not None:
        executor_for(cluster).ensure_project(isolation)


def clusters_to_sync(vdc_id: int) -> list[Cluster]:
    """Per-project clusters of a VDC, whose mirrors follow the quotas of that VDC."""
    return list(
        Cluster.objects.filter(vdc_id=vdc_id, project_isolation=ProjectIsolation.PER_PROJECT).filter(
            Q(cluster_type=ClusterType.KUBERNETES) | Q(cluster_type=ClusterType.SLURM)
        )
    )
