"""Placement rules (docs/rules.md#placement): cluster filters and strategies, node and device scoring, FGD."""

from __future__ import annotations

import pytest

from apps.queues.engine import Cluster, GpuModel, Reason, Snapshot, VdcSettings, schedule
from apps.queues.engine.capacity import ClusterIndex, NodeState
from apps.queues.engine.fragmentation import FragmentationModel

from .builders import MODELS, node, queues, running, snap, started, task, waiting


def _cluster_of(d):
    return d.starts[0].cluster_id


@pytest.mark.parametrize(
    "cluster, task_kw",
    [
        (Cluster("c1", enabled=False), {}),
        (Cluster("c1", status="unavailable"), {}),
        (Cluster("c1", status="maintenance"), {}),
        (Cluster("c1", type="slurm"), {"cluster_type": "kubernetes"}),
        (Cluster("c1", max_total_tasks=0), {}),
        (Cluster("c1", max_tasks_per_user=0), {}),
        (Cluster("c1"), {"required_labels": {"zone": "a"}}),
    ],
)
def test_cluster_filters_exclude_unusable_clusters(cluster, task_kw):
    d = schedule(snap([node("n1")], [task("a", **task_kw)], clusters=[cluster]))
    assert waiting(d)["a"].reason == Reason.NO_ELIGIBLE_CLUSTER


def test_required_labels_must_match():
    clusters = [Cluster("c1", labels={"zone": "a"}), Cluster("c2", labels={"zone": "b"})]
    nodes = [node("a1", cluster="c1"), node("b1", cluster="c2")]
    d = schedule(snap(nodes, [task("t", required_labels={"zone": "b"})], clusters=clusters))
    assert _cluster_of(d) == "c2"


def test_degraded_cluster_gets_no_new_placements():
    clusters = [Cluster("c1", status="degraded"), Cluster("c2", status="degraded")]
    d = schedule(snap([node("a", cluster="c1"), node("b", cluster="c2")], [task("t")], clusters=clusters))
    assert d.starts == ()
    assert d.waiting[0].reason == "no_eligible_cluster"


def test_elastic_task_goes_only_to_a_cluster_that_can_resize_running_jobs():
    clusters = [Cluster("c1", resizable=False), Cluster("c2")]
    elastic = task("t", min_replicas=1, max_replicas=4)
    d = schedule(snap([node("a", cluster="c1"), node("b", cluster="c2")], [elastic], clusters=clusters))
    assert _cluster_of(d) == "c2"
    d = schedule(snap([node("a", cluster="c1")], [elastic], clusters=clusters[:1]))
    assert d.starts == () and "resize" in d.waiting[0].message


def test_a_task_goes_only_to_a_cluster_that_can_run_what_it_needs():
    # Kubernetes first by priority, but it runs images only: a command without an image goes to the local cluster.
    clusters = [
        Cluster("k8s", priority=9, capabilities=frozenset({"image", "training"})),
        Cluster("local", capabilities=frozenset({"command", "training"})),
    ]
    nodes = [node("a", cluster="k8s"), node("b", cluster="local")]
    command_only = task("t", needs=frozenset({"command", "training"}))
    d = schedule(snap(nodes, [command_only], clusters=clusters, cluster_strategy="priority_weight"))
    assert _cluster_of(d) == "local"
    assert (
        _cluster_of(schedule(snap(nodes, [task("u")], clusters=clusters, cluster_strategy="priority_weight"))) == "k8s"
    )

    d = schedule(snap(nodes[:1], [command_only], clusters=clusters[:1]))
    assert d.starts == () and waiting(d)["t"].reason == Reason.NO_ELIGIBLE_CLUSTER
    assert "none of its healthy clusters can run what it needs: command" in waiting(d)["t"].message


