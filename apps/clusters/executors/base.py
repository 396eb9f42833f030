"""The one interface every execution backend implements.

Executors take plain data (a :class:`JobSpec`) and return plain data (:class:`JobState`),
so nothing outside this package knows a backend's API, and the Django layer only maps
Task rows to JobSpecs and JobStates back to task statuses.
"""

from __future__ import annotations

import abc
import enum
import json
import re
from dataclasses import dataclass, field
from datetime import datetime

# Owner labels every backend object of a task carries. The identity of an object is the installation, the
# task's uid and the attempt, all three: the reconciler lists a cluster by installation and matches the other
# two. Task id and project are for people reading the backend's own tools.
LABEL_INSTALLATION = "hcs.io/installation"
LABEL_TASK_UID = "hcs.io/task-uid"
LABEL_ATTEMPT = "hcs.io/attempt"
LABEL_TASK_ID = "hcs.io/task-id"
LABEL_PROJECT = "hcs.io/project"
# A random token per launch intent (one per attempt and cluster), written into the job: the only way a job whose
# submit answer was lost is adopted (docs/control.md, "Identity by id").
LABEL_LAUNCH_TOKEN = "hcs.io/launch-token"

# Every kind of task there is (``JobSpec.kind``).
TASK_KINDS = frozenset(("dev_env", "training", "fine_tuning", "inference"))
# Kinds that get a checkpoint directory kept across their attempts on a cluster (docs/tasks.md).
CHECKPOINT_KINDS = ("training", "fine_tuning")
# Where a job finds its checkpoint directory on backends that mount it (local, Kubernetes), unless the task's
# checkpoint_path names another place.
CHECKPOINT_MOUNT = "/hcs/checkpoint"
# The port a job serves TensorBoard on when its task sets a TensorBoard log directory; Connect serves it
# (/tasks/<id>/connect/<port>/ hands over to its own origin, docs/console.md).
TENSORBOARD_PORT = 6006
# Ports a service listens on when its task sets none: the IDEs' own defaults, and the inference default.
IDE_DEFAULT_PORTS = {"jupyter": 8888, "vscode": 8080}
DEFAULT_INFERENCE_PORT = 8000


class ExecutorError(Exception):
    """A backend refused or failed a call; the message is the backend's own, for the task timeline."""

    def __init__(self, message: str, *, retryable: bool = True):
        super().__init__(message)
        self.retryable = retryable


