"""Plain input and output types of the scheduling engine.

Everything here is a frozen dataclass holding ints, floats, strings and tuples, so the
Django service can build a :class:`Snapshot` from rows and apply a :class:`Decisions`
without the engine knowing about models, and the simulator can do the same from a trace.
Ids are whatever the caller uses (database primary keys, trace names); the engine only
compares them for equality and, for tie-breaking, with ids of the same kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Id = int | str

HIGH = "high"
MEDIUM = "medium"
LOW = "low"
CLASS_RANK = {LOW: 0, MEDIUM: 1, HIGH: 2}

FIFO = "fifo"
DRF = "drf"
BACKFILL = "backfill"
NONSTRICT_FIFO = "nonstrict_fifo"
LAS = "las"
SJF = "sjf"
FAIR_SHARE = "fair_share"
POLICIES = (FIFO, DRF, BACKFILL, NONSTRICT_FIFO, LAS, SJF, FAIR_SHARE)
# Policies whose blocked head reserves the nodes it drains while later tasks that fit elsewhere run.
RESERVING_POLICIES = frozenset((NONSTRICT_FIFO, LAS, SJF, FAIR_SHARE))

LINK_FAST = frozenset({"nvlink", "hccs"})

# A cluster that can run a share of a card of any vendor (``Cluster.capabilities``); ``share:<vendor>`` names one.
SHARE_ANY_VENDOR = "share:*"


def share_capability(vendor: str) -> str:
    """The capability of running a share of one of ``vendor``'s cards (a HAMi-style fraction or memory share)."""
    return f"share:{vendor}"


# How capacity loans (:mod:`.rebalance`) count, in billing and in fair share (``VdcSettings.loan_billing``).
LOAN_BORROWER_PAYS = "borrower_pays"
LOAN_LENDER_CREDITED = "lender_credited"
LOAN_NEITHER = "neither"
LOAN_BILLING = (LOAN_BORROWER_PAYS, LOAN_LENDER_CREDITED, LOAN_NEITHER)


class Reason:
    """Machine-readable codes for why a queued task has not started (``Waiting.reason``)."""

    BUDGET_EXHAUSTED = "budget_exhausted"
    INVALID_REQUEST = "invalid_request"
    NO_MATCHING_GPU_MODEL = "no_matching_gpu_model"
    MAX_CONCURRENT = "max_concurrent"
    KIND_LIMIT = "kind_limit"
    QUOTA_EXCEEDED = "quota_exceeded"
    QUEUE_CAPACITY = "queue_capacity"
    VDC_CAPACITY = "vdc_capacity"
    NO_ELIGIBLE_CLUSTER = "no_eligible_cluster"
    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    QUEUE_ORDER = "queue_order"
    WAITING_FOR_RESERVATION = "waiting_for_reservation"
    WAITING_FOR_HIGHER_CLASS = "waiting_for_higher_class"
    HOLDS_RESERVATION = "holds_reservation"
    # Free capacity an admin holds back (maintenance, another project's event): see :mod:`.reservations`.
    CAPACITY_RESERVED = "capacity_reserved"


class PreemptReason:
    """Why a running task was preempted (``Preempt.reason``)."""

    HIGHER_CLASS = "higher_class"
    QUOTA_RECLAIM = "quota_reclaim"
    QUEUE_RECLAIM = "queue_reclaim"
    # A las queue's task whose attained service passed a threshold gave way to one of its queue with less service.
    LAS_DEMOTION = "las_demotion"
    # A capacity reservation set to drain its nodes started (``by_task_id`` is None).
    CAPACITY_RESERVATION = "capacity_reservation"


@dataclass(frozen=True, slots=True)
class Resources:
    """A resource vector: cpu cores, memory GiB and GPU-equivalents (A100-80G = 1.0)."""

    cpu: float = 0.0
    memory_gib: float = 0.0
    gpu: float = 0.0


@dataclass(frozen=True, slots=True)
class GpuModel:
    """A catalog entry; ``exchange_rate`` converts one card into GPU-equivalents."""

    name: str
    vendor: str = ""
    vram_gib: float = 0.0
    tflops_fp16: float = 0.0
    tflops_fp32: float = 0.0
    exchange_rate: float = 1.0
    shareable: bool = False
    # "mig" / "time_slice": a unit of a partitioned card (a MIG instance, a time-sliced replica), placed only when a
    # request names it; "" for a card.
    partition: str = ""


