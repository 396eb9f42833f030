"""GPU fragmentation measure and the FGD node scorer.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC 2023). A task type *t* of the target workload is
its cpu, its GPU demand (a share of one card, or whole cards) and the models it accepts;
fragmentation of a node with respect to *t* is the unallocated GPU capacity that *t* cannot
use there:

* *t* requests no GPU: every unallocated GPU share of the node is a fragment (the paper's
  x-axis case; whether the cpu fits does not matter);
* *t* cannot run on the node (not enough free cpu, no accepted model, not enough free GPU):
  every unallocated GPU share of the node is a fragment;
* otherwise the cards whose free share is below ``min(t's GPU demand, 1 card)`` are
  fragments (for a whole-card task: every partly used card), plus the free share of cards
  of a model *t* does not accept.

As in the paper, task types are told apart by cpu and GPU only: memory is checked when a
task is placed but is not part of the measure. Fragmentation with respect to the target
workload is the expectation over its types (weights: popularity), and FGD places a task
where that expectation grows least. Growths are compared at the resolution of the paper's
Kubernetes score plugin (``int(100 * sigmoid(-growth in cards))``, see :meth:`delta`); the
caller breaks ties by node order, as the paper's simulator does (lowest node name).

Node states are memoised by a key that keeps only what the measure depends on (free cards
per model and how many workload cpu thresholds the free cpu reaches), so thousands of
nodes collapse into a few hundred distinct states.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable

from .resources import EPS, WHOLE

# Keep the measure cheap: the most frequent shapes carry nearly all the probability mass.
MAX_SHAPES = 256
MEMO_LIMIT = 500_000
# Score levels of the paper's implementation (Kubernetes MaxNodeScore); None compares exact growths.
SCORE_LEVELS: int | None = 100

# (weight, cpu, memory GiB, GPU demand in thousandths of a card, accepted models or None);
# the memory is accepted for the callers' convenience and not used by the measure.
Shape = tuple[float, float, float, int, frozenset[str] | None]


class FragmentationModel:
    """A target workload distribution with memoised node fragmentation and FGD deltas.

    ``score_levels`` is the resolution :meth:`delta` reports at (:data:`SCORE_LEVELS`);
    ``None`` (on the class or an instance, before its first use) compares exact growths.
    """

    score_levels: int | None = SCORE_LEVELS

    def __init__(self, shapes: Iterable[Shape]):
        merged: dict[tuple, float] = {}
        for w, cpu, _mem, gpu, models in shapes:
            if w > 0:
                key = (float(cpu), int(gpu), models)
                merged[key] = merged.get(key, 0.0) + w
        top = sorted(merged.items(), key=lambda kv: (-kv[1], repr(kv[0])))[:MAX_SHAPES]
        total = sum(w for _k, w in top) or 1.0
        self.cpu_thr = sorted({k[0] for k, _w in top})
        self.types = [(w / total, self.cpu_thr.index(cpu), gpu, models) for (cpu, gpu, models), w in top]
        self._frag: dict[tuple, float] = {}
        self._delta: dict[tuple, float] = {}

    def key_of(self, free_cpu: float, devs: tuple) -> tuple:
        """Memo key of a node state; ``devs`` is the sorted ``(model, free milli)`` of usable cards."""
        return (bisect_right(self.cpu_thr, free_cpu + EPS), devs)

    def node_key(self, ns) -> tuple:
        """Memo key of a :class:`~.capacity.NodeState` (cached on the node until it changes)."""
        if ns.fkey is None:
            devs = tuple(sorted((m, f) for m, f, ok in zip(ns.dev_model, ns.dev_free, ns.dev_ok, strict=True) if ok))
            ns.fkey = self.key_of(ns.free_cpu, devs)
        return ns.fkey

    def fragmentation(self, key: tuple) -> float:
        """Expected fragmented GPU capacity (in cards) of a node state."""
        value = self._frag.get(key)
        if value is not None:
            return value
        cc, devs = key
        total = sum(f for _m, f in devs)
        frag = 0.0
        if total:
            for p, ci, d, models in self.types:
                if d == 0 or cc <= ci:
                    frag += p * total
                    continue
                usable = 0
                lost = 0
                need = min(d, WHOLE)
                for m, f in devs:
                    if models is not None and m not in models:
                        lost += f
                    elif f >= need:
                        usable += 1
                    else:
                        lost += f
                frag += p * (lost if usable * need >= d else total)
        value = frag / WHOLE
        if len(self._frag) > MEMO_LIMIT:
            self._frag.clear()
        self._frag[key] = value
        return value

    def node_fragmentation(self, ns) -> float:
        """Fragmentation of a node as it is now."""
        return self.fragmentation(self.node_key(ns))

    def growth(self, ns, cpu: float, model: str | None, amount: int, from_free: int) -> float:
        """Exact growth of the node's fragmentation (in cards) if a task takes cpu and GPU on it.

        ``amount`` >= 1000 takes ``amount // 1000`` free cards of ``model``; a smaller
        ``amount`` takes that share from one card of ``model`` that has ``from_free`` free.
        """
        before = self.node_key(ns)
        devs = list(before[1])
        if model is not None:
            if amount >= WHOLE:
                for _ in range(amount // WHOLE):
                    devs[devs.index((model, WHOLE))] = (model, 0)
            else:
                devs[devs.index((model, from_free))] = (model, from_free - amount)
            devs.sort()
        after = self.key_of(ns.free_cpu - cpu, tuple(devs))
        return self.fragmentation(after) - self.fragmentation(before)

    def delta(self, ns, cpu: float, mem: float, model: str | None, amount: int, from_free: int) -> float:
        """What FGD minimises for a placement: its growth of fragmentation, lower is better.

        With ``score_levels`` set, the growth is reported at the paper's resolution:
        ``-floor(levels * sigmoid(-growth))``, the negated Kubernetes node score of the
        paper's FGD plugin, so growths that differ by less than a score step tie and the
        caller's tie-break (node order) decides. ``mem`` is not part of the measure.
        """
        before = self.node_key(ns)
        memo = (before, bisect_right(self.cpu_thr, ns.free_cpu - cpu + EPS), model, amount, from_free)
        value = self._delta.get(memo)
        if value is not None:
            return value
        value = self.growth(ns, cpu, model, amount, from_free)
        levels = self.score_levels
        if levels:
            value = -float(math.floor(levels / (1.0 + math.exp(min(value, 700.0)))))
        if len(self._delta) > MEMO_LIMIT:
            self._delta.clear()
        self._delta[memo] = value
        return value


def shape_of(cpu: float, mem: float, alternatives, all_models: frozenset[str], weight: float = 1.0) -> Shape:
    """The workload shape of a normalised demand (first alternative's size, all accepted models)."""
    model, cards, milli, _eq = alternatives[0]
    if model is None:
        return (weight, cpu, mem, 0, None)
    models = frozenset(a[0] for a in alternatives)
    return (weight, cpu, mem, cards * WHOLE if cards else milli, None if models >= all_models else models)
