"""Admin actions on accounts: add credit, issue invoices. Each asks for its figures on an intermediate page."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db import transaction
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html

from apps.billing import jobs as billing_jobs
from apps.billing import services
from apps.billing.models import InvoiceRun
from apps.billing.templatetags.money import format_money
from hcsportal import redis_guard


class CreditForm(forms.Form):
    amount = forms.DecimalField(min_value=Decimal("0.01"), max_digits=14, decimal_places=4)
    description = forms.CharField(max_length=200, required=False, initial="Credit added by an admin")


def _last_month() -> tuple:
    this_month, _ = services.month_bounds(timezone.now())
    last_month, _ = services.month_bounds(this_month - timedelta(days=1))
    return last_month.date(), (this_month - timedelta(days=1)).date()


class PeriodForm(forms.Form):
    first_day = forms.DateField(help_text="UTC, included")
    last_day = forms.DateField(help_text="UTC, included")

    def clean(self):
        data = super().clean()
        if data.get("first_day") and data.get("last_day") and data["last_day"] < data["first_day"]:
            raise forms.ValidationError("Expected the last day on or after the first day.")
        return data

    def bounds(self) -> tuple[datetime, datetime]:
        start = datetime.combine(self.cleaned_data["first_day"], time.min, tzinfo=UTC)
        end = datetime.combine(self.cleaned_data["last_day"] + timedelta(days=1), time.min, tzinfo=UTC)
        return start, end


def _ask(modeladmin, request, queryset, form, title: str, action: str):
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "form": form,
        "queryset": queryset,
        "action": action,
        "opts": modeladmin.model._meta,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "billing/admin/action_form.html", context)


@admin.action(description="Add credit to the selected accounts", permissions=["change"])
def add_credit(modeladmin, request, queryset):
    form = CreditForm(request.POST if "apply" in request.POST else None)
    if not form.is_valid():
        return _ask(modeladmin, request, queryset, form, "Add credit", "add_credit")
    accounts = list(queryset)
    amount = form.cleaned_data["amount"]
    for account in accounts:
        services.add_credit(account, amount, request.user, form.cleaned_data["description"])
    each = " / ".join(sorted({format_money(amount, a.currency) for a in accounts}))
    modeladmin.message_user(request, f"Added {each} to each of {len(accounts)} account(s).")
    return None


def _queue_invoice_run(run_id: int) -> None:
    """Hand the run to a worker; if the job queue does not answer, the run says so at once instead of waiting."""
    if not redis_guard.enqueue(billing_jobs.run_invoice_run, run_id, expires=None):
        InvoiceRun.objects.filter(pk=run_id).update(
            status=InvoiceRun.Status.FAILED,
            finished_at=timezone.now(),
            message="Not started: the job queue (Redis) did not answer. Issue the invoices again.",
        )


@admin.action(description="Issue invoices for a period", permissions=["change"])
def generate_invoices(modeladmin, request, queryset):
    if "apply" in request.POST:
        form = PeriodForm(request.POST)
    else:
        first, last = _last_month()
        form = PeriodForm(initial={"first_day": first, "last_day": last})
    if not form.is_valid():
        return _ask(modeladmin, request, queryset, form, "Issue invoices", "generate_invoices")
    start, end = form.bounds()
    # A worker issues them, account by account; the run shows how far it got and how it ended.
    run = InvoiceRun.objects.create(
        period_start=start,
        period_end=end,
        created_by=request.user,
        accounts=list(queryset.order_by("pk").values_list("pk", flat=True)),
    )
    transaction.on_commit(lambda: _queue_invoice_run(run.pk))
    url = reverse("admin:billing_invoicerun_change", args=[run.pk])
    modeladmin.message_user(
        request,
        format_html(
            '{}: {} account(s), issued in the background. <a href="{}">Follow it</a>.', run, len(run.accounts), url
        ),
        messages.SUCCESS,
    )
    return None
