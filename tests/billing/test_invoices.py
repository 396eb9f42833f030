"""Invoices: totals are the sum of their records, closed periods are immutable, admin actions issue and credit."""

from __future__ import annotations

import csv
import io
import time
from decimal import Decimal

import pytest

from apps.billing import services
from apps.billing.models import Account, ImmutablePeriodError, Invoice, InvoiceRun, Transaction, UsageRecord
from apps.clusters.models import GPUModel
from tests.billing.conftest import T0, at, start_task

D = Decimal


@pytest.fixture
def metered(world, prices, account):
    """Two tasks metered over a few hours, one crossing into the next day."""
    first = start_task(world, gpu_spec="2(A100)", name="first")
    second = start_task(world, gpu_spec="1(A100)", name="second", started=at(hours=2))
    for hour in (1, 3, 5):
        services.accrue_task(first.pk, now=at(hours=hour))
        services.accrue_task(second.pk, now=at(hours=hour))
    return first, second


def test_invoice_total_is_the_sum_of_its_records_and_lines(world, account, metered):
    invoice = services.generate_invoice(account, T0, at(days=1))
    records = UsageRecord.objects.filter(invoice=invoice)
    assert records.count() == UsageRecord.objects.count() > 0
    assert invoice.status == "issued" and invoice.issued_at
    assert invoice.total == sum(r.cost for r in records) == sum(line.amount for line in invoice.lines.all())
    a100 = GPUModel.objects.get(name="A100-80G").pk
    lines = {(line.resource_type, line.gpu_model_id): line for line in invoice.lines.all()}
    # The A100 is priced per card, so its use is billed once, in card-hours; the free
    # GPU-equivalents twin of the same hours is not a line next to it.
    assert set(lines) == {("cpu", None), ("memory", None), ("gpu", a100)}
    assert lines[("gpu", a100)].quantity == D("2") * 5 + D("1") * 3  # card-hours of both tasks
    # Charged on the ledger exactly what was invoiced.
    charged = -sum(t.amount for t in Transaction.objects.filter(kind="charge"))
    assert charged == invoice.total


def test_issuing_the_same_period_again_returns_the_same_invoice(world, account, metered):
    first = services.generate_invoice(account, T0, at(days=1))
    assert services.generate_invoice(account, T0, at(days=1)) == first
    assert Invoice.objects.count() == 1


def test_usage_metered_after_its_period_was_invoiced_is_carried_into_the_next(world, account, metered):
    january = services.generate_invoice(account, T0, at(hours=3))
    late = UsageRecord.objects.filter(invoice__isnull=True).order_by("period_start").first()
    assert late.period_start >= at(hours=3)
    UsageRecord.objects.filter(pk=late.pk).update(period_start=at(hours=2, minutes=59))  # arrived late
    february = services.generate_invoice(account, at(hours=3), at(days=1))
    assert UsageRecord.objects.get(pk=late.pk).invoice == february
    assert not UsageRecord.objects.filter(invoice__isnull=True).exists()
    assert january.total + february.total == sum(r.cost for r in UsageRecord.objects.all())


def test_a_closed_period_rejects_changes(world, account, metered):
    invoice = services.generate_invoice(account, T0, at(days=1))
    record = UsageRecord.objects.filter(invoice=invoice).first()
    record.cost = D("0")
    with pytest.raises(ImmutablePeriodError):
        record.save()
    with pytest.raises(ImmutablePeriodError):
        record.delete()
    with pytest.raises(ImmutablePeriodError):
        UsageRecord.objects.filter(invoice=invoice).update(cost=0)
    with pytest.raises(ImmutablePeriodError):
        UsageRecord.objects.filter(pk=record.pk).delete()
    line = invoice.lines.first()
    line.amount = D("0")
    with pytest.raises(ImmutablePeriodError):
        line.save()
    invoice.total = D("0")
    with pytest.raises(ImmutablePeriodError):
        invoice.save()
    with pytest.raises(ImmutablePeriodError):
        Invoice.objects.get(pk=invoice.pk).delete()
    # Closing (settling) it is the one change allowed, and it stays immutable afterwards.
    services.close_invoice(Invoice.objects.get(pk=invoice.pk))
    assert Invoice.objects.get(pk=invoice.pk).status == "closed"
    with pytest.raises(ImmutablePeriodError):
        UsageRecord.objects.filter(invoice=invoice).update(cost=0)
    invoice.refresh_from_db()
    assert sum(r.cost for r in UsageRecord.objects.filter(invoice=invoice)) == invoice.total


def test_uninvoiced_usage_can_still_be_corrected(world, account, metered):
    record = UsageRecord.objects.first()
    record.cost = D("0")
    record.save()
    assert UsageRecord.objects.get(pk=record.pk).cost == 0


def test_add_credit_writes_the_ledger(world, account):
    entry = services.add_credit(account, D("50"), world.admin, "top-up")
    account.refresh_from_db()
    assert account.balance == D("1050")
    assert (entry.kind, entry.amount, entry.balance_after, entry.created_by) == (
        "credit",
        D("50"),
        D("1050"),
        world.admin,
    )
    with pytest.raises(ValueError):
        services.add_credit(account, D("-5"))


