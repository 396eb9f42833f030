"""Parameter sweeps: one submission that creates a task per combination of parameter values (docs/tasks.md,
"Parameter sweeps").

Every element goes through ``services.submit_task`` (roles, queue, quota, admission), all in one transaction:
one refused element refuses the whole sweep and nothing is written.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from typing import Any

from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction

from apps.tasks import services
from apps.tasks.choices import ACTIVE, FINAL, SweepGoal, TaskStatus
from apps.tasks.models import Sweep, Task
from apps.vdc import policy
from apps.vdc.models import Project

# The most tasks one sweep creates.
SWEEP_MAX = 100
PARAM_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,31}$")
MAX_VALUE_LENGTH = 256
EXPECTED = (
    "Expected parameters as a grid, an object of names to non-empty lists of values "
    '({"lr": [0.1, 0.01], "batch_size": [32, 64]}), or a non-empty list of objects of names to values '
    '([{"lr": 0.1, "batch_size": 32}, ...])'
)


def _value(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValidationError({"parameters": [f"{name}: expected a string or a number as a value, got {value!r}."]})
    text = str(value)
    if not text or len(text) > MAX_VALUE_LENGTH or "\n" in text or "\x00" in text:
        raise ValidationError(
            {"parameters": [f"{name}: expected a value of 1 to {MAX_VALUE_LENGTH} characters on one line."]}
        )
    return text


def _name(name: Any) -> str:
    if not isinstance(name, str) or not PARAM_NAME.match(name):
        raise ValidationError(
            {
                "parameters": [
                    f"{name!r}: expected a parameter name of a letter then letters, digits or _ "
                    "(at most 32), e.g. lr or batch_size."
                ]
            }
        )
    return name


def _check_size(size: int) -> None:
    if size > SWEEP_MAX:
        raise ValidationError(
            {"parameters": [f"The sweep has {size} elements; at most {SWEEP_MAX} tasks are created by one sweep."]}
        )


def expand(parameters: Any) -> list[dict[str, str]]:
    """The sweep's elements, each a mapping of parameter name to value as text, in order: a grid's cartesian
    product (the last name varying fastest) or the list as given. Raises ValidationError saying what was expected."""
    if isinstance(parameters, dict) and parameters:
        names = [_name(name) for name in parameters]
        columns = []
        size = 1
        for name in names:
            values = parameters[name]
            if not isinstance(values, list) or not values:
                raise ValidationError({"parameters": [f"{name}: expected a non-empty list of values. {EXPECTED}."]})
            column = [_value(name, value) for value in values]
            if len(set(column)) != len(column):
                raise ValidationError({"parameters": [f"{name}: a value is given twice."]})
            columns.append(column)
            size *= len(column)
            _check_size(size)
        return [dict(zip(names, combination, strict=True)) for combination in itertools.product(*columns)]
    if isinstance(parameters, list) and parameters:
        _check_size(len(parameters))
        elements = []
        for index, element in enumerate(parameters, 1):
            if not isinstance(element, dict) or not element:
                raise ValidationError({"parameters": [f"Element {index}: expected an object of names to values."]})
            elements.append({_name(name): _value(name, value) for name, value in element.items()})
        seen = set()
        for index, element in enumerate(elements, 1):
            key = tuple(sorted(element.items()))
            if key in seen:
                raise ValidationError({"parameters": [f"Element {index} repeats an earlier combination."]})
            seen.add(key)
        return elements
    raise ValidationError({"parameters": [f"{EXPECTED}."]})


# A job reports its metric with a line ``HCS_METRIC name=value`` in its output; the last one its run printed counts.
METRIC_LINE = re.compile(r"^HCS_METRIC\s+([A-Za-z][A-Za-z0-9_./-]{0,63})=(\S+)\s*$")
# How much of the end of a run's log is read for it.
METRIC_TAIL_LINES = 200
GOALS = tuple(SweepGoal.values)


def last_metric(text: str) -> tuple[str, float] | None:
    """The last ``HCS_METRIC name=value`` line of a log with a finite number as its value, or None."""
    for line in reversed(text.splitlines()):
        match = METRIC_LINE.match(line.strip())
        if match:
            try:
                value = float(match.group(2))
            except ValueError:
                continue
            if math.isfinite(value):
                return match.group(1), value
    return None


def best(sweep: Sweep, tasks: list[Task]) -> Task | None:
    """The element with the best metric by the sweep's goal (the first one on a tie), None while none reported."""
    reported = [task for task in tasks if task.metric_value is not None]
    if not reported:
        return None
    sign = -1 if sweep.goal == "max" else 1
    return min(reported, key=lambda task: (sign * task.metric_value, task.pk))


