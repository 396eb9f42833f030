"""The dashboard's quota meters count capacity loans: a borrower's limit shows what it borrowed on top, a lender's
guarantee what it lent out, so a borrower running on a loan does not read as over its limit."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.vdc.models import CapacityLoan, ProjectQuota
from tests.factories import TaskFactory


def meters(client, user) -> dict[str, list[str]]:
    """Each quota card's meters as text, by project name."""
    client.force_login(user)
    html = client.get("/").content.decode()
    out: dict[str, list[str]] = {}
    for card in re.findall(r'<div class="quota">(.*?)</div>\s*(?=<div class="quota">|</section>|{%)', html, re.S):
        name = re.search(r"<h3>\s*([^<]+?)\s*<span", card).group(1)
        texts = re.findall(r'data-quota-meter="[^"]*">(.*?)</span></span>', card, re.S)
        out[name] = [" ".join(re.sub(r"<[^>]+>", "", t).split()) for t in texts]
    return out


@pytest.fixture
def on_loan(world):
    """alpha (guaranteed and limited to 4 GPUs) borrowed 2 from beta and runs 6."""
    ProjectQuota.objects.filter(vdc=world.vdc).update(guaranteed_gpu=Decimal(4), limit_gpu=Decimal(4))
    now = timezone.now()
    CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(2),
        reason="test",
        started_at=now,
        expires_at=now + timedelta(hours=1),
    )
    TaskFactory(
        project=world.project,
        owner=world.member,
        vdc=world.vdc,
        queue=world.low,
        status="running",
        allocated_gpu=Decimal(6),
    )
    return world


def test_borrower_meter_shows_the_limit_with_what_it_borrowed(client, on_loan):
    gpu = meters(client, on_loan.member)["alpha"][2]
    assert gpu == "6 / 4 + 2 borrowed (guaranteed 4)"


def test_lender_meter_shows_what_it_lent_out(client, on_loan):
    gpu = meters(client, on_loan.outsider)["beta"][2]
    assert gpu == "0 / 4 (guaranteed 4, 2 lent out)"


def test_meters_without_loans_read_as_before(client, on_loan):
    CapacityLoan.objects.update(returned_at=timezone.now(), return_reason="admin")
    assert meters(client, on_loan.member)["alpha"][2] == "6 / 4 (guaranteed 4)"
