"""Virtual data centers, projects (tenants), memberships and project quotas."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from django.db.models import Q, Sum

from apps.core.crypto import decrypt_text, encrypt_text
from apps.vdc.choices import ClusterSelectionStrategy, LoanBilling, LoanReturnReason, NodeScorer, QueuePolicy, Role

ZERO = Decimal("0")


def _quantity(**kwargs) -> models.DecimalField:
    return models.DecimalField(max_digits=12, decimal_places=2, validators=[MinValueValidator(ZERO)], **kwargs)


class VDC(models.Model):
    """A virtual data center: a pool of clusters that projects get quotas in.

    Total caps are optional; empty means "the sum of the clusters' nodes".
    """

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    total_cpu = _quantity(null=True, blank=True, help_text="Cores; empty = sum of the clusters")
    total_memory_gib = _quantity(null=True, blank=True, help_text="GiB; empty = sum of the clusters")
    total_gpu = _quantity(null=True, blank=True, help_text="GPU-equivalents; empty = sum of the clusters")
    allow_overcommit = models.BooleanField(default=False)
    overcommit_ratio = models.DecimalField(
        max_digits=5, decimal_places=2, default=Decimal("1.00"), validators=[MinValueValidator(Decimal("1"))]
    )
    default_queue_policy = models.CharField(max_length=16, choices=QueuePolicy.choices, default=QueuePolicy.FIFO)
    cluster_selection_strategy = models.CharField(
        max_length=24, choices=ClusterSelectionStrategy.choices, default=ClusterSelectionStrategy.RESOURCE_FIT
    )
    node_scorer = models.CharField(max_length=16, choices=NodeScorer.choices, default=NodeScorer.FGD)
    is_default = models.BooleanField(default=False, help_text="Tasks submitted without a VDC go here")
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "VDC"
        verbose_name_plural = "VDCs"
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_vdc"),
            models.CheckConstraint(condition=Q(overcommit_ratio__gte=1), name="vdc_overcommit_ratio_gte_1"),
            models.CheckConstraint(
                condition=Q(total_cpu__gte=0) | Q(total_cpu__isnull=True), name="vdc_total_cpu_non_negative"
            ),
            models.CheckConstraint(
                condition=Q(total_memory_gib__gte=0) | Q(total_memory_gib__isnull=True),
                name="vdc_total_memory_non_negative",
            ),
            models.CheckConstraint(
                condition=Q(total_gpu__gte=0) | Q(total_gpu__isnull=True), name="vdc_total_gpu_non_negative"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def default(cls) -> VDC | None:
        """The VDC that takes tasks submitted without one (docs/rules.md#vdcs-projects-and-doors)."""
        return cls.objects.filter(is_default=True, enabled=True).first()

    def capacity(self) -> dict[str, Decimal]:
        """Cpu cores, memory GiB and GPU-equivalents: the admin's caps where set, else the clusters' sum."""
        clusters = self.clusters.filter(enabled=True)
        sums = clusters.aggregate(cpu=Sum("nodes__cpu"), memory=Sum("nodes__memory_gib"))
        # Schedulable units: a card partitioned into MIG instances or replicas counts as those units.
        units = Q(
            nodes__devices__sharing="whole",
            nodes__devices__missing_since__isnull=True,
            nodes__devices__parent__missing_since__isnull=True,
        )
        gpu = clusters.aggregate(eq=Sum("nodes__devices__gpu_model__exchange_rate", filter=units))["eq"]
        return {
            "cpu": self.total_cpu if self.total_cpu is not None else (sums["cpu"] or ZERO),
            "memory_gib": self.total_memory_gib if self.total_memory_gib is not None else (sums["memory"] or ZERO),
            "gpu": self.total_gpu if self.total_gpu is not None else (gpu or ZERO),
        }

    @property
    def effective_overcommit_ratio(self) -> Decimal:
        return self.overcommit_ratio if self.allow_overcommit else Decimal("1")


class Project(models.Model):
    """A tenant: users work in projects, and projects get quotas in VDCs."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="projects")
    # Idle autostop of dev environments (docs/rules.md#idle-autostop): off by default; a task may set its own.
    idle_stop_percent = models.PositiveSmallIntegerField(
        default=5,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Dev environments count as idle while their GPU utilisation is under this (%)",
    )
    idle_stop_minutes = models.PositiveIntegerField(
        default=0,
        validators=[MaxValueValidator(7 * 24 * 60)],
        help_text="Stop a dev environment idle this many minutes (0: never); tasks may set their own at submit",
    )

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def role_of(self, user) -> str | None:
        """The user's role in this project, or None for outsiders."""
        membership = self.memberships.filter(user=user).first()
        return membership.role if membership else None


class Membership(models.Model):
    """A user's role in a project: owner and member may submit and act; viewer only reads."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["project__name", "user__username"]
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="unique_membership")]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ProjectQuota(models.Model):
    """A project's guaranteed and maximum share of one VDC.

    GPU quantities are GPU-equivalents (docs/rules.md#exchange-rates), so "8 GPU" means the same on any vendor.
    Usage between guaranteed and limit is borrowed from idle capacity and can be reclaimed.
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="quotas")
    vdc = models.ForeignKey(VDC, on_delete=models.CASCADE, related_name="quotas", verbose_name="VDC")
    guaranteed_cpu = _quantity(default=ZERO)
    limit_cpu = _quantity(default=ZERO)
    guaranteed_memory_gib = _quantity(default=ZERO)
    limit_memory_gib = _quantity(default=ZERO)
    guaranteed_gpu = _quantity(default=ZERO, help_text="GPU-equivalents")
    limit_gpu = _quantity(default=ZERO, help_text="GPU-equivalents")
    max_concurrent_tasks = models.PositiveIntegerField(null=True, blank=True, help_text="Empty = unlimited")
    max_training_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_inference_tasks = models.PositiveIntegerField(null=True, blank=True)
    max_dev_env_tasks = models.PositiveIntegerField(null=True, blank=True)
    priority = models.IntegerField(
        default=0,
        help_text="Higher goes first within each queue (ahead of earlier tasks of lower-priority projects) and is "
        "preempted last within its class; equal priorities keep submit order",
    )
    enforce = models.BooleanField(default=True, help_text="Off makes the quota advisory")
    weight = models.DecimalField(
        max_digits=8,
        decimal_places=3,
        default=Decimal("1"),
        validators=[MinValueValidator(Decimal("0.001"))],
        help_text="Share weight in queues with the weighted fair share policy: weights 2 and 1 split contended "
        "capacity 2:1",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    RESOURCES = ("cpu", "memory_gib", "gpu")

    class Meta:
        ordering = ["vdc__name", "project__name"]
        constraints = [
            models.UniqueConstraint(fields=["project", "vdc"], name="unique_project_quota_per_vdc"),
            *[
                models.CheckConstraint(
                    condition=Q(**{f"guaranteed_{r}__gte": 0}) & Q(**{f"limit_{r}__gte": models.F(f"guaranteed_{r}")}),
                    name=f"quota_{r}_limit_gte_guaranteed_gte_0",
                )
                for r in ("cpu", "memory_gib", "gpu")
            ],
            models.CheckConstraint(condition=Q(weight__gt=0), name="quota_weight_gt_0"),
        ]

    def __str__(self) -> str:
        return f"{self.project} @ {self.vdc}"

    def kind_limit(self, kind: str) -> int | None:
        """The per-kind task limit (training / inference / dev env), None when unlimited."""
        return {
            "training": self.max_training_tasks,
            "fine_tuning": self.max_training_tasks,
            "inference": self.max_inference_tasks,
            "dev_env": self.max_dev_env_tasks,
        }.get(kind)

    def warnings(self) -> list[str]:
        """Settings that are allowed but cannot take effect: limits above everything the VDC has."""
        capacity = self.vdc.capacity()
        units = {"cpu": "cores", "memory_gib": "GiB", "gpu": "GPU-equivalents"}
        out = []
        for r in self.RESOURCES:
            limit = getattr(self, f"limit_{r}")
            if limit is not None and limit > capacity[r]:
                out.append(
                    f"The {r.replace('_gib', '')} limit {Decimal(limit).normalize():f} is more than all of VDC "
                    f"{self.vdc} has ({Decimal(capacity[r]).normalize():f} {units[r]}): it cannot be reached, so "
                    "it limits nothing."
                )
        return out

    def clean(self) -> None:
        errors: dict[str, str] = {}
        for r in self.RESOURCES:
            g, lim = getattr(self, f"guaranteed_{r}"), getattr(self, f"limit_{r}")
            if g is not None and lim is not None and lim < g:
                errors[f"limit_{r}"] = f"Expected a limit of at least the guaranteed {g}, got {lim}."
        if errors:
            raise ValidationError(errors)
        if self.vdc_id is None:
            return
        capacity = self.vdc.capacity()
        ratio = self.vdc.effective_overcommit_ratio
        others = ProjectQuota.objects.filter(vdc_id=self.vdc_id).exclude(pk=self.pk)
        sums = others.aggregate(
            cpu=Sum("guaranteed_cpu"), memory_gib=Sum("guaranteed_memory_gib"), gpu=Sum("guaranteed_gpu")
        )
        for r in self.RESOURCES:
            total = (sums[r] or ZERO) + (getattr(self, f"guaranteed_{r}") or ZERO)
            allowed = capacity[r] * ratio
            if total > allowed:
                errors[f"guaranteed_{r}"] = (
                    f"Guarantees in VDC {self.vdc} would add up to {total}, over its capacity "
                    f"{capacity[r]} x overcommit {ratio} = {allowed}."
                )
        if errors:
            raise ValidationError(errors)


SECRET_NAME = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$",
    "Expected a name of letters, digits and underscores, not starting with a digit (e.g. HF_TOKEN).",
)
# The most text a secret holds: it travels as an environment value on Slurm, and a Kubernetes Secret holds 1 MiB.
MAX_SECRET_LENGTH = 32_768


class ProjectSecret(models.Model):
    """A credential a project keeps in the portal (registry password, API key, dataset token) for its tasks.

    Tasks refer to it by name (``Task.secret_refs``); the value is encrypted with HCS_CREDENTIALS_KEY,
    write-only (set with :meth:`set_value`), and decrypted only to build a job (``apps.control.jobspec``).
    """

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=64, validators=[SECRET_NAME], help_text="e.g. HF_TOKEN; tasks refer to it by it")
    description = models.TextField(blank=True)
    value = models.TextField(editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["project__name", "name"]
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="unique_secret_name_per_project")]

    def __str__(self) -> str:
        return f"{self.project} / {self.name}" if self.project_id else self.name

    def __repr__(self) -> str:
        return f"<ProjectSecret {self.pk}: {self.name}>"

    def set_value(self, value: str) -> None:
        """Encrypt and keep the value (validated by the caller); call save() afterwards."""
        self.value = encrypt_text(value)

    def get_value(self) -> str:
        """The decrypted value, for the job spec only; raises ValueError when the key changed."""
        return decrypt_text(self.value)


