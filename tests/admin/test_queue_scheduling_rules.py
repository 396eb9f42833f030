"""Queue fields of the scheduling-quality rules (docs/rules.md#scheduling-quality): edited and bounded in the admin."""

from __future__ import annotations

from datetime import timedelta

from tests.admin.conftest import admin_url, form_data


def _edit(client, obj, **changes):
    data = form_data(client.get(admin_url(obj)))
    data.update(changes)
    return client.post(admin_url(obj), data)


def test_queue_reservation_threshold_and_minimum_run_are_edited_in_the_admin(admin_web, world):
    page = admin_web.get(admin_url(world.medium)).content.decode()
    assert "Starvation and churn" in page and "min_run_before_reclaim" in page
    assert (
        _edit(admin_web, world.medium, reserve_after="00:30:00", min_run_before_reclaim="00:10:00").status_code == 302
    )
    world.medium.refresh_from_db()
    assert world.medium.reserve_after == timedelta(minutes=30)
    assert world.medium.min_run_before_reclaim == timedelta(minutes=10)
    # Empty: a medium task never reserves.
    assert _edit(admin_web, world.medium, reserve_after="").status_code == 302
    world.medium.refresh_from_db()
    assert world.medium.reserve_after is None


def test_queue_reservation_threshold_and_minimum_run_are_bounded(admin_web, world):
    response = _edit(admin_web, world.medium, reserve_after="00:00:00", min_run_before_reclaim="-00:01:00")
    errors = response.context["adminform"].form.errors
    assert "positive duration" in errors["reserve_after"][0]
    assert "from 0 to 366 days" in errors["min_run_before_reclaim"][0]
    world.medium.refresh_from_db()
    assert world.medium.reserve_after == timedelta(hours=1)
    assert world.medium.min_run_before_reclaim == timedelta(minutes=5)
