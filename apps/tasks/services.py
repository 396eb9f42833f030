"""Every write to tasks goes through here: submission, stop, delete, and the event timeline.

The API, the admin, the pages and the Celery jobs all call these functions, so validation,
permissions and audit events are the same whichever door a request came in by.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from decimal import Decimal
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from apps.clusters import services as cluster_services
from apps.clusters.gpuspec import GPURequest, GPUSpecError, candidate_models, equivalents
from apps.clusters.models import Node
from apps.queues.choices import PriorityClass
from apps.queues.models import TaskQueue
from apps.tasks import lifecycle, schedule
from apps.tasks.admission import admission_errors
from apps.tasks.bulk import bulk_update_rows
from apps.tasks.choices import ACTIVE, ASLEEP, FINAL, WAITING, EventKind, TaskKind, TaskStatus
from apps.tasks.lifecycle import record_event
from apps.tasks.live import duration_words
from apps.tasks.models import Task, TaskEvent
from apps.tasks.signals import autoscaling_changed, cluster_work, task_changed
from apps.tasks.validation import secret_env_error, secret_refs_error
from apps.vdc import policy
from apps.vdc.models import VDC, Project, ProjectQuota, ProjectSecret

# Fields a submitter may set; everything else (status, placement ...) belongs to the scheduler.
SUBMIT_FIELDS = (
    "name",
    "kind",
    "cpu",
    "memory_gib",
    "gpu_spec",
    "instances",
    "elastic_min",
    "elastic_max",
    "scaling",
    "expected_duration",
    "wall_time",
    "preemptible",
    "required_labels",
    "image",
    "command",
    "env",
    "volumes",
    "ide_type",
    "framework",
    "model_path",
    "epochs",
    "batch_size",
    "checkpoint_path",
    "tensorboard_dir",
    "max_retries",
    "port",
    "max_tokens",
    "temperature",
    "autoscale_min",
    "autoscale_max",
    "autoscale_cpu_percent",
    "autoscale_gpu_percent",
    "autoscale_memory_percent",
    "autoscale_rps",
    "autoscale_concurrency",
    "autoscale_latency_ms",
    "autoscale_predictive",
    "autoscale_schedule",
    "scale_to_zero_after_s",
    "readiness_path",
    "secret_refs",
    "idle_stop_percent",
    "idle_stop_minutes",
)


def _min_gpu_equivalents(request: GPURequest, gpu_catalog) -> Decimal:
    """The fewest GPU-equivalents the request can cost on a model it may land on (for quota checks)."""
    if request.is_none:
        return Decimal("0")
    models = [name for name, _count in candidate_models(request, gpu_catalog)]
    return min((equivalents(request, gpu_catalog, model) for model in models), default=Decimal("0"))


def _resolve_queue(vdc: VDC, queue: TaskQueue | str | None) -> TaskQueue:
    if isinstance(queue, TaskQueue):
        if queue.vdc_id != vdc.pk:
            raise ValidationError({"queue": f"Expected a queue of VDC {vdc}; {queue} belongs to {queue.vdc}."})
        return queue
    found = TaskQueue.objects.filter(vdc=vdc, name=queue).first() if queue else None
    if found is not None:
        return found
    names = ", ".join(TaskQueue.objects.filter(vdc=vdc).values_list("name", flat=True)) or "none yet"
    if not queue:
        raise ValidationError({"queue": f"Expected a queue of VDC {vdc}: one of {names}."})
    raise ValidationError({"queue": f"Unknown queue {queue!r} in VDC {vdc}; expected one of {names}."})


def submit_task(
    user,
    *,
    project: Project,
    queue: TaskQueue | str | None,
    vdc: VDC | None = None,
    preferred_clusters=(),
    secret_env: dict[str, str] | None = None,
    **fields: Any,
) -> Task:
    """Validate a submission and leave the task queued for the scheduler.

    Checks, in order: the user may act in the project; the VDC (default when omitted) and queue exist
    and the queue is open; the fields, their bounds (``apps.tasks.validation``) and the GPU spec are valid;
    ``secret_env`` (name -> value, checked like ``env``) is stored encrypted;
    medium queues get an expected duration; the request fits the project's quota limits in the VDC
    (a per-kind limit is checked under a lock of the quota row, in the transaction that writes the task). Raises
    ValidationError (per field) or PermissionDenied and writes nothing in either case.
    """
    if not policy.can_act(user, project, policy.SUBMIT_TASK):
        if policy.project_role(user, project) is not None:
            raise PermissionDenied(f"Viewers of project {project} cannot submit tasks.")
        raise PermissionDenied(f"You are not a member of project {project}.")
    unknown = set(fields) - set(SUBMIT_FIELDS)
    if unknown:
        raise ValidationError(dict.fromkeys(sorted(unknown), "Not a field a submission may set."))
    if vdc is None and isinstance(queue, str) and queue:
        # The usual submission names a queue of the default VDC: both in one query.
        found = (
            TaskQueue.objects.select_related("vdc").filter(vdc__is_default=True, vdc__enabled=True, name=queue).first()
        )
        if found is not None:
            vdc, queue = found.vdc, found
    if vdc is None:
        vdc = queue.vdc if isinstance(queue, TaskQueue) else VDC.default()
        if vdc is None:
            raise ValidationError({"vdc": "Expected a VDC: none was given and no default VDC is set."})
    if not vdc.enabled:
        raise ValidationError({"vdc": f"VDC {vdc} is disabled and takes no tasks."})
    queue = _resolve_queue(vdc, queue)
    if not queue.is_open:
        raise ValidationError({"queue": f"Queue {queue.name} is closed and takes no new tasks."})

    task = Task(project=project, owner=user, vdc=vdc, queue=queue, **fields)
    wall_from_queue = task.wall_time is None and queue.default_wall_time is not None
    if task.wall_time is None:
        task.wall_time = queue.default_wall_time
    if task.kind not in TaskKind.values:
        raise ValidationError({"kind": f"Expected one of {', '.join(TaskKind.values)}, got {task.kind!r}."})
    gpu_catalog = cluster_services.catalog()
    errors = _field_errors(task, gpu_catalog)
    secret_env = {} if secret_env is None else secret_env
    message = secret_env_error(secret_env, task.env)
    if message:
        errors["secret_env"] = [message]
    message = secret_refs_error(task.secret_refs, task.env, secret_env) or _unknown_secrets(project, task.secret_refs)
    if message:
        errors["secret_refs"] = [message]
    if queue.priority_class == PriorityClass.MEDIUM and not task.expected_duration:
        errors.setdefault("expected_duration", []).append(
            f"Queue {queue.name} is medium priority: it needs an expected duration (e.g. 02:00:00), "
            "the window the task is guaranteed for."
        )
    if wall_from_queue and task.expected_duration and task.expected_duration > task.wall_time:
        # The queue's default would stop the job before the time it says it needs (docs/rules.md, "A task's life").
        errors.setdefault("wall_time", []).append(
            f"Queue {queue.name} stops a job after {duration_words(task.wall_time)} (its default wall time), "
            f"less than the expected duration {duration_words(task.expected_duration)}: "
            "set a wall time of at least the expected duration, or choose another queue."
        )
    if "gpu_spec" not in errors:
        request = cluster_services.validate_gpu_spec(task.gpu_spec, gpu_catalog)
        if not request.is_none and not candidate_models(request, gpu_catalog):
            errors["gpu_spec"] = [f"No GPU model in the catalog can satisfy {task.gpu_spec!r}."]
    if errors:
        raise ValidationError(errors)
    task.gpu_spec = task.gpu_spec.strip()
    task.set_secret_env(secret_env)

    # What no cluster of the VDC could ever run is refused for that reason ("its nodes hold A100-80G"), before
    # the quota, whose message would count equivalents of cards the task could never get anyway.
    problems = admission_errors(task, request, gpu_catalog)
    if problems:
        raise ValidationError(problems)
    quota = _check_quota(task, request, gpu_catalog)
    # The transaction holds only what must be atomic with the insert; its locks are taken last and held briefly.
    with transaction.atomic():
        # Held until the task is written, so a secret it refers to cannot be deleted in between.
        message = _unknown_secrets(project, task.secret_refs, lock=True)
        if message:
            raise ValidationError({"secret_refs": [message]})
        _check_kind_limit(task, quota)
        change = lifecycle.submitted(task, user, f"Submitted to queue {queue.name} ({queue.priority_class})")
        preferred_clusters = list(preferred_clusters)
        if preferred_clusters:
            task.preferred_clusters.set(preferred_clusters)
    _hold_related(task, events=change.events, preferred_clusters=preferred_clusters)
    return task


def _unknown_secrets(project: Project, refs, *, lock: bool = False) -> str | None:
    """A message naming the secrets ``refs`` refers to that the project does not have, and those it has.

    ``lock`` holds the rows found until the transaction ends, so none of them is deleted before the task that
    refers to them is written (``apps.vdc.services.delete_secret`` locks the row it deletes).
    """
    wanted = {ref["secret"] for ref in refs or () if isinstance(ref, dict) and isinstance(ref.get("secret"), str)}
    if not wanted:
        return None
    found = ProjectSecret.objects.filter(project=project, name__in=wanted)
    if lock:
        found = found.select_for_update()
    missing = sorted(wanted - set(found.values_list("name", flat=True)))
    if not missing:
        return None
    names = ", ".join(ProjectSecret.objects.filter(project=project).order_by("name").values_list("name", flat=True))
    return (
        f"Project {project} has no secret {', '.join(missing)}; "
        f"its secrets are: {names or 'none yet (its owners add them)'}."
    )


def secret_users(secret: ProjectSecret) -> list[str]:
    """The waiting and running tasks of the secret's project that refer to it, as "#id name" (at most 20)."""
    tasks = Task.objects.filter(project_id=secret.project_id, status__in=(*WAITING, *ACTIVE)).only(
        "name", "secret_refs"
    )
    users = [task for task in tasks.order_by("pk") if secret.name in task.secret_ref_names]
    return [str(task) for task in users[:20]]


