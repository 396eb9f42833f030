"""Who sees which costs: project billing page, invoices (HTML, CSV) and the price preview API."""

from __future__ import annotations

from decimal import Decimal

import pytest
from rest_framework.test import APIRequestFactory, force_authenticate

from apps.billing import services
from apps.billing.api.price_preview import PricePreviewView
from tests.billing.conftest import T0, at, start_task
from tests.factories import ProjectQuotaFactory, VDCFactory

D = Decimal


@pytest.fixture
def invoice(world, prices, account):
    task = start_task(world, gpu_spec="1(A100)")
    services.accrue_task(task.pk, now=at(hours=2))
    return services.generate_invoice(account, T0, at(days=1))


@pytest.mark.parametrize("role", ["owner", "member", "viewer", "admin"])
def test_project_members_see_their_costs(client, world, invoice, role):
    client.force_login(world.user(role))
    page = client.get(f"/billing/projects/{world.project.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "<svg" in text and "<rect" in text
    assert "A100-80G" in text and "card-hours" in text
    assert f"/billing/invoices/{invoice.pk}/" in text
    assert client.get(f"/billing/invoices/{invoice.pk}/").status_code == 200
    assert client.get(f"/billing/invoices/{invoice.pk}/csv/").status_code == 200


def test_billing_is_in_the_menu_and_lists_only_the_users_projects(client, world, invoice):
    # /billing/ was a 404 and no menu entry led to the costs.
    client.force_login(world.member)
    dashboard = client.get("/").content.decode()
    assert 'href="/billing/"' in dashboard
    page = client.get("/billing/")
    assert page.status_code == 200
    text = page.content.decode()
    assert f'href="/billing/projects/{world.project.pk}/"' in text and "alpha" in text
    assert f"/billing/projects/{world.other_project.pk}/" not in text
    client.force_login(world.outsider)
    text = client.get("/billing/").content.decode()
    assert "alpha" not in text and f"/billing/projects/{world.other_project.pk}/" in text


def test_outsiders_get_404_for_another_projects_costs(client, world, invoice):
    client.force_login(world.outsider)
    assert client.get(f"/billing/projects/{world.project.pk}/").status_code == 404
    assert client.get(f"/billing/invoices/{invoice.pk}/").status_code == 404
    assert client.get(f"/billing/invoices/{invoice.pk}/csv/").status_code == 404
    # Their own project's page works and shows none of alpha's money.
    own = client.get(f"/billing/projects/{world.other_project.pk}/")
    assert own.status_code == 200 and str(invoice.total.quantize(D("0.01"))) not in own.content.decode()


def test_anonymous_users_are_sent_to_login(client, world, invoice):
    response = client.get(f"/billing/projects/{world.project.pk}/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_invoice_page_shows_lines_and_total(client, world, invoice):
    client.force_login(world.member)
    text = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert f"{invoice.total:.2f}" in text
    assert text.count("<tr>") >= 1 + invoice.lines.count()


def preview(user, **data):
    request = APIRequestFactory().post("/api/v1/billing/price-preview/", data, format="json")
    force_authenticate(request, user=user)
    response = PricePreviewView.as_view()(request)
    response.render()
    return response


def test_price_preview_answers_the_hourly_price(world, prices):
    response = preview(world.member, vdc="main", cpu="4", memory_gib="16", gpu_spec="2(A100)", instances=2)
    assert response.status_code == 200, response.data
    assert D(response.data["hourly_price"]) == (D("0.4") + D("0.16") + D("20")) * 2
    assert response.data["currency"] == "CNY"


def test_price_preview_uses_the_default_vdc_and_says_null_without_prices(world):
    response = preview(world.member, gpu_spec="1")
    assert response.status_code == 200 and response.data["hourly_price"] is None


def test_price_preview_rejects_a_bad_spec_with_a_field_error(world, prices):
    response = preview(world.member, gpu_spec="2(nosuchgpu)")
    assert response.status_code == 400 and "gpu_spec" in response.data


def test_price_preview_hides_vdcs_and_projects_you_cannot_see(world, prices):
    hidden = VDCFactory(name="hidden")
    ProjectQuotaFactory(project=world.other_project, vdc=hidden)
    assert preview(world.member, vdc="hidden").status_code == 404
    assert preview(world.member, vdc=str(hidden.pk)).status_code == 404
    assert preview(world.member, project=world.other_project.pk).status_code == 404
    assert preview(world.outsider, vdc="hidden").status_code == 200
    assert preview(world.member, project=world.project.pk).status_code == 200


def test_price_preview_needs_a_login(world, prices):
    request = APIRequestFactory().post("/api/v1/billing/price-preview/", {}, format="json")
    assert PricePreviewView.as_view()(request).status_code in (401, 403)
