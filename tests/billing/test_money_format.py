"""Money reads the same everywhere: cents, thousands grouped, the currency; usage to two decimals of its unit."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest
from django.template import Context, Template

from apps.billing import services
from apps.billing.models import Transaction
from apps.billing.templatetags.money import format_money, format_quantity
from tests.billing.conftest import T0, at, start_task


def test_amounts_are_rounded_half_up_to_cents_grouped_and_carry_their_currency():
    assert format_money(Decimal("16.2956"), "CNY") == "16.30 CNY"
    assert format_money(Decimal("-1234.565"), "CNY") == "-1,234.57 CNY"
    assert format_money(Decimal("0"), "EUR") == "0.00 EUR"
    assert format_money(None, "CNY") == "—"
    assert format_quantity(Decimal("1016.295612"), "GPU-hours") == "1,016.30 GPU-hours"


def test_the_template_filters_are_the_same_functions():
    rendered = Template("{% load money %}{{ a|money:c }} | {{ q|quantity:u }}").render(
        Context({"a": Decimal("12345.6789"), "c": "CNY", "q": Decimal("2.005"), "u": "card-hours"})
    )
    assert rendered == "12,345.68 CNY | 2.01 card-hours"


@pytest.mark.django_db
def test_ledger_and_invoice_pages_show_no_four_decimal_amounts(client, world, prices, account):
    task = start_task(world, gpu_spec="1(A100)")
    services.accrue_task(task.pk, now=at(hours=1, minutes=37, seconds=47))
    invoice = services.generate_invoice(account, T0, at(days=1))
    client.force_login(world.member)
    pages = [
        client.get(f"/billing/projects/{world.project.pk}/").content.decode(),
        client.get(f"/billing/invoices/{invoice.pk}/").content.decode(),
    ]
    charge = Transaction.objects.filter(account=account, kind="charge").first()
    assert charge is not None and charge.amount != charge.amount.quantize(Decimal("0.01"))
    for html in pages:
        cells = re.findall(r'<td class="num">([^<]*)</td>', html)
        assert cells, "no amounts on the page"
        assert not [c for c in cells if re.search(r"\d\.\d{3}", c)], cells
    assert format_money(charge.amount, "CNY") in pages[0]
    assert f"{format_money(invoice.total, 'CNY')}</th>" in pages[1]