def test_a_share_goes_only_where_the_backend_shares_that_vendors_cards():
    ascend = GpuModel("Ascend910B", "huawei", 64, 320, 0, 0.8, True)
    clusters = [
        Cluster("k8s", priority=9, capabilities=frozenset({"share:nvidia"})),
        Cluster("slurm", capabilities=frozenset({"share:*"})),
    ]
    nodes = [node("a", cluster="k8s", model="Ascend910B"), node("b", cluster="slurm", model="Ascend910B")]

    def run(*tasks, clusters=clusters, nodes=nodes):
        return schedule(
            Snapshot(
                100.0,
                tuple(clusters),
                tuple(nodes),
                (*MODELS, ascend),
                queues(),
                queued=tasks,
                settings=VdcSettings(cluster_strategy="priority_weight"),
            )
        )

    d = run(task("share", gpu=0.5, models=("Ascend910B",)), task("whole", gpu=1, models=("Ascend910B",)))
    assert {s.task_id: s.cluster_id for s in d.starts} == {"share": "slurm", "whole": "k8s"}
    d = run(task("share", gpu=0.5, models=("Ascend910B",)), clusters=clusters[:1], nodes=nodes[:1])
    assert d.starts == ()
    # Where the request allows a vendor the cluster shares, the share lands on that vendor's card.
    mixed = [node("a", cluster="k8s", model="Ascend910B"), node("c", cluster="k8s", model="A100-80G")]
    d = run(task("share", gpu=0.5), clusters=clusters[:1], nodes=mixed)
    assert d.starts[0].placements[0].gpu_model == "A100-80G"


def _two_clusters(**settings):
    clusters = [
        Cluster("c1", priority=1, cost_weight=2.0),
        Cluster("c2", priority=5, cost_weight=1.0),
    ]
    nodes = [node("a", cluster="c1", cards=8), node("b", cluster="c2", cards=4)]
    busy = running(task("busy", gpu=3), [("b", [0, 1, 2])], cluster="c2")
    return clusters, nodes, busy


def test_load_balancing_picks_least_allocated_cluster():
    clusters, nodes, busy = _two_clusters()
    d = schedule(snap(nodes, [task("t")], [busy], clusters=clusters, cluster_strategy="load_balancing"))
    assert _cluster_of(d) == "c1"


def test_resource_fit_picks_tightest_cluster():
    clusters, nodes, busy = _two_clusters()
    d = schedule(snap(nodes, [task("t")], [busy], clusters=clusters, cluster_strategy="resource_fit"))
    assert _cluster_of(d) == "c2"


def test_priority_weight_picks_highest_priority():
    clusters, nodes, busy = _two_clusters()
    d = schedule(snap(nodes, [task("t")], [busy], clusters=clusters, cluster_strategy="priority_weight"))
    assert _cluster_of(d) == "c2"


def test_affinity_follows_preferred_clusters():
    clusters, nodes, busy = _two_clusters()
    d = schedule(
        snap(nodes, [task("t", preferred_clusters=("c2",))], [busy], clusters=clusters, cluster_strategy="affinity")
    )
    assert _cluster_of(d) == "c2"


def test_cost_optimized_picks_cheapest_cluster():
    clusters, nodes, busy = _two_clusters()
    d = schedule(snap(nodes, [task("t")], [busy], clusters=clusters, cluster_strategy="cost_optimized"))
    assert _cluster_of(d) == "c2"


def test_multi_gpu_task_prefers_nvlinked_devices():
    n = node("n1", cards=4, nvlink=[[0, 1], [2, 3]])
    busy = running(task("b"), [("n1", [0])])
    d = schedule(snap([n], [task("t", gpu=2)], [busy]))
    assert [s.device_id for s in d.starts[0].placements[0].devices] == ["n1/2", "n1/3"]


def test_node_whose_free_cards_share_an_island_is_preferred():
    plain = node("n1", cards=2)
    linked = node("n2", cards=2, nvlink=[[0, 1]])
    d = schedule(snap([plain, linked], [task("t", gpu=2)]))
    assert d.starts[0].placements[0].node_id == "n2"


def test_subhealthy_node_loses_score():
    d = schedule(snap([node("n1", health=60), node("n2")], [task("t")]))
    assert d.starts[0].placements[0].node_id == "n2"