def submission_field_errors(project: Project, **fields: Any) -> dict[str, list[str]]:
    """The checks ``submit_task`` makes of a submission's own fields (bounds, GPU spec, references to the project's
    secrets), without the queue, quota or admission, which hold at submit: what a task template is held to."""
    task = Task(project=project, **fields)
    gpu_catalog = cluster_services.catalog()
    errors = _field_errors(task, gpu_catalog)
    message = secret_refs_error(task.secret_refs, task.env, {}) or _unknown_secrets(project, task.secret_refs)
    if message:
        errors["secret_refs"] = [message]
    if "gpu_spec" not in errors:
        request = cluster_services.validate_gpu_spec(task.gpu_spec, gpu_catalog)
        if not request.is_none and not candidate_models(request, gpu_catalog):
            errors["gpu_spec"] = [f"No GPU model in the catalog can satisfy {task.gpu_spec!r}."]
    return errors


def _field_errors(task: Task, gpu_catalog) -> dict[str, list[str]]:
    """``full_clean`` of a submission, less what the caller checks itself: {field: messages}.

    The model's check constraints are not queried: ``Task.clean`` (``apps.tasks.validation``) applies
    stricter bounds to the same fields, and the database still enforces them on insert.
    """
    errors: dict[str, list[str]] = {}
    for check in (
        lambda: task.clean_fields(exclude=["project", "owner", "vdc", "queue"]),
        lambda: task.clean(gpu_catalog),
    ):
        try:
            check()
        except ValidationError as exc:
            for field, messages in exc.message_dict.items():
                errors.setdefault(field, []).extend(messages)
    return errors


