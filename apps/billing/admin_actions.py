"""Admin actions on accounts: add credit, issue invoices. Each asks for its figures on an intermediate page."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta
from decimal import Decimal

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.utils import timezone

from apps.billing import services
from apps.billing.pricing import format_money, format_totals


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
    invoices = services.generate_invoices(start, end, accounts=list(queryset))
    total = format_totals((invoice.total, invoice.currency) for invoice in invoices)
    modeladmin.message_user(request, f"{len(invoices)} invoice(s) issued, {total} in all.", messages.SUCCESS)
    return None
