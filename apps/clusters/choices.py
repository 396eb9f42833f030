"""Enumerations of the clusters app."""

from django.db import models


class ClusterType(models.TextChoices):
    KUBERNETES = "kubernetes", "Kubernetes"
    SLURM = "slurm", "Slurm"
    LOCAL = "local", "Local processes"


class ProjectIsolation(models.TextChoices):
    """How a Kubernetes or Slurm cluster keeps projects apart (docs/kubernetes.md, docs/slurm.md)."""

    SHARED = "shared", "Shared (one namespace / account for every project)"
    PER_PROJECT = "per_project", "Per project (a namespace / account per project, with its quota)"


class ClusterStatus(models.TextChoices):
    UNKNOWN = "unknown", "Not checked yet"  # a new cluster, until its first health check (it takes no work)
    HEALTHY = "healthy", "Healthy"
    DEGRADED = "degraded", "Degraded"
    UNAVAILABLE = "unavailable", "Unavailable"
    MAINTENANCE = "maintenance", "Maintenance"


class NodeStatus(models.TextChoices):
    READY = "ready", "Ready"
    DRAINING = "draining", "Draining"
    DOWN = "down", "Down"


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    HUAWEI = "huawei", "Huawei"
    HYGON = "hygon", "Hygon"
    CAMBRICON = "cambricon", "Cambricon"
    AMD = "amd", "AMD"
    INTEL = "intel", "Intel"


class LinkType(models.TextChoices):
    NVLINK = "nvlink", "NVLink"
    HCCS = "hccs", "HCCS"
    PCIE = "pcie", "PCIe"
    XGMI = "xgmi", "AMD Infinity Fabric (xGMI)"
    MLULINK = "mlulink", "MLU-Link"


class FiguresSource(models.TextChoices):
    UNREPORTED = "", "Not reported yet"  # devices no node agent has reported (discovered from the backend)
    CATALOG = "catalog", "GPU catalog"
    MEASURED = "measured", "Measured by the node agent"


# A health score below this makes a node or device "sub-healthy" (loses placement score);
# at or below UNHEALTHY it is filtered out of placement altogether.
SUB_HEALTHY_SCORE = 80
UNHEALTHY_SCORE = 30


class Sharing(models.TextChoices):
    """How a card is offered to the scheduler (docs/engine.md "Device sharing")."""

    WHOLE = "whole", "Whole card (or HAMi shares of a shareable model)"
    MIG = "mig", "MIG instances"
    TIME_SLICING = "time_slicing", "Time-sliced replicas"


class Partition(models.TextChoices):
    """What a catalog row is a unit of: a card, one MIG profile of a card model, or one time-sliced replica."""

    CARD = "", "Card"
    MIG = "mig", "MIG profile"
    TIME_SLICE = "time_slice", "Time-sliced replica"