def _hold_related(instance, **related: list) -> None:
    """Keep related rows the caller already holds as the instance's prefetched relations, as
    ``prefetch_related`` would, so whoever shows the instance next does not load them back."""
    cache = instance.__dict__.setdefault("_prefetched_objects_cache", {})
    for name, objects in related.items():
        queryset = getattr(instance, name).all()
        queryset._result_cache = list(objects)
        queryset._prefetch_done = True
        cache[name] = queryset


def _check_quota(task: Task, request: GPURequest, gpu_catalog) -> ProjectQuota:
    """Reject a request that could never run within the project's enforced limits in the VDC; the quota row.

    These limits bound one task, so the row is read without a lock: submissions to one project run side by side.
    """
    quota = ProjectQuota.objects.filter(project=task.project, vdc=task.vdc).first()
    if quota is None:
        raise ValidationError({"project": f"Project {task.project} has no quota in VDC {task.vdc}."})
    if not quota.enforce:
        return quota
    size = task.elastic_min if task.is_elastic else task.instances
    need = {
        "cpu": task.cpu * size,
        "memory_gib": task.memory_gib * size,
        "gpu": _min_gpu_equivalents(request, gpu_catalog) * size,
    }
    errors = {}
    for resource, field in (("cpu", "cpu"), ("memory_gib", "memory_gib"), ("gpu", "gpu_spec")):
        limit = getattr(quota, f"limit_{resource}")
        if need[resource] > limit:
            errors[field] = (
                f"Expected at most the project's {resource.replace('_gib', '')} limit of {limit} in VDC {task.vdc}; "
                f"this task needs {need[resource].normalize():f}."
            )
    if errors:
        raise ValidationError(errors)
    return quota


