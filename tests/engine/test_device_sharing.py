"""Device sharing in the engine: MIG instances and time-sliced replicas are units of their own catalog models.

The Django snapshot offers a partitioned card as its units only (tests/control/test_device_sharing.py); here the
engine is given such units directly and must place a MIG or time-slice request only onto a free unit of a model
it names, never overcommit a unit, count the unit's own exchange rate against quotas, and never hand a unit to a
request for "any GPU".
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.clusters.catalog import MIG_CATALOG
from apps.queues.engine import Device, GpuModel, Node, ProjectQuota, Resources, Task, schedule
from apps.queues.engine.model import Reason

from .builders import MODELS, running, snap, started, task, waiting


def _unit(name: str, partition: str) -> GpuModel:
    entry = next((e for e in MIG_CATALOG if e["name"] == name), None)
    if entry is not None:
        return GpuModel(name, "nvidia", entry["vram_gib"], 0, 0, entry["exchange_rate"], False, partition)
    return GpuModel(name, "nvidia", 80, 0, 0, 1.0 / int(name.rsplit("ts", 1)[1]), False, partition)


MIG_1G = "A100-80G-1g.10gb"
MIG_2G = "A100-80G-2g.20gb"
MIG_3G = "A100-80G-3g.40gb"
TS4 = "A100-80G-ts4"
TS2 = "A100-80G-ts2"
UNITS = tuple(_unit(n, "mig") for n in (MIG_1G, MIG_2G, MIG_3G)) + tuple(_unit(n, "time_slice") for n in (TS4, TS2))
CATALOG = MODELS + UNITS


def partitioned_node(nid: str, layout: list[list[str]], whole: int = 0) -> Node:
    """A node whose card i is split into the units ``layout[i]`` (as the snapshot loader offers them), plus
    ``whole`` unpartitioned A100-80G cards after them."""
    devices = [Device(f"{nid}/{i}/{j}", i, model) for i, units in enumerate(layout) for j, model in enumerate(units)]
    devices += [Device(f"{nid}/{len(layout) + k}", len(layout) + k, "A100-80G") for k in range(whole)]
    return Node(nid, "c1", 64.0, 256.0, tuple(devices))


def sharing_snap(nodes, queued=(), running_=(), quotas=()):
    base = snap(nodes, queued, running_, quotas)
    return type(base)(
        base.now, base.clusters, base.nodes, CATALOG, base.queues, base.quotas, base.running, base.queued, base.settings
    )


def unit_task(tid, model, count=1, **kw):
    return task(tid, gpu=count, models=(model,), **kw)


def device_models(decisions, nodes) -> dict:
    by_id = {d.id: d.model for n in nodes for d in n.devices}
    return {s.task_id: [by_id[d.device_id] for p in s.placements for d in p.devices] for s in decisions.starts}


def test_a_mig_request_lands_only_on_a_free_instance_of_its_profile():
    nodes = [partitioned_node("n1", [[MIG_3G, MIG_2G, MIG_1G, MIG_1G]], whole=1)]
    queued = [unit_task(f"m{i}", MIG_1G, submit_time=i) for i in range(3)]
    decisions = schedule(sharing_snap(nodes, queued))
    assert started(decisions) == ["m0", "m1"]
    assert device_models(decisions, nodes) == {"m0": [MIG_1G], "m1": [MIG_1G]}
    assert {d.device_id for s in decisions.starts for p in s.placements for d in p.devices} == {"n1/0/2", "n1/0/3"}
    # Neither the whole card nor the bigger instances are taken for a 1g.10gb request.
    assert waiting(decisions)["m2"].reason == Reason.INSUFFICIENT_CAPACITY


def test_whole_card_and_any_gpu_requests_never_take_a_mig_instance_or_replica():
    nodes = [partitioned_node("n1", [[MIG_3G, MIG_3G], [TS4] * 4], whole=1)]
    queued = [
        task("any", gpu=1, submit_time=0),
        task("a100", gpu=1, models=("A100-80G",), submit_time=1),
        task("two", gpu=2, submit_time=2),
    ]
    decisions = schedule(sharing_snap(nodes, queued))
    assert started(decisions) == ["any"]
    assert device_models(decisions, nodes) == {"any": ["A100-80G"]}
    assert set(waiting(decisions)) == {"a100", "two"}


def test_a_mig_instance_held_by_a_running_task_is_not_given_again():
    nodes = [partitioned_node("n1", [[MIG_1G, MIG_1G]])]
    holder = running(unit_task("r", MIG_1G), [("n1", ["0/0"])], model=MIG_1G)
    queued = [unit_task("a", MIG_1G), unit_task("b", MIG_1G, submit_time=1)]
    decisions = schedule(sharing_snap(nodes, queued, running_=[holder]))
    assert started(decisions) == ["a"]
    assert [d.device_id for p in decisions.starts[0].placements for d in p.devices] == ["n1/0/1"]


def test_time_sliced_card_takes_as_many_tasks_as_it_has_replicas():
    nodes = [partitioned_node("n1", [[TS4] * 4])]
    queued = [unit_task(f"t{i}", TS4, submit_time=i) for i in range(5)]
    decisions = schedule(sharing_snap(nodes, queued))
    assert started(decisions) == ["t0", "t1", "t2", "t3"]
    devices = [d.device_id for s in decisions.starts for p in s.placements for d in p.devices]
    assert sorted(devices) == [f"n1/0/{j}" for j in range(4)]
    assert waiting(decisions)["t4"].reason == Reason.INSUFFICIENT_CAPACITY


def test_quota_counts_each_unit_at_its_own_exchange_rate():
    # 1g.10gb is worth 0.143 GPU-equivalents: a 0.3 limit holds two of them, not three, on a card with seven.
    nodes = [partitioned_node("n1", [[MIG_1G] * 7])]
    quota = ProjectQuota("p1", limit=Resources(1000, 1000, 0.3))
    queued = [unit_task(f"m{i}", MIG_1G, submit_time=i) for i in range(3)]
    decisions = schedule(sharing_snap(nodes, queued, quotas=[quota]))
    assert started(decisions) == ["m0", "m1"]
    assert waiting(decisions)["m2"].reason == Reason.QUOTA_EXCEEDED
    # Time-sliced replicas are a quarter of the card each: four fit under a 1.0 limit, a fifth would not.
    nodes = [partitioned_node("n1", [[TS4] * 4, [TS4] * 4])]
    quota = ProjectQuota("p1", limit=Resources(1000, 1000, 1.0))
    decisions = schedule(
        sharing_snap(nodes, [unit_task(f"t{i}", TS4, submit_time=i) for i in range(5)], quotas=[quota])
    )
    assert len(started(decisions)) == 4 and waiting(decisions)["t4"].reason == Reason.QUOTA_EXCEEDED


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layouts=st.lists(
        st.lists(st.sampled_from([MIG_1G, MIG_2G, MIG_3G]), min_size=1, max_size=4)
        | st.sampled_from([[TS4] * 4, [TS2] * 2]),
        min_size=1,
        max_size=4,
    ),
    whole=st.integers(0, 2),
    requests=st.lists(
        st.tuples(st.sampled_from([MIG_1G, MIG_2G, MIG_3G, TS4, TS2, "A100-80G", None]), st.integers(1, 2)),
        min_size=1,
        max_size=12,
    ),
)
def test_units_are_never_overcommitted_and_match_the_request(layouts, whole, requests):
    nodes = [partitioned_node("n1", layouts, whole=whole)]
    queued = []
    for i, (model, count) in enumerate(requests):
        if model in (TS4, TS2):
            count = 1
        queued.append(task(f"q{i}", gpu=count, models=(model,) if model else (), submit_time=i))
    decisions = schedule(sharing_snap(nodes, queued))
    used = [d.device_id for s in decisions.starts for p in s.placements for d in p.devices]
    assert len(used) == len(set(used)), "a unit was given twice"
    models = device_models(decisions, nodes)
    asked = {t.id: t.gpu.models for t in queued}
    for tid, got in models.items():
        if asked[tid]:
            assert set(got) <= set(asked[tid]), (tid, got)
        else:
            assert set(got) == {"A100-80G"}, (tid, got)  # "any GPU" is a card, never a unit


def test_engine_requests_name_units_through_the_gpu_spec():
    """A parsed spec ("1(a100-1g.10gb)") reaches the engine as the unit's canonical name."""
    from apps.clusters.gpuspec import Catalog, parse_gpu_spec

    req = parse_gpu_spec("1(a100-1g.10gb)", Catalog.default())
    nodes = [partitioned_node("n1", [[MIG_1G]])]
    decisions = schedule(sharing_snap(nodes, [Task("t", "p1", "high", cpu=1.0, memory_gib=1.0, gpu=req)]))
    assert device_models(decisions, nodes) == {"t": [MIG_1G]}
