"""The capacity ledger: one rule for what a placement holds, read the same by every door."""

from decimal import Decimal

from django.db.models import Q

from apps.billing.choices import ResourceType
from apps.billing.services import _models_for, holdings
from apps.clusters.models import Device, GPUModel
from apps.control.scheduling import run_cycle
from apps.tasks import ledger
from apps.tasks.services import submit_task

D = Decimal


def _placement(*devices: Device, milli: int = 1000) -> list[dict]:
    return [
        {
            "node": d.node_id,
            "node_name": d.node.name,
            "gpu_model": d.gpu_model.name,
            "devices": [{"id": d.pk, "index": d.index, "milli": milli}],
        }
        for d in devices
    ]


def test_a_placement_holds_its_shares_at_their_models_rates(world):
    cards = list(Device.objects.filter(node=world.node).order_by("index")[:3])
    v100 = GPUModel.objects.get(name="V100-32G")
    Device.objects.filter(pk=cards[2].pk).update(gpu_model=v100)
    placement = _placement(cards[0]) + _placement(cards[1], milli=500) + _placement(Device.objects.get(pk=cards[2].pk))
    assert ledger.placement_equivalents(placement) == D(1) + D("0.5") + v100.exchange_rate


def test_a_card_of_a_model_without_a_rate_counts_as_the_reference_card_everywhere(world):
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        kind="training",
        name="held",
        command="sleep 1",
        gpu_spec="2(A100)",
    )
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.allocated_gpu == 2
    # The catalog changes under the running task: its model is disabled and loses its rate.
    GPUModel.objects.filter(name="A100-80G").update(exchange_rate=None, enabled=False)
    assert ledger.placement_equivalents(task.placement) == 2
    assert ledger.held_by(task, task.placement).gpu == 2
    eq = [h for h in holdings(task, task.placement, _models_for([task.placement])) if h.resource_type == "gpu_eq"]
    assert [h.units for h in eq] == [2] and ResourceType.GPU_EQUIVALENT == "gpu_eq"
    # A model gone from the catalog altogether: metered as reference cards, not forgotten.
    gone = [{**entry, "gpu_model": "GONE-1"} for entry in task.placement]
    assert [(h.resource_type, h.units) for h in holdings(task, gone, {}) if h.resource_type != "cpu"][-1] == (
        ResourceType.GPU_EQUIVALENT,
        2,
    )


def test_free_cards_leave_out_missing_cards_and_any_card_with_a_share_held(world):
    for spec in ("1(A100)", "0.5(A100)"):
        submit_task(
            world.member,
            project=world.project,
            queue="high",
            kind="training",
            name=spec,
            command="sleep 1",
            gpu_spec=spec,
        )
    run_cycle(world.vdc.pk)
    Device.objects.filter(node=world.node, index=7).update(missing_since="2026-01-01T00:00:00Z")
    [use] = ledger.card_use(Q(node__cluster=world.cluster)).values()
    assert (use.cards, use.held, use.free) == (7, D("1.5"), 5)