class JobPhase(enum.StrEnum):
    """Backend-neutral job state; the service maps it onto task statuses."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"  # the backend no longer knows the job (node died, process vanished)
    UNKNOWN = "unknown"


class Failure(enum.StrEnum):
    """Why a job failed, as far as its backend tells (``JobState.failure``); the task keeps it as a field."""

    EXIT_CODE = "exit_code"  # the job's own command ended with a non-zero exit code
    WALL_TIME = "wall_time"  # stopped at its wall-time limit
    OUT_OF_MEMORY = "out_of_memory"  # killed for using more memory than it asked for
    LAUNCH = "launch_failed"  # the backend could not start it (refused submit, bad image, bad configuration)
    NODE = "node_failure"  # its node failed (boot failure, node lost for good)
    BACKEND = "backend"  # the backend failed it for another reason: the message says which


@dataclass(frozen=True)
class DeviceSlot:
    """One accelerator (or a share of one) on a node chosen by the scheduler."""

    index: int
    fraction: float = 1.0  # < 1 means a shared card
    vram_gib: float | None = None  # for fractional (HAMi-style) sharing
    cores_percent: int | None = None
    uuid: str = ""  # a MIG instance: its MIG-... uuid, which CUDA takes in place of an index


@dataclass(frozen=True)
class NodePlacement:
    """What one instance (rank) of the job gets on one node."""

    node: str
    devices: tuple[DeviceSlot, ...] = ()


@dataclass(frozen=True)
class GPUModelSpec:
    """The catalog entry of the GPU model a job runs on, as executors need it for vendor injection."""

    name: str  # canonical catalog name, e.g. "A100-80G"
    vendor: str  # nvidia / huawei / hygon / cambricon / amd / intel
    resource_name: str  # Kubernetes extended resource, e.g. "nvidia.com/gpu"
    visible_devices_env: str  # e.g. "NVIDIA_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES"
    slurm_gres_type: str = ""  # gres type on Slurm clusters, e.g. "a100"
    shareable: bool = False
    vram_gib: float = 0.0  # the card's memory: a share given as a fraction of the card gets that part of it
    partition: str = ""  # "mig" / "time_slice": the job runs on MIG instances or time-sliced replicas of cards


@dataclass(frozen=True)
class JobSpec:
    """Everything a backend needs to run one task attempt.

    ``name`` is unique per task attempt and carries the task id; ``labels`` carry the identity
    (``LABEL_INSTALLATION``, ``LABEL_TASK_UID``, ``LABEL_ATTEMPT``) that reconciliation matches on.
    """

    task_id: int
    attempt: int
    name: str
    project: str
    owner: str
    kind: str  # dev_env / training / inference / fine_tuning
    image: str = ""
    command: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # The task's secret variables, decrypted: kept out of repr so they never reach a log or a traceback.
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    # Project secrets the task gets as files: absolute path in the job -> value; kept out of repr likewise.
    # Each backend delivers them readable by the job alone (docs/security.md).
    secret_files: dict[str, str] = field(default_factory=dict, repr=False)
    volumes: tuple[dict, ...] = ()  # {"name", "mount_path", "host_path" | "claim_name", "read_only"}
    cpu: float = 1.0  # cores per instance
    memory_gib: float = 1.0  # per instance
    gpus_per_instance: float = 0.0  # whole cards, or a fraction < 1 of one card
    gpu_model: GPUModelSpec | None = None
    instances: int = 1  # gang size (ranks)
    placements: tuple[NodePlacement, ...] = ()  # one per instance, chosen by the scheduler
    namespace: str = ""  # Kubernetes namespace or Slurm partition
    time_limit_s: int | None = None  # the task's wall-time limit (its expected duration is never one)
    labels: dict[str, str] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)  # kind-specific: ide, port, replicas, hpa targets ...
    backend_flavour: str = "default"  # "volcano" for Volcano queues on Kubernetes
    task_uid: str = ""  # the task's uid (hex): names what outlives an attempt, such as its checkpoint directory
    # Where the job finds its checkpoint directory; each executor fills it in (see ``checkpoint_mount``).
    checkpoint_dir: str = ""


TASK_UID_RE = re.compile(r"^[0-9a-f]{32}$")


def wants_checkpoints(spec: JobSpec) -> bool:
    """Whether the job gets a checkpoint directory that survives its task's requeues on this cluster."""
    return spec.kind in CHECKPOINT_KINDS and bool(spec.task_uid)


def checkpoint_mount(spec: JobSpec) -> str:
    """Where backends that mount the checkpoint directory put it: the task's checkpoint_path, else /hcs/checkpoint."""
    return str(spec.settings.get("checkpoint_path") or CHECKPOINT_MOUNT)


def service_port(spec: JobSpec) -> int | None:
    """The port the job's service listens on: the task's, else its IDE's or the inference default; None for
    batch jobs that set none."""
    if spec.settings.get("port"):
        return int(spec.settings["port"])
    if spec.kind == "dev_env":
        return IDE_DEFAULT_PORTS.get(str(spec.settings.get("ide", "jupyter")).lower())
    if spec.kind == "inference":
        return DEFAULT_INFERENCE_PORT
    return None


# The task's declared parameters as the job sees them: JobSpec.settings key -> variable (docs/tasks.md).
PARAMETER_VARIABLES = {
    "ide": "HCS_IDE",
    "framework": "HCS_FRAMEWORK",
    "model_path": "HCS_MODEL_PATH",
    "epochs": "HCS_EPOCHS",
    "batch_size": "HCS_BATCH_SIZE",
    "max_tokens": "HCS_MAX_TOKENS",
    "temperature": "HCS_TEMPERATURE",
    "tensorboard_dir": "HCS_TENSORBOARD_DIR",
}


def parameter_environment(spec: JobSpec) -> dict[str, str]:
    """The task's parameters that are set, as ``HCS_*`` variables: one naming for every backend."""
    env = {
        variable: str(spec.settings[key])
        for key, variable in PARAMETER_VARIABLES.items()
        if spec.settings.get(key) not in (None, "")
    }
    if (port := service_port(spec)) is not None:
        env["HCS_PORT"] = str(port)
    if spec.checkpoint_dir:
        env["HCS_CHECKPOINT_DIR"] = spec.checkpoint_dir
    if "HCS_TENSORBOARD_DIR" in env:
        env["HCS_TENSORBOARD_PORT"] = str(TENSORBOARD_PORT)
    for name, value in (spec.settings.get("sweep_values") or {}).items():
        env[f"HCS_PARAM_{name.upper()}"] = str(value)
    return env


