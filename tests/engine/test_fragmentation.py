"""The FGD fragmentation measure against values worked out by hand (Weng et al., ATC'23)."""

from __future__ import annotations

import math

import pytest

from apps.queues.engine import Scheduler, WorkloadShape, schedule
from apps.queues.engine.capacity import ClusterIndex, NodeState
from apps.queues.engine.fragmentation import FragmentationModel

from .builders import node, snap, task

# Target workload (weight, cpu, memory GiB, GPU milli, models): popularity 0.4 / 0.3 / 0.2 / 0.1.
WORKLOAD = [
    (4, 2.0, 1.0, 500, None),  # A: half a card
    (3, 4.0, 1.0, 2000, None),  # B: two whole cards
    (2, 12.0, 1.0, 1000, None),  # C: one whole card, cpu-heavy
    (1, 1.0, 1.0, 0, None),  # D: CPU only
]


def _node_state(cards=4, cpu=16.0, take_cpu=6.0, shares=((2, 400), (3, 700))):
    """One node with ``cards`` cards; ``take_cpu`` cpu and the given (card, milli) shares in use."""
    ns = NodeState(0, node("n1", cards=cards, cpu=cpu), 80, 30)
    index = ClusterIndex("c1", [ns], frozenset({"A100-80G"}))
    index.take((ns, take_cpu, 0.0, tuple(shares)))
    return ns


def test_fragmentation_by_hand():
    # Free: cpu 10, cards 1.0 / 1.0 / 0.6 / 0.3 (2.9 in all).
    # A fits (three cards have >= 0.5): the 0.3 card is a fragment.      0.4 * 0.3 = 0.12
    # B fits (two whole cards): the partly used 0.6 and 0.3 are fragments. 0.3 * 0.9 = 0.27
    # C needs 12 cpu, 10 are free: it cannot run, all 2.9 are fragments.   0.2 * 2.9 = 0.58
    # D uses no GPU: all 2.9 are fragments although its cpu fits.         0.1 * 2.9 = 0.29
    fm = FragmentationModel(WORKLOAD)
    assert fm.node_fragmentation(_node_state()) == pytest.approx(1.26)


def test_cpu_only_tasks_count_every_free_card_as_fragment():
    fm = FragmentationModel([(1, 1.0, 1.0, 0, None)])
    ns = _node_state(shares=())
    assert fm.node_fragmentation(ns) == pytest.approx(4.0)


def test_memory_is_not_part_of_the_measure():
    # A type that asks for more memory than the node has still fits as far as the measure goes.
    big_mem = [(w, cpu, 10_000.0, gpu, models) for w, cpu, _mem, gpu, models in WORKLOAD]
    assert FragmentationModel(big_mem).node_fragmentation(_node_state()) == pytest.approx(1.26)


def test_gpu_model_constraint_makes_other_models_fragments():
    fm = FragmentationModel([(1, 1.0, 1.0, 500, frozenset({"H100"}))])
    assert fm.node_fragmentation(_node_state()) == pytest.approx(2.9)


def test_growth_and_its_score_resolution():
    # 0.3 of a card and 2 cpu on the card with 0.3 free. After: cpu 8, cards 1 / 1 / 0.6 / 0.
    # A: no fragment; B: 0.6; C: all 2.6; D: all 2.6 -> 0.18 + 0.52 + 0.26 = 0.96, growth -0.30.
    fm = FragmentationModel(WORKLOAD)
    ns = _node_state()
    assert fm.growth(ns, 2.0, "A100-80G", 300, 300) == pytest.approx(-0.30)
    # The paper's Kubernetes score: floor(100 * sigmoid(0.30)) = 57; delta is its negation.
    assert fm.delta(ns, 2.0, 1.0, "A100-80G", 300, 300) == -math.floor(100 / (1 + math.exp(-0.30)))
    exact = FragmentationModel(WORKLOAD)
    exact.score_levels = None
    assert exact.delta(ns, 2.0, 1.0, "A100-80G", 300, 300) == pytest.approx(-0.30)


def test_fgd_breaks_score_ties_by_node_order():
    # Two equal nodes: the placements score the same, and the first node wins (the paper's
    # simulator breaks score ties by node name).
    wl = (WorkloadShape(1, 1, 1, 1.0), WorkloadShape(1, 1, 1, 0.5))
    d = schedule(
        snap([node("n1", cards=1), node("n2", cards=1)], [task("t", gpu=0.5)], node_scorer="fgd", fgd_workload=wl)
    )
    assert d.starts[0].placements[0].node_id == "n1"


def test_fgd_without_a_workload_or_tasks_still_keeps_the_only_8_card_node_whole():
    # A Scheduler started empty had no target workload, so FGD tied everywhere and placed
    # first-fit: the 1-card task took a card of n1, the only node an 8-card task could ever use.
    s = Scheduler(snap([node("n1", cards=8), node("n2", cards=4)], [], node_scorer="fgd"))
    s.submit(task("small", gpu=1))
    d = s.cycle(100.0)
    assert [p.node_id for st in d.starts for p in st.placements] == ["n2"]
