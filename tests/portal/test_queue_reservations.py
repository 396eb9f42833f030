"""The queue page lists the VDC's current and upcoming capacity reservations (what they hold, until when)."""

from datetime import timedelta

from django.urls import reverse
from django.utils import timezone

from apps.clusters.models import CapacityReservation, GPUModel


def test_queue_page_lists_current_and_upcoming_reservations(client, world):
    now = timezone.now()
    maintenance = CapacityReservation.objects.create(
        vdc=world.vdc,
        cluster=world.cluster,
        name="firmware",
        reason="GPU firmware upgrade",
        starts_at=now - timedelta(minutes=5),
        ends_at=now + timedelta(hours=2),
        preempt_at_start=True,
    )
    maintenance.nodes.set([world.node])
    event = CapacityReservation.objects.create(
        vdc=world.vdc,
        name="hackathon",
        starts_at=now + timedelta(days=1),
        ends_at=now + timedelta(days=2),
        gpu_model=GPUModel.objects.get(name="A100-80G"),
        cards=4,
    )
    event.projects.set([world.project, world.other_project])
    CapacityReservation.objects.create(
        vdc=world.vdc, name="long-over", starts_at=now - timedelta(days=2), ends_at=now - timedelta(days=1)
    )
    client.force_login(world.member)
    html = client.get(reverse("portal:task-queues")).content.decode()
    block = html[html.index(f'data-reservations="{world.vdc.pk}"') :]
    block = block[: block.index("</table>")]
    assert "long-over" not in html
    assert block.index("firmware") < block.index("hackathon")
    row = block[block.index(f'data-reservation="{maintenance.pk}"') :]
    assert "now</span>" in row and "GPU firmware upgrade" in row and "nodes gpu-node-1" in row
    assert "nobody (maintenance)" in row and "drains its nodes at the start" in row
    assert (maintenance.ends_at.strftime("%Y-%m-%d")) in row
    row = block[block.index(f'data-reservation="{event.pk}"') :]
    assert "upcoming</span>" in row and "4 × A100-80G on every cluster (whole nodes)" in row
    assert "alpha, 1 other project" in row and "beta" not in block  # another project's name stays hidden


def test_queue_page_without_reservations_shows_no_block(client, world):
    client.force_login(world.member)
    assert "data-reservations" not in client.get(reverse("portal:task-queues")).content.decode()