def platform_environment(spec: JobSpec) -> dict[str, str]:
    """Variables every job gets from the platform, whatever its backend; they win over the task's own."""
    return {
        "HCS_TASK_ID": str(spec.task_id),
        "HCS_ATTEMPT": str(spec.attempt),
        "HCS_JOB_NAME": spec.name,
        "HCS_PROJECT": spec.project,
        "HCS_OWNER": spec.owner,
        **parameter_environment(spec),
    }


@dataclass(frozen=True)
class JobState:
    """What a backend says about a job right now."""

    external_id: str
    phase: JobPhase
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    exit_code: int | None = None
    objects: tuple[dict, ...] = ()  # backend objects for the monitoring page: {"kind", "name", ...}
    name: str = ""  # the job's name on the backend (listings fill it in)
    labels: dict[str, str] = field(default_factory=dict)  # its owner labels (listings fill them in)
    replicas: int | None = None  # instances the backend runs now (placed, not ending), where it can tell
    desired_replicas: int | None = None  # instances the backend is set to run (a Deployment's, after its HPA)
    ready_replicas: int | None = None  # instances passing their readiness probe, where the backend checks one
    restarts: int = 0  # times the backend restarted the job by itself (Slurm's requeue after a node failure)
    nodes: tuple[str, ...] = ()  # the node of each running instance, where the backend can tell
    # The cards each placed instance was given, where the backend tells: (node, the device ids as its device plugin
    # names them, such as an NVIDIA card's UUID) per instance (Kubernetes: what the kubelet reports).
    devices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    failure: str = ""  # a Failure when phase is FAILED and the backend says why
    uid: str = ""  # the backend's own unique id of the object where its id is a reusable name (a Kubernetes UID)


@dataclass(frozen=True)
class InstanceState:
    """One instance (replica, rank) of a job as its backend sees it now, for the monitoring page and the API.

    Values the backend cannot tell are None (``usage_note`` says why CPU and memory are missing). Only the
    *names* of the secrets an instance mounts ever appear here, never their values.
    """

    index: int  # the rank (an indexed Job's completion index, a local job's HCS_RANK) or replica number
    name: str  # the backend's name of the instance: a pod, a Slurm node's share of the job, a local rank
    state: str  # the backend's word: "Running", "Pending", "exited 0", "RUNNING" ...
    node: str | None = None
    ip: str | None = None
    restarts: int | None = None
    cpu_used_cores: float | None = None
    memory_used_gib: float | None = None
    started_at: datetime | None = None
    message: str = ""  # why it waits or failed, in the backend's words
    usage_note: str = ""  # why CPU/memory use is unknown (no metrics API on the cluster ...)
    service: str | None = None  # the Service (or other stable name) that reaches the instance
    ports: tuple[dict, ...] = ()  # {"port", "target_port", "protocol", "name"} of that service
    ingress_host: str | None = None
    ingress_tls: bool | None = None
    secrets: tuple[str, ...] = ()  # names of the secret objects the instance mounts (never values)


# The most output one read of a log returns; a follower asks again at once when ``LogChunk.more`` says so.
LOG_CHUNK_BYTES = 1 << 20
# How many of the last lines the tail-comparison fallback compares (backends without offsets).
_FALLBACK_TAIL = 10_000
_FALLBACK_ANCHOR = 3


@dataclass(frozen=True)
class LogChunk:
    """Output of a job read from a cursor: the text, the cursor that continues after it, and whether more
    output was already written past this chunk (the read stopped at ``LOG_CHUNK_BYTES``)."""

    text: str
    cursor: str
    more: bool = False


@dataclass(frozen=True)
class NodeCondition:
    """A node as its backend sees it: ``down`` runs nothing (its jobs are lost), ``draining`` takes nothing new."""

    name: str
    state: str  # "ready", "draining" or "down"
    reason: str = ""


@dataclass(frozen=True)
class Endpoint:
    """Where the portal reaches a port of a running job instance: ``host``:``port``, through ``uds`` when set
    (a unix socket on the portal host that forwards to the port, for jobs with no network of their own)."""

    host: str
    port: int
    uds: str = ""


