"""A task on a MIG instance is metered at the instance's model and exchange rate, not the card's."""

from __future__ import annotations

from decimal import Decimal

from apps.billing import services
from apps.billing.models import UsageRecord
from apps.clusters.choices import Sharing
from apps.clusters.models import Device, GPUModel
from apps.clusters.partitions import parse_mig_layout, set_device_sharing
from tests.billing.conftest import at, start_task


def test_a_mig_instance_is_billed_per_gpu_equivalent_at_its_own_rate(world, prices, account):
    card = Device.objects.get(node=world.node, index=0, parent=None)
    set_device_sharing(card, Sharing.MIG, mig=parse_mig_layout("3g.40gb, 2g.20gb, 1g.10gb x2"))
    task = start_task(world, gpu_spec="1(A100-80G-2g.20gb)")
    services.accrue_task(task.pk, now=at(hours=1))
    unit = GPUModel.objects.get(name="A100-80G-2g.20gb")
    records = {r.resource_type: r for r in UsageRecord.objects.filter(task=task, gpu_model=unit)}
    # One instance-hour of the 2g.20gb model, worth 0.286 GPU-equivalent hours at 8 per equivalent-hour.
    assert records["gpu"].quantity == Decimal("1")
    assert records["gpu_eq"].quantity == Decimal("0.286")
    assert records["gpu_eq"].cost == Decimal("0.286") * 8
    # The A100 card price (10 per card-hour) is not charged for an instance.
    assert not UsageRecord.objects.filter(task=task, gpu_model__name="A100-80G").exists()
