"""Sweep pages: the list, the form (a task file and parameters, previewed or submitted through the API's sweep
serializer), a sweep's page with its elements, and Stop all (docs/tasks.md, "Parameter sweeps")."""

from __future__ import annotations

import json

import yaml
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.exceptions import ValidationError as DRFValidationError

from apps.tasks import sweeps, taskfile
from apps.tasks.api.sweeps import SweepSubmitSerializer, sweep_price
from apps.tasks.models import Sweep, Task
from apps.tasks.views import _error_lines, _visible_task
from apps.vdc import policy
from apps.vdc.policy import scope_to_projects

PARAMETERS_EXAMPLE = "lr: [0.1, 0.01]\nbatch_size: [32, 64]"


def _visible_sweeps(user):
    return scope_to_projects(Sweep.objects.select_related("project", "created_by"), user)


def _counted(sweep: Sweep, by_status: dict[str, int]) -> Sweep:
    sweep.by_status = by_status
    sweep.summary = sweeps.summary(by_status)
    return sweep


@login_required
def sweep_list(request: HttpRequest) -> HttpResponse:
    rows = list(_visible_sweeps(request.user)[:200])
    counts: dict[int, dict[str, int]] = {sweep.pk: {} for sweep in rows}
    for row in Task.objects.filter(sweep__in=rows).values("sweep", "status").annotate(n=Count("pk")):
        counts[row["sweep"]][row["status"]] = row["n"]
    sweeps_shown = [_counted(sweep, counts[sweep.pk]) for sweep in rows]
    return render(request, "portal/sweeps.html", {"sweeps": sweeps_shown, "nav": "sweeps"})


@login_required
def sweep_detail(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = get_object_or_404(_visible_sweeps(request.user), pk=pk)
    tasks = list(sweep.tasks.order_by("pk"))
    by_status: dict[str, int] = {}
    for task in tasks:
        by_status[task.status] = by_status.get(task.status, 0) + 1
    _counted(sweep, by_status)
    names = list(dict.fromkeys(name for task in tasks for name in task.sweep_values))
    for task in tasks:
        task.value_cells = [(name, task.sweep_values.get(name, "")) for name in names]
    context = {
        "sweep": sweep,
        "tasks": tasks,
        "names": names,
        "best": sweeps.best(sweep, tasks),
        "parameters_json": json.dumps(sweep.parameters, ensure_ascii=False),
        "unfinished": sweep.summary["waiting"] + sweep.summary["active"],
        "can_stop": policy.can_act(request.user, sweep.project, policy.CHANGE_TASK),
        "nav": "sweeps",
    }
    return render(request, "portal/sweep.html", context)


@login_required
@require_POST
def sweep_stop(request: HttpRequest, pk: int) -> HttpResponse:
    sweep = get_object_or_404(_visible_sweeps(request.user), pk=pk)
    try:
        stopped = sweeps.stop_sweep(sweep, request.user, request.POST.get("reason", "").strip()[:200])
        messages.success(request, f"Sweep {sweep.name}: {len(stopped)} task(s) stopped.")
    except PermissionDenied as exc:
        messages.error(request, str(exc))
    return redirect("portal:sweep", pk=sweep.pk)


def _parse(task_text: str, parameters_text: str) -> tuple[dict, list[str]]:
    """The sweep body of the form's two boxes, and what is wrong with them (nothing sent when anything is)."""
    errors = []
    body: dict = {}
    try:
        body = taskfile.load(task_text)
    except ValidationError as exc:
        errors += [f"Task file: {message}" for message in exc.messages]
    errors += [f"Task file: {key}: {message}" for key, message in taskfile.unknown_key_errors(body).items()]
    try:
        parameters = yaml.safe_load(parameters_text) if parameters_text.strip() else None
    except yaml.YAMLError:
        parameters = None
        errors.append(f"Parameters: expected YAML or JSON, e.g. {PARAMETERS_EXAMPLE!r}.")
    else:
        if parameters is None:
            errors.append(f"Parameters: {sweeps.EXPECTED}.")
    return {**body, "parameters": parameters}, errors


@login_required
def sweep_new(request: HttpRequest) -> HttpResponse:
    """The sweep form: a task file and the parameters; Preview is a dry run, Submit creates the sweep. Both go
    through the API's sweep serializer, so the checks and messages are the API's."""
    task_text, parameters_text, goal = "", "", "max"
    errors: list[str] = []
    preview = None
    source = request.GET.get("from", "")
    if request.method == "GET" and source.isdecimal():
        task_text = taskfile.dump_yaml(_visible_task(request, int(source)))
        parameters_text = PARAMETERS_EXAMPLE
    if request.method == "POST":
        task_text = request.POST.get("task_file", "")
        parameters_text = request.POST.get("parameters", "")
        dry_run = "preview" in request.POST
        goal = request.POST.get("goal", "max")
        body, errors = _parse(task_text, parameters_text)
        if not errors:
            data = {**body, "goal": goal, "dry_run": dry_run}
            serializer = SweepSubmitSerializer(data=data, context={"request": request})
            try:
                serializer.is_valid(raise_exception=True)
                sweep, tasks = sweeps.create_from_body(request.user, serializer.validated_data, dry_run=dry_run)
            except DRFValidationError as exc:
                errors = list(_error_lines(exc.detail))
            except ValidationError as exc:
                errors = list(_error_lines(exc.message_dict if hasattr(exc, "error_dict") else exc.messages))
            except (PermissionDenied, DRFPermissionDenied) as exc:
                errors = [str(exc.detail if isinstance(exc, DRFPermissionDenied) else exc)]
            else:
                if not dry_run:
                    messages.success(request, f"Sweep {sweep.name} submitted: {len(tasks)} tasks.")
                    return redirect("portal:sweep", pk=sweep.pk)
                preview = {"tasks": tasks, "price": sweep_price(tasks[0], len(tasks))}
    context = {
        "task_text": task_text,
        "parameters_text": parameters_text,
        "parameters_example": PARAMETERS_EXAMPLE,
        "goal": goal,
        "errors": errors,
        "preview": preview,
        "sweep_max": sweeps.SWEEP_MAX,
        "nav": "sweeps",
    }
    return render(request, "portal/sweep_form.html", context)