@dataclass(frozen=True, slots=True)
class Link:
    """A device-to-device link inside a node (``kind`` nvlink / hccs / pcie)."""

    peer_index: int
    kind: str = "pcie"
    bandwidth_gbps: float = 0.0


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator card; ``id`` must be unique over the snapshot."""

    id: Id
    index: int
    model: str
    health: int = 100
    links: tuple[Link, ...] = ()


@dataclass(frozen=True, slots=True)
class Node:
    """A worker node of a cluster with its cards; ``status`` other than "ready" is unschedulable."""

    id: Id
    cluster_id: Id
    cpu: float
    memory_gib: float
    devices: tuple[Device, ...] = ()
    status: str = "ready"
    health: int = 100
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Cluster:
    """A Kubernetes / Slurm / local cluster of the VDC; status healthy / degraded / unavailable / maintenance.

    Only healthy clusters take new work.
    """

    id: Id
    name: str = ""
    type: str = "kubernetes"
    enabled: bool = True
    status: str = "healthy"
    labels: Mapping[str, str] = field(default_factory=dict)
    priority: int = 0
    weight: float = 1.0
    cost_weight: float = 1.0
    max_total_tasks: int | None = None
    max_tasks_per_user: int | None = None
    resizable: bool = True  # its backend can grow and shrink a running job (elastic tasks go only here)
    # What its backend can run, as names the caller chooses (a task goes only where all its ``Task.needs`` are),
    # plus ``share:<vendor>`` / ``share:*`` for the vendors whose cards it runs shares of. None: anything.
    capabilities: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Queue:
    """A task queue: its class, ordering policy and capacity in GPU-equivalents."""

    id: Id
    priority_class: str = MEDIUM
    policy: str = FIFO
    guaranteed_gpu: float = 0.0
    max_gpu: float | None = None
    weight: float = 1.0
    window_floor_s: float = 600.0
    name: str = ""
    # A medium task waiting longer than this reserves capacity across queues like a high task (None: never).
    reserve_after_s: float | None = 3600.0
    # A task of this queue is not preempted for a guarantee reclaim before it has run this long.
    min_run_before_reclaim_s: float = 300.0
    # las: attained-service thresholds (GPU-seconds) between the queue's LAS levels, ascending; None = the
    # engine's default (policies.LAS_THRESHOLDS_GPU_S). A running task demoted past one may be preempted for a
    # waiting task of the queue in a higher level (docs/engine.md, "2D-LAS").
    las_thresholds_gpu_s: tuple[float, ...] | None = None


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """A project's quota in the VDC; ``limit`` None = unlimited; ``enforce`` False = advisory."""

    project_id: Id
    guaranteed: Resources = Resources()
    limit: Resources | None = None
    max_concurrent: int | None = None
    max_per_kind: Mapping[str, int] = field(default_factory=dict)
    enforce: bool = True
    budget_exhausted: bool = False
    # Higher goes first within a queue (ahead of earlier submissions of lower-priority projects), and its running
    # work is the last chosen when capacity is preempted or reclaimed. 0 for every project: submit order.
    priority: int = 0
    # Weighted fair share (policy "fair_share"): the project's DRF share is divided by this, so weights 2:1
    # split contended capacity 2:1.
    weight: float = 1.0

    def __post_init__(self):
        if not self.weight > 0:
            raise ValueError(f"project {self.project_id!r}: quota weight must be > 0, got {self.weight!r}")


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """The accelerator part of a request, field for field like ``apps.clusters.gpuspec.GPURequest``.

    ``count`` 0 = no GPU, < 1 = a fraction of one shareable card; ``models`` () = any model;
    ``vram_gib`` / ``cores_percent`` = the ``1(16G,50%)`` sharing form; the ``min_*`` fields
    are the vendor-neutral form where the engine picks model and count. Any object with
    these attributes (such as a parsed GPURequest) is accepted as ``Task.gpu``.
    """

    count: Any = 0
    models: tuple[str, ...] = ()
    shared: bool = False
    vram_gib: float | None = None
    cores_percent: float | None = None
    min_vram_gib: float | None = None
    min_tflops_fp16: float | None = None
    min_tflops_fp32: float | None = None


