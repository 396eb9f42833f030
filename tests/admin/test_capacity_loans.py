"""The admin's capacity loans: the list says who lent what and why; "Return now" ends a loan; settings validate."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from apps.vdc.models import CapacityLoan, RebalancerSettings
from tests.admin.conftest import admin_url
from tests.admin.test_actions import _act


@pytest.fixture
def loan(world):
    now = timezone.now()
    return CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(2),
        cpu=Decimal(8),
        reason="gpu: alpha uses 100% of its guarantee with 2 GPU-eq waiting beyond its limit, beta uses 0%",
        started_at=now - timedelta(minutes=30),
        expires_at=now + timedelta(hours=3),
    )


def test_loan_list_shows_lender_borrower_amount_state_and_reason(admin_web, loan):
    html = admin_web.get(admin_url(CapacityLoan, "changelist")).content.decode()
    assert "2 GPU-eq, 8 cores" in html and "active" in html and "alpha uses 100% of its guarantee" in html
    assert "beta" in html and "alpha" in html
    assert admin_web.get(admin_url(CapacityLoan, "changelist") + "?returned_at__isempty=1").status_code == 200


def test_return_now_ends_the_loan_and_lands_in_the_history(admin_web, world, loan):
    messages = _act(admin_web, CapacityLoan, "return_now", [loan])
    assert messages == ["1 loans returned; the lenders reclaim at the next scheduling cycle."]
    loan.refresh_from_db()
    assert loan.return_reason == "admin" and loan.returned_at is not None
    assert loan.settlement.startswith("borrower paid its metered usage")
    again = _act(admin_web, CapacityLoan, "return_now", [loan])
    assert again[-1] == "0 loans returned; the lenders reclaim at the next scheduling cycle."


def test_loans_cannot_be_added_or_deleted_in_the_admin(admin_web, loan):
    assert admin_web.get(admin_url(CapacityLoan, "add")).status_code == 403
    assert admin_web.get(admin_url(loan, "delete")).status_code == 403


def test_rebalancer_settings_refuse_a_minimum_longer_than_the_maximum(world):
    settings = RebalancerSettings(vdc=world.vdc, min_loan_duration=timedelta(hours=5))
    with pytest.raises(ValidationError, match="at most the maximum loan duration"):
        settings.full_clean()
    with pytest.raises(ValidationError, match="above zero"):
        RebalancerSettings(vdc=world.vdc, interval=timedelta(0)).full_clean()


def test_vdc_page_has_the_rebalancer_inline(admin_web, world):
    html = admin_web.get(admin_url(world.vdc)).content.decode()
    assert "inter-project rebalancer" in html.lower() and "threshold_percent" in html