def test_unhealthy_node_and_device_are_filtered_out():
    d = schedule(snap([node("n1", health=10)], [task("t")]))
    assert started(d) == []
    d2 = schedule(snap([node("n1", status="down")], [task("t")]))
    assert started(d2) == []


def test_fractional_tasks_share_a_card_without_exceeding_it():
    tasks = [task(f"f{i}", gpu=0.4, submit_time=i) for i in range(5)]
    d = schedule(snap([node("n1", cards=2)], tasks))
    per_card: dict = {}
    for s in d.starts:
        for share in s.placements[0].devices:
            per_card[share.device_id] = per_card.get(share.device_id, 0) + share.milli
    assert len(d.starts) == 4
    assert all(v <= 1000 for v in per_card.values())


def test_fractions_go_to_partly_used_cards_first():
    busy = running(task("b", gpu=0.5), [("n2", [(0, 500)])])
    d = schedule(snap([node("n1", cards=1), node("n2", cards=1)], [task("t", gpu=0.5)], [busy]))
    assert d.starts[0].placements[0].node_id == "n2"


def test_best_fit_fills_partly_used_node():
    busy = running(task("b", gpu=3), [("n2", [0, 1, 2])])
    d = schedule(snap([node("n1"), node("n2")], [task("t")], [busy], node_scorer="best_fit"))
    assert d.starts[0].placements[0].node_id == "n2"


def test_first_fit_takes_lowest_node():
    busy = running(task("b", gpu=3), [("n2", [0, 1, 2])])
    d = schedule(snap([node("n1"), node("n2")], [task("t")], [busy], node_scorer="first_fit"))
    assert d.starts[0].placements[0].node_id == "n1"


def _states(*nodes):
    states = [NodeState(i, n, 80, 30) for i, n in enumerate(nodes)]
    return states, ClusterIndex("c1", states, frozenset({"A100-80G"}))


def test_fragmentation_counts_what_the_workload_cannot_use():
    # Workload: only whole-card tasks. A card with 0.5 free is a fragment; a free card is not.
    fm = FragmentationModel([(1.0, 1.0, 1.0, 1000, None)])
    states, index = _states(node("n1", cards=2))
    assert fm.node_fragmentation(states[0]) == 0
    index.take((states[0], 1.0, 1.0, ((0, 500),)))
    assert fm.node_fragmentation(states[0]) == pytest.approx(0.5)


def test_fragmentation_of_a_node_the_task_cannot_use_is_all_its_free_gpu():
    fm = FragmentationModel([(1.0, 100.0, 1.0, 500, None)])  # needs more cpu than the node has
    states, _index = _states(node("n1", cards=2, cpu=64))
    assert fm.node_fragmentation(states[0]) == pytest.approx(2.0)


def test_fgd_prefers_the_card_that_keeps_whole_cards_for_whole_card_work():
    # Half whole-card tasks, half 0.5 tasks. Placing a 0.5 task on the half-used card of n2
    # adds no fragmentation; opening a fresh card on n1 would strand 0.5 for whole-card tasks.
    from apps.queues.engine import WorkloadShape

    wl = (WorkloadShape(1, 1, 1, 1.0), WorkloadShape(1, 1, 1, 0.5))
    busy = running(task("b", gpu=0.5), [("n2", [(1, 500)])])
    d = schedule(
        snap(
            [node("n1", cards=1), node("n2", cards=2)], [task("t", gpu=0.5)], [busy], node_scorer="fgd", fgd_workload=wl
        )
    )
    assert [(p.node_id, p.devices[0].device_id) for p in d.starts[0].placements] == [("n2", "n2/1")]


def test_fgd_prefers_node_where_cpu_use_does_not_strand_gpus():
    # A CPU-heavy task: putting it on the GPU-rich node would leave its cards unusable.
    from apps.queues.engine import WorkloadShape

    wl = (WorkloadShape(1, 32, 1, 1.0),)
    nodes = [node("gpu", cards=4, cpu=64), node("small", cards=1, cpu=64)]
    d = schedule(snap(nodes, [task("t", gpu=0, cpu=40)], node_scorer="fgd", fgd_workload=wl))
    assert d.starts[0].placements[0].node_id == "small"