class RebalancerSettings(models.Model):
    """Per VDC, the inter-project rebalancer's settings (docs/rules.md#rebalancing); a VDC without a row is not
    rebalanced.

    The rules are ``apps.queues.engine.rebalance``; the loop is ``apps.control.rebalance``.
    """

    vdc = models.OneToOneField(VDC, on_delete=models.CASCADE, related_name="rebalancer", verbose_name="VDC")
    enabled = models.BooleanField(default=True)
    interval = models.DurationField(
        default=timedelta(minutes=1), help_text="How often new loans are considered (returns are checked every tick)"
    )
    threshold_percent = models.PositiveSmallIntegerField(
        default=20,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Lend only when the lender's use of its guarantee is this many points below the borrower's",
    )
    max_loan_duration = models.DurationField(
        default=timedelta(hours=4), help_text="A loan is returned this long after it opened, at the latest"
    )
    min_loan_duration = models.DurationField(
        default=timedelta(minutes=10),
        help_text="An unused loan is kept at least this long (the lender's demand takes it back at once)",
    )
    cooldown = models.DurationField(
        default=timedelta(minutes=15),
        help_text="After a loan between two projects ends, wait this long before "
        "the same lender lends to the same borrower again",
    )
    loan_billing = models.CharField(
        max_length=16,
        choices=LoanBilling.choices,
        default=LoanBilling.BORROWER_PAYS,
        help_text="Who pays for usage on a loan; fair share (drf, fair_share queues) counts loans the same way",
    )
    loans_low_class_only = models.BooleanField(
        default=True,
        verbose_name="loans for low-class work only",
        help_text="Only low-class work runs on borrowed capacity: it is suspended at once when the lender needs "
        "its guarantee back, where medium work would keep it until its guaranteed window ends",
    )
    last_run_at = models.DateTimeField(
        null=True, blank=True, editable=False, help_text="When loans were last considered"
    )

    class Meta:
        verbose_name = "rebalancer settings of a VDC"
        verbose_name_plural = "rebalancer settings"
        constraints = [
            models.CheckConstraint(
                condition=Q(threshold_percent__gte=1, threshold_percent__lte=100), name="rebalancer_threshold_range"
            ),
            models.CheckConstraint(condition=Q(interval__gt=timedelta(0)), name="rebalancer_interval_positive"),
            models.CheckConstraint(
                condition=Q(max_loan_duration__gt=timedelta(0)), name="rebalancer_max_duration_positive"
            ),
        ]

    def __str__(self) -> str:
        return f"rebalancer of {self.vdc}"

    def clean(self) -> None:
        errors = {}
        for name in ("interval", "max_loan_duration"):
            value = getattr(self, name)
            if value is not None and value <= timedelta(0):
                errors[name] = f"Expected a duration above zero, got {value}."
        for name in ("min_loan_duration", "cooldown"):
            value = getattr(self, name)
            if value is not None and value < timedelta(0):
                errors[name] = f"Expected a duration of zero or more, got {value}."
        if (
            not errors
            and self.min_loan_duration
            and self.max_loan_duration
            and (self.min_loan_duration > self.max_loan_duration)
        ):
            errors["min_loan_duration"] = (
                f"Expected at most the maximum loan duration {self.max_loan_duration}, got {self.min_loan_duration}."
            )
        if errors:
            raise ValidationError(errors)


