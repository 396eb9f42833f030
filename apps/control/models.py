"""What the control plane keeps: this installation's identity and every object it created on a backend."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q

from apps.clusters.models import Cluster
from apps.tasks.choices import ACTIVE
from apps.tasks.ledger import placement_devices
from apps.tasks.models import Task


class Installation(models.Model):
    """The one row naming this portal installation; every backend object carries its uid.

    A second portal (or this one on a fresh database) has another uid, so the objects of one are never
    adopted, reported or cancelled by the other.
    """

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(id=1), name="installation_singleton")]

    def __str__(self) -> str:
        return str(self.uid)

    @classmethod
    def current(cls) -> Installation:
        """This installation's row, created on first use."""
        return cls.objects.get_or_create(pk=1)[0]


class ObjectState(models.TextChoices):
    """Where a backend object stands, as far as the backend has confirmed."""

    PENDING = "pending", "Pending (not yet confirmed on the backend)"
    ACTIVE = "active", "Active on the backend"
    ENDED = "ended", "Ended (the backend holds nothing for it)"


# States in which an object may hold devices on its backend.
HOLDING = (ObjectState.PENDING, ObjectState.ACTIVE)


class BackendObjectQuerySet(models.QuerySet):
    def holders_of(self, device_ids) -> dict[int, set[int | None]]:
        """Card id -> the tasks whose jobs (launching, running or being cancelled) may hold it on the backend, for
        the cards of ``device_ids`` that any such job holds. Every placement has its job's object from the moment
        it is decided, so this is also every card an active task holds."""
        wanted = set(device_ids)
        holders: dict[int, set[int | None]] = {}
        for task_id, shares in self.filter(state__in=HOLDING).values_list("task_id", "shares"):
            for share in shares or ():
                if share["id"] in wanted:
                    holders.setdefault(share["id"], set()).add(task_id)
        return holders


def new_launch_token() -> str:
    """A fresh launch token (docs/control.md, "Identity by id")."""
    return uuid.uuid4().hex


class BackendObject(models.Model):
    """One job the portal asked a backend to run (a Slurm job, a Kubernetes workload, a local process).

    It is recorded in the same transaction as the decision that wants it (the scheduler's placement) and
    kept until the backend confirms it no longer runs. Whether it should exist is derived, never stored:
    it should while its task is active on this cluster in this attempt; otherwise the reconciler cancels it
    until the backend confirms it gone.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.PROTECT, related_name="backend_objects")
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="backend_objects")
    task_uid = models.UUIDField(help_text="The task's uid, carried by the object on the backend")
    attempt = models.PositiveIntegerField()
    name = models.CharField(max_length=128, help_text="Job name on the backend")
    launch_token = models.CharField(
        max_length=32,
        default=new_launch_token,
        editable=False,
        help_text="Random per launch intent, written into the job: adopts a job whose submit answer was lost",
    )
    external_id = models.CharField(max_length=255, blank=True, help_text="The backend's id, once it is known")
    backend_uid = models.CharField(
        max_length=64,
        blank=True,
        help_text="Where the backend's id is a reusable name (Kubernetes): the object's UID, recorded when first seen",
    )
    state = models.CharField(max_length=8, choices=ObjectState.choices, default=ObjectState.PENDING, db_index=True)
    shares = models.JSONField(
        default=list,
        blank=True,
        help_text='Cards the object may hold on its backend, with the share of each: [{"id": 7, "milli": 500}]',
    )
    replicas = models.PositiveIntegerField(default=1, help_text="Instances the backend was asked to run")
    phase = models.CharField(max_length=16, blank=True, help_text="Last phase the backend reported")
    message = models.TextField(blank=True, help_text="Last thing the control plane did or saw")
    # A launch or resize call in flight: until then a listing that lacks the object proves nothing.
    lease_until = models.DateTimeField(null=True, blank=True)
    submit_attempts = models.PositiveIntegerField(default=0)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    submitted_at = models.DateTimeField(null=True, blank=True)
    observed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    objects = BackendObjectQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "task_uid", "attempt"], name="backendobject_one_per_attempt"),
        ]
        indexes = [models.Index(fields=["cluster", "state"])]

    def __str__(self) -> str:
        return f"{self.name} on {self.cluster_id} ({self.state})"

    @property
    def device_ids(self) -> list[int]:
        """The cards the object may hold on its backend."""
        return [share["id"] for share in self.shares or ()]

    @property
    def wanted(self) -> bool:
        """True while the object's task is active on this cluster in this attempt (the desired state)."""
        task = self.task
        return (
            task is not None
            and task.attempt == self.attempt
            and task.cluster_id == self.cluster_id
            and task.status in ACTIVE
        )


def shares_of(placement: list[dict]) -> list[dict]:
    """The cards a placement holds, as a backend object records them: [{"id": card, "milli": thousandths}]."""
    return [{"id": pk, "milli": milli} for pk, milli in sorted(placement_devices(placement).items())]


def merge_shares(held: list[dict] | None, added: list[dict]) -> list[dict]:
    """What an object holds after it grew by ``added`` (shares of one card add up)."""
    total: dict[int, int] = {}
    for share in [*(held or ()), *added]:
        total[share["id"]] = total.get(share["id"], 0) + share["milli"]
    return [{"id": pk, "milli": milli} for pk, milli in sorted(total.items())]


class CheckpointStore(models.Model):
    """A training task's checkpoint directory on one cluster, kept across its attempts there.

    Recorded before the first job that may write it is submitted, and kept until the backend removed the
    directory after the task was deleted: the reconciler removes the stores of deleted tasks.
    """

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="checkpoint_stores")
    task = models.ForeignKey(Task, null=True, blank=True, on_delete=models.SET_NULL, related_name="checkpoint_stores")
    task_uid = models.UUIDField(help_text="The task's uid, which names its checkpoint directory on the backend")
    project = models.CharField(max_length=64, help_text="The task's project, part of the directory's path on Slurm")
    message = models.TextField(blank=True, help_text="Why the last removal failed, if it did")
    failed_at = models.DateTimeField(null=True, blank=True, help_text="When the last removal failed")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "task_uid"], name="checkpointstore_one_per_cluster"),
        ]

    def __str__(self) -> str:
        return f"checkpoints of {self.task_uid.hex} on {self.cluster_id}"
