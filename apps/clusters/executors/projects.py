"""Per-project isolation on a backend, as plain data (no Django): the name of a project's Kubernetes namespace or
Slurm account, and the limits of the project's quota each backend mirrors.

The Django side (:mod:`apps.clusters.isolation`) computes a :class:`ProjectLimits` from the project's quota in
the cluster's VDC; each executor turns it into its own objects (a ResourceQuota, a GrpTRES).
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass, field

# The ResourceQuota the portal keeps in each project namespace.
QUOTA_NAME = "hcs-project-quota"
# Labels (Kubernetes) the portal puts on a project namespace; the installation label is base.LABEL_INSTALLATION.
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "hcs-portal"
# The project's id: a project renamed, and a new project given its old name, never share a namespace.
LABEL_PROJECT_ID = "hcs.io/project-id"
MAX_NAME = 63  # a DNS label (namespace); Slurm accounts take the same names
_BAD = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True)
class ProjectLimits:
    """What a backend mirrors of a project's enforced quota: cores, memory and whole cards per GPU resource
    (a Kubernetes extended resource such as ``nvidia.com/gpu``, or ``gres/gpu`` on Slurm). An empty ``gpus``
    mirrors no card count."""

    cpu: float
    memory_gib: float
    gpus: dict[str, int] = field(default_factory=dict)
    # Why some of the quota is not mirrored (a shareable card's count), for the object's annotation and docs.
    notes: tuple[str, ...] = ()


def project_backend_name(prefix: str, project: str) -> str:
    """``<prefix><project>`` as a DNS label: stable for a project name, distinct for distinct names.

    A name that had to change to fit (upper case, ``_``, too long) gets a short digest of the project's own
    name, so ``Team_A`` and ``team-a`` never share a namespace or an account.
    """
    base = _BAD.sub("-", project.lower()).strip("-")
    name = f"{prefix}{base}".strip("-")
    if base != project or len(name) > MAX_NAME:
        digest = hashlib.sha1(project.encode()).hexdigest()[:6]
        name = f"{name[: MAX_NAME - 7].rstrip('-')}-{digest}".lstrip("-")
    return name


# Rounded up: the mirror must never refuse what the portal's own limit allows.
def _cpu_quantity(cores: float) -> str:
    return str(int(cores)) if float(cores).is_integer() else f"{math.ceil(cores * 1000)}m"


def _memory_quantity(gib: float) -> str:
    return f"{int(gib)}Gi" if float(gib).is_integer() else f"{math.ceil(gib * 1024)}Mi"


def resource_quota_hard(limits: ProjectLimits) -> dict[str, str]:
    """The ``spec.hard`` of a project namespace's ResourceQuota.

    Requests only: the portal's pods request what they limit, so requests are what the quota must count, and a
    quota on ``limits.*`` would also refuse pods others create there without limits.
    """
    hard = {"requests.cpu": _cpu_quantity(limits.cpu), "requests.memory": _memory_quantity(limits.memory_gib)}
    for resource, cards in sorted(limits.gpus.items()):
        hard[f"requests.{resource}"] = str(int(cards))
    return hard


def slurm_grp_tres(limits: ProjectLimits) -> dict[str, int]:
    """The GrpTRES of a project account (TRES name -> count): cores rounded up (Slurm allocates whole cores, so
    rounding down would refuse what the portal allows), memory in MB, GPUs as ``gres/gpu``."""
    tres = {"cpu": math.ceil(limits.cpu), "mem": math.ceil(limits.memory_gib * 1024)}
    if "gres/gpu" in limits.gpus:
        tres["gres/gpu"] = int(limits.gpus["gres/gpu"])
    return tres