@dataclass(frozen=True, slots=True)
class Task:
    """A compute task as the engine sees it; cpu / memory / gpu are per instance.

    ``instances`` > 1 is a gang. ``min_replicas``/``max_replicas`` make it elastic (it starts
    with ``min_replicas`` instances). ``window_s`` is the guaranteed window of the next run
    of a medium task (None: its expected duration, i.e. the first run).
    """

    id: Id
    project_id: Id
    queue_id: Id
    kind: str = "training"
    owner: Id = ""
    cpu: float = 0.0
    memory_gib: float = 0.0
    gpu: Any = None
    instances: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    expected_duration_s: float | None = None
    window_s: float | None = None
    submit_time: float = 0.0
    preemptible: bool = True
    required_labels: Mapping[str, str] = field(default_factory=dict)
    preferred_clusters: tuple[Id, ...] = ()
    cluster_type: str | None = None
    # Capabilities the task needs in its cluster (``Cluster.capabilities``): an image runtime, its kind of workload...
    needs: frozenset[str] = frozenset()
    # Service the task already received in earlier runs, in GPU-seconds (cards x seconds): policy "las" orders by
    # it. The Django layer sums the task's metered GPU usage; the simulator adds each preempted run.
    attained_gpu_s: float = 0.0
    # The hard run-time limit (the backend stops the task there); None: none. Capacity reservations trust it
    # before the expected duration when they decide whether the task would still run at their start.
    wall_time_s: float | None = None
    # An autoscaled inference service: ``max_replicas`` is the count its autoscaler asks for (a demand), so a
    # replica it lacks may shrink or preempt lower-class work like a queued task of its class; a plain elastic
    # task only grows into idle capacity.
    autoscaled: bool = False
    # Times the task was preempted (or suspended) before: a preempted low task is started again only when no high or
    # medium task that could use those resources waits (docs/rules.md#priority-classes). The Django layer maps
    # ``Task.preemption_count``; a
    # kept Scheduler counts its own preemptions.
    preemptions: int = 0
    # An elastic task's speed-up curve (:func:`speedup`): the parallel fraction of its work in Amdahl's law, 0..1
    # (1 = linear in its replicas); None = DEFAULT_SCALING. Growth goes to the highest marginal speed-up per GPU.
    scaling: float | None = None


# The default speed-up curve of an elastic task: 95 % of its work parallel, so 2 replicas run 1.9x, 4 run 3.5x,
# 8 run 5.9x and 16 run 9.1x as fast as one (a sub-linear curve, docs/engine.md "Elastic").
DEFAULT_SCALING = 0.95


def speedup(task: Task, replicas: int) -> float:
    """Throughput of ``task`` on ``replicas`` replicas, relative to one replica (Amdahl's law with the task's
    ``scaling`` as the parallel fraction)."""
    p = DEFAULT_SCALING if task.scaling is None else min(1.0, max(0.0, task.scaling))
    n = max(1, replicas)
    return 1.0 / ((1.0 - p) + p / n)


