"""What each cluster type can run, and what a task needs of the cluster it runs on (docs/rules.md "Placement").

Each executor declares what its backend runs (``Executor.runs_images``, ``runs_host_commands``, ``task_kinds``,
``supports_resize``, ``share_vendors``); this module reads those declarations per cluster type and matches a
task against them, for the scheduler's snapshot (``Cluster.capabilities`` / ``Task.needs`` of the engine) and for
admission, which refuses a task no cluster of its VDC can run, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from apps.clusters.choices import ClusterType
from apps.clusters.executors.base import Executor
from apps.clusters.gpuspec import Catalog, GPURequest, candidate_models

# The names the engine matches a task's needs with (any strings would do; these read well in its messages).
IMAGE = "container image"
HOST_COMMAND = "command without an image"


def kind_need(kind: str) -> str:
    """The capability of running tasks of ``kind``."""
    return f"{kind} tasks"


@dataclass(frozen=True)
class Capabilities:
    """What the executor of one cluster type can run."""

    label: str  # the type's name for messages: "Kubernetes", "Slurm", "Local"
    images: bool
    host_commands: bool
    kinds: frozenset[str]
    resize: bool
    share_vendors: frozenset[str] | None  # None: shares of every vendor's cards

    def names(self) -> frozenset[str]:
        """The capabilities a task's needs (:func:`needs_of`) are matched with, share vendors aside."""
        names = {kind_need(kind) for kind in self.kinds}
        if self.images:
            names.add(IMAGE)
        if self.host_commands:
            names.add(HOST_COMMAND)
        return frozenset(names)

    def shares(self, vendor: str) -> bool:
        """Whether it runs a share of one of ``vendor``'s cards."""
        return self.share_vendors is None or vendor.lower() in self.share_vendors


def _executor_class(cluster_type: str) -> type[Executor]:
    if cluster_type == ClusterType.KUBERNETES:
        from apps.clusters.executors.kubernetes import KubernetesExecutor  # loads the client

        return KubernetesExecutor
    if cluster_type == ClusterType.SLURM:
        from apps.clusters.executors.slurm import SlurmExecutor

        return SlurmExecutor
    if cluster_type == ClusterType.LOCAL:
        from apps.clusters.executors.local import LocalExecutor

        return LocalExecutor
    raise ValueError(f"unknown cluster type {cluster_type!r}; expected one of {', '.join(ClusterType.values)}")


@cache
def capabilities(cluster_type: str) -> Capabilities:
    """What clusters of ``cluster_type`` can run, as their executor declares it."""
    executor = _executor_class(cluster_type)
    return Capabilities(
        label=ClusterType(cluster_type).label,
        images=executor.runs_images,
        host_commands=executor.runs_host_commands,
        kinds=frozenset(executor.task_kinds),
        resize=executor.supports_resize,
        share_vendors=executor.share_vendors,
    )


def _command_needed(kind: str, command: str) -> bool:
    """A dev environment without a command runs its IDE; any other task runs its command or its image's."""
    return kind != "dev_env" and not (command or "").strip()


def needs_of(kind: str, image: str, command: str) -> frozenset[str]:
    """What a task of ``kind`` with ``image`` and ``command`` needs of its cluster.

    Elastic resizing and shares of cards are matched by the engine itself (``Cluster.resizable``, share vendors).
    """
    return _needs(kind, not (image or "").strip(), _command_needed(kind, command))


@cache
def _needs(kind: str, no_image: bool, no_command: bool) -> frozenset[str]:
    needs = {kind_need(kind)}
    if no_image:
        needs.add(HOST_COMMAND)
    if no_command:
        needs.add(IMAGE)
    return frozenset(needs)


def refusal(task, request: GPURequest, catalog: Catalog, caps: Capabilities) -> tuple[str, str] | None:
    """(field, reason) when a cluster with ``caps`` can never run ``task``, whatever its nodes; None otherwise."""
    if task.is_elastic and not caps.resize:
        return "elastic_min", f"{caps.label} cannot grow or shrink a running job"
    if task.kind not in caps.kinds:
        return "kind", f"{caps.label} does not run {task.kind} tasks"
    has_image = bool((task.image or "").strip())
    if _command_needed(task.kind, task.command):
        if not caps.images:
            return "command", "runs the task's command and none was given"
        if not has_image:
            return "command", "needs a command or an image whose entrypoint runs the task"
    if not has_image and not caps.host_commands:
        return "image", f"{caps.label} runs containers: an image is required"
    options = candidate_models(request, catalog)
    if options and not runnable_options(options, catalog, caps):
        vendors = sorted({catalog.entry(model).vendor for model, _count in options})
        shared = "every vendor's" if caps.share_vendors is None else ", ".join(sorted(caps.share_vendors)) or "no"
        return "gpu_spec", (
            f"{caps.label} cannot run a share of a {' or '.join(vendors)} card (it shares {shared} "
            "cards); ask for whole cards there"
        )
    return None


def runnable_options(options: list[tuple[str, object]], catalog: Catalog, caps: Capabilities) -> list:
    """The (model, cards per instance) options of a request a cluster with ``caps`` can run: whole cards of any
    model, shares (a count below one) only of the vendors it shares."""
    return [(model, count) for model, count in options if count >= 1 or caps.shares(catalog.entry(model).vendor)]