def _check_kind_limit(task: Task, quota: ProjectQuota) -> None:
    """Reject a task beyond the project's limit of unfinished tasks of its kind in the VDC.

    Runs in the submission's transaction: when the kind has a limit, the quota row is locked (and read again
    under the lock) before counting, so concurrent submissions to one project and VDC count each other's
    tasks: a per-kind limit of 5 admits 5. Without a limit nothing is locked or counted (docs/load.md, "What a
    submit costs").
    """
    if not quota.enforce or quota.kind_limit(task.kind) is None:
        return
    quota = ProjectQuota.objects.select_for_update().filter(pk=quota.pk).first()
    if quota is None:
        raise ValidationError({"project": f"Project {task.project} has no quota in VDC {task.vdc}."})
    kind_limit = quota.kind_limit(task.kind)
    if not quota.enforce or kind_limit is None:
        return
    unfinished = Task.objects.filter(project=task.project, vdc=task.vdc, kind=task.kind).exclude(status__in=FINAL)
    count = unfinished.count()
    if count >= kind_limit:
        raise ValidationError(
            {
                "kind": f"Project {task.project} already has {count} unfinished {task.get_kind_display()} "
                f"tasks, its limit in VDC {task.vdc}."
            }
        )


# The settings of an inference service's autoscaling that may change while it runs (API PATCH, page, admin).
AUTOSCALE_FIELDS = (
    "autoscale_min",
    "autoscale_max",
    "autoscale_cpu_percent",
    "autoscale_gpu_percent",
    "autoscale_memory_percent",
    "autoscale_rps",
    "autoscale_concurrency",
    "autoscale_latency_ms",
    "autoscale_predictive",
    "autoscale_schedule",
    "scale_to_zero_after_s",
)


