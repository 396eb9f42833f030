"""``/api/v1/capacity-loans/``: both projects' members see a loan, nobody else; nobody writes through the API."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from apps.vdc.models import CapacityLoan
from tests.api.base import client_for
from tests.factories import MembershipFactory, ProjectQuotaFactory, UserFactory

URL = "/api/v1/capacity-loans/"


@pytest.fixture
def loan(world):
    """beta (the outsider's project) lent 2 GPU-eq to alpha; a third project gamma has nothing to do with it."""
    now = timezone.now()
    return CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(2),
        reason="gpu: alpha uses 100% of its guarantee, beta uses 0%",
        figures={"threshold": 0.2},
        started_at=now - timedelta(minutes=5),
        expires_at=now + timedelta(hours=4),
    )


@pytest.fixture
def stranger(world):
    gamma = ProjectQuotaFactory(vdc=world.vdc).project
    user = UserFactory(username="gina")
    MembershipFactory(project=gamma, user=user, role="owner")
    return user


def ids(user, query: str = "") -> list[int]:
    response = client_for(user).get(URL + query)
    assert response.status_code == 200, response.content
    return [row["id"] for row in response.json()["results"]]


def test_borrower_member_sees_the_loan_with_who_lent_what_and_why(world, loan):
    response = client_for(world.viewer).get(f"{URL}{loan.pk}/")
    assert response.status_code == 200
    body = response.json()
    assert (body["lender_name"], body["borrower_name"], body["gpu"], body["active"]) == ("beta", "alpha", "2.00", True)
    assert "alpha uses 100%" in body["reason"]


def test_lender_member_sees_the_loan(world, loan):
    assert ids(world.outsider) == [loan.pk]  # the world's "outsider" owns beta, the lender


def test_member_of_neither_project_sees_nothing(world, loan, stranger):
    assert ids(stranger) == []
    assert client_for(stranger).get(f"{URL}{loan.pk}/").status_code == 404


def test_admin_sees_every_loan(world, loan):
    assert ids(world.admin) == [loan.pk]


def test_loans_are_read_only(world, loan):
    for user in (world.admin, world.owner):
        client = client_for(user)
        assert client.post(URL, {"lender": world.project.pk}, format="json").status_code == 405
        assert client.patch(f"{URL}{loan.pk}/", {"gpu": "8"}, format="json").status_code == 405
        assert client.delete(f"{URL}{loan.pk}/").status_code == 405


def test_filters_by_project_and_state(world, loan):
    assert ids(world.admin, f"?project={world.other_project.pk}&active=true") == [loan.pk]
    assert ids(world.admin, "?active=false") == []
    assert ids(world.admin, f"?lender={world.project.pk}") == []
    assert client_for(world.admin).get(URL + "?active=maybe").status_code == 400


def test_dashboard_card_lists_active_loans_of_my_projects(client, world, loan, stranger):
    CapacityLoan.objects.create(
        vdc=world.vdc,
        lender=world.other_project,
        borrower=world.project,
        gpu=Decimal(1),
        reason="old one",
        started_at=loan.started_at - timedelta(hours=5),
        expires_at=loan.started_at - timedelta(hours=1),
        returned_at=loan.started_at - timedelta(hours=1),
        return_reason="expired",
    )
    client.force_login(world.member)
    html = client.get("/").content.decode()
    assert "Capacity loans" in html and "alpha uses 100% of its guarantee" in html and "old one" not in html
    client.force_login(stranger)
    assert "Capacity loans" not in client.get("/").content.decode()
