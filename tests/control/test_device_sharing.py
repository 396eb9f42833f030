"""Device sharing end to end in Django: MIG layouts and time-sliced replicas declared on cards, scheduled as units
with their own exchange rates, counted by quotas, billing and VDC capacity, and handed to the backends."""

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.billing.choices import ResourceType
from apps.billing.services import holdings
from apps.clusters.choices import Sharing
from apps.clusters.executors.k8s_manifests import accelerator_injection
from apps.clusters.executors.local import _visible_id
from apps.clusters.executors.slurm import SlurmExecutor
from apps.clusters.models import Device, GPUModel
from apps.clusters.partitions import MigInstance, SharingError, parse_mig_layout, set_device_sharing
from apps.control.jobspec import job_spec
from apps.control.scheduling import run_cycle
from apps.tasks.services import submit_task
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory

D = Decimal


def submit(world, spec, name="job", queue="high"):
    return submit_task(
        world.member, project=world.project, queue=queue, kind="training", name=name, command="sleep 1", gpu_spec=spec
    )


def card(world, index=0):
    return Device.objects.get(node=world.node, index=index, parent=None)


def mig(world, layout="3g.40gb, 2g.20gb, 1g.10gb x2", index=0):
    return set_device_sharing(card(world, index), Sharing.MIG, mig=parse_mig_layout(layout))


def test_a_mig_request_is_placed_on_a_mig_instance_and_billed_and_counted_at_its_rate(world):
    capacity_before = world.vdc.capacity()["gpu"]
    mig(world)
    units = list(card(world).units.order_by("slot"))
    assert [u.gpu_model.name for u in units] == ["A100-80G-3g.40gb", "A100-80G-2g.20gb"] + ["A100-80G-1g.10gb"] * 2
    # Capacity counts the card as its units (3/7-compute 3g.40gb is half the memory: 0.5), never twice.
    assert world.vdc.capacity()["gpu"] == capacity_before - 1 + D("0.5") + D("0.286") + 2 * D("0.143")

    task = submit(world, "1(a100-1g.10gb)")
    assert task.gpu_spec == "1(a100-1g.10gb)"
    assert run_cycle(world.vdc.pk).started == 1
    task.refresh_from_db()
    (device,) = task.placement[0]["devices"]
    assert device["id"] in {u.pk for u in units[2:]} and device["slot"] in (2, 3)
    assert task.placement[0]["gpu_model"] == "A100-80G-1g.10gb"
    assert task.allocated_gpu == D("0.143")
    models = {m.name: m for m in GPUModel.objects.filter(name="A100-80G-1g.10gb")}
    eq = next(h for h in holdings(task, task.placement, models) if h.resource_type == ResourceType.GPU_EQUIVALENT)
    assert eq.units == D("0.143")


def test_a_card_in_mig_mode_is_never_offered_as_a_whole_card(world):
    for index in range(6):
        mig(world, "7g.80gb", index)
    # Admission already knows: two whole cards are left on the node.
    with pytest.raises(ValidationError, match="no node has 3 A100-80G per instance"):
        submit(world, "3(A100)", name="three-cards")
    two = submit(world, "2(A100)", name="two-cards")
    run_cycle(world.vdc.pk)
    two.refresh_from_db()
    assert two.status == "scheduled"
    assert sorted(d["index"] for d in two.placement[0]["devices"]) == [6, 7]
    assert all("slot" not in d for d in two.placement[0]["devices"])


def test_the_quota_limit_counts_mig_instances_at_their_exchange_rate(world):
    world.quota.guaranteed_gpu, world.quota.limit_gpu = 0, D("0.3")
    world.quota.save()
    mig(world, "1g.10gb x7")
    tasks = [submit(world, "1(A100-80G-1g.10gb)", name=f"m{i}") for i in range(3)]
    run_cycle(world.vdc.pk)
    states = [Task.status for Task in (t.__class__.objects.get(pk=t.pk) for t in tasks)]
    assert states == ["scheduled", "scheduled", "queued"]
    assert tasks[2].__class__.objects.get(pk=tasks[2].pk).pending_reason == "quota_exceeded"


def test_time_sliced_replicas_take_one_task_each_at_a_share_of_the_card_rate(world):
    set_device_sharing(card(world), Sharing.TIME_SLICING, replicas=4)
    row = GPUModel.objects.get(name="A100-80G-ts4")
    assert (row.exchange_rate, row.partition, row.parent_model.name) == (D("0.250"), "time_slice", "A100-80G")
    tasks = [submit(world, "1(A100-ts)", name=f"t{i}") for i in range(5)]
    run_cycle(world.vdc.pk)
    placed = [t.__class__.objects.get(pk=t.pk) for t in tasks]
    assert [t.status for t in placed] == ["scheduled"] * 4 + ["queued"]
    assert len({t.placement[0]["devices"][0]["id"] for t in placed[:4]}) == 4
    assert all(t.allocated_gpu == D("0.25") and t.placement[0]["devices"][0]["index"] == 0 for t in placed[:4])
    # Kubernetes: the card's own resource (the device plugin hands out a replica), no device index forced.
    spec = job_spec(placed[0], "i" * 32)
    injection = accelerator_injection(spec)
    assert injection.limits == {"nvidia.com/gpu": "1"} and "NVIDIA_VISIBLE_DEVICES" not in injection.env
    assert _visible_id(spec, spec.placements[0].devices[0]) == "0"