def autoscale_errors(task: Task, changes: dict[str, Any]) -> dict[str, str]:
    """Why ``changes`` to the service's autoscaling cannot be made: {field: message} (empty when they can).

    Only the autoscaling settings, on an inference service that has not ended; min and max set together
    (or both cleared), min <= max, each in its bounds; min replicas within the project's enforced limits and
    max replicas within the project's GPU limit and the queue's maximum (a count it could never reach is
    refused, not kept silently).
    """
    from apps.tasks.validation import NUMBER_BOUNDS, task_errors

    unknown = sorted(set(changes) - set(AUTOSCALE_FIELDS))
    if unknown:
        return dict.fromkeys(unknown, "Only the autoscaling settings of a task can change after submission.")
    if task.kind != TaskKind.INFERENCE:
        return {"kind": "Only inference services autoscale."}
    if task.is_final:
        return {"status": f"The task has {task.get_status_display().lower()}; its settings no longer change."}
    edited = Task(**{f.attname: getattr(task, f.attname) for f in Task._meta.concrete_fields})
    for field, value in changes.items():
        setattr(edited, field, value)
    try:
        edited.clean_fields(exclude=[f.name for f in Task._meta.fields if f.name not in AUTOSCALE_FIELDS])
    except ValidationError as exc:
        return {field: " ".join(messages) for field, messages in exc.message_dict.items()}
    bounded = {field for field, _low, _high in NUMBER_BOUNDS if field in AUTOSCALE_FIELDS} | {"autoscale_schedule"}
    errors = {k: v for k, v in task_errors(edited).items() if k in bounded}
    if errors:
        return errors
    if (edited.autoscale_min is None) != (edited.autoscale_max is None):
        missing = "autoscale_max" if edited.autoscale_max is None else "autoscale_min"
        return {missing: "Expected both min and max replicas (or neither, to turn autoscaling off)."}
    if edited.autoscale_min is None:
        return {}
    gpu_catalog = cluster_services.catalog()
    try:
        per_replica = _min_gpu_equivalents(cluster_services.validate_gpu_spec(task.gpu_spec, gpu_catalog), gpu_catalog)
    except ValidationError:
        per_replica = Decimal(0)
    quota = ProjectQuota.objects.filter(project_id=task.project_id, vdc_id=task.vdc_id).first()
    if quota is not None and quota.enforce:
        for resource, each in (("cpu", task.cpu), ("memory_gib", task.memory_gib), ("gpu", per_replica)):
            limit = getattr(quota, f"limit_{resource}")
            if each * edited.autoscale_min > limit:
                return {
                    "autoscale_min": f"Expected at most the project's {resource.replace('_gib', '')} limit of "
                    f"{limit} in VDC {task.vdc}: {edited.autoscale_min} replicas need "
                    f"{(each * edited.autoscale_min).normalize():f}."
                }
        if per_replica * edited.autoscale_max > quota.limit_gpu:
            return {
                "autoscale_max": f"Expected at most {int(quota.limit_gpu / per_replica)} replicas: the project's "
                f"GPU limit in VDC {task.vdc} is {quota.limit_gpu} and one replica needs "
                f"{per_replica.normalize():f}."
            }
    queue_max = task.queue.max_gpu
    if queue_max is not None and per_replica and per_replica * edited.autoscale_max > queue_max:
        return {
            "autoscale_max": f"Expected at most {int(queue_max / per_replica)} replicas: queue "
            f"{task.queue.name} holds at most {queue_max} GPU-equivalents."
        }
    return {}


def _said(field: str, value: Any) -> Any:
    """A setting as the timeline writes it: scheduled minimums as their lines."""
    if field == "autoscale_schedule":
        return "[" + "; ".join(schedule.format_entry(e) for e in value or () if isinstance(e, dict)) + "]"
    return value


def update_autoscaling(task: Task, user, **changes: Any) -> Task:
    """Change a service's autoscaling bounds and targets (API PATCH, monitoring page, admin): checked by
    :func:`autoscale_errors`, written with an ``autoscaled`` event, and a portal-scaled service's desired
    count moved into the new bounds at once (the next scheduling cycle follows). Raises ValidationError or
    PermissionDenied and writes nothing then."""
    if not policy.can_act(user, task.project, policy.CHANGE_TASK):
        raise PermissionDenied(f"Only owners and members of project {task.project} change its services.")
    with transaction.atomic():
        locked = Task.objects.select_for_update().select_related("queue", "vdc").get(pk=task.pk)
        if "autoscale_schedule" in changes:
            changes["autoscale_schedule"] = schedule.normalise(changes["autoscale_schedule"])
        changes = {k: v for k, v in changes.items() if k not in AUTOSCALE_FIELDS or getattr(locked, k) != v}
        errors = autoscale_errors(locked, changes)
        if errors:
            raise ValidationError(errors)
        if not changes:
            return locked
        said = ", ".join(
            f"{k.removeprefix('autoscale_')} {_said(k, getattr(locked, k))} → {_said(k, v)}" for k, v in changes.items()
        )
        for field, value in changes.items():
            setattr(locked, field, value)
        fields = [*changes, "updated_at"]
        if locked.autoscale_desired is not None:
            if locked.autoscale_min is None:
                locked.autoscale_desired = None
            else:
                locked.autoscale_desired = min(
                    max(locked.autoscale_desired, locked.autoscale_min), locked.autoscale_max
                )
            fields.append("autoscale_desired")
        locked.save(update_fields=fields)
        record_event(
            locked,
            EventKind.AUTOSCALED,
            f"Autoscaling changed by {user}: {said}",
            actor=user,
            data={"changes": dict(changes), "by": "user"},
        )
        if locked.is_asleep and not locked.scales_to_zero:
            # Nothing would wake it any more: it goes back to its queue now.
            lifecycle.save(lifecycle.woken(locked, f"Woken: scale to zero turned off by {user}"))
        lifecycle.demand_changes()
        if locked.is_active and locked.external_id:
            task_id = locked.pk
            transaction.on_commit(lambda: autoscaling_changed.send(sender=Task, task_id=task_id))
    return locked


