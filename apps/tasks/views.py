"""User pages: dashboard, the per-kind lists and create forms, all tasks, monitoring, queues.

Every page reads through ``visible_tasks`` (``apps.vdc.policy``: outsiders get 404) and every write goes
through a service (``submit_task``, ``stop_task``, ``delete_task``, ``set_queue_policy``,
``set_queue_open``). Lists take a constant number of queries whatever the number of tasks.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db.models import Case, Count, F, Q, QuerySet, Sum, Value, When, Window
from django.db.models.functions import Lower
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from rest_framework.exceptions import PermissionDenied as DRFPermissionDenied
from rest_framework.exceptions import ValidationError as DRFValidationError

from apps.billing.project_alerts import open_alerts_for
from apps.billing.services import (
    PriceBook,
    billed_task_ids,
    card_prices,
    hourly_price_of_request,
    price_book,
    task_costs,
)
from apps.billing.templatetags.money import format_money
from apps.clusters import services as cluster_services
from apps.clusters.backends import executor_for
from apps.clusters.executors.base import ExecutorError
from apps.clusters.models import CapacityReservation, Cluster, Device, GPUModel
from apps.core.charts import svg_chart
from apps.queues import services as queue_services
from apps.queues.choices import CLASS_RULES, PriorityClass
from apps.queues.models import TaskQueue
from apps.tasks import access, connect, forms, ledger, lineup, live, schedule, task_templates, taskfile, usage
from apps.tasks.admission import wait_notice
from apps.tasks.api.serializers import TaskSerializer
from apps.tasks.choices import ACTIVE, WAITING, EventKind, TaskKind, TaskStatus
from apps.tasks.filtersets import TaskFilterSet
from apps.tasks.instances import task_instances
from apps.tasks.load import BUCKET, backtest_of, load_series
from apps.tasks.models import Task, TaskEvent, TaskTemplate
from apps.tasks.services import (
    AUTOSCALE_FIELDS,
    delete_task,
    stop_task,
    stop_tasks,
    update_autoscaling,
    waiting_gpu_equivalents,
)
from apps.vdc import policy
from apps.vdc.models import VDC, CapacityLoan, Membership, Project, ProjectQuota

PAGE_SIZE = 50
QUEUE_CHANGE = policy.model_perm(TaskQueue, "change")
DASHBOARD_TASKS = 20
DASHBOARD_LOANS = 20
ZERO = Decimal(0)
NO_LOAN = (ZERO, ZERO, ZERO)


@dataclass(frozen=True)
class KindPage:
    """One of the per-kind pages (docs/rules.md#vdcs-projects-and-doors): its URL name, kinds, title and create form."""

    slug: str
    kinds: tuple[str, ...]
    title: str
    noun: str
    form_class: type[forms.TaskForm]


KIND_PAGES = {
    "instances": KindPage("instances", (TaskKind.DEV_ENV,), "Dev environments", "dev environment", forms.DevEnvForm),
    "training-jobs": KindPage(
        "training-jobs", (TaskKind.TRAINING, TaskKind.FINE_TUNING), "Training jobs", "training job", forms.TrainingForm
    ),
    "inference-services": KindPage(
        "inference-services", (TaskKind.INFERENCE,), "Inference services", "inference service", forms.InferenceForm
    ),
}


# --- helpers shared by the pages ---------------------------------------------------------------


def visible_tasks(user) -> QuerySet[Task]:
    """Tasks of the user's projects (all for staff who may view tasks), with what pages show loaded."""
    tasks = Task.objects.select_related("project", "vdc", "queue", "cluster", "owner")
    return policy.scope_to_projects(tasks, user)


def decorate(tasks, user) -> list[Task]:
    """Attach what the rows show: the status line, what the user may do (stop, delete, open a Web Console or
    Connect), the hourly price and cost so far."""
    rights = policy.ProjectRights.of(user)
    rows = list(tasks)
    costs = task_costs([task.pk for task in rows])
    billed = billed_task_ids([task.pk for task in rows if task.started_at is not None])
    prices: dict[tuple, Decimal | None] = {}
    books: dict[int, PriceBook] = {}
    gpu_catalog = cluster_services.catalog() if rows else None
    for task in rows:
        task.summary = live.status_summary(task)
        task.user_can_act = rights.can_act(task.project_id, policy.CHANGE_TASK)
        # A task that runs, or ran and was metered, is kept for billing: Delete is not offered for it.
        task.user_can_delete = (
            rights.can_act(task.project_id, policy.DELETE_TASK) and task.status not in ACTIVE and task.pk not in billed
        )
        task.user_can_enter = rights.can_enter(task.project_id)
        task.user_console = rights.console_access(task.project_id)
        task.cost = costs.get(task.pk)
        # Pages show many tasks of the same shape: each distinct request is priced once.
        key = (task.vdc_id, task.cpu, task.memory_gib, task.gpu_spec, task.instances)
        if task.vdc_id not in books:
            books[task.vdc_id] = price_book(task.vdc_id)
        if key not in prices:
            prices[key] = hourly_price(task, books[task.vdc_id], gpu_catalog)
        task.hourly_price = prices[key]
        task.currency = books[task.vdc_id].currency or ""
    return rows


def hourly_price(task: Task, book: PriceBook | None = None, gpu_catalog=None) -> Decimal | None:
    """The list price per hour of the task's request; None when no price applies or its spec no longer parses."""
    try:
        return hourly_price_of_request(
            task.vdc, task.cpu, task.memory_gib, task.gpu_spec, task.instances, book=book, gpu_catalog=gpu_catalog
        )
    except ValidationError:
        return None


def user_vdc_ids(user) -> list[int]:
    """VDCs whose queues and clusters the user's pages show: those of their projects' quotas (all for staff who
    may view VDCs)."""
    vdcs = policy.visible_vdcs(user).filter(enabled=True)
    return sorted(vdcs.values_list("pk", flat=True))


def card_usage(vdc_ids) -> dict[tuple[int, str], ledger.CardUse]:
    """The cards of the VDCs' enabled clusters per cluster and model, as the capacity ledger counts them."""
    return ledger.card_use(Q(node__cluster__vdc__in=vdc_ids, node__cluster__enabled=True))


def free_by_model(cards: dict[tuple[int, str], ledger.CardUse]) -> list[dict]:
    """Per VDC and GPU model: cards in total and free now (no active task holds any share of them)."""
    cluster_vdc = dict(Cluster.objects.filter(pk__in={c for c, _m in cards}).values_list("pk", "vdc_id"))
    models = {m.name: m for m in GPUModel.objects.filter(name__in={m for _c, m in cards})}
    rows: dict[tuple[int, str], dict] = {}
    for (cluster_id, model), use in sorted(cards.items()):
        key = (cluster_vdc[cluster_id], model)
        row = rows.setdefault(
            key,
            {
                "vdc": key[0],
                "model": model,
                "vendor": models[model].vendor,
                "vram": models[model].vram_gib,
                "total": 0,
                "free": 0,
            },
        )
        row["total"] += use.cards
        row["free"] += use.free
    # The list price of one card of each model, so the picker and the task's price agree.
    gpu_catalog = cluster_services.catalog() if rows else None
    for vdc_id in {vdc for vdc, _model in rows}:
        book = price_book(vdc_id)
        prices, currency = card_prices(book, gpu_catalog), book.currency or ""
        for (vdc, model), row in rows.items():
            if vdc == vdc_id and model in prices:
                row["card_price"], row["currency"] = prices[model], currency
    return sorted(rows.values(), key=lambda r: (r["vdc"], r["model"]))


# --- charts: activity over the last 24 h from the event timeline ---------------------------------


@dataclass
class Series:
    """Per bucket, the peak number of tasks running and waiting, and of GPUs held; ``now``: current levels."""

    running: list[float]
    waiting: list[float]
    gpus: list[float]
    now: dict = field(default_factory=dict)


@dataclass
class Activity:
    times: list[datetime]
    series: dict = field(default_factory=dict)

    def of(self, key=None) -> Series:
        empty = [0.0] * len(self.times)
        return self.series.get(key) or Series(empty, empty, empty, {"running": 0, "waiting": 0, "gpus": 0})


def _cards(placement) -> float:
    return sum(d.get("milli", 1000) for p in placement or () for d in p.get("devices", ())) / 1000


def _peaks(deltas: list[tuple[datetime, float]], start: datetime, step: timedelta, buckets: int):
    """The highest level each bucket reaches, stepping through +n / -n changes in time order; and the last level."""
    deltas.sort(key=lambda d: (d[0], d[1]))  # at one instant, leaving counts before arriving
    peaks, level, i = [], 0.0, 0
    for b in range(buckets):
        end = start + step * (b + 1)
        peak = level
        while i < len(deltas) and deltas[i][0] <= end:
            level += deltas[i][1]
            peak = max(peak, level)
            i += 1
        peaks.append(round(peak, 3))
    return peaks, round(level, 3)


def activity(tasks: QuerySet[Task], group: str | None = None, hours: int = 24, buckets: int = 48) -> Activity:
    """Peak running tasks, waiting tasks and GPUs held in each bucket of the last ``hours``, per ``group`` value.

    Exact from the timeline: every status change is a TaskEvent with its from / to status, so a task
    without events in the window kept its current status throughout. Three queries.
    """
    now = timezone.now()
    start = now - timedelta(hours=hours)
    step = (now - start) / buckets
    key_field = group or "project_id"
    events = TaskEvent.objects.filter(task__in=tasks, created_at__gt=start).exclude(to_status="")
    deltas: dict = defaultdict(lambda: {"running": [], "waiting": [], "gpus": []})

    def span(key, status: str, cards: float, since: datetime, until: datetime | None, n: int = 1) -> None:
        category = "running" if status in ACTIVE else "waiting" if status in WAITING else None
        if category is None:
            return
        lists = deltas[key if group else None]
        weights = [(category, n)] + ([("gpus", cards)] if category == "running" else [])
        for name, weight in weights:
            lists[name].append((since, weight))
            if until is not None:
                lists[name].append((until, -weight))

    steady = tasks.exclude(pk__in=events.values("task_id"))
    for row in steady.filter(status__in=WAITING).values(key_field).annotate(n=Count("id")).order_by():
        span(row[key_field], TaskStatus.QUEUED, 0, start, None, row["n"])
    for key, status, placement in steady.filter(status__in=ACTIVE).values_list(key_field, "status", "placement"):
        span(key, status, _cards(placement), start, None)

    rows = events.order_by("task_id", "created_at", "id").values_list(
        "task_id", f"task__{key_field}", "created_at", "kind", "from_status", "to_status", "data"
    )
    current: dict = {}
    for task_id, key, created_at, kind, from_status, to_status, data in rows:
        state = current.setdefault(task_id, {"key": key, "status": from_status, "since": start, "cards": 0.0})
        span(key, state["status"], state["cards"], state["since"], created_at)
        if kind == EventKind.SCHEDULED and isinstance(data, dict):
            state["cards"] = _cards(data.get("placement"))
        state["status"], state["since"] = to_status, created_at
    for state in current.values():
        span(state["key"], state["status"], state["cards"], state["since"], None)

    out = {}
    for key, lists in deltas.items():
        levels = {name: _peaks(values, start, step, buckets) for name, values in lists.items()}
        out[key] = Series(
            levels["running"][0],
            levels["waiting"][0],
            levels["gpus"][0],
            {name: level for name, (_, level) in levels.items()},
        )
    return Activity(times=[start + step * (i + 1) for i in range(buckets)], series=out)


def activity_chart(data: Activity, key=None) -> dict:
    series = data.of(key)
    return svg_chart(
        data.times,
        [
            ("Running", "running", series.running, series.now["running"]),
            ("Waiting", "waiting", series.waiting, series.now["waiting"]),
            ("GPUs held", "gpus", series.gpus, series.now["gpus"]),
        ],
    )


# --- dashboard ------------------------------------------------------------------------------------


def running_first(tasks: QuerySet[Task]) -> QuerySet[Task]:
    """Tasks holding resources first (newest start first), then waiting ones in queue order: a flood of
    queued tasks must not push a running one off the dashboard."""
    holding = Case(When(status__in=ACTIVE, then=Value(0)), default=Value(1))
    return tasks.order_by(
        holding, F("started_at").desc(nulls_last=True), F("queue_position").asc(nulls_last=True), "submitted_at", "id"
    )


def unfinished_query(user) -> str:
    """The compute-tasks filter of the user's own running and waiting tasks (the dashboard's "all" link)."""
    return urlencode({"owner": user.pk, "status__in": ",".join((*ACTIVE, *WAITING)), "sort": "status"})


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    user = request.user
    unfinished = visible_tasks(user).filter(owner=user, status__in=(*ACTIVE, *WAITING))
    # Every row carries the total (a window over the whole set), so "N more" costs no second query.
    mine = decorate(running_first(unfinished.annotate(total=Window(Count("id"))))[:DASHBOARD_TASKS], user)
    more = mine[0].total - len(mine) if mine else 0
    projects = list(policy.visible_projects(user))
    quotas = list(ProjectQuota.objects.filter(project__in=projects).select_related("project", "vdc"))
    usage = {
        (row["project_id"], row["vdc_id"]): row
        for row in Task.objects.filter(project__in=projects, status__in=ACTIVE)
        .values("project_id", "vdc_id")
        .annotate(**ledger.allocation_sums(), n=Count("id"))
        .order_by()
    }
    # Capacity the rebalancer lent between these projects and others: who lent what, since when, why. Active
    # loans are few (at most one per lender and borrower pair), so all are read once for the meters and the card.
    active_loans = list(
        CapacityLoan.objects.active()
        .filter(Q(lender__in=projects) | Q(borrower__in=projects))
        .select_related("vdc", "lender", "borrower")
    )
    borrowed: dict[tuple, list[Decimal]] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    lent: dict[tuple, list[Decimal]] = defaultdict(lambda: [ZERO, ZERO, ZERO])
    for loan in active_loans:
        for side, project_id in ((borrowed, loan.borrower_id), (lent, loan.lender_id)):
            row = side[(project_id, loan.vdc_id)]
            row[0], row[1], row[2] = row[0] + loan.cpu, row[1] + loan.memory_gib, row[2] + loan.gpu
    quota_rows = []
    for q in quotas:
        used = usage.get((q.project_id, q.vdc_id), {})
        got, gave = borrowed.get((q.project_id, q.vdc_id), NO_LOAN), lent.get((q.project_id, q.vdc_id), NO_LOAN)
        quota_rows.append(
            {
                "quota": q,
                "resources": [
                    _meter("CPU cores", used.get("cpu"), q.guaranteed_cpu, q.limit_cpu, got[0], gave[0]),
                    _meter(
                        "Memory GiB",
                        used.get("memory_gib"),
                        q.guaranteed_memory_gib,
                        q.limit_memory_gib,
                        got[1],
                        gave[1],
                    ),
                    _meter("GPU-eq", used.get("gpu"), q.guaranteed_gpu, q.limit_gpu, got[2], gave[2]),
                ],
                "tasks": used.get("n", 0),
            }
        )
    vdc_ids = user_vdc_ids(user)
    clusters = list(
        Cluster.objects.filter(vdc__in=vdc_ids)
        .select_related("vdc")
        .annotate(n_nodes=Count("nodes", distinct=True), cpu=Sum("nodes__cpu"))
    )
    cards = card_usage(vdc_ids)
    per_cluster: dict[int, list[ledger.CardUse]] = defaultdict(list)
    for (cluster_id, _model), use in cards.items():
        per_cluster[cluster_id].append(use)
    for c in clusters:
        uses = per_cluster.get(c.pk, [])
        c.gpu_total = sum(u.cards for u in uses)
        c.gpu_busy = c.gpu_total - sum(u.free for u in uses)
        c.gpu_util = round(sum(u.utilisation * u.cards for u in uses) / c.gpu_total) if c.gpu_total else 0
        c.busy_percent = round(100 * c.gpu_busy / c.gpu_total) if c.gpu_total else 0
    chart = activity_chart(activity(policy.scope_to_projects(Task.objects.all(), user)))
    loans = active_loans[:DASHBOARD_LOANS]
    return render(
        request,
        "portal/dashboard.html",
        {
            "tasks": mine,
            "more_tasks": more,
            "more_url": f"{reverse('portal:compute-tasks')}?{unfinished_query(user)}",
            "quota_rows": quota_rows,
            "clusters": clusters,
            "chart": chart,
            "free_models": free_by_model(cards),
            "projects": projects,
            "alerts": open_alerts_for(user),
            "loans": loans,
            "nav": "dashboard",
        },
    )


def _meter(label: str, used, guaranteed: Decimal, limit: Decimal, borrowed=ZERO, lent=ZERO) -> dict:
    """One quota meter: use against the limit plus what the project borrowed (its loans raise its limit), with
    what it lent out of its guarantee."""
    used = Decimal(used or 0)
    room = limit + borrowed
    percent = min(100, round(100 * used / room)) if room else 0
    return {
        "label": label,
        "used": used,
        "guaranteed": guaranteed,
        "limit": limit,
        "borrowed": borrowed,
        "lent": lent,
        "percent": percent,
    }


# --- task lists -----------------------------------------------------------------------------------


# Sortable columns (``?sort=name``, ``?sort=-name``): the expressions they order by, and the direction a
# first click on the column picks (names and queues A to Z, statuses running first, newest submissions first).
STATUS_RANK = Case(When(status__in=ACTIVE, then=Value(0)), When(status__in=WAITING, then=Value(1)), default=Value(2))
SORTS = {
    "name": ((Lower("name"),), ""),
    "status": ((STATUS_RANK, F("status"), F("queue_position")), ""),
    "queue": ((F("queue__name"), F("queue_position")), ""),
    "submitted": ((F("submitted_at"),), "-"),
}
DEFAULT_SORT = "-submitted"


def sort_key(value: str | None) -> str:
    """The ``sort`` parameter if it names a sortable column (with an optional ``-``), else the default."""
    return value if value and value.lstrip("-") in SORTS and value.count("-") <= 1 else DEFAULT_SORT


def sorted_tasks(tasks: QuerySet[Task], sort: str) -> QuerySet[Task]:
    """Order by a sortable column; ties by id in the same direction, so pages never repeat or skip a row."""
    descending = sort.startswith("-")
    exprs = (*SORTS[sort.lstrip("-")][0], F("id"))
    return tasks.order_by(*(e.desc(nulls_last=True) if descending else e.asc(nulls_last=True) for e in exprs))


def sort_links(query, sort: str) -> dict[str, dict]:
    """Per sortable column: the URL that sorts by it (the other way when it is the current sort) and its arrow."""
    links = {}
    for name, (_exprs, first) in SORTS.items():
        current = sort.lstrip("-") == name
        target = ("" if sort.startswith("-") else "-") + name if current else first + name
        params = query.copy()
        params["sort"] = target
        arrow = ("▼" if sort.startswith("-") else "▲") if current else ""
        links[name] = {"url": "?" + params.urlencode(), "arrow": arrow, "current": current}
    return links


def _filtered_list(request: HttpRequest, base: QuerySet[Task]) -> dict:
    """The filter choices, the filtered and sorted page of rows and the filterset (constant queries)."""
    filterset = TaskFilterSet(request.GET or None, queryset=base)
    queryset = filterset.qs if filterset.is_bound and filterset.is_valid() else base
    sort = sort_key(request.GET.get("sort"))
    page = Paginator(sorted_tasks(queryset, sort), PAGE_SIZE).get_page(request.GET.get("page"))
    page.object_list = decorate(page.object_list, request.user)
    query = request.GET.copy()
    query.pop("page", None)
    unsorted = query.copy()
    unsorted.pop("sort", None)
    vdc_ids = user_vdc_ids(request.user)
    projects = list(policy.visible_projects(request.user).only("pk", "name"))
    return {
        "page": page,
        "tasks": page.object_list,
        "filterset": filterset,
        "query": query.urlencode(),
        "filtered": bool(unsorted),
        "sort": sort,
        "sort_links": sort_links(unsorted, sort),
        "bulk": any(task.user_can_act and not task.is_final for task in page.object_list),
        "live_projects": [p.pk for p in projects],
        "selected": {k: request.GET.get(k, "") for k in ("kind", "status", "queue", "project", "cluster", "q")},
        "choices": {
            "kind": TaskKind.choices,
            "status": TaskStatus.choices,
            "queue": [
                (q.pk, f"{q.vdc.name} / {q.name}")
                for q in TaskQueue.objects.filter(vdc__in=vdc_ids).select_related("vdc")
            ],
            "project": [(p.pk, p.name) for p in projects],
            "cluster": [
                (c.pk, f"{c.vdc.name} / {c.name}")
                for c in Cluster.objects.filter(vdc__in=vdc_ids).select_related("vdc")
            ],
        },
    }


@login_required
def compute_tasks(request: HttpRequest) -> HttpResponse:
    context = _filtered_list(request, visible_tasks(request.user))
    context.update(nav="compute-tasks", title="Compute tasks", show_kind_filter=True)
    return render(request, "portal/compute_tasks.html", context)


@login_required
def kind_list(request: HttpRequest, slug: str) -> HttpResponse:
    page = KIND_PAGES[slug]
    context = _filtered_list(request, visible_tasks(request.user).filter(kind__in=page.kinds))
    context.update(nav=slug, title=page.title, kind_page=page, show_kind_filter=len(page.kinds) > 1)
    return render(request, "portal/kind_list.html", context)


@login_required
def kind_create(request: HttpRequest, slug: str) -> HttpResponse:
    """A kind's submit form; ``?from=ID`` fills it from that task's task file ("Submit again"), ``?template=ID``
    from that template's ("Use"), and a task file uploaded in ``task_file`` is submitted as the API submits it
    (docs/tasks.md, "Task files" and "Templates")."""
    page = KIND_PAGES[slug]
    upload_errors: list[str] = []
    if request.method == "POST" and "task_file" in request.FILES:
        task, form, upload_errors = _submit_task_file(request, page)
        if task is not None:
            return _submitted(request, page, task)
    else:
        form = page.form_class(request.POST or None, user=request.user)
        source = request.GET.get("from", "")
        template_id = request.GET.get("template", "")
        if request.method == "GET" and source.isdecimal():
            task = _visible_task(request, int(source))
            form = page.form_class(user=request.user)
            form.initial = form.initial_from_file(taskfile.task_file(task))
            form.source_task = task
        elif request.method == "GET" and template_id.isdecimal():
            templates = policy.scope_to_projects(TaskTemplate.objects.select_related("project"), request.user)
            template = get_object_or_404(templates, pk=int(template_id))
            form = page.form_class(user=request.user)
            form.initial = form.initial_from_file(task_templates.submission(template))
            form.source_template = template
        if request.method == "POST" and form.is_valid():
            task = form.submit()
            if task is not None:
                return _submitted(request, page, task)
    vdc_ids = user_vdc_ids(request.user)
    cards = card_usage(vdc_ids)
    queues = list(TaskQueue.objects.filter(vdc__in=vdc_ids).select_related("vdc"))
    for queue in queues:
        queue.default_wall_time_words = live.duration_words(queue.default_wall_time) if queue.default_wall_time else ""
        queue.max_wall_time_words = live.duration_words(queue.max_wall_time) if queue.max_wall_time else ""
    return render(
        request,
        "portal/task_form.html",
        {
            "form": form,
            "upload_errors": upload_errors,
            "kind_page": page,
            "nav": slug,
            "queues": queues,
            "free_models": free_by_model(cards),
        },
    )


def _submitted(request: HttpRequest, page: KindPage, task: Task) -> HttpResponse:
    messages.success(request, f"{page.noun.capitalize()} {task.name} submitted to queue {task.queue.name}.")
    notice = wait_notice(task)
    if notice:
        messages.warning(request, notice)
    return redirect("portal:task-monitoring", pk=task.pk)


def _error_lines(detail, prefix: str = ""):
    """An API error body as ``field: message`` lines, as ``hcs`` prints them."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            label = "" if key in ("detail", "non_field_errors") else str(key)
            yield from _error_lines(value, f"{prefix}.{label}" if prefix and label else prefix or label)
    elif isinstance(detail, list):
        for item in detail:
            yield from _error_lines(item, prefix)
    else:
        yield f"{prefix}: {detail}" if prefix else str(detail)


def _submit_task_file(request: HttpRequest, page: KindPage) -> tuple[Task | None, forms.TaskForm, list[str]]:
    """Submit an uploaded task file through the API's submit serializer (same fields, same checks). When it is
    refused: the form filled from the file, and the refusals as ``field: message`` lines."""
    form = page.form_class(user=request.user)
    upload = request.FILES["task_file"]
    try:
        data = taskfile.load(upload.read(taskfile.MAX_FILE_BYTES + 1))
    except ValidationError as exc:
        return None, form, [f"Task file {upload.name}: {message}" for message in exc.messages]
    form.initial = form.initial_from_file({key: value for key, value in data.items() if key in taskfile.FILE_FIELDS})
    serializer = TaskSerializer(data=data, context={"request": request})
    try:
        if serializer.is_valid():
            return serializer.save(), form, []
        errors = serializer.errors
    except (DRFValidationError, DRFPermissionDenied) as exc:
        errors = exc.detail
    except PermissionDenied as exc:
        errors = [str(exc)]
    return None, form, [f"Task file {upload.name}: {line}" for line in _error_lines(errors)]


# --- one task -------------------------------------------------------------------------------------


def _visible_task(request: HttpRequest, pk: int) -> Task:
    return get_object_or_404(visible_tasks(request.user), pk=pk)


@login_required
def task_monitoring(request: HttpRequest, pk: int) -> HttpResponse:
    task = decorate([_visible_task(request, pk)], request.user)[0]
    events = list(task.events.select_related("actor"))
    for event in events:
        event.details = _event_details(event)
    backend_objects, backend_error, backend_state = [], "", None
    if task.external_id and task.cluster is not None:
        try:
            backend_state = executor_for(task.cluster).status(task.external_id)
            backend_objects = list(backend_state.objects)
        except ExecutorError as exc:
            backend_error = str(exc)
    # A finished task's placement stays on record (billing reads it), but it holds nothing any more.
    held = [] if task.is_final else task.placement or ()
    device_ids = [d.get("id") for p in held for d in p.get("devices", ())]
    shares = {d.get("id"): d.get("milli", 1000) / 10 for p in task.placement or () for d in p.get("devices", ())}
    devices = Device.objects.filter(pk__in=device_ids).select_related("node", "gpu_model").order_by("node", "index")
    devices = list(devices)
    for device in devices:
        device.share_percent = shares.get(device.pk, 100)
    # Every run keeps its log: ?run=N shows an earlier one, the latest by default.
    run = request.GET.get("run", "")
    log_run = int(run) if run.isdecimal() and 1 <= int(run) < task.attempt else None
    instances = task_instances(task)
    ide_url = access.ide_connect_url(task)
    # Connect is offered only while the IDE answers; who may not enter is never shown it, so is not probed for.
    ide_down = ""
    if ide_url and task.status == "running" and task.external_id and getattr(task, "user_can_enter", False):
        ide_down = access.ide_not_answering(task)
    return render(
        request,
        "portal/task_monitoring.html",
        {
            "task": task,
            "events": events,
            "backend_objects": backend_objects,
            "backend_error": backend_error,
            "devices": devices,
            "preferred": list(task.preferred_clusters.all()),
            "runs": range(1, task.attempt + 1),
            "log_run": log_run,
            "instance_numbers": terminal_instances(task, instances),
            "ide_url": ide_url,
            "ide_down": ide_down,
            "service": access.service_facts(task, backend_state, connect.app_origin(request, task.pk, task.port or 0)),
            "instances": instances,
            "load_chart": load_chart(task),
            "usage_chart": usage_chart(task),
            "usage_summary": usage.summary(task),
            "idle_state": idle_state_of(task),
            "task_file": taskfile.dump_yaml(task),
            "submit_again_url": _submit_again_url(request, task),
            "can_save_template": policy.can_manage(request.user, task.project, policy.model_perm(TaskTemplate, "add")),
            "nav": "compute-tasks",
        },
    )


def terminal_instances(task: Task, instances) -> list[int]:
    """The instances a terminal can open: those the backend says run now (an autoscaled service has as many as
    it runs, not as it asked for); the task's count while the backend is not asked or did not answer."""
    if instances.rows:
        return [row["index"] for row in instances.rows if row["state"] == "running"]
    return list(range(max(task.instances, 1)))


def _submit_again_url(request: HttpRequest, task: Task) -> str:
    """The submit form of the task's kind filled from its task file, for users who may submit in its project."""
    if not policy.can_act(request.user, task.project, policy.SUBMIT_TASK):
        return ""
    slug = next(page.slug for page in KIND_PAGES.values() if task.kind in page.kinds)
    return f"{reverse(f'portal:{slug}-new')}?from={task.pk}"


@login_required
@require_GET
def task_file_download(request: HttpRequest, pk: int) -> HttpResponse:
    """The task's task file (YAML) as a download: what it was submitted with, secret values never."""
    task = _visible_task(request, pk)
    response = HttpResponse(taskfile.dump_yaml(task), content_type="application/yaml; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="task-{task.pk}.yaml"'
    return response


def usage_chart(task: Task) -> dict | None:
    """The task's GPU utilisation and memory used (both in %) per minute over the last day of its history (to its
    end, for a finished task); None with fewer than two samples."""
    until = task.finished_at if task.is_final and task.finished_at else timezone.now()
    rows = usage.series(task, until - timedelta(days=1), until)
    if len(rows) < 2:
        return None
    gpu = [r.gpu_percent for r in rows]
    vram = [round(r.vram_used_gib / r.vram_gib * 100, 1) if r.vram_gib else None for r in rows]
    lines = [
        ("GPU utilisation %", "running", gpu, rows[-1].gpu_percent or 0.0),
        ("GPU memory used %", "waiting", vram, vram[-1] or 0.0),
    ]
    end = "now" if not task.is_final else timezone.localtime(rows[-1].at).strftime("%H:%M")
    return svg_chart([r.at for r in rows], lines, end_label=end)


def idle_state_of(task: Task):
    """Idle autostop's view of a running dev environment: its settings, and how long it has been idle."""
    if task.kind != TaskKind.DEV_ENV or task.is_final:
        return None
    percent, minutes = usage.settings_of(task)
    state = next(iter(usage.idle_states(task_ids=[task.pk])), None) if task.status == TaskStatus.RUNNING else None
    return {"percent": percent, "minutes": minutes, "state": state}


def load_chart(task: Task) -> dict | None:
    """An autoscaled service's request rate per 5 minutes over the last day, and its forecast to an hour
    ahead (predictive scaling); None when the autoscaler has recorded nothing for it."""
    if task.kind != TaskKind.INFERENCE or not task.autoscale_max:
        return None
    rows = load_series(task)
    if len(rows) < 2:
        return None
    now = timezone.now()
    actual = [r.rps if r.start <= now else None for r in rows]
    forecast = [r.forecast_rps for r in rows]
    current = next((r for r in reversed(rows) if r.start <= now), rows[0])
    lines = [("Requests/s", "running", actual, current.rps or 0.0)]
    if any(v is not None for v in forecast):
        lines.append(("Forecast", "waiting", forecast, current.forecast_rps or 0.0))
    ahead = int((rows[-1].start - now).total_seconds() // 60)
    chart = svg_chart([r.start for r in rows], lines, end_label=f"+{ahead} min" if ahead > 0 else "now")
    chart["method"] = next((r.forecast_method for r in reversed(rows) if r.forecast_method), "")
    if task.autoscale_predictive:
        step = BUCKET.total_seconds()
        until = datetime.fromtimestamp(now.timestamp() // step * step, tz=UTC)
        chart["backtest"] = backtest_of(task.pk, until, int(step), int(timedelta(days=1) / BUCKET)).describe()
    return chart


@login_required
@require_GET
def task_instances_part(request: HttpRequest, pk: int) -> HttpResponse:
    """The monitoring page's instance table alone, polled by the page to keep its figures current."""
    task = _visible_task(request, pk)
    return render(request, "portal/_task_instances.html", {"task": task, "instances": task_instances(task)})


def _event_details(event: TaskEvent) -> list[str]:
    """What the event's data says in words: who preempted and why, the new window, where it landed."""
    data = event.data if isinstance(event.data, dict) else {}
    out = []
    if data.get("by_task"):
        out.append(f"for task #{data['by_task']}")
    if data.get("reason"):
        out.append(f"reason: {str(data['reason']).replace('_', ' ')}")
    if data.get("new_window_s") is not None:
        out.append(f"requeued with a window of {timedelta(seconds=int(data['new_window_s']))}")
    if data.get("placement"):
        out.append(
            "; ".join(
                f"{p.get('node_name', '?')}: {p.get('gpu_model') or 'no GPU'} "
                f"[{', '.join(str(d.get('index')) for d in p.get('devices', ()))}]"
                for p in data["placement"]
            )
        )
    if data.get("external_id"):
        out.append(f"backend id {data['external_id']}")
    if data.get("exit_code") is not None:
        out.append(f"exit code {data['exit_code']}")
    return out


@login_required
@require_GET
def task_logs(request: HttpRequest, pk: int) -> JsonResponse:
    """The tail of the task's backend log, polled by the monitoring page."""
    task = _visible_task(request, pk)
    body = {"status": task.status, "text": "", "note": ""}
    if not task.external_id or task.cluster is None:
        body["note"] = "No log yet: the task has not started on a backend."
        return JsonResponse(body)
    try:
        body["text"] = executor_for(task.cluster).logs(task.external_id, tail=200)
    except ExecutorError as exc:
        body["note"] = f"Log unavailable: {exc}"
    return JsonResponse(body)


@login_required
@require_GET
def price_estimate(request: HttpRequest) -> JsonResponse:
    """The list price per hour of a request being written in a create form (null when no price applies)."""
    vdc = VDC.objects.filter(pk__in=user_vdc_ids(request.user), pk=request.GET.get("vdc") or 0).first()
    try:
        cpu = Decimal(request.GET.get("cpu") or "0")
        memory = Decimal(request.GET.get("memory_gib") or "0")
        instances = max(1, int(request.GET.get("instances") or "1"))
        price = hourly_price_of_request(vdc, cpu, memory, request.GET.get("gpu_spec", ""), instances) if vdc else None
    except (ArithmeticError, ValueError, ValidationError) as exc:
        message = " ".join(exc.messages) if isinstance(exc, ValidationError) else "Expected numbers."
        return JsonResponse({"hourly_price": None, "currency": None, "error": message})
    currency = price_book(vdc).currency if price is not None else None
    return JsonResponse(
        {
            "hourly_price": f"{price:.2f}" if price is not None else None,
            "currency": currency,
            "display": format_money(price, currency) if price is not None else None,
            "minimum_minutes": price_book(vdc).minimum_minutes if price is not None else None,
            "error": "",
        }
    )


@login_required
@require_POST
def task_stop(request: HttpRequest, pk: int) -> HttpResponse:
    task = _visible_task(request, pk)
    try:
        stop_task(task, request.user, reason=request.POST.get("reason", "").strip()[:200])
        messages.success(request, f"Task #{task.pk} {task.name} stopped.")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    except Task.DoesNotExist:
        # Deleted by another request since it was looked up.
        raise Http404(f"Task {pk} no longer exists.")
    return redirect(_next_url(request, reverse("portal:task-monitoring", args=[task.pk])))


@login_required
@require_POST
def task_autoscaling(request: HttpRequest, pk: int) -> HttpResponse:
    """The monitoring page's autoscaling form: new bounds and targets through ``update_autoscaling``."""
    task = _visible_task(request, pk)
    changes: dict = {}
    for name in AUTOSCALE_FIELDS:
        if name in request.POST and name not in ("autoscale_predictive", "autoscale_schedule"):
            raw = request.POST[name].strip()
            if raw and not (raw.isdecimal() and len(raw) < 10):
                label = name.removeprefix("autoscale_")
                messages.error(request, f"{label}: expected a whole number, got {raw[:20]!r}.")
                return redirect(reverse("portal:task-monitoring", args=[task.pk]))
            changes[name] = int(raw) if raw else None
    if "autoscale_min" in request.POST:
        # The form's checkbox: absent when unticked.
        changes["autoscale_predictive"] = request.POST.get("autoscale_predictive") in ("on", "true", "1")
    if "autoscale_schedule" in request.POST:
        # Entries one a line, or separated by semicolons as the page shows them.
        lines = [line for line in re.split(r"[;\n]", request.POST["autoscale_schedule"]) if line.strip()]
        try:
            changes["autoscale_schedule"] = [schedule.parse_line(line) for line in lines]
        except ValueError as exc:
            messages.error(request, f"schedule: {exc}")
            return redirect(reverse("portal:task-monitoring", args=[task.pk]))
    try:
        update_autoscaling(task, request.user, **changes)
        messages.success(request, f"Autoscaling of #{task.pk} {task.name} saved.")
    except ValidationError as exc:
        errors = exc.message_dict if hasattr(exc, "error_dict") else {"": exc.messages}
        messages.error(
            request,
            " ".join(f"{k.removeprefix('autoscale_')}: {' '.join(v)}" if k else " ".join(v) for k, v in errors.items()),
        )
    return redirect(reverse("portal:task-monitoring", args=[task.pk]))


@login_required
@require_POST
def task_delete(request: HttpRequest, pk: int) -> HttpResponse:
    task = _visible_task(request, pk)
    try:
        delete_task(task, request.user)
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
        return redirect(_next_url(request, reverse("portal:task-monitoring", args=[task.pk])))
    messages.success(request, f"Task #{pk} {task.name} deleted.")
    return redirect(_next_url(request, reverse("portal:compute-tasks"), exclude=f"/task-monitoring/{pk}/"))


@login_required
@require_POST
def tasks_stop_selected(request: HttpRequest) -> HttpResponse:
    """Stop the tasks ticked in a list (at most a page of them); viewers may not (403)."""
    ids = sorted({int(v) for v in request.POST.getlist("task") if v.isdigit() and len(v) < 12})
    default = reverse("portal:compute-tasks")
    if not ids:
        messages.error(request, "Select the tasks to stop first.")
        return redirect(_next_url(request, default))
    if len(ids) > PAGE_SIZE:
        messages.error(request, f"Stop at most {PAGE_SIZE} tasks at once (a page of the list).")
        return redirect(_next_url(request, default))
    stopped, left = stop_tasks(ids, request.user, reason=request.POST.get("reason", "").strip()[:200])
    if stopped:
        names = ", ".join(f"#{t.pk}" for t in stopped)
        messages.success(request, f"{len(stopped)} task{pluralize(len(stopped))} stopped: {names}.")
    if left:
        messages.error(
            request, f"{left} selected task{pluralize(left)} not stopped: already finished, or not yours to stop."
        )
    return redirect(_next_url(request, default))


def _next_url(request: HttpRequest, default: str, exclude: str = "") -> str:
    """Back to the page the action came from when it is one of ours."""
    target = request.POST.get("next", "")
    if target.startswith("/") and not target.startswith("//") and (not exclude or not target.startswith(exclude)):
        return target
    return default


# --- queues ---------------------------------------------------------------------------------------


def reservations_of(user, vdc_ids, now: datetime) -> dict[int, list[CapacityReservation]]:
    """Current and upcoming capacity reservations per VDC, each with ``current`` and ``for_whom`` (the user's
    own projects by name, other projects only as such)."""
    admin = policy.sees_all(user, Project)
    mine: set | None = None
    rows = (
        CapacityReservation.objects.filter(vdc__in=vdc_ids)
        .current_and_upcoming(now)
        .select_related("cluster", "gpu_model")
        .prefetch_related("nodes", "projects")
    )
    out: dict[int, list[CapacityReservation]] = defaultdict(list)
    for r in rows:
        r.current = r.starts_at <= now
        projects = list(r.projects.all())
        if projects and mine is None:
            mine = set(Membership.objects.filter(user=user).values_list("project_id", flat=True))
        ours = sorted(p.name for p in projects if admin or p.pk in mine)
        others = len(projects) - len(ours)
        if not projects:
            r.for_whom = "nobody (maintenance)"
        else:
            r.for_whom = ", ".join(ours + ([f"{others} other project{pluralize(others)}"] if others else []))
        out[r.vdc_id].append(r)
    return out


@login_required
def task_queues(request: HttpRequest) -> HttpResponse:
    user = request.user
    vdc_ids = user_vdc_ids(user)
    queues = list(TaskQueue.objects.filter(vdc__in=vdc_ids).select_related("vdc"))
    ids = [q.pk for q in queues]
    counts = live.queue_counts(ids)
    demand = waiting_gpu_equivalents(ids)
    history = activity(Task.objects.filter(queue__in=ids), group="queue_id")
    lines = lineup.lineups(ids, user, {qid: c["waiting"] for qid, c in counts.items()})
    for q in queues:
        q.counts = counts[q.pk]
        q.lineup = lines[q.pk]
        q.mine = [e for e in q.lineup if isinstance(e, lineup.Entry) and e.mine]
        q.gpu_waiting = demand.get(q.pk, Decimal("0"))
        q.chart = activity_chart(history, q.pk)
    by_vdc: dict[int, list[TaskQueue]] = defaultdict(list)
    for q in queues:
        by_vdc[q.vdc_id].append(q)
    held = reservations_of(user, vdc_ids, timezone.now())
    return render(
        request,
        "portal/task_queues.html",
        {
            "vdcs": [(qs[0].vdc, qs, held.get(qs[0].vdc_id, [])) for qs in by_vdc.values()],
            "queues": queues,
            "is_queue_admin": policy.has_platform_perm(user, QUEUE_CHANGE),
            "policies": forms.QueuePolicy.choices,
            "class_rules": [(c.value, c.label, CLASS_RULES[c]) for c in PriorityClass],
            "nav": "task-queues",
        },
    )


def _admin_queue(request: HttpRequest, pk: int) -> TaskQueue:
    if not policy.has_platform_perm(request.user, QUEUE_CHANGE):
        raise PermissionDenied("Only platform admins (with the permission to change queues) manage queues.")
    return get_object_or_404(TaskQueue, pk=pk)


@login_required
@require_POST
def queue_policy(request: HttpRequest, pk: int) -> HttpResponse:
    queue = _admin_queue(request, pk)
    form = forms.QueuePolicyForm(request.POST)
    if form.is_valid():
        queue_services.set_queue_policy(queue, form.cleaned_data["policy"])
        policy = queue.get_policy_display()
        messages.success(request, f"Queue {queue} now orders by {policy}; the next scheduling cycle applies it.")
    else:
        messages.error(request, f"Queue {queue}: {' '.join(form.errors.get('policy', ['invalid policy']))}")
    return redirect("portal:task-queues")


@login_required
@require_POST
def queue_open(request: HttpRequest, pk: int) -> HttpResponse:
    queue = _admin_queue(request, pk)
    is_open = request.POST.get("open") == "1"
    queue_services.set_queue_open(queue, is_open)
    messages.success(request, f"Queue {queue} is {'open' if is_open else 'closed'}.")
    return redirect("portal:task-queues")
