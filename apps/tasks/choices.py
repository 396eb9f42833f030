"""Enumerations of the tasks app."""

from django.db import models


class TaskKind(models.TextChoices):
    DEV_ENV = "dev_env", "Dev environment"
    TRAINING = "training", "Training job"
    INFERENCE = "inference", "Inference service"
    FINE_TUNING = "fine_tuning", "Fine-tuning job"


class TaskStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    QUEUED = "queued", "Queued"
    SCHEDULED = "scheduled", "Scheduled"
    STARTING = "starting", "Starting"
    RUNNING = "running", "Running"
    UNKNOWN = "unknown", "Unknown"
    SCALED_TO_ZERO = "scaled_to_zero", "Scaled to zero"
    PREEMPTED = "preempted", "Preempted"
    SUSPENDED = "suspended", "Suspended"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    STOPPED = "stopped", "Stopped"


# Statuses in which a task waits for the scheduler.
WAITING = (TaskStatus.PENDING, TaskStatus.QUEUED, TaskStatus.PREEMPTED, TaskStatus.SUSPENDED)
# Statuses in which a task holds resources on a cluster. ``unknown``: it was running and its cluster's API stopped
# answering; it keeps what it holds until the backend says what became of it (docs/rules.md, "A task's life").
ACTIVE = (TaskStatus.SCHEDULED, TaskStatus.STARTING, TaskStatus.RUNNING, TaskStatus.UNKNOWN)
FINAL = (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.STOPPED)
# A service that scales to zero and has released its cards: neither waiting for the scheduler nor holding
# anything, until a request through Connect wakes it (docs/tasks.md "Scale to zero").
ASLEEP = (TaskStatus.SCALED_TO_ZERO,)


class FailureReason(models.TextChoices):
    """Why a task's last run failed (``Task.failure_reason``); the values of the executors' ``Failure``."""

    EXIT_CODE = "exit_code", "Its command exited with an error"
    WALL_TIME = "wall_time", "Wall-time limit reached"
    OUT_OF_MEMORY = "out_of_memory", "Out of memory"
    LAUNCH = "launch_failed", "The backend could not start it"
    NODE = "node_failure", "Node failure"
    BACKEND = "backend", "The backend failed it"


class IDEType(models.TextChoices):
    JUPYTER = "jupyter", "Jupyter Lab"
    VSCODE = "vscode", "VS Code (code-server)"


class Framework(models.TextChoices):
    PYTORCH = "pytorch", "PyTorch (DDP)"
    DEEPSPEED = "deepspeed", "DeepSpeed"
    TENSORFLOW = "tensorflow", "TensorFlow"
    MINDSPORE = "mindspore", "MindSpore"
    JAX = "jax", "JAX"


class EventKind(models.TextChoices):
    SUBMITTED = "submitted", "Submitted"
    QUEUED = "queued", "Queued"
    SCHEDULED = "scheduled", "Scheduled"
    STARTED = "started", "Started"
    PREEMPTED = "preempted", "Preempted"
    SUSPENDED = "suspended", "Suspended"
    REQUEUED = "requeued", "Requeued"
    RESIZED = "resized", "Resized"
    AUTOSCALED = "autoscaled", "Autoscale decision"
    SCALED_TO_ZERO = "scaled_to_zero", "Scaled to zero"
    WOKEN = "woken", "Woken by a request"
    COLD_START = "cold_start", "Cold start"
    COMPLETED = "completed", "Completed"
    FAILED = "failed", "Failed"
    STOP_REQUESTED = "stop_requested", "Stop requested"
    STOPPED = "stopped", "Stopped"
    BACKEND_ERROR = "backend_error", "Backend error"
    STATUS = "status", "Status change"


class SweepGoal(models.TextChoices):
    """Which element of a parameter sweep is best: the highest or the lowest metric its job reported."""

    MAX = "max", "highest metric is best"
    MIN = "min", "lowest metric is best"