def stop_task(task: Task, user, reason: str = "") -> Task:
    """Stop a task: it is ``stopped`` at once and its devices go back to the pool.

    A running task's job is cancelled by the control plane, which keeps cancelling it until its backend
    confirms it gone (whatever Redis or the backend do meanwhile); until then no other task is launched on
    its devices.
    """
    if not policy.can_act(user, task.project, policy.CHANGE_TASK):
        raise PermissionDenied("Only owners and members of the project can stop its tasks.")
    with transaction.atomic():
        task = Task.objects.select_for_update().get(pk=task.pk)
        if task.is_final:
            raise ValidationError({"status": f"Task is already {task.status}; nothing to stop."})
        was_active = task.is_active
        message = f"Stopped by {user}" + (f": {reason}" if reason else "")
        lifecycle.save(lifecycle.stopped(task, user, message))
        if was_active and task.cluster_id:
            cluster_id = task.cluster_id
            transaction.on_commit(lambda: cluster_work.send(sender=Task, cluster_id=cluster_id))
        lifecycle.demand_changes()
    return task


def stop_idle_task(task_id: int, message: str, data: dict) -> bool:
    """Stop a running dev environment that idle autostop found idle (docs/rules.md#idle-autostop), as a user's
    stop does (its checkpoint directory stays). False when it no longer runs: a second pass stops nothing."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.RUNNING).first()
        if task is None:
            return False
        change = lifecycle.stopped(task, None, message)
        change.events[-1].data = {**change.events[-1].data, "idle_stop": data}
        lifecycle.save(change)
        if task.cluster_id:
            cluster_id = task.cluster_id
            transaction.on_commit(lambda: cluster_work.send(sender=Task, cluster_id=cluster_id))
        lifecycle.demand_changes()
    return True


def scale_to_zero(task_id: int, message: str, data: dict) -> bool:
    """Release the cards of a running service that scales to zero and found no request for its idle time
    (docs/tasks.md "Scale to zero"); its job is cancelled by the control plane, as after a preemption. False when
    it no longer runs or no longer scales to zero: a second pass releases nothing."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, status=TaskStatus.RUNNING).first()
        if task is None or not task.scales_to_zero:
            return False
        cluster_id = task.cluster_id
        lifecycle.save(lifecycle.scaled_to_zero(task, message, data))
        if cluster_id:
            transaction.on_commit(lambda: cluster_work.send(sender=Task, cluster_id=cluster_id))
        lifecycle.demand_changes()
    return True


