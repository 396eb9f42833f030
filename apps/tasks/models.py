"""Compute tasks (dev environments, training, inference, fine-tuning) and their event timeline."""

from __future__ import annotations

import uuid
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.base import DEFERRED

from apps.clusters.models import Cluster
from apps.clusters.services import validate_gpu_spec
from apps.core.crypto import decrypt_text, encrypt_text
from apps.queues.models import TaskQueue
from apps.tasks import schedule
from apps.tasks.choices import (
    ACTIVE,
    ASLEEP,
    FINAL,
    WAITING,
    EventKind,
    FailureReason,
    Framework,
    IDEType,
    SweepGoal,
    TaskKind,
    TaskStatus,
)
from apps.tasks.validation import task_errors
from apps.vdc.models import VDC, Project

ZERO = Decimal("0")


class TaskQuerySet(models.QuerySet):
    def waiting(self) -> TaskQuerySet:
        return self.filter(status__in=WAITING)

    def active(self) -> TaskQuerySet:
        return self.filter(status__in=ACTIVE)


class Sweep(models.Model):
    """A parameter sweep: one submission that created a task per combination of parameter values (docs/tasks.md,
    "Parameter sweeps"); its tasks point to it (``Task.sweep``)."""

    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="sweeps")
    name = models.CharField(max_length=128)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="sweeps")
    parameters = models.JSONField(help_text="The parameter spec as submitted: a grid (name -> values) or a list")
    goal = models.CharField(
        max_length=3,
        choices=SweepGoal.choices,
        default=SweepGoal.MAX,
        help_text="Which element's metric (its job's last HCS_METRIC line) is the best",
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (sweep {self.pk})"


class TaskTemplate(models.Model):
    """A named task file kept by a project (docs/tasks.md, "Templates"): its owners write it, everyone in the
    project reads it and those who may submit there submit from it. Secret values are never kept in one: only
    references to project secrets by name."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="task_templates")
    name = models.CharField(max_length=128)
    description = models.TextField(blank=True)
    task_file = models.JSONField(
        help_text="The fields of a submission (a task file) without project: the project is the template's"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="task_templates",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="task_template_unique_name")]

    def __str__(self) -> str:
        return f"{self.name} (template {self.pk})"

    @property
    def kind(self) -> str:
        """The kind of task it submits (training unless its task file says)."""
        return self.task_file.get("kind") or "training"


class Task(models.Model):
    """One unit of work a user submitted: what it needs, where it runs, and how far it got.

    ``gpu_spec`` holds the GPU spec grammar of docs/rules.md#resources-and-gpu-requests (e.g. ``2(A100)``,
    ``0.5(vgpu)``). The scheduler fills the
    placement, the queue position, the estimated start and the pending reason.
    """

    name = models.CharField(max_length=128)
    # Backend job names carry it, so ids that repeat (a reset database, two portals on one cluster) never
    # make an idempotent submit adopt another task's job.
    uid = models.UUIDField(default=uuid.uuid4, editable=False)
    project = models.ForeignKey(Project, on_delete=models.PROTECT, related_name="tasks")
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="tasks")
    vdc = models.ForeignKey(VDC, on_delete=models.PROTECT, related_name="tasks", verbose_name="VDC")
    queue = models.ForeignKey(TaskQueue, on_delete=models.PROTECT, related_name="tasks")
    kind = models.CharField(max_length=16, choices=TaskKind.choices)

    # Resources, per instance.
    cpu = models.DecimalField(
        max_digits=8, decimal_places=2, default=Decimal("1"), validators=[MinValueValidator(ZERO)]
    )
    memory_gib = models.DecimalField(
        max_digits=10, decimal_places=2, default=Decimal("1"), validators=[MinValueValidator(ZERO)]
    )
    gpu_spec = models.CharField(max_length=128, blank=True, help_text="e.g. 2(A100), 1(A100|H100), 0.5(vgpu), 1")
    instances = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1)])
    elastic_min = models.PositiveIntegerField(null=True, blank=True)
    elastic_max = models.PositiveIntegerField(null=True, blank=True)
    scaling = models.FloatField(
        null=True,
        blank=True,
        help_text="Elastic tasks: the parallel fraction of the work in Amdahl's law, from 0 to 1 (1 = linear in the "
        "replicas); spare cards go to the tasks that speed up most per card. Empty: 0.95 (docs/engine.md, "
        '"Elastic")',
    )

    # Scheduling wishes.
    expected_duration = models.DurationField(
        null=True,
        blank=True,
        help_text="An estimate, never a kill: queue estimates, backfill and the medium window; required for medium "
        "queues",
    )
    exit_code = models.IntegerField(null=True, blank=True, help_text="The last run's exit code, once it ended")
    failure_reason = models.CharField(
        max_length=16,
        choices=FailureReason.choices,
        blank=True,
        help_text="Why the last run failed (empty if it did not)",
    )
    wall_time = models.DurationField(
        null=True,
        blank=True,
        help_text="Optional hard limit: the job is stopped once it has run this long (empty: the queue's default)",
    )
    preemptible = models.BooleanField(default=True)
    required_labels = models.JSONField(default=dict, blank=True)
    preferred_clusters = models.ManyToManyField(Cluster, blank=True, related_name="preferred_by")

    # What to run.
    image = models.CharField(max_length=255, blank=True)
    command = models.TextField(blank=True)
    env = models.JSONField(default=dict, blank=True)
    # Name -> value encrypted with HCS_CREDENTIALS_KEY. Write-only: set with set_secret_env(), shown by name only,
    # decrypted only to build the job (apps.control.jobspec).
    secret_env = models.JSONField(default=dict, blank=True, editable=False)
    # Project secrets by name, each given to the job as a variable or a file:
    # [{"secret": "HF_TOKEN", "env": "HF_TOKEN"}, {"secret": "REGISTRY", "file": "/run/secrets/registry"}].
    secret_refs = models.JSONField(default=list, blank=True, help_text="Project secrets given to the job by name")
    volumes = models.JSONField(default=list, blank=True)

    # Kind-specific settings.
    ide_type = models.CharField(max_length=16, choices=IDEType.choices, blank=True)
    framework = models.CharField(max_length=16, choices=Framework.choices, blank=True)
    model_path = models.CharField(max_length=255, blank=True)
    epochs = models.PositiveIntegerField(null=True, blank=True)
    batch_size = models.PositiveIntegerField(null=True, blank=True)
    checkpoint_path = models.CharField(
        max_length=255,
        blank=True,
        help_text="Where the job finds its checkpoint directory ($HCS_CHECKPOINT_DIR); empty: /hcs/checkpoint",
    )
    tensorboard_dir = models.CharField(
        max_length=255,
        blank=True,
        verbose_name="TensorBoard log dir",
        help_text="The job writes TensorBoard logs here and serves TensorBoard on port 6006; the task page links it",
    )
    max_retries = models.PositiveSmallIntegerField(default=0)
    port = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(65535)]
    )
    max_tokens = models.PositiveIntegerField(null=True, blank=True)
    temperature = models.DecimalField(
        max_digits=4,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(ZERO), MaxValueValidator(2)],
    )
    autoscale_min = models.PositiveIntegerField(null=True, blank=True)
    autoscale_max = models.PositiveIntegerField(null=True, blank=True)
    autoscale_cpu_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    autoscale_gpu_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    autoscale_memory_percent = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)]
    )
    autoscale_rps = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        verbose_name="autoscale requests/s per replica",
        help_text="Inference: target requests per second per replica, as the portal's proxy counts them",
    )
    autoscale_concurrency = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(10_000)],
        verbose_name="autoscale requests in flight per replica",
        help_text="Inference: target concurrency (requests in flight) per replica, as the portal's proxy times them",
    )
    autoscale_latency_ms = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(600_000)],
        verbose_name="autoscale latency target (ms)",
        help_text="Inference: target mean time of a request, as the portal's proxy times them; replicas follow "
        "ceil(replicas x measured / target), as the HPA scales on any per-replica average",
    )
    autoscale_predictive = models.BooleanField(
        default=False,
        help_text="Inference: also scale ahead of the request rate forecast from the service's history "
        "(Holt-Winters, daily season) while the forecast beats the naive rules; on Kubernetes as the HPA's "
        "minimum; never scales down on a forecast alone",
    )
    autoscale_schedule = models.JSONField(
        default=list,
        blank=True,
        help_text="Inference: scheduled minimums, entries of days, from, to (HH:MM), timezone and min_replicas; "
        "while an entry holds the service runs at least that many replicas",
    )
    autoscale_desired = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Inference: replicas the service's autoscaler asks the scheduler for (the portal's on local and "
        "Slurm clusters, the HPA's count on Kubernetes); the scheduler grants them",
    )
    # Scale to zero (docs/tasks.md "Scale to zero"): an inference service that received no request through Connect
    # for this long releases its cards; the next request wakes it and is held until a replica answers.
    scale_to_zero_after_s = models.PositiveIntegerField(
        null=True,
        blank=True,
        verbose_name="scale to zero after (s)",
        help_text="Inference with a port: release the cards after this many seconds without a request through "
        "Connect; the next request wakes the service and waits for it (empty: never)",
    )
    last_cold_start_s = models.FloatField(
        null=True,
        blank=True,
        editable=False,
        verbose_name="last cold start (s)",
        help_text="Seconds the request that last woke the service waited for its first answer",
    )
    # Idle autostop of a dev environment (docs/rules.md#idle-autostop): None takes the project's default; minutes 0
    # turns it off for this task.
    idle_stop_percent = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="Dev environment: GPU utilisation (%) under which it counts as idle (empty: the project's default)",
    )
    idle_stop_minutes = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Dev environment: stopped after this many minutes idle; 0 never (empty: the project's default)",
    )
    readiness_path = models.CharField(
        max_length=255,
        blank=True,
        help_text="Inference: an HTTP path of the service that answers 2xx once a replica can serve (e.g. /health); "
        "empty counts a replica ready as soon as it runs",
    )

    # State, written by services and the scheduler.
    status = models.CharField(max_length=16, choices=TaskStatus.choices, default=TaskStatus.QUEUED, db_index=True)
    status_message = models.TextField(blank=True)
    pending_reason = models.CharField(max_length=32, blank=True)
    pending_message = models.TextField(blank=True)
    queue_position = models.PositiveIntegerField(null=True, blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    cluster = models.ForeignKey(Cluster, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks")
    placement = models.JSONField(default=list, blank=True, help_text="Per instance: node and devices")
    # The capacity ledger (apps.tasks.ledger): what the placement holds, written with it by apps.tasks.lifecycle.
    allocated_gpu = models.DecimalField(
        max_digits=10, decimal_places=3, default=ZERO, help_text="GPU-equivalents held while running"
    )
    held_cpu = models.DecimalField(
        max_digits=16,
        decimal_places=3,
        default=ZERO,
        editable=False,
        help_text="Cpu cores held while running: per-instance cores times the instances placed",
    )
    held_memory_gib = models.DecimalField(
        max_digits=16,
        decimal_places=3,
        default=ZERO,
        editable=False,
        help_text="Memory GiB held while running: per-instance memory times the instances placed",
    )
    replicas = models.PositiveIntegerField(default=0, help_text="Instances running now (elastic tasks vary)")
    ready_replicas = models.PositiveIntegerField(
        null=True, blank=True, help_text="Inference: replicas passing their readiness check, where the backend tells"
    )
    external_id = models.CharField(max_length=255, blank=True, db_index=True)
    attempt = models.PositiveIntegerField(default=0)
    preemption_count = models.PositiveIntegerField(default=0, help_text="Times the scheduler preempted or suspended it")
    lost_gpu_seconds = models.DecimalField(
        max_digits=16,
        decimal_places=1,
        default=ZERO,
        help_text="Work lost to preemptions: GPU-equivalent seconds from the start of each preempted run",
    )
    window = models.DurationField(null=True, blank=True, help_text="Medium class: current guaranteed window")
    submitted_at = models.DateTimeField(auto_now_add=True, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    sweep = models.ForeignKey(Sweep, null=True, blank=True, on_delete=models.SET_NULL, related_name="tasks")
    sweep_values = models.JSONField(
        default=dict,
        blank=True,
        help_text="A sweep element's parameter values (name -> text), its HCS_PARAM_* variables",
    )
    metric_name = models.CharField(max_length=64, blank=True, help_text="Of the last HCS_METRIC line its run printed")
    metric_value = models.FloatField(null=True, blank=True)

    objects = TaskQuerySet.as_manager()

    class Meta:
        ordering = ["-submitted_at", "-id"]
        indexes = [models.Index(fields=["status", "queue"]), models.Index(fields=["project", "status"])]
        constraints = [
            models.CheckConstraint(condition=Q(cpu__gte=0) & Q(memory_gib__gte=0), name="task_resources_non_negative"),
            models.CheckConstraint(condition=Q(instances__gte=1), name="task_instances_gte_1"),
            models.CheckConstraint(
                condition=Q(elastic_min__isnull=True)
                | Q(elastic_max__isnull=True)
                | Q(elastic_max__gte=models.F("elastic_min")),
                name="task_elastic_max_gte_min",
            ),
        ]
        # A visitor's Web Console into a task of a project the user is not in (apps.vdc.policy.console_access).
        permissions = [("open_any_console", "Can open a visitor's Web Console into any project's task")]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    # Which concrete fields a selection of columns loads, per selection (a handful: the scheduler's, the pages').
    _loaded_masks: dict[tuple[type, tuple[str, ...]], tuple[bool, ...]] = {}

    @classmethod
    def from_db(cls, db, field_names, values):
        """Django's ``from_db``, with the deferred fields worked out once per selection of columns.

        For a row of a ``.only()`` / ``.defer()`` query Django tests each of the model's 67 fields for membership
        in the list of selected names, row after row: 0.17 s of the scheduler's 10,000-task snapshot load.
        """
        concrete = cls._meta.concrete_fields
        if len(values) != len(concrete):
            key = (cls, tuple(field_names))
            mask = cls._loaded_masks.get(key)
            if mask is None:
                mask = cls._loaded_masks[key] = tuple(f.attname in field_names for f in concrete)
            loaded = iter(values)
            values = [next(loaded) if selected else DEFERRED for selected in mask]
        new = cls(*values)
        new._state.adding = False
        new._state.db = db
        return new

    @property
    def lost_gpu_hours(self) -> Decimal:
        """Work lost to preemptions in GPU-equivalent hours (for pages)."""
        return (self.lost_gpu_seconds or ZERO) / 3600

    @property
    def is_waiting(self) -> bool:
        return self.status in WAITING

    @property
    def is_active(self) -> bool:
        return self.status in ACTIVE

    @property
    def is_final(self) -> bool:
        return self.status in FINAL

    @property
    def scales_to_zero(self) -> bool:
        """An inference service that releases its cards when idle and is woken by a request."""
        return self.kind == TaskKind.INFERENCE and self.scale_to_zero_after_s is not None

    @property
    def is_asleep(self) -> bool:
        return self.status in ASLEEP

    @property
    def is_elastic(self) -> bool:
        return self.elastic_min is not None and self.elastic_max is not None

    @property
    def is_autoscaled(self) -> bool:
        """An inference service with replica bounds: an HPA (Kubernetes) or the portal's autoscaler scales it."""
        return self.kind == TaskKind.INFERENCE and self.autoscale_min is not None and self.autoscale_max is not None

    @property
    def replica_bounds(self) -> tuple[int | None, int | None, bool]:
        """(min, max, autoscaled) replicas the scheduler keeps the task between: an elastic task's bounds, or a
        running portal-autoscaled service's minimum and desired count; (None, None, False) for a fixed size."""
        if self.is_elastic:
            return self.elastic_min, self.elastic_max, False
        if self.autoscale_desired is not None and self.is_autoscaled and self.status in ACTIVE:
            return self.autoscale_min, max(self.autoscale_desired, self.autoscale_min), True
        return None, None, False

    @property
    def node_names(self) -> list[str]:
        """Node names of the placement, in rank order (instances being released included)."""
        return [p.get("node_name", "") for p in self.placement or []]

    @property
    def secret_env_names(self) -> list[str]:
        """The names of the task's secret variables; their values are never shown."""
        return sorted(self.secret_env or {})

    @property
    def secret_ref_names(self) -> list[str]:
        """The project secrets the task refers to, by name."""
        return sorted({ref.get("secret", "") for ref in self.secret_refs or () if isinstance(ref, dict)})

    @property
    def autoscale_schedule_text(self) -> str:
        """The scheduled minimums as the pages show them, e.g. ``Mon-Fri 08:00-20:00 4 Europe/Berlin``."""
        return "; ".join(schedule.format_entry(e) for e in self.autoscale_schedule or () if isinstance(e, dict))

    def set_secret_env(self, values: dict[str, str]) -> None:
        """Encrypt and keep secret variables (validated by the caller); call save() afterwards."""
        self.secret_env = {name: encrypt_text(value) for name, value in values.items()}

    def get_secret_env(self) -> dict[str, str]:
        """Decrypted secret variables, for the job spec only; raises ValueError when the key changed."""
        return {name: decrypt_text(token) for name, token in (self.secret_env or {}).items()}

    def clean(self, gpu_catalog=None) -> None:
        """The submission rules of :mod:`apps.tasks.validation` and the GPU spec grammar, per field.

        ``gpu_catalog`` saves loading the catalog when the caller has it already.
        """
        errors: dict[str, str] = {}
        # Scheduled minimums given as lines are stored as objects, whichever door they came through.
        self.autoscale_schedule = schedule.normalise(self.autoscale_schedule)
        try:
            validate_gpu_spec(self.gpu_spec, gpu_catalog, vdc_id=self.vdc_id)
        except ValidationError as exc:
            errors["gpu_spec"] = exc.messages[0]
        if (self.elastic_min is None) != (self.elastic_max is None):
            errors["elastic_max"] = "Expected both elastic_min and elastic_max, or neither."
        if self.scaling is not None:
            if self.elastic_min is None or self.elastic_max is None:
                errors["scaling"] = "A speed-up curve applies to elastic tasks: set elastic_min and elastic_max too."
            elif not 0 <= self.scaling <= 1:
                errors["scaling"] = f"Expected a parallel fraction from 0 to 1, e.g. 0.95, got {self.scaling}."
        errors = {**task_errors(self), **errors}
        if errors:
            raise ValidationError(errors)


