"""GPU fragmentation measure and the FGD node scorer.

After Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC 2023). Fragmentation of a node with respect to
one task shape *t* is the unallocated GPU capacity that *t* cannot use there:

* *t* cannot run on the node at all (cpu, memory, model or not enough free GPU): every
  unallocated GPU share of the node is a fragment;
* otherwise the cards whose free share is below ``min(t's GPU demand, 1 card)`` are
  fragments (for a whole-card task: every partly used card; for a CPU-only task: none),
  plus the free share of cards of a model *t* does not accept.

Fragmentation with respect to a target workload is the expectation over its shapes, and
FGD places a task where that expectation grows least. Node states are memoised by a key
that keeps only what the measure depends on (free cards per model, and how many workload
cpu/memory thresholds the free cpu/memory reach), so thousands of nodes collapse into a
few hundred distinct states.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable

from .resources import EPS, WHOLE

# Keep the measure cheap: the most frequent shapes carry nearly all the probability mass.
MAX_SHAPES = 256
MEMO_LIMIT = 500_000

# (weight, cpu, memory GiB, GPU demand in thousandths of a card, accepted models or None)
Shape = tuple[float, float, float, int, frozenset[str] | None]


class FragmentationModel:
    """A target workload distribution with memoised node fragmentation and FGD deltas."""

    def __init__(self, shapes: Iterable[Shape]):
        merged: dict[tuple, float] = {}
        for w, cpu, mem, gpu, models in shapes:
            if w > 0:
                key = (float(cpu), float(mem), int(gpu), models)
                merged[key] = merged.get(key, 0.0) + w
        top = sorted(merged.items(), key=lambda kv: (-kv[1], repr(kv[0])))[:MAX_SHAPES]
        total = sum(w for _k, w in top) or 1.0
        self.cpu_thr = sorted({k[0] for k, _w in top})
        self.mem_thr = sorted({k[1] for k, _w in top})
        self.types = [
            (w / total, self.cpu_thr.index(cpu), self.mem_thr.index(mem), gpu, models)
            for (cpu, mem, gpu, models), w in top
        ]
        self._frag: dict[tuple, float] = {}
        self._delta: dict[tuple, float] = {}

    def key_of(self, free_cpu: float, free_mem: float, devs: tuple) -> tuple:
        """Memo key of a node state; ``devs`` is the sorted ``(model, free milli)`` of usable cards."""
        return (
            bisect_right(self.cpu_thr, free_cpu + EPS),
            bisect_right(self.mem_thr, free_mem + EPS),
            devs,
        )

    def node_key(self, ns) -> tuple:
        """Memo key of a :class:`~.capacity.NodeState` (cached on the node until it changes)."""
        if ns.fkey is None:
            devs = tuple(sorted((m, f) for m, f, ok in zip(ns.dev_model, ns.dev_free, ns.dev_ok, strict=True) if ok))
            ns.fkey = self.key_of(ns.free_cpu, ns.free_mem, devs)
        return ns.fkey

    def fragmentation(self, key: tuple) -> float:
        """Expected fragmented GPU capacity (in cards) of a node state."""
        value = self._frag.get(key)
        if value is not None:
            return value
        cc, mc, devs = key
        total = sum(f for _m, f in devs)
        frag = 0.0
        if total:
            for p, ci, mi, d, models in self.types:
                if cc <= ci or mc <= mi:
                    frag += p * total
                    continue
                if d == 0:
                    continue
                usable = 0
                lost = 0
                if d < WHOLE:
                    for m, f in devs:
                        if models is not None and m not in models:
                            lost += f
                        elif f >= d:
                            usable += 1
                        else:
                            lost += f
                    frag += p * (lost if usable else total)
                else:
                    for m, f in devs:
                        if models is not None and m not in models:
                            lost += f
                        elif f == WHOLE:
                            usable += 1
                        else:
                            lost += f
                    frag += p * (lost if usable * WHOLE >= d else total)
        value = frag / WHOLE
        if len(self._frag) > MEMO_LIMIT:
            self._frag.clear()
        self._frag[key] = value
        return value

    def node_fragmentation(self, ns) -> float:
        """Fragmentation of a node as it is now."""
        return self.fragmentation(self.node_key(ns))

    def delta(self, ns, cpu: float, mem: float, model: str | None, amount: int, from_free: int) -> float:
        """Growth of the node's fragmentation if a task takes cpu, memory and GPU on it.

        ``amount`` >= 1000 takes ``amount // 1000`` free cards of ``model``; a smaller
        ``amount`` takes that share from one card of ``model`` that has ``from_free`` free.
        """
        before = self.node_key(ns)
        cc = bisect_right(self.cpu_thr, ns.free_cpu - cpu + EPS)
        mc = bisect_right(self.mem_thr, ns.free_mem - mem + EPS)
        memo = (before, cc, mc, model, amount, from_free)
        value = self._delta.get(memo)
        if value is not None:
            return value
        devs = list(before[2])
        if model is not None:
            if amount >= WHOLE:
                for _ in range(amount // WHOLE):
                    devs[devs.index((model, WHOLE))] = (model, 0)
            else:
                devs[devs.index((model, from_free))] = (model, from_free - amount)
            devs.sort()
        value = self.fragmentation((cc, mc, tuple(devs))) - self.fragmentation(before)
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