class Terminal(abc.ABC):
    """An interactive shell inside one instance of a running job, as the job's own identity (the Web Console).

    Calls block; callers off an event loop run them in threads. Output is raw terminal bytes.
    """

    @abc.abstractmethod
    def read(self, timeout: float) -> bytes | None:
        """The shell's next output; None when nothing came within ``timeout`` seconds, b"" once it ended."""

    @abc.abstractmethod
    def write(self, data: bytes) -> None:
        """Keystrokes (or pasted text) for the shell."""

    @abc.abstractmethod
    def resize(self, rows: int, cols: int) -> None:
        """The terminal's new size, so full-screen programs redraw to fit."""

    @abc.abstractmethod
    def close(self) -> None:
        """End the shell (hang up) and free what it holds; safe to call twice."""


class Executor(abc.ABC):
    """Runs jobs on one cluster. Implementations: local processes, Slurm (slurmrestd), Kubernetes."""

    @abc.abstractmethod
    def submit(self, spec: JobSpec, *, fresh: bool = False) -> str:
        """Start the job and return its external id. Idempotent per ``spec.name``.

        ``fresh``: the caller knows no earlier submit of this name can have reached the backend, so the
        backend need not be searched for one first.
        """

    @abc.abstractmethod
    def status(self, external_id: str) -> JobState:
        """Current state of a job; ``JobPhase.LOST`` when the backend no longer knows it."""

    @abc.abstractmethod
    def logs(self, external_id: str, tail: int = 200) -> str:
        """The last ``tail`` lines of the job's output, or "" when none is readable."""

    def read_logs(self, external_id: str, *, after: str | None = None, tail: int = 200) -> LogChunk:
        """Output for a follower: ``after`` None reads the last ``tail`` lines; ``after`` "" the output from the
        start; any other ``after`` (a cursor this executor returned) the output written since. Raises
        ValueError for a cursor it cannot read.

        This fallback, for backends that cannot read from an offset, compares tails: the cursor holds the
        last lines seen and the output after them in the last 10,000 lines is new. When those lines are no
        longer in the tail (more than 10,000 lines came since), the whole tail is returned; a repeated block
        of identical lines can make it resume at the wrong repetition. Only whole lines are returned.
        """
        lines = self.logs(external_id, tail=_FALLBACK_TAIL).splitlines(keepends=True)
        if lines and not lines[-1].endswith("\n"):
            lines.pop()  # a line still being written: it comes whole with a later read
        if after is None:
            new = lines[-tail:] if tail > 0 else []
        elif after == "":
            new = lines
        else:
            try:
                anchor = json.loads(after)
            except ValueError:
                raise ValueError("not a tail cursor") from None
            if not isinstance(anchor, list) or not all(isinstance(line, str) for line in anchor):
                raise ValueError("not a tail cursor")
            new = _after_anchor(lines, anchor)
        return LogChunk("".join(new), json.dumps(lines[-_FALLBACK_ANCHOR:]))

    @abc.abstractmethod
    def stop(self, external_id: str) -> None:
        """Ask the job to end (graceful first); no error when it already ended."""

    @abc.abstractmethod
    def delete(self, external_id: str) -> None:
        """Remove the job and everything it created on the backend."""

    @abc.abstractmethod
    def list_by_owner(self, labels: dict[str, str]) -> list[JobState]:
        """Jobs on the backend whose owner labels include all of ``labels``, in one listing of the backend.

        Each state carries the job's ``name`` and ``labels``; the reconciler calls this once per cluster per
        sync with this installation's label, whatever the number of tasks.
        """

    def final_state(self, external_id: str, name: str, submitted_after: float | None = None) -> JobState | None:
        """How job ``external_id`` (named ``name``, submitted at ``submitted_after`` or later, seconds since the
        epoch) ended, from a record the backend keeps after its listings forget the job; None when it keeps none
        or has no such job. The reconciler asks before it treats a job its listing no longer shows as lost, so a
        job that ended while nobody looked is not run again. Backends without such records return None."""
        return None

    def instances(self, external_id: str) -> list[InstanceState]:
        """Each instance of the job now: state, node, IP, restarts and CPU/memory use where the backend tells.

        Ordered by ``index``; empty when the job has no instance placed yet. Backends that cannot tell refuse
        (not retryable).
        """
        raise ExecutorError(f"{type(self).__name__} cannot list a job's instances", retryable=False)

    def resize(self, external_id: str, replicas: int, keep_nodes: tuple[str, ...] = ()) -> None:
        """Run ``replicas`` instances of a running job from now on; instances on ``keep_nodes`` stay.

        Backends that cannot change a running job's size refuse (not retryable); the engine places
        elastic tasks only on clusters whose executor supports it (``supports_resize``).
        """
        raise ExecutorError(f"{type(self).__name__} cannot resize a running job", retryable=False)

    def update_autoscaling(self, external_id: str, spec: JobSpec) -> None:
        """Give a running inference service's new autoscaling settings (``spec.settings``) to the backend's own
        autoscaler. Backends without one need nothing: the portal's autoscaler reads the task."""
        return

    # What the backend can run (docs/rules.md "Placement"): the scheduler places a task only on clusters whose
    # executor can run all it needs, and admission refuses a task no cluster of its VDC can run.
    runs_images = False  # runs a container image: its entrypoint, or the task's command inside it
    runs_host_commands = False  # runs the task's command on the node itself, without an image
    task_kinds: frozenset[str] = TASK_KINDS  # the kinds of workload it knows how to run
    supports_resize = False  # grows and shrinks a running job (elastic tasks)
    share_vendors: frozenset[str] | None = frozenset()  # vendors whose cards it runs a share of; None: every one
    # The portal's autoscaler may run more replicas of an inference service here: ``resize`` then takes the
    # service's ``spec`` with one placement per replica (the local executor; Kubernetes has its HPA).
    scales_services = False
    # The backend itself restarts a failed job as often as the task's retry setting says (Kubernetes Jobs'
    # backoffLimit, Volcano's maxRetry); elsewhere the control plane retries it as a new attempt.
    retries_failed_jobs = False

    def open_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """A shell in instance ``instance`` of a running job, with the job's identity, files and environment.

        Backends that cannot reach into a running job refuse (not retryable).
        """
        raise ExecutorError(f"{type(self).__name__} cannot open a terminal", retryable=False)

    # A visitor's terminal (below) hides the job's secrets here; elsewhere the portal offers none.
    visitor_terminals = False

    def open_visitor_terminal(self, external_id: str, instance: int = 0, rows: int = 24, cols: int = 80) -> Terminal:
        """A visitor's shell in instance ``instance`` of a running job: it sees the job's processes but none of its
        secrets (not its environment, nor files only the job may read). For users outside the job's project.

        Backends that cannot hide the job's secrets from a shell beside it refuse (not retryable).
        """
        raise ExecutorError(f"{type(self).__name__} cannot open a shell that hides the job's secrets", retryable=False)

    def port_endpoint(self, external_id: str, instance: int, port: int) -> Endpoint:
        """Where the portal reaches TCP ``port`` of instance ``instance`` of a running job (Connect, TensorBoard).

        Backends whose jobs the portal cannot reach refuse (not retryable).
        """
        raise ExecutorError(f"{type(self).__name__} cannot reach a job's ports", retryable=False)

    def remove_checkpoints(self, task_uid: str, project: str) -> None:  # noqa: B027 - nothing to remove by default
        """Remove the checkpoint directory of a deleted task, if this backend keeps one; no error when none is left.

        Called by the reconciler once the task is deleted and none of its jobs runs on this cluster any more. A
        backend that keeps no checkpoints has nothing to remove; the three executors override it.
        """

    def nodes(self) -> list[dict]:
        """The backend's nodes for discovery: ``name``, ``address``, ``cpus``, ``memory_gib`` and ``gpus`` (GPU-like
        resources, e.g. ``{"nvidia.com/gpu": 8}`` or Slurm gres types ``{"a100": 8}``; None when the backend
        cannot tell, and the node agent reports them), plus ``labels`` where the backend has them."""
        raise ExecutorError(f"{type(self).__name__} cannot list its nodes", retryable=False)

    def node_conditions(self) -> list[NodeCondition] | None:
        """The backend's view of its nodes, in one call; None when the backend has no such view (local)."""
        return None

    def ensure_project(self, isolation: dict) -> None:
        """Create or update a project's namespace / account and its limits (per-project clusters only)."""
        raise ExecutorError(f"{type(self).__name__} has no per-project namespaces or accounts", retryable=False)

    @abc.abstractmethod
    def health(self) -> str:
        """Raise ExecutorError when the backend cannot be reached; return a short status line otherwise."""


def _after_anchor(lines: list[str], anchor: list[str]) -> list[str]:
    """The lines after the last occurrence of ``anchor`` (the last lines a follower saw); all when absent."""
    if not anchor:
        return lines
    for start in range(len(lines) - len(anchor), -1, -1):
        if lines[start : start + len(anchor)] == anchor:
            return lines[start + len(anchor) :]
    return lines