class CapacityLoanQuerySet(models.QuerySet):
    def active(self) -> CapacityLoanQuerySet:
        """Loans not returned yet (an expired one stays active until the rebalancer returns it)."""
        return self.filter(returned_at__isnull=True)


class CapacityLoan(models.Model):
    """Part of one project's unused guarantee in a VDC lent to another project with waiting work
    (docs/rules.md#rebalancing).

    While active, the borrower's guarantee and limit are raised by the amount and the lender's guarantee lowered
    (``apps.control.scheduling``); returning it lets the lender reclaim through the ordinary reclaim rules.
    ``reason`` and ``figures`` keep what triggered it, ``return_reason`` / ``return_message`` why it ended.
    """

    vdc = models.ForeignKey(VDC, on_delete=models.CASCADE, related_name="loans", verbose_name="VDC")
    lender = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="loans_given")
    borrower = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="loans_taken")
    gpu = _quantity(default=ZERO, help_text="GPU-equivalents lent")
    cpu = _quantity(default=ZERO, help_text="Cores lent")
    memory_gib = _quantity(default=ZERO, help_text="GiB lent")
    reason = models.TextField(help_text="The figures that opened it, in words")
    figures = models.JSONField(default=dict, blank=True, help_text="The same figures, as numbers")
    started_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    returned_at = models.DateTimeField(null=True, blank=True)
    return_reason = models.CharField(max_length=16, choices=LoanReturnReason.choices, blank=True)
    return_message = models.TextField(blank=True)
    used_gpu_hours = models.DecimalField(
        max_digits=16,
        decimal_places=6,
        default=ZERO,
        help_text="GPU-equivalent hours the borrower ran on the loan (above its own limit), as the rebalancer saw",
    )
    accounted_until = models.DateTimeField(null=True, blank=True, help_text="used_gpu_hours counts up to here")
    settlement = models.CharField(max_length=255, blank=True, help_text="What billing did at the return")

    objects = CapacityLoanQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["vdc", "returned_at"], name="loan_vdc_returned")]
        constraints = [
            models.CheckConstraint(condition=~Q(lender=models.F("borrower")), name="loan_lender_is_not_borrower"),
            models.CheckConstraint(condition=Q(expires_at__gt=models.F("started_at")), name="loan_expires_after_start"),
            models.CheckConstraint(condition=Q(gpu__gte=0, cpu__gte=0, memory_gib__gte=0), name="loan_amount_gte_0"),
            models.CheckConstraint(
                condition=Q(returned_at__isnull=True, return_reason="")
                | Q(returned_at__isnull=False) & ~Q(return_reason=""),
                name="loan_returned_with_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"loan #{self.pk}: {self.lender} -> {self.borrower} ({self.amount_text})"

    @property
    def active(self) -> bool:
        return self.returned_at is None

    @property
    def amount_text(self) -> str:
        """The amount in words, e.g. "2 GPU-eq, 16 cores"."""
        parts = [(self.gpu, "GPU-eq"), (self.cpu, "cores"), (self.memory_gib, "GiB")]
        return ", ".join(f"{Decimal(v).normalize():f} {unit}" for v, unit in parts if v) or "nothing"