@dataclass(frozen=True, slots=True)
class DeviceShare:
    """A card (``milli`` = 1000) or a share of one (``milli`` < 1000) given to one instance."""

    device_id: Id
    milli: int = 1000

    @property
    def fraction(self) -> float:
        """The share as a fraction of the card."""
        return self.milli / 1000


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """Where one instance (replica) of a task runs."""

    node_id: Id
    devices: tuple[DeviceShare, ...] = ()
    gpu_model: str | None = None


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task holding resources: its placements, when it started and its guaranteed window.

    ``gpu_equivalents`` is what its placements hold in GPU-equivalents, as the portal's capacity ledger counts
    them (None: worked out from the catalog, a card of a model the catalog lacks counting 1.0).
    """

    task: Task
    cluster_id: Id
    placements: tuple[InstancePlacement, ...]
    started_at: float
    window_s: float | None = None
    gpu_equivalents: float | None = None


@dataclass(frozen=True, slots=True)
class Holding:
    """Capacity on a node that no running task counts but a job may still hold: a preempted or stopped task's job
    not yet confirmed gone, the instances an elastic shrink releases. Nothing is placed on it until it is gone."""

    node_id: Id
    devices: tuple[DeviceShare, ...] = ()
    cpu: float = 0.0
    memory_gib: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkloadShape:
    """One task shape of the target workload used by the FGD node scorer."""

    weight: float
    cpu: float
    memory_gib: float
    gpu: float
    models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class VdcSettings:
    """Per-VDC knobs: cluster selection strategy, node scorer, optional caps and health thresholds."""

    cluster_strategy: str = "load_balancing"
    node_scorer: str = "best_fit"
    cap: Resources | None = None
    subhealthy_below: int = 80
    unhealthy_below: int = 30
    fgd_workload: tuple[WorkloadShape, ...] | None = None
    # Capacity loans (``Snapshot.loans``): how a loan counts in fair share (drf, fair_share), the same way as in
    # billing; and whether only low-class work may run on borrowed capacity (docs/engine.md, Rebalancer).
    loan_billing: str = LOAN_BORROWER_PAYS
    loans_low_class_only: bool = False
    # Cross-class reservations (every blocked high task, and medium tasks past their queue's reserve_after) hold at
    # most this fraction of the VDC's nodes in a cycle (at least one node); holders past the bound wait without
    # one (docs/engine.md, "Cross-class reservations").
    reserved_nodes_max_fraction: float = 0.75

    def __post_init__(self):
        if not 0.0 <= self.reserved_nodes_max_fraction <= 1.0:
            raise ValueError(f"reserved_nodes_max_fraction must be within 0..1, got {self.reserved_nodes_max_fraction}")
        if self.loan_billing not in LOAN_BILLING:
            raise ValueError(f"unknown loan billing {self.loan_billing!r}; expected one of {', '.join(LOAN_BILLING)}")


@dataclass(frozen=True, slots=True)
class CapacityReservation:
    """Capacity an admin holds back from ``start`` to ``end`` (epoch seconds, like ``Snapshot.now``).

    What is held: the named ``node_ids`` whole; else, when any amount is set (``cards`` of ``gpu_model``,
    ``gpu`` GPU-equivalents, ``cpu``, ``memory_gib``), whole nodes of the scope that together cover it,
    chosen by the engine each cycle; else every node of the scope. The scope is ``cluster_ids`` (() = every
    cluster of the snapshot). Tasks of ``projects`` may use the held nodes (an event); nobody else may
    (maintenance when ``projects`` is empty). A task without a wall-time limit or expected duration keeps
    off the held nodes from ``lead_s`` before the start. ``preempt_at_start``: preemptible medium and low
    work on the held nodes is preempted once the window starts (by default it runs on).
    """

    id: Id
    start: float
    end: float
    cluster_ids: tuple[Id, ...] = ()
    node_ids: tuple[Id, ...] = ()
    gpu_model: str | None = None
    cards: int = 0
    gpu: float = 0.0
    cpu: float = 0.0
    memory_gib: float = 0.0
    projects: frozenset = frozenset()
    lead_s: float = 86400.0
    preempt_at_start: bool = False
    name: str = ""

    def __post_init__(self):
        if not self.end > self.start:
            raise ValueError(f"capacity reservation {self.id!r}: end must be after start")
        if self.cards and not self.gpu_model:
            raise ValueError(f"capacity reservation {self.id!r}: cards need a gpu_model")
        if min(self.cards, self.gpu, self.cpu, self.memory_gib, self.lead_s) < 0:
            raise ValueError(f"capacity reservation {self.id!r}: amounts and lead_s must be >= 0")

    @property
    def holds_amount(self) -> bool:
        """True when an amount (not named nodes or the whole scope) is held."""
        return not self.node_ids and bool(self.cards or self.gpu or self.cpu or self.memory_gib)

    @property
    def purpose(self) -> str:
        """How waiting tasks read it: maintenance when nobody may use it, else an event."""
        kind = "an event" if self.projects else "maintenance"
        return f"{kind} (“{self.name}”)" if self.name else kind


@dataclass(frozen=True, slots=True)
class Loan:
    """An active capacity loan (:mod:`.rebalance`): ``amount`` of the lender's guarantee is the borrower's until
    it is returned. In a :class:`Snapshot` the quotas already carry it (:func:`.rebalance.quota_adjustments`)."""

    id: Id
    lender_id: Id
    borrower_id: Id
    amount: Resources
    started_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything one scheduling cycle needs."""

    now: float
    clusters: tuple[Cluster, ...]
    nodes: tuple[Node, ...]
    gpu_models: tuple[GpuModel, ...]
    queues: tuple[Queue, ...]
    quotas: tuple[ProjectQuota, ...] = ()
    running: tuple[RunningTask, ...] = ()
    queued: tuple[Task, ...] = ()
    settings: VdcSettings = VdcSettings()
    reservations: tuple[CapacityReservation, ...] = ()
    loans: tuple[Loan, ...] = ()
    draining: tuple[Holding, ...] = ()


@dataclass(frozen=True, slots=True)
class Start:
    """Start ``task_id`` on ``cluster_id``: one placement per instance, all at once."""

    task_id: Id
    cluster_id: Id
    placements: tuple[InstancePlacement, ...]
    window_s: float | None = None


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop ``task_id`` and requeue it; ``new_window_s`` is the window of its next run (medium)."""

    task_id: Id
    reason: str
    by_task_id: Id | None
    message: str
    requeue: bool = True
    new_window_s: float | None = None
    # Work lost by this preemption: GPU-equivalent seconds since the preempted run started.
    lost_gpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Resize:
    """Change an elastic task to ``replicas`` instances by adding / removing placements."""

    task_id: Id
    replicas: int
    added: tuple[InstancePlacement, ...] = ()
    removed: tuple[InstancePlacement, ...] = ()
    message: str = ""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A task that stays queued: 1-based position in its queue, estimated start, and why."""

    task_id: Id
    queue_id: Id
    position: int
    estimated_start: float | None
    reason: str
    message: str
    # The running task whose expected end (or, for a high task, guaranteed window end) frees what this one
    # needs, as far as the estimate can tell; None when free capacity or queued work decides.
    blocked_by: Id | None = None
    until_window_end: bool = False  # blocked_by's guaranteed window ends then, and this task may preempt it


@dataclass(frozen=True, slots=True)
class Decisions:
    """The result of one cycle, to be applied in one transaction."""

    starts: tuple[Start, ...] = ()
    preemptions: tuple[Preempt, ...] = ()
    resizes: tuple[Resize, ...] = ()
    waiting: tuple[Waiting, ...] = ()