def wake(task_id: int, message: str = "Woken by a request through Connect") -> bool:
    """Put a service scaled to zero back in its queue (a request arrived); True when this call woke it, False when
    it was not asleep (already woken by another request, running, stopped)."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id, status__in=ASLEEP).first()
        if task is None:
            return False
        lifecycle.save(lifecycle.woken(task, message))
        lifecycle.demand_changes()
    return True


def record_cold_start(task_id: int, seconds: float) -> None:
    """Keep how long the request that woke a service waited for its first answer (its page shows it)."""
    with transaction.atomic():
        task = Task.objects.select_for_update().filter(pk=task_id).first()
        if task is not None:
            message = f"Cold start: the request that woke the service was answered after {seconds:.1f} s"
            lifecycle.save(lifecycle.cold_started(task, seconds, message))


# The most tasks one bulk stop takes (the API's bound; the pages send at most a page of them).
BULK_STOP_MAX = 500


def stop_tasks(task_ids, user, reason: str = "") -> tuple[list[Task], int]:
    """Stop many tasks at once, as ``stop_task`` stops one: the ones the user may stop and that are not
    finished yet. Returns them and how many of ``task_ids`` were left alone (another project's, a viewer's,
    finished or unknown); a user who may stop no project's tasks is refused.

    A fixed number of statements whatever the number of tasks (one locking read, one ``UPDATE ... FROM``
    through ``bulk_update_rows``, one insert of the events), so a page's worth of tasks stops inside the
    request; the backends' jobs are cancelled by the control plane, as for one task.
    """
    ids = sorted(set(task_ids))
    may_stop_any = policy.has_platform_perm(user, policy.CHANGE_TASK)
    acting = None if may_stop_any else policy.member_project_ids(user, policy.WRITE_ROLES)
    if acting is not None and not acting.exists():
        raise PermissionDenied("Only owners and members of a project can stop its tasks; viewers only read.")
    with transaction.atomic():
        tasks = Task.objects.select_for_update(of=("self",)).filter(pk__in=ids).exclude(status__in=FINAL)
        if acting is not None:
            tasks = tasks.filter(project_id__in=acting)
        tasks = list(tasks.order_by("pk"))
        now = timezone.now()
        message = f"Stopped by {user}" + (f": {reason}" if reason else "")
        # Jobs to cancel: those of tasks that held resources (as stop_task signals them).
        clusters = {task.cluster_id for task in tasks if task.status in ACTIVE and task.cluster_id}
        changes = [lifecycle.stopped(task, user, message, now) for task in tasks]
        for task in tasks:
            task.updated_at = now
        # Whatever the stop changed (lifecycle.stopped decides), written for all of them in one statement.
        bulk_update_rows(Task, tasks, sorted({"updated_at"}.union(*(change.fields for change in changes))))
        TaskEvent.objects.bulk_create([entry for change in changes for entry in change.events])
        stopped_ids = [task.pk for task in tasks]
        if stopped_ids:
            transaction.on_commit(lambda: task_changed.send(sender=Task, task_ids=stopped_ids))
            for cluster_id in clusters:
                transaction.on_commit(lambda c=cluster_id: cluster_work.send(sender=Task, cluster_id=c))
            lifecycle.demand_changes()
    return tasks, len(ids) - len(tasks)


def adopt_instances(task: Task, nodes: list[str]) -> tuple[list[dict], int]:
    """A placement for the instances a backend runs on ``nodes`` (one entry per instance), keeping the task's
    own where they still run and giving new ones free cards of the same model on their node.

    Returns the placement and how many instances found no node or free card the portal knows of.
    """
    current: dict[str, list[dict]] = defaultdict(list)
    for entry in task.placement or []:
        current[entry.get("node_name", "")].append(entry)
    template = (task.placement or [{}])[0]
    per_instance = [(d.get("milli", 1000)) for d in template.get("devices", ())]
    model = template.get("gpu_model")
    placement, unplaced = [], 0
    wanted = Counter(nodes)
    for node_name, count in sorted(wanted.items()):
        kept = current.get(node_name, [])[:count]
        placement += kept
        for _ in range(count - len(kept)):
            entry = _free_instance(task, node_name, model, per_instance, placement)
            if entry is None:
                unplaced += 1
            else:
                placement.append(entry)
    return placement, unplaced


def _free_instance(task: Task, node_name: str, model: str | None, shares: list[int], taken: list[dict]):
    """One instance's cards on a node: whole free cards of ``model`` not given to any active task."""
    node = Node.objects.filter(cluster_id=task.cluster_id, name=node_name).first()
    if node is None:
        return None
    used = {d["id"] for p in taken for d in p.get("devices", ())}
    others = Task.objects.filter(cluster_id=task.cluster_id, status__in=ACTIVE).exclude(pk=task.pk)
    for placement in others.values_list("placement", flat=True):
        used |= {d["id"] for p in placement or () for d in p.get("devices", ()) if p.get("node") == node.pk}
    devices = node.devices.units().filter(gpu_model__name=model) if model else node.devices.none()
    free = [d for d in devices.order_by("index") if d.pk not in used]
    if len(free) < len(shares):
        return None
    chosen = [
        {"id": d.pk, "index": d.index, "milli": milli, **({"slot": d.slot, "uuid": d.uuid} if d.parent_id else {})}
        for d, milli in zip(free, shares, strict=False)
    ]
    return {"node": node.pk, "node_name": node.name, "gpu_model": model, "devices": chosen}


