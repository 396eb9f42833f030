"""Billing pages: a project's costs (usage by resource, daily cost chart, ledger, invoices), invoices as HTML and CSV.

Only members of the project (and platform admins) see its costs; everyone else gets 404.
"""

from __future__ import annotations

import csv
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.db.models import Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.utils import timezone
from django.views.decorators.http import require_GET

from apps.billing.choices import UNITS
from apps.billing.models import Account, Invoice, Transaction, UsageRecord
from apps.billing.services import daily_costs, month_bounds, task_costs, usage_by_resource
from apps.core.charts import bar_chart
from apps.tasks.models import Task
from apps.vdc.models import Project
from apps.vdc.policy import can_view, visible_projects

CHART_DAYS = 30
LEDGER_ROWS = 20


def _visible_project(user, project_id: int) -> Project:
    project = get_object_or_404(Project, pk=project_id)
    if not can_view(user, project, "billing.view_account"):
        raise Http404("No such project.")
    return project


def _visible_invoice(user, invoice_id: int) -> Invoice:
    invoice = get_object_or_404(
        Invoice.objects.select_related("account__project").prefetch_related("lines__gpu_model"), pk=invoice_id
    )
    if not can_view(user, invoice.account.project, "billing.view_invoice"):
        raise Http404("No such invoice.")
    return invoice


@login_required
@require_GET
def billing_index(request: HttpRequest) -> HttpResponse:
    """Every project the user may see, with its balance and this month's cost: the way into each one's costs."""
    projects = list(visible_projects(request.user, "billing.view_account").order_by("name"))
    accounts = {a.project_id: a for a in Account.objects.filter(project__in=projects)}
    month_start, _ = month_bounds(timezone.now())
    month_costs = dict(
        UsageRecord.objects.filter(project__in=projects, period_start__gte=month_start)
        .values("project")
        .annotate(total=Sum("cost"))
        .values_list("project", "total")
    )
    rows = [(p, accounts.get(p.pk), month_costs.get(p.pk) or Decimal(0)) for p in projects]
    context = {"rows": rows, "month_start": month_start, "nav": "billing"}
    return render(request, "billing/index.html", context)


@login_required
@require_GET
def project_billing(request: HttpRequest, project_id: int) -> HttpResponse:
    """A project's account, this month's and all-time usage per resource, daily costs, ledger and invoices."""
    project = _visible_project(request.user, project_id)
    now = timezone.now()
    month_start, _ = month_bounds(now)
    account = Account.objects.filter(project=project).first()
    days = daily_costs(project, CHART_DAYS, now)
    recent_tasks = list(
        Task.objects.filter(
            pk__in=UsageRecord.objects.filter(
                project=project, period_start__gte=now - timedelta(days=CHART_DAYS)
            ).values("task_id")
        )
        .only("name", "status", "kind")
        .order_by("-submitted_at")[:20]
    )
    costs = task_costs(t.pk for t in recent_tasks)
    for task in recent_tasks:
        task.cost = costs[task.pk]
    context = {
        "project": project,
        "account": account,
        "currency": account.currency if account else "",
        "month_start": month_start,
        "this_month": usage_by_resource(project, since=month_start),
        "all_time": usage_by_resource(project),
        "chart": bar_chart([(day.strftime("%m-%d"), cost) for day, cost in days]),
        "chart_total": sum((cost for _, cost in days), Decimal(0)),
        "chart_days": CHART_DAYS,
        "tasks": recent_tasks,
        "ledger": list(Transaction.objects.filter(account=account)[:LEDGER_ROWS]) if account else [],
        "invoices": list(Invoice.objects.filter(account=account)) if account else [],
    }
    return render(request, "billing/project.html", context)


@login_required
@require_GET
def invoice_detail(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """One invoice: its period, a line per resource and the total."""
    invoice = _visible_invoice(request.user, invoice_id)
    lines = list(invoice.lines.all())
    for line in lines:
        line.unit = UNITS[line.resource_type]
    context = {"invoice": invoice, "lines": lines, "project": invoice.account.project}
    return render(request, "billing/invoice.html", context)


@login_required
@require_GET
def invoice_csv(request: HttpRequest, invoice_id: int) -> HttpResponse:
    """One invoice as CSV: a header block, a row per line, and the total."""
    invoice = _visible_invoice(request.user, invoice_id)
    response = HttpResponse(content_type="text/csv; charset=utf-8")
    name = f"invoice-{invoice.account.project.name}-{invoice.period_start:%Y%m%d}-{invoice.period_end:%Y%m%d}.csv"
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    writer = csv.writer(response)
    writer.writerow(["invoice", invoice.pk])
    writer.writerow(["project", invoice.account.project.name])
    writer.writerow(["period_start", invoice.period_start.isoformat()])
    writer.writerow(["period_end", invoice.period_end.isoformat()])
    writer.writerow(["status", invoice.status])
    writer.writerow([])
    writer.writerow(["resource", "gpu_model", "quantity", "unit", "amount", "currency"])
    for line in invoice.lines.all():
        gpu = line.gpu_model.name if line.gpu_model_id else ""
        writer.writerow(
            [line.resource_type, gpu, line.quantity, UNITS[line.resource_type], line.amount, invoice.currency]
        )
    writer.writerow(["total", "", "", "", invoice.total, invoice.currency])
    return response