def test_backends_get_the_mig_resource_name_gres_type_and_instance_uuid(world):
    device = card(world)
    set_device_sharing(device, Sharing.MIG, mig=[MigInstance("1g.10gb", "MIG-aaaa", 9)])
    task = submit(world, "1(A100-80G-1g.10gb)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.placement[0]["devices"][0] | {"id": 0} == {
        "id": 0,
        "index": 0,
        "milli": 1000,
        "slot": 9,
        "uuid": "MIG-aaaa",
    }
    spec = job_spec(task, "i" * 32)
    assert spec.gpu_model.partition == "mig" and spec.gpus_per_instance == 1
    injection = accelerator_injection(spec)
    assert injection.limits == {"nvidia.com/mig-1g.10gb": "1"}
    assert "NVIDIA_VISIBLE_DEVICES" not in injection.env
    assert _visible_id(spec, spec.placements[0].devices[0]) == "MIG-aaaa"
    assert SlurmExecutor("http://slurm", "token", "hcs")._gpus_per_node(spec) == "gpu:1g.10gb:1"


def test_a_held_card_keeps_its_sharing_and_a_bad_layout_changes_nothing(world):
    task = submit(world, "8(A100)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"
    with pytest.raises(SharingError, match=f"held by task\\(s\\) {task.pk}"):
        mig(world)
    assert card(world).sharing == Sharing.WHOLE and not Device.objects.filter(parent__isnull=False).exists()
    free = DeviceFactory(node=NodeFactory(cluster=world.cluster, name="n2"), index=0)
    for layout, message in [
        ("4g.40gb, 4g.40gb", "7 compute slices"),
        ("9g.90gb", "unknown MIG profile '9g.90gb'"),
        ("1g.10gb x9", "repeat count"),
        ("", "at least one MIG profile"),
    ]:
        with pytest.raises(SharingError, match=message):
            set_device_sharing(free, Sharing.MIG, mig=parse_mig_layout(layout))
    with pytest.raises(SharingError, match="2 to 64"):
        set_device_sharing(free, Sharing.TIME_SLICING, replicas=1)
    free.refresh_from_db()
    assert free.sharing == Sharing.WHOLE and not free.units.exists()
    assert not GPUModel.objects.filter(name__startswith="A100-80G-ts").exists()


def test_time_slicing_is_refused_on_slurm_and_for_cards_without_mig_profiles(world):
    slurm = ClusterFactory(vdc=world.vdc, name="slurm-1", cluster_type="slurm")
    device = DeviceFactory(node=NodeFactory(cluster=slurm, name="s1"), index=0)
    with pytest.raises(SharingError, match="not offered on Slurm"):
        set_device_sharing(device, Sharing.TIME_SLICING, replicas=2)
    t4 = DeviceFactory(node=world.node, index=9, gpu_model=GPUModel.objects.get(name="T4"))
    with pytest.raises(SharingError, match="T4 has no MIG profiles"):
        set_device_sharing(t4, Sharing.MIG, mig=parse_mig_layout("1g.10gb"))


def test_back_to_whole_removes_the_units_and_the_card_is_offered_again(world):
    mig(world, "7g.80gb")
    set_device_sharing(card(world), Sharing.WHOLE)
    assert not card(world).units.exists()
    task = submit(world, "8(A100)")
    run_cycle(world.vdc.pk)
    task.refresh_from_db()
    assert task.status == "scheduled"


def test_submitting_an_unknown_mig_profile_is_refused_with_the_profiles_offered(world):
    with pytest.raises(ValidationError, match="unknown MIG profile '5g.50gb' of A100-80G.*1g.10gb"):
        submit(world, "1(A100-80G-5g.50gb)")
    with pytest.raises(ValidationError, match="no A100-80G card is declared time-sliced"):
        submit(world, "1(A100-80G-ts)")


def test_a_card_model_added_after_the_seed_gets_its_mig_profile_rows_when_first_partitioned(world):
    a100_40 = GPUModel.objects.create(
        name="A100-40G",
        vendor="nvidia",
        aliases=["a100-40g"],
        vram_gib=40,
        tflops_fp16=312,
        tflops_fp32=19.5,
        exchange_rate=D("0.9"),
        resource_name="nvidia.com/gpu",
        visible_devices_env="NVIDIA_VISIBLE_DEVICES",
    )
    device = DeviceFactory(node=world.node, index=8, gpu_model=a100_40)
    with pytest.raises(SharingError, match="unknown MIG profile '1g.20gb' of A100-40G; its profiles: 1g.10gb, 1g.5gb"):
        set_device_sharing(device, Sharing.MIG, mig=parse_mig_layout("1g.20gb"))
    with pytest.raises(SharingError, match="A100-40G has 7 compute slices and 40 GB: .* needs 7 slices and 70 GB"):
        set_device_sharing(device, Sharing.MIG, mig=parse_mig_layout("1g.10gb x7"))
    assert not GPUModel.objects.filter(parent_model=a100_40).exists()
    set_device_sharing(device, Sharing.MIG, mig=parse_mig_layout("1g.5gb x7"))
    row = GPUModel.objects.get(name="A100-40G-1g.5gb")
    assert (row.parent_model, row.exchange_rate, row.resource_name) == (a100_40, D("0.129"), "nvidia.com/mig-1g.5gb")
    assert device.units.filter(gpu_model=row).count() == 7


def test_idle_gpu_alerts_skip_mig_instances_whose_utilisation_nvml_does_not_give(world):
    from django.utils import timezone

    from apps.billing.project_alerts import _idle

    world.node.last_report = timezone.now()
    world.node.save()
    mig(world, "7g.80gb")
    tasks = [submit(world, "1(A100-80G-7g.80gb)", name="on-mig"), submit(world, "1(A100)", name="on-card")]
    run_cycle(world.vdc.pk)
    for task in tasks:
        task.__class__.objects.filter(pk=task.pk).update(status="running")
    flagged = {c.task_id for c in _idle({}, timezone.now())}
    assert flagged == {tasks[1].pk}