def describe(values: dict[str, str]) -> str:
    return ", ".join(f"{name}={value}" for name, value in values.items())


def variables(values: dict[str, str]) -> dict[str, str]:
    """The variables an element's job gets for its values (``apps.clusters.executors.base.parameter_environment``
    builds the same)."""
    return {f"HCS_PARAM_{name.upper()}": value for name, value in values.items()}


def create_sweep(
    user,
    *,
    project: Project,
    name: str,
    parameters: Any,
    goal: str = "max",
    dry_run: bool = False,
    **submission: Any,
) -> tuple[Sweep, list[Task]]:
    """Submit one task per element of ``parameters``, named ``<name>-<n>``, each with ``submission`` (the fields
    of ``services.submit_task``) and its values as ``HCS_PARAM_*`` variables. All or nothing: a refused element
    raises its error (prefixed with the element) and nothing is written. ``dry_run`` checks everything the
    same way and then writes nothing (the sweep and its tasks are returned unsaved)."""
    if not policy.can_act(user, project, policy.SUBMIT_TASK):
        if policy.project_role(user, project) is not None:
            raise PermissionDenied(f"Viewers of project {project} cannot submit sweeps.")
        raise PermissionDenied(f"You are not a member of project {project}.")
    elements = expand(parameters)
    if goal not in GOALS:
        raise ValidationError({"goal": [f"Expected max or min (which metric is best), got {goal!r}."]})
    if not name:
        raise ValidationError({"name": ["Expected a name for the sweep; its tasks are named <name>-1, <name>-2, ..."]})
    tasks = []
    with transaction.atomic():
        sweep = Sweep.objects.create(project=project, name=name, created_by=user, parameters=parameters, goal=goal)
        for index, values in enumerate(elements, 1):
            try:
                task = services.submit_task(user, project=project, name=f"{name}-{index}", **submission)
            except ValidationError as exc:
                prefix = (
                    f"Sweep element {index} of {len(elements)} ({describe(values)}) refused, so no task was created: "
                )
                if hasattr(exc, "error_dict"):
                    raise ValidationError(
                        {field: [prefix + m for m in messages] for field, messages in exc.message_dict.items()}
                    )
                raise ValidationError([prefix + m for m in exc.messages])
            task.sweep, task.sweep_values = sweep, values
            Task.objects.filter(pk=task.pk).update(sweep=sweep, sweep_values=values)
            tasks.append(task)
        if dry_run:
            transaction.set_rollback(True)
    if dry_run:
        sweep.pk = None
        for task in tasks:
            task.pk = None
    return sweep, tasks


def status_counts(sweep: Sweep) -> dict[str, int]:
    """How many of the sweep's tasks are in each status (only statuses some task is in)."""
    counts = Counter(sweep.tasks.values_list("status", flat=True))
    return {status: counts[status] for status in TaskStatus.values if counts[status]}


def summary(counts: dict[str, int]) -> dict[str, int]:
    """Counts folded into waiting, active and finished (with the total)."""
    total = sum(counts.values())
    active = sum(n for status, n in counts.items() if status in ACTIVE)
    finished = sum(n for status, n in counts.items() if status in FINAL)
    return {"total": total, "active": active, "finished": finished, "waiting": total - active - finished}


def stop_sweep(sweep: Sweep, user, reason: str = "") -> list[Task]:
    """Stop every task of the sweep that has not finished (as ``services.stop_tasks``); owners and members only."""
    if not policy.can_act(user, sweep.project, policy.CHANGE_TASK):
        raise PermissionDenied("Only owners and members of the project can stop its sweeps.")
    ids = list(sweep.tasks.exclude(status__in=FINAL).values_list("pk", flat=True))
    stopped, _left = services.stop_tasks(ids, user, reason or f"sweep {sweep.name} stopped")
    return stopped


def create_from_body(user, values: dict, *, dry_run: bool):
    """``create_sweep`` from a validated sweep body (the API's and the sweep form's): its named fields, and the
    task fields as they are."""
    values = dict(values)
    values.pop("dry_run", None)
    return create_sweep(
        user,
        project=values.pop("project"),
        name=values.pop("name", ""),
        parameters=values.pop("parameters"),
        goal=values.pop("goal"),
        queue=values.pop("queue", None),
        vdc=values.pop("vdc", None),
        preferred_clusters=values.pop("preferred_clusters", []),
        dry_run=dry_run,
        **values,
    )
