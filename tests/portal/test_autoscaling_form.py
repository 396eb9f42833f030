"""The monitoring page's autoscaling form: shown to members, saved through update_autoscaling, errors as messages."""

import pytest
from django.urls import reverse

from apps.tasks.services import submit_task

pytestmark = pytest.mark.django_db


def service(world):
    return submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="svc",
        kind="inference",
        gpu_spec="1(A100)",
        command="serve",
        port=8000,
        autoscale_min=1,
        autoscale_max=2,
    )


def test_members_see_the_form_and_viewers_do_not(client, world):
    svc = service(world)
    page = reverse("portal:task-monitoring", args=[svc.pk])
    client.force_login(world.member)
    assert 'data-form="autoscaling"' in client.get(page).content.decode()
    client.force_login(world.viewer)
    assert 'data-form="autoscaling"' not in client.get(page).content.decode()


def test_the_form_saves_through_the_service(client, world):
    svc = service(world)
    client.force_login(world.member)
    url = reverse("portal:task-autoscaling", args=[svc.pk])
    response = client.post(
        url,
        {
            "autoscale_min": "2",
            "autoscale_max": "3",
            "autoscale_rps": "40",
            "autoscale_gpu_percent": "",
            "autoscale_cpu_percent": "",
            "autoscale_memory_percent": "",
        },
        follow=True,
    )
    svc.refresh_from_db()
    assert (svc.autoscale_min, svc.autoscale_max, svc.autoscale_rps) == (2, 3, 40)
    assert "Autoscaling of" in response.content.decode()
    assert svc.events.filter(kind="autoscaled").count() == 1


def test_the_form_sets_a_concurrency_target_and_the_page_shows_it(client, world):
    svc = service(world)
    client.force_login(world.member)
    url = reverse("portal:task-autoscaling", args=[svc.pk])
    page = client.post(
        url,
        {"autoscale_min": "1", "autoscale_max": "2", "autoscale_rps": "", "autoscale_concurrency": "6"},
        follow=True,
    ).content.decode()
    svc.refresh_from_db()
    assert svc.autoscale_concurrency == 6
    assert "6 requests in flight per replica" in page
    assert 'name="autoscale_concurrency" min="1" max="10000" value="6"' in page
    page = client.post(
        url, {"autoscale_min": "1", "autoscale_max": "2", "autoscale_concurrency": "0"}, follow=True
    ).content.decode()
    assert "concurrency: Ensure this value is greater than or equal to 1." in page
    svc.refresh_from_db()
    assert svc.autoscale_concurrency == 6


def test_a_refused_edit_says_why_and_changes_nothing(client, world):
    svc = service(world)
    client.force_login(world.member)
    url = reverse("portal:task-autoscaling", args=[svc.pk])
    page = client.post(url, {"autoscale_min": "4", "autoscale_max": "3"}, follow=True).content.decode()
    assert "Expected at least autoscale_min (4), got 3." in page
    assert client.post(url, {"autoscale_max": "x"}, follow=True).status_code == 200
    svc.refresh_from_db()
    assert (svc.autoscale_min, svc.autoscale_max) == (1, 2)


def test_viewers_are_refused(client, world):
    svc = service(world)
    client.force_login(world.viewer)
    assert client.post(reverse("portal:task-autoscaling", args=[svc.pk]), {"autoscale_max": "3"}).status_code == 403


def test_the_page_shows_the_scheduled_minimums_and_the_form_changes_them(client, world):
    svc = service(world)
    client.force_login(world.member)
    url = reverse("portal:task-autoscaling", args=[svc.pk])
    page = client.post(
        url,
        {"autoscale_min": "1", "autoscale_max": "2", "autoscale_schedule": "Mon-Fri 08:00-20:00 2 Europe/Berlin"},
        follow=True,
    ).content.decode()
    svc.refresh_from_db()
    assert svc.autoscale_schedule == [
        {"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "Europe/Berlin", "min_replicas": 2}
    ]
    assert 'scheduled minimums: <span data-field="autoscale-schedule">Mon-Fri 08:00-20:00 2 Europe/Berlin' in page
    page = client.post(
        url, {"autoscale_min": "1", "autoscale_max": "2", "autoscale_schedule": "weekdays 2"}, follow=True
    ).content.decode()
    assert "schedule: Expected DAYS HH:MM-HH:MM N [TIME ZONE]" in page
    svc.refresh_from_db()
    assert len(svc.autoscale_schedule) == 1