def requeue_task(task: Task, message: str, data: dict | None = None, *, status: str | None = None) -> None:
    """Put an active task back in its queue (caller holds the row lock); low tasks are suspended, unless
    ``status`` says otherwise (a retry after a failure waits as queued).

    Its backend job, if any, no longer belongs to a live attempt: the control plane cancels it.
    """
    lifecycle.save(lifecycle.requeued(task, message, data, status=status))
    lifecycle.demand_changes()


def retries_used(task: Task) -> int:
    """How many times the portal has retried the task after a failed run (its timeline says)."""
    return task.events.filter(kind=EventKind.REQUEUED, data__has_key="retry").count()


def retry_failed_run(task: Task, exit_code: int | None, failure: str, detail: str) -> bool:
    """A run failed: when the task's retry setting allows another, requeue it as a new attempt and say so on its
    timeline (True); otherwise leave it to fail (False). The caller holds the row lock."""
    used = retries_used(task) if task.max_retries else 0
    if used >= task.max_retries:
        return False
    why = f"exit code {exit_code}" if exit_code is not None else (detail or failure)
    message = f"Attempt {task.attempt} failed ({why}); retry {used + 1} of {task.max_retries}"
    data = {"retry": used + 1, "exit_code": exit_code, "failure_reason": failure}
    requeue_task(task, message, data, status=TaskStatus.QUEUED)
    return True


def delete_task(task: Task, user) -> None:
    """Delete a task that has ended (stop it first); its timeline goes with it."""
    if not policy.can_act(user, task.project, policy.DELETE_TASK):
        raise PermissionDenied("Only owners and members of the project can delete its tasks.")
    if not task.is_final:
        raise ValidationError({"status": f"Task is {task.status}; expected a stopped, completed or failed task."})
    if task.usage_records.exists():
        raise ValidationError({"status": "Task has metered usage on record and is kept for billing."})
    task.delete()


def waiting_gpu_equivalents(queue_ids: list[int]) -> dict[int, Decimal]:
    """GPU-equivalents the waiting tasks of each queue ask for, at their cheapest model (two queries).

    Waiting tasks hold no allocation yet, so the demand comes from their GPU specs; identical specs are
    grouped in the database and parsed once.
    """
    rows = (
        Task.objects.filter(queue_id__in=queue_ids, status__in=WAITING)
        .values("queue_id", "gpu_spec", "instances", "elastic_min")
        .annotate(n=Count("id"))
        .order_by()
    )
    gpu_catalog = cluster_services.catalog()
    per_spec: dict[str, Decimal] = {}
    demand: dict[int, Decimal] = defaultdict(Decimal)
    for row in rows:
        spec = row["gpu_spec"]
        if spec not in per_spec:
            try:
                per_spec[spec] = equivalents(cluster_services.validate_gpu_spec(spec, gpu_catalog), gpu_catalog)
            except (ValidationError, GPUSpecError):
                # Its model was disabled or removed since submission: nothing it asks for can be counted.
                per_spec[spec] = Decimal(0)
        size = row["elastic_min"] or row["instances"]
        demand[row["queue_id"]] += per_spec[spec] * size * row["n"]
    return demand
