"""``/api/v1/rebalancer-settings/``: users of the VDC read a rebalancer's settings, admins change them, and a
setting the model refuses answers 400 with its message and changes nothing."""

from datetime import timedelta

from apps.vdc.models import RebalancerSettings
from tests.api.base import client_for

URL = "/api/v1/rebalancer-settings/"


def test_members_read_the_settings_and_admins_switch_loans_for_low_class_only(world):
    settings = RebalancerSettings.objects.create(vdc=world.vdc)
    row = client_for(world.member).get(URL).json()["results"][0]
    assert (row["vdc_name"], row["loans_low_class_only"], row["loan_billing"]) == ("main", True, "borrower_pays")
    change = {"loans_low_class_only": False, "loan_billing": "neither"}
    response = client_for(world.admin).patch(f"{URL}{settings.pk}/", change, format="json")
    assert response.status_code == 200, response.content
    settings.refresh_from_db()
    assert settings.loans_low_class_only is False and settings.loan_billing == "neither"
    assert client_for(world.admin).get(URL + "?loans_low_class_only=false").json()["count"] == 1
    assert client_for(world.admin).get(URL + "?loans_low_class_only=true").json()["count"] == 0


def test_bad_settings_answer_400_and_change_nothing(world):
    settings = RebalancerSettings.objects.create(vdc=world.vdc)
    admin = client_for(world.admin)
    response = admin.patch(
        f"{URL}{settings.pk}/", {"min_loan_duration": "05:00:00", "loans_low_class_only": False}, format="json"
    )
    assert response.status_code == 400
    assert "Expected at most the maximum loan duration" in response.json()["min_loan_duration"][0]
    response = admin.patch(f"{URL}{settings.pk}/", {"loan_billing": "lender"}, format="json")
    assert response.status_code == 400 and "loan_billing" in response.json()
    settings.refresh_from_db()
    assert settings.min_loan_duration == timedelta(minutes=10) and settings.loans_low_class_only is True