def test_admin_actions_add_credit_and_issue_invoices(
    client, world, account, metered, monkeypatch, django_capture_on_commit_callbacks
):
    from celery_app.app import app as celery

    monkeypatch.setitem(celery.conf, "task_always_eager", True)  # the worker's part, run here
    client.force_login(world.admin)
    url = "/admin/billing/account/"
    page = client.post(url, {"action": "add_credit", "_selected_action": [account.pk]})
    assert page.status_code == 200 and b"amount" in page.content
    done = client.post(
        url,
        {
            "action": "add_credit",
            "_selected_action": [account.pk],
            "apply": "1",
            "amount": "25",
            "description": "grant",
        },
    )
    assert done.status_code == 302
    account.refresh_from_db()
    assert Transaction.objects.filter(kind="credit", amount=D("25"), created_by=world.admin).exists()
    assert [str(m) for m in client.get(url).context["messages"]] == ["Added 25.00 CNY to each of 1 account(s)."]
    # Invoice runs are a worker's job with progress, not a request that may time out half-way.
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(
            url,
            {
                "action": "generate_invoices",
                "_selected_action": [account.pk],
                "apply": "1",
                "first_day": "2026-01-05",
                "last_day": "2026-01-05",
            },
        )
    assert done.status_code == 302
    run = InvoiceRun.objects.get()
    shown = [str(m) for m in client.get(url).context["messages"]]
    assert shown[0].startswith(f"{run}: 1 account(s), issued in the background.")
    invoice = Invoice.objects.get(account=account)
    assert (run.status, run.done, run.issued) == ("done", 1, 1)
    # Money in admin messages and lists has its currency and cents, never a raw Decimal.
    assert run.message == f"1 invoice(s) issued, {invoice.total:,.2f} CNY in all."
    page = client.get(f"/admin/billing/invoicerun/{run.pk}/change/").content.decode()
    assert "1 / 1" in page and run.message in page
    listing = client.get(url).content.decode()
    account.refresh_from_db()
    assert f"{account.balance:,.2f} CNY" in listing and "0000" not in listing
    assert (invoice.period_start, invoice.period_end) == (T0.replace(hour=0), T0.replace(hour=0) + (at(days=1) - T0))
    assert invoice.total == sum(r.cost for r in UsageRecord.objects.all())


def test_an_invoice_run_names_the_accounts_it_could_not_invoice_and_invoices_the_others(
    world, account, metered, monkeypatch
):
    other = Account.objects.create(project=world.other_project)
    run = InvoiceRun.objects.create(period_start=T0, period_end=at(days=1), accounts=[other.pk, 999999, account.pk])
    real = services.generate_invoice

    def flaky(acct, start, end):
        if acct.pk == other.pk:
            raise RuntimeError("ledger locked")
        return real(acct, start, end)

    monkeypatch.setattr(services, "generate_invoice", flaky)
    run = services.run_invoice_run(run.pk)
    assert (run.status, run.done, run.issued) == ("failed", 3, 1)
    assert "Not invoiced: beta: ledger locked; account 999999: the account no longer exists." in run.message
    assert Invoice.objects.filter(account=account).count() == 1
    assert services.run_invoice_run(run.pk).issued == 1  # again: nothing issued twice


def test_invoice_csv_totals(client, world, account, metered):
    invoice = services.generate_invoice(account, T0, at(days=1))
    client.force_login(world.member)
    response = client.get(f"/billing/invoices/{invoice.pk}/csv/")
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    body = rows[rows.index(["resource", "gpu_model", "quantity", "unit", "amount", "currency"]) + 1 :]
    lines, total = body[:-1], body[-1]
    assert total[0] == "total" and D(total[4]) == invoice.total
    assert sum(D(row[4]) for row in lines) == invoice.total
    assert {row[0] for row in lines} == {"cpu", "memory", "gpu"}


def test_each_gpu_models_use_is_billed_once_in_the_unit_it_is_priced_in():
    # Card-hours and GPU-equivalent hours of the same use never stand side by side.
    rows = [
        {"resource_type": "cpu", "gpu_model": None, "amount": D("1")},
        {"resource_type": "gpu", "gpu_model": 1, "amount": D("12.96")},  # A100: priced per card
        {"resource_type": "gpu_eq", "gpu_model": 1, "amount": D("0")},
        {"resource_type": "gpu", "gpu_model": 2, "amount": D("0")},  # V100: priced in equivalents
        {"resource_type": "gpu_eq", "gpu_model": 2, "amount": D("3.50")},
        {"resource_type": "gpu", "gpu_model": 3, "amount": D("0")},  # no price at all: card-hours, once
        {"resource_type": "gpu_eq", "gpu_model": 3, "amount": D("0")},
    ]
    kept = {(r["resource_type"], r["gpu_model"]) for r in services.charged_rows(rows, "gpu_model", "amount")}
    assert kept == {("cpu", None), ("gpu", 1), ("gpu_eq", 2), ("gpu", 3)}


def test_money_is_formatted_with_cents_grouping_and_currency_and_totals_per_currency():
    from apps.billing.pricing import format_money, format_totals

    assert format_money(D("19.82270000000000000"), "CNY") == "19.82 CNY"
    assert format_money(D("1234567.005"), "EUR") == "1,234,567.01 EUR"
    assert format_totals([(D("1.5"), "CNY"), (D("2"), "EUR"), (D("0.25"), "CNY")]) == "1.75 CNY + 2.00 EUR"
    assert format_totals([]) == "nothing"


def test_an_invoice_run_the_job_queue_cannot_take_says_so_at_once(
    client, world, account, settings, django_capture_on_commit_callbacks
):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"  # nothing listens there: Redis is down
    client.force_login(world.admin)
    began = time.monotonic()
    with django_capture_on_commit_callbacks(execute=True):
        done = client.post(
            "/admin/billing/account/",
            {
                "action": "generate_invoices",
                "_selected_action": [account.pk],
                "apply": "1",
                "first_day": "2026-01-05",
                "last_day": "2026-01-05",
            },
        )
    assert done.status_code == 302 and time.monotonic() - began < 5
    run = InvoiceRun.objects.get()
    assert (run.status, run.done) == ("failed", 0)
    assert run.message == "Not started: the job queue (Redis) did not answer. Issue the invoices again."