class TaskEvent(models.Model):
    """One entry of a task's timeline: a status change, placement, preemption (who and why), requeue."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16, choices=EventKind.choices)
    from_status = models.CharField(max_length=16, choices=TaskStatus.choices, blank=True)
    to_status = models.CharField(max_length=16, choices=TaskStatus.choices, blank=True)
    message = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="task_events"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.task_id}: {self.kind}"


class ServiceLoadSample(models.Model):
    """A service's load over one bucket of time (5 minutes), written by the portal's autoscaler: the measured
    request rate and GPU utilisation, and the request rate forecast for it; the history predictive scaling
    fits and the monitoring page charts. Pruned after ``apps.control.autoscaling.LOAD_KEEP_DAYS`` days."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="load_samples")
    start = models.DateTimeField(db_index=True, help_text="Start of the bucket")
    rps = models.FloatField(null=True, blank=True, help_text="Mean requests per second measured (none yet: future)")
    gpu_percent = models.FloatField(null=True, blank=True, help_text="Mean GPU utilisation of the service's cards")
    samples = models.PositiveIntegerField(default=0, help_text="Readings averaged into the bucket")
    forecast_rps = models.FloatField(null=True, blank=True, help_text="Requests per second forecast for the bucket")
    forecast_method = models.CharField(max_length=32, blank=True)

    class Meta:
        ordering = ("task", "start")
        constraints = [models.UniqueConstraint(fields=("task", "start"), name="one_load_sample_per_bucket")]

    def __str__(self) -> str:
        return f"#{self.task_id} {self.start:%Y-%m-%d %H:%M}"


