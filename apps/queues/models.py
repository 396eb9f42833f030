"""Task queues: priority class, ordering policy and capacity of a queue in a VDC."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from apps.queues.choices import CLASS_RULES, BackendFlavour, PriorityClass
from apps.vdc.choices import QueuePolicy
from apps.vdc.models import VDC

ZERO = Decimal("0")
# The longest expected duration any queue may allow: a year (and a day), far inside what datetimes can add.
LONGEST_EXPECTED_DURATION = timedelta(days=366)
DEFAULT_MAX_EXPECTED_DURATION = timedelta(days=7)
DEFAULT_RESERVE_AFTER = timedelta(hours=1)
DEFAULT_MIN_RUN_BEFORE_RECLAIM = timedelta(minutes=5)


class TaskQueue(models.Model):
    """A queue of a VDC. Its class decides preemption rules, its policy the order within it.

    Capacities are GPU-equivalents; an empty maximum means unbounded. ``max_expected_duration`` bounds
    the expected duration a task may declare in the queue.
    """

    vdc = models.ForeignKey(VDC, on_delete=models.CASCADE, related_name="queues", verbose_name="VDC")
    name = models.SlugField(max_length=64)
    description = models.TextField(blank=True)
    priority_class = models.CharField(max_length=8, choices=PriorityClass.choices)
    policy = models.CharField(max_length=16, choices=QueuePolicy.choices, default=QueuePolicy.FIFO)
    guaranteed_gpu = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        default=ZERO,
        validators=[MinValueValidator(ZERO)],
        help_text="GPU-equivalents",
    )
    max_gpu = models.DecimalField(
        max_digits=12,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(ZERO)],
        help_text="GPU-equivalents; empty = unbounded",
    )
    weight = models.DecimalField(
        max_digits=6, decimal_places=2, default=Decimal("1"), validators=[MinValueValidator(ZERO)]
    )
    min_window = models.DurationField(
        default=timedelta(minutes=15), help_text="Medium class: the halved window never drops below this"
    )
    max_expected_duration = models.DurationField(
        default=DEFAULT_MAX_EXPECTED_DURATION,
        help_text="Longest expected duration a task may declare here (at most 366 days)",
    )
    default_wall_time = models.DurationField(
        null=True, blank=True, help_text="Wall-time limit of tasks that set none; empty: no limit"
    )
    max_wall_time = models.DurationField(
        null=True, blank=True, help_text="Longest wall-time limit a task may set here; empty: up to 366 days"
    )
    reserve_after = models.DurationField(
        null=True,
        blank=True,
        default=DEFAULT_RESERVE_AFTER,
        help_text="Medium class: a task waiting longer than this reserves the capacity it needs, so later work of "
        "any queue cannot keep taking it; empty: never",
    )
    min_run_before_reclaim = models.DurationField(
        default=DEFAULT_MIN_RUN_BEFORE_RECLAIM,
        help_text="A task of this queue is not preempted to give a project or queue its guarantee back before it "
        "has run this long (stops restart-and-reclaim churn); 0 turns the protection off",
    )
    las_thresholds_gpu_s = models.JSONField(
        null=True,
        blank=True,
        help_text="las policy: the attained GPU-seconds between the queue's levels, ascending, e.g. [3600, 36000]; "
        "a running task demoted past one may be preempted for a waiting task of a higher level. Empty: "
        '[3600, 36000] (docs/engine.md, "2D-LAS")',
    )
    backend_flavour = models.CharField(max_length=16, choices=BackendFlavour.choices, default=BackendFlavour.DEFAULT)
    is_open = models.BooleanField(default=True, help_text="Closed queues take no new submissions")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["vdc__name", "priority_class", "name"]
        constraints = [
            models.UniqueConstraint(fields=["vdc", "name"], name="unique_queue_name_per_vdc"),
            models.CheckConstraint(
                condition=Q(guaranteed_gpu__gte=0)
                & (Q(max_gpu__isnull=True) | Q(max_gpu__gte=models.F("guaranteed_gpu"))),
                name="queue_max_gte_guaranteed_gte_0",
            ),
            models.CheckConstraint(condition=Q(weight__gte=0), name="queue_weight_non_negative"),
        ]

    def __str__(self) -> str:
        return f"{self.vdc}/{self.name}"

    @property
    def rules(self) -> str:
        """The class rules in words, for forms and pages."""
        return CLASS_RULES[self.priority_class]

    def clean(self) -> None:
        errors: dict[str, str] = {}
        if self.max_gpu is not None and self.guaranteed_gpu is not None and self.max_gpu < self.guaranteed_gpu:
            errors["max_gpu"] = f"Expected at least the guaranteed {self.guaranteed_gpu}, got {self.max_gpu}."
        longest = self.max_expected_duration
        if longest is not None and not timedelta(0) < longest <= LONGEST_EXPECTED_DURATION:
            errors["max_expected_duration"] = (
                f"Expected a positive duration of at most {LONGEST_EXPECTED_DURATION.days} days, e.g. 7 00:00:00."
            )
        for name in ("default_wall_time", "max_wall_time"):
            value = getattr(self, name)
            if value is not None and not timedelta(0) < value <= LONGEST_EXPECTED_DURATION:
                errors[name] = (
                    f"Expected a positive duration of at most {LONGEST_EXPECTED_DURATION.days} days, e.g. 1 00:00:00."
                )
        default_wall, max_wall = self.default_wall_time, self.max_wall_time
        if default_wall and max_wall and "max_wall_time" not in errors and default_wall > max_wall:
            errors["default_wall_time"] = (
                f"Expected at most the queue's longest wall time ({max_wall}), got {default_wall}."
            )
        if self.reserve_after is not None and not timedelta(0) < self.reserve_after <= LONGEST_EXPECTED_DURATION:
            errors["reserve_after"] = (
                f"Expected a positive duration of at most {LONGEST_EXPECTED_DURATION.days} days, e.g. 01:00:00, "
                "or empty for never."
            )
        reclaim = self.min_run_before_reclaim
        if reclaim is not None and not timedelta(0) <= reclaim <= LONGEST_EXPECTED_DURATION:
            errors["min_run_before_reclaim"] = (
                f"Expected a duration from 0 to {LONGEST_EXPECTED_DURATION.days} days, e.g. 00:05:00."
            )
        thresholds = self.las_thresholds_gpu_s
        if thresholds is not None and not (
            isinstance(thresholds, list)
            and 0 < len(thresholds) <= 8
            and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in thresholds)
            and all(a < b for a, b in zip(thresholds, thresholds[1:], strict=False))
        ):
            errors["las_thresholds_gpu_s"] = (
                f"Expected 1 to 8 ascending positive GPU-second thresholds, e.g. [3600, 36000], got {thresholds!r}."
            )
        if self.min_window is not None and self.min_window <= timedelta(0):
            errors["min_window"] = "Expected a positive duration, e.g. 00:15:00."
        elif self.min_window is not None and longest is not None and self.min_window > longest:
            errors["min_window"] = (
                f"Expected at most the queue's longest expected duration ({longest}), got {self.min_window}."
            )
        if errors:
            raise ValidationError(errors)