class TaskUsageSample(models.Model):
    """What a running task's cards did in one minute, from its node agents' last reports: mean utilisation and
    memory used over the cards of its placement (apps.tasks.usage). The history its monitoring page charts, the
    utilisation API returns and idle autostop decides on; pruned as ``apps.tasks.usage`` says."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="usage_samples")
    at = models.DateTimeField(help_text="Start of the minute")
    gpu_percent = models.FloatField(null=True, blank=True, help_text="Mean utilisation of the task's cards")
    vram_used_gib = models.FloatField(null=True, blank=True, help_text="GPU memory used on the task's cards")
    vram_gib = models.FloatField(null=True, blank=True, help_text="GPU memory of the task's cards")
    cards = models.PositiveSmallIntegerField(default=0, help_text="Cards with a fresh report")

    class Meta:
        ordering = ("task", "at")
        constraints = [models.UniqueConstraint(fields=("task", "at"), name="one_usage_sample_per_minute")]
        indexes = [models.Index(fields=["at"], name="usage_sample_at")]

    def __str__(self) -> str:
        return f"#{self.task_id} {self.at:%Y-%m-%d %H:%M}"


class IdempotentRequest(models.Model):
    """The first successful answer to a submit sent with an ``Idempotency-Key``, replayed to its retries for a day
    (docs/api.md); a key is unique per user, so two copies sent at once create one task."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="idempotent_requests")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of the method, path and body")
    status_code = models.PositiveSmallIntegerField()
    body = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=("user", "key"), name="idempotency_key_once_per_user")]

    def __str__(self) -> str:
        return f"{self.user_id}: {self.key}"
