"""Free-capacity index of the nodes of one cluster, and instance placement on it.

Placement must not scan every node for every task (10,000 tasks x 2,000 nodes), so each
cluster keeps, per GPU model:

* ``whole[model][k]``: the nodes with exactly ``k`` fully free cards of that model, as a
  sorted list of ``(health tier, node position)`` (healthy nodes first, then by position);
* ``partial[model]``: the partly used cards of shareable models, as a sorted list of
  ``(free milli, tier, node position, device position)``, so "the tightest card with at
  least f free" is one bisect.

Every change to a node goes through :meth:`ClusterIndex.take` / :meth:`ClusterIndex.release`,
which unindex the node, change it and index it again.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from .model import LINK_FAST, Node
from .resources import EPS, WHOLE

FIRST_FIT = "first_fit"
BEST_FIT = "best_fit"
FGD = "fgd"
# Classic multi-resource best fit (least cpu + memory + GPU left on the node, each as a share
# of the node), the "BestFit" baseline of the FGD paper; O(nodes) per task, for comparisons.
BEST_FIT_WEIGHTED = "best_fit_weighted"
NODE_SCORERS = (FIRST_FIT, BEST_FIT, FGD, BEST_FIT_WEIGHTED)
# Index key of nodes without usable cards, so CPU-only work finds them in bucket 0.
NO_GPU = ""

# How many equally good candidate nodes best-fit inspects to prefer one whose free cards
# share an NVLink/HCCS island; a bound keeps placement O(1) per task.
TOPOLOGY_LOOKAHEAD = 8


class NodeState:
    """Mutable free resources of one node; devices are addressed by position in ``Node.devices``."""

    __slots__ = (
        "pos",
        "node",
        "cluster_id",
        "free_cpu",
        "free_mem",
        "dev_ids",
        "dev_model",
        "models",
        "dev_free",
        "_island",
        "dev_tier",
        "dev_ok",
        "tier",
        "schedulable",
        "fkey",
        "wc",
        "ifit",
        "mixed_tiers",
    )

    def __init__(self, pos: int, node: Node, subhealthy_below: int, unhealthy_below: int):
        self.pos = pos
        self.node = node
        self.cluster_id = node.cluster_id
        self.free_cpu = float(node.cpu)
        self.free_mem = float(node.memory_gib)
        devs = node.devices
        self.dev_ids = [d.id for d in devs]
        self.dev_model = [d.model for d in devs]
        self.models = frozenset(self.dev_model)  # the GPU models it has, whatever their health
        self.dev_free = [WHOLE] * len(devs)
        self.dev_ok = [d.health >= unhealthy_below for d in devs]
        self.dev_tier = [0 if d.health >= subhealthy_below else 1 for d in devs]
        self.mixed_tiers = len(set(self.dev_tier)) > 1
        self._island: list[int] | None = None
        self.schedulable = node.status == "ready" and node.health >= unhealthy_below
        self.tier = 0 if node.health >= subhealthy_below else 1
        self.fkey = None
        self.wc: dict[str, int] = {}
        # island_fit's answer (the most free cards per model on one island) until the node changes: best-fit
        # looks at the same few candidate nodes for every task of a shape, and most do not change in between.
        self.ifit: dict | None = None

    def free_gpu_milli(self) -> int:
        """Unallocated capacity of the usable cards, in thousandths of a card."""
        return sum(f for f, ok in zip(self.dev_free, self.dev_ok, strict=True) if ok)

    @property
    def dev_island(self) -> list[int]:
        """Fast-link island of each device; computed on first use (most nodes never need it)."""
        if self._island is None:
            self._island = _islands(self.node)
        return self._island

    def whole_counts(self) -> dict[str, int]:
        """Fully free usable cards per model (0 included; a node without usable cards is model "")."""
        counts: dict[str, int] = {}
        free = self.dev_free
        ok = self.dev_ok
        for i, m in enumerate(self.dev_model):
            if ok[i]:
                counts[m] = counts.get(m, 0) + (free[i] == WHOLE)
        return counts or {NO_GPU: 0}

    def fits(self, cpu: float, mem: float) -> bool:
        """True when cpu and memory of one instance fit."""
        return self.free_cpu + EPS >= cpu and self.free_mem + EPS >= mem


def _islands(node: Node) -> list[int]:
    """Connected components of the node's devices over NVLink/HCCS links (union-find)."""
    devices = node.devices
    parent = list(range(len(devices)))
    pos_of = {d.index: i for i, d in enumerate(devices)}
    for i, d in enumerate(devices):
        for link in d.links:
            if link.kind not in LINK_FAST:
                continue
            j = pos_of.get(link.peer_index)
            if j is None:
                continue
            a, b = i, j
            while parent[a] != a:
                a = parent[a]
            while parent[b] != b:
                b = parent[b]
            if a != b:
                # Always hang the larger root under the smaller: a component is named by its lowest device.
                if a < b:
                    parent[b] = a
                else:
                    parent[a] = b
    out = []
    for i in range(len(devices)):
        r = i
        while parent[r] != r:
            r = parent[r]
        out.append(r)
    return out


def choose_whole_devices(ns: NodeState, model: str, k: int) -> list[int] | None:
    """Pick ``k`` free cards of ``model`` on a node, preferring one fast-link island.

    The smallest island that holds all k is taken (keeps big islands whole for big tasks);
    otherwise the biggest islands are used first so the task spans as few as possible.
    """
    free = ns.dev_free
    ok = ns.dev_ok
    tier = ns.dev_tier
    if k == 1:
        best = None
        for i, m in enumerate(ns.dev_model):
            if m == model and ok[i] and free[i] == WHOLE and (best is None or tier[i] < tier[best]):
                best = i
        return None if best is None else [best]
    groups: dict[int, list[int]] = {}
    island = ns.dev_island
    total = 0
    for i, m in enumerate(ns.dev_model):
        if m == model and ok[i] and free[i] == WHOLE:
            total += 1
            g = groups.get(island[i])
            if g is None:
                groups[island[i]] = [i]
            else:
                g.append(i)
    if total < k:
        return None
    if ns.mixed_tiers:
        # Groups are in device order; healthier cards first only matters when the tiers differ.
        for g in groups.values():
            g.sort(key=lambda i: (tier[i], i))
    fitting = [g for g in groups.values() if len(g) >= k]
    if fitting:
        best = min(fitting, key=lambda g: (len(g), g[0])) if len(fitting) > 1 else fitting[0]
        return sorted(best[:k]) if ns.mixed_tiers else best[:k]
    chosen: list[int] = []
    for g in sorted(groups.values(), key=lambda g: (-len(g), g[0])):
        chosen.extend(g[: k - len(chosen)])
        if len(chosen) == k:
            break
    return sorted(chosen)


def island_fit(ns: NodeState, model: str, k: int) -> bool:
    """True when ``k`` free cards of ``model`` on this node share one fast-link island."""
    most = ns.ifit
    if most is None:
        most = ns.ifit = _island_free(ns)
    return most.get(model, 0) >= k


def _island_free(ns: NodeState) -> dict[str, int]:
    """The most free usable cards of each model on one fast-link island of the node."""
    sizes: dict[tuple, int] = {}
    free = ns.dev_free
    ok = ns.dev_ok
    island = ns.dev_island
    for i, m in enumerate(ns.dev_model):
        if ok[i] and free[i] == WHOLE:
            key = (m, island[i])
            sizes[key] = sizes.get(key, 0) + 1
    most: dict[str, int] = {}
    for (m, _isl), n in sizes.items():
        if n > most.get(m, 0):
            most[m] = n
    return most


def remaining_share(ns: NodeState, cpu: float, mem: float, gpu_milli: int) -> float:
    """What a node would have left after a placement: cpu + memory + GPU, each as a share of the node."""
    node = ns.node
    left = (ns.free_cpu - cpu) / node.cpu if node.cpu else 0.0
    left += (ns.free_mem - mem) / node.memory_gib if node.memory_gib else 0.0
    if ns.dev_free:
        left += (ns.free_gpu_milli() - gpu_milli) / (len(ns.dev_free) * WHOLE)
    return left


# One instance's claim on a node: (node state, cpu, memory, ((device position, milli), ...)).
Claim = tuple[NodeState, float, float, tuple[tuple[int, int], ...]]


class ClusterIndex:
    """The free-capacity index of one cluster's schedulable nodes."""

    def __init__(
        self, cluster_id, nodes: list[NodeState], shareable: frozenset[str], unshareable: frozenset[str] = frozenset()
    ):
        """``unshareable``: shareable models whose shares this cluster's backend cannot run: a request for a
        share of one never fits here (whole cards of it do)."""
        self.cluster_id = cluster_id
        self.nodes = nodes
        self.by_pos = {ns.pos: ns for ns in nodes}
        self.shareable = shareable - unshareable
        self.unshareable = unshareable
        self.whole: dict[str, list[list[tuple[int, int]]]] = {}
        self.partial: dict[str, list[tuple[int, int, int, int]]] = {}
        self.schedulable = [ns for ns in nodes if ns.schedulable]
        # Node sizes never change, so "could it fit on an empty node" is cached for good.
        self._ever: dict = {}
        self._with_model: dict = {}  # model -> ClusterIndex.with_model
        for ns in self.schedulable:
            for m in set(ns.dev_model) | {NO_GPU}:
                size = ns.dev_model.count(m) + 1
                buckets = self.whole.setdefault(m, [])
                while len(buckets) < size:
                    buckets.append([])
        self.depth = max((len(b) for b in self.whole.values()), default=0)
        for ns in self.schedulable:
            self._index(ns)

    # -- index maintenance -------------------------------------------------------------

    def with_model(self, model: str) -> list[tuple[int, list[int]]]:
        """(index into ``schedulable``, positions of its usable cards of ``model``) of the nodes that have a card
        of ``model`` (nodes never change)."""
        found = self._with_model.get(model)
        if found is None:
            found = self._with_model[model] = [
                (k, [i for i, m in enumerate(ns.dev_model) if m == model and ns.dev_ok[i]])
                for k, ns in enumerate(self.schedulable)
                if model in ns.models
            ]
        return found

    def _index(self, ns: NodeState) -> None:
        key = (ns.tier, ns.pos)
        ns.wc = ns.whole_counts()
        for m, k in ns.wc.items():
            insort(self.whole[m][k], key)
        free = ns.dev_free
        for i, m in enumerate(ns.dev_model):
            if ns.dev_ok[i] and 0 < free[i] < WHOLE and m in self.shareable:
                insort(self.partial.setdefault(m, []), (free[i], ns.dev_tier[i], ns.pos, i))

    def _apply(self, claim: Claim, sign: int) -> None:
        """Take (sign=+1) or give back (sign=-1) a claim, moving only the index entries that change."""
        ns, cpu, mem, devs = claim
        ns.free_cpu -= sign * cpu
        ns.free_mem -= sign * mem
        ns.fkey = None
        ns.ifit = None
        free = ns.dev_free
        if not ns.schedulable:
            for i, milli in devs:
                free[i] -= sign * milli
            return
        delta: dict[str, int] = {}
        for i, milli in devs:
            old = free[i]
            new = old - sign * milli
            free[i] = new
            if not ns.dev_ok[i]:
                continue
            m = ns.dev_model[i]
            if m in self.shareable:
                tier = ns.dev_tier[i]
                if 0 < old < WHOLE:
                    lst = self.partial[m]
                    del lst[bisect_left(lst, (old, tier, ns.pos, i))]
                if 0 < new < WHOLE:
                    insort(self.partial.setdefault(m, []), (new, tier, ns.pos, i))
            if (old == WHOLE) != (new == WHOLE):
                delta[m] = delta.get(m, 0) + (1 if new == WHOLE else -1)
        if delta:
            key = (ns.tier, ns.pos)
            wc = ns.wc
            for m, dk in delta.items():
                lst = self.whole[m][wc[m]]
                del lst[bisect_left(lst, key)]
                wc[m] += dk
                insort(self.whole[m][wc[m]], key)

    def take(self, claim: Claim) -> None:
        """Allocate a claim (the caller has checked that it fits)."""
        self._apply(claim, 1)

    def release(self, claim: Claim) -> None:
        """Give a claim back."""
        self._apply(claim, -1)

    # -- search ------------------------------------------------------------------------

    def could_fit(self, model: str | None, cards: int, milli: int, n: int = 1) -> bool:
        """Cheap necessary condition: there are nodes with the cards (or share) for ``n`` instances."""
        if model is None:
            return bool(self.schedulable)
        if not cards and model in self.unshareable:
            return False
        buckets = self.whole.get(model)
        if not buckets:
            return False
        need = cards if cards else 1
        if cards and n > 1:
            # Whole-card gangs: count how many instances the free cards could host at most.
            slots = 0
            for k in range(need, len(buckets)):
                slots += len(buckets[k]) * (k // need)
                if slots >= n:
                    return True
            return False
        for k in range(need, len(buckets)):
            if buckets[k]:
                return True
        if milli:
            lst = self.partial.get(model)
            return bool(lst) and lst[-1][0] >= milli
        return False

    def free_milli_by_model(self) -> dict[str, int]:
        """Unallocated capacity per model in thousandths of a card (from the buckets, no node scan)."""
        out: dict[str, int] = {}
        for m, buckets in self.whole.items():
            if m != NO_GPU:
                out[m] = sum(k * WHOLE * len(lst) for k, lst in enumerate(buckets))
        for m, lst in self.partial.items():
            out[m] = out.get(m, 0) + sum(e[0] for e in lst)
        return out

    def could_ever_fit(self, alt, cpu: float, mem: float) -> bool:
        """True when one instance fits on some schedulable node of this cluster if it were empty."""
        key = (alt, cpu, mem)
        known = self._ever.get(key)
        if known is not None:
            return known
        model, cards, _milli, _eq = alt
        need = max(cards, 1)
        result = False
        if not cards and model in self.unshareable:
            self._ever[key] = result
            return result
        for ns in self.schedulable:
            if ns.node.cpu + EPS < cpu or ns.node.memory_gib + EPS < mem:
                continue
            if model is None or sum(1 for i, m in enumerate(ns.dev_model) if m == model and ns.dev_ok[i]) >= need:
                result = True
                break
        self._ever[key] = result
        return result

    def find(self, alt, cpu: float, mem: float, scorer: str, excluded, fgd=None) -> Claim | None:
        """Find a claim for one instance of alternative ``alt``, or None.

        ``excluded`` is a set of node positions not to use (backfill reservations) or None.
        """
        model, cards, milli, _eq = alt
        if not cards and model in self.unshareable:
            return None
        if scorer == BEST_FIT_WEIGHTED:
            return self._find_weighted(model, cards, milli, cpu, mem, excluded)
        if model is None:
            return self._find_cpu(cpu, mem, scorer, excluded, fgd)
        if scorer == FGD and fgd is not None:
            found = self._find_fgd(model, cards, milli, cpu, mem, excluded, fgd)
            return None if found is None else found[0]
        if cards:
            ns = self._find_whole(model, cards, cpu, mem, scorer, excluded)
            if ns is None:
                return None
            devs = choose_whole_devices(ns, model, cards)
            return (ns, cpu, mem, tuple((i, WHOLE) for i in devs))
        return self._find_share(model, milli, cpu, mem, scorer, excluded)

    def find_best(self, alts, cpu: float, mem: float, scorer: str, excluded, fgd=None):
        """One instance of whichever alternative (GPU model) the node scorer likes best.

        Returns ``(claim, alt)`` or None. Scores: first-fit the lowest node; best-fit the
        tightest fit (fewest whole cards, or least share, left over); FGD the least growth of
        fragmentation. Ties keep the order of ``alts`` (cheapest card first).
        """
        best = None
        best_key = None
        for rank, alt in enumerate(alts):
            model, cards, milli, _eq = alt
            if not cards and model in self.unshareable:
                continue
            if scorer == FGD and fgd is not None and model is not None:
                found = self._find_fgd(model, cards, milli, cpu, mem, excluded, fgd)
                if found is None:
                    continue
                claim, key = found
                # The paper's scheduler breaks equal FGD scores by node only, not by the card model's rank.
                key = (*key, rank)
            elif cards and model is not None and scorer in (BEST_FIT, FIRST_FIT):
                # Only the node decides the key: the cards are chosen for the winner alone.
                ns = self._find_whole(model, cards, cpu, mem, scorer, excluded)
                if ns is None:
                    continue
                claim = ns
                if scorer == FIRST_FIT:
                    key = (ns.tier, ns.pos, rank)
                else:
                    key = (ns.tier, ns.wc.get(model, 0) - cards, rank, ns.pos)
            else:
                claim = self.find(alt, cpu, mem, scorer, excluded, fgd)
                if claim is None:
                    continue
                ns = claim[0]
                if scorer == BEST_FIT_WEIGHTED:
                    key = (ns.tier, remaining_share(ns, cpu, mem, cards * WHOLE if cards else milli), rank, ns.pos)
                elif scorer == FIRST_FIT or model is None:
                    key = (ns.tier, ns.pos, rank)
                elif cards:
                    key = (ns.tier, ns.wc.get(model, 0) - cards, rank, ns.pos)
                else:
                    dev = claim[3][0][0]
                    key = (ns.tier, ns.dev_free[dev] - milli, rank, ns.pos)
            if best_key is None or key < best_key:
                best, best_key = (claim, alt), key
        if best is not None and type(best[0]) is NodeState:
            ns, alt = best
            devs = choose_whole_devices(ns, alt[0], alt[1])
            best = ((ns, cpu, mem, tuple((i, WHOLE) for i in devs)), alt)
        return best

    def _find_whole(self, model, k, cpu, mem, scorer, excluded) -> NodeState | None:
        buckets = self.whole.get(model)
        if not buckets or k >= len(buckets):
            return None
        by_pos = self.by_pos
        first_fit = scorer == FIRST_FIT
        nb = len(buckets)
        best: NodeState | None = None
        for tier in (0, 1):
            for kk in range(k, nb):
                lst = buckets[kk]
                if not lst:
                    continue
                # Entries are (tier, position) with tier 0 or 1: tier 0 starts the list.
                i = 0 if tier == 0 else bisect_left(lst, (1, -1))
                n = len(lst)
                seen: list[NodeState] = []
                while i < n:
                    t, pos = lst[i]
                    if t != tier:
                        break
                    i += 1
                    ns = by_pos[pos]
                    # NodeState.fits, inlined: this loop runs for every placement.
                    if (
                        ns.free_cpu + EPS >= cpu
                        and ns.free_mem + EPS >= mem
                        and (excluded is None or pos not in excluded)
                    ):
                        if first_fit:
                            if best is None or pos < best.pos:
                                best = ns
                            break
                        # The first of the next few fitting nodes whose free cards share an island, else the
                        # first of them: checked as they come, so the look-ahead stops at the first such node.
                        if k == 1 or island_fit(ns, model, k):
                            return ns
                        seen.append(ns)
                        if len(seen) >= TOPOLOGY_LOOKAHEAD:
                            break
                if seen:
                    return seen[0]
            if best is not None:
                return best
        return best

    def _find_share(self, model, milli, cpu, mem, scorer, excluded) -> Claim | None:
        lst = self.partial.get(model, ())
        by_pos = self.by_pos
        i = bisect_left(lst, (milli, -1, -1, -1)) if lst else 0
        found = None
        while i < len(lst):
            free, _t, pos, dev = lst[i]
            i += 1
            ns = by_pos[pos]
            if ns.fits(cpu, mem) and (excluded is None or pos not in excluded):
                if scorer != FIRST_FIT:
                    return (ns, cpu, mem, ((dev, milli),))
                if found is None or pos < found[0].pos:
                    found = (ns, dev)
        ns = self._find_whole(model, 1, cpu, mem, scorer, excluded)
        if ns is not None and (found is None or ns.pos < found[0].pos):
            dev = choose_whole_devices(ns, model, 1)[0]
            return (ns, cpu, mem, ((dev, milli),))
        if found is not None:
            return (found[0], cpu, mem, ((found[1], milli),))
        return None

    def _find_cpu(self, cpu, mem, scorer, excluded, fgd) -> Claim | None:
        if scorer == FGD and fgd is not None:
            best, best_key = None, None
            for ns in self.schedulable:
                if ns.fits(cpu, mem) and (excluded is None or ns.pos not in excluded):
                    key = (fgd.delta(ns, cpu, mem, None, 0, 0), ns.tier, ns.pos)
                    if best_key is None or key < best_key:
                        best, best_key = ns, key
            return None if best is None else (best, cpu, mem, ())
        if scorer == FIRST_FIT:
            for ns in self.schedulable:
                if ns.fits(cpu, mem) and (excluded is None or ns.pos not in excluded):
                    return (ns, cpu, mem, ())
            return None
        # Best fit: nodes with the fewest free cards first, so CPU work does not strand GPUs.
        by_pos = self.by_pos
        for kk in range(self.depth):
            for tier in (0, 1):
                best = None
                for buckets in self.whole.values():
                    if kk >= len(buckets):
                        continue
                    lst = buckets[kk]
                    i = bisect_left(lst, (tier, -1))
                    while i < len(lst) and lst[i][0] == tier:
                        ns = by_pos[lst[i][1]]
                        i += 1
                        if ns.fits(cpu, mem) and (excluded is None or ns.pos not in excluded):
                            if best is None or ns.pos < best.pos:
                                best = ns
                            break
                if best is not None:
                    return (best, cpu, mem, ())
        return None

    def _find_weighted(self, model, cards, milli, cpu, mem, excluded) -> Claim | None:
        best = None
        best_key = None
        for ns in self.schedulable:
            if not ns.fits(cpu, mem) or (excluded is not None and ns.pos in excluded):
                continue
            dev = None
            if model is not None:
                if cards:
                    if ns.wc.get(model, 0) < cards:
                        continue
                else:
                    fitting = [
                        (f, i)
                        for i, f in enumerate(ns.dev_free)
                        if ns.dev_model[i] == model and ns.dev_ok[i] and f >= milli
                    ]
                    if not fitting:
                        continue
                    dev = min(fitting)[1]
            key = (ns.tier, remaining_share(ns, cpu, mem, cards * WHOLE if cards else milli), ns.pos)
            if best_key is None or key < best_key:
                best, best_key = (ns, dev), key
        if best is None:
            return None
        ns, dev = best
        if model is None:
            return (ns, cpu, mem, ())
        if cards:
            return (ns, cpu, mem, tuple((i, WHOLE) for i in choose_whole_devices(ns, model, cards)))
        return (ns, cpu, mem, ((dev, milli),))

    def _find_fgd(self, model, cards, milli, cpu, mem, excluded, fgd):
        """Fragmentation Gradient Descent: the choice that least increases fragmentation.

        Returns ``(claim, key)`` with the fragmentation growth first in ``key``, or None.
        """
        buckets = self.whole.get(model)
        if not buckets:
            return None
        by_pos = self.by_pos
        need = cards if cards else 1
        best_key = None
        best = None
        seen: set[int] = set()
        candidates: list[NodeState] = []
        for kk in range(need, len(buckets)):
            for _tier, pos in buckets[kk]:
                ns = by_pos[pos]
                if ns.fits(cpu, mem) and (excluded is None or pos not in excluded):
                    candidates.append(ns)
                    seen.add(pos)
        if milli:
            for free, _t, pos, _dev in reversed(self.partial.get(model, ())):
                if free < milli:
                    break
                if pos in seen:
                    continue
                ns = by_pos[pos]
                if ns.fits(cpu, mem) and (excluded is None or pos not in excluded):
                    candidates.append(ns)
                    seen.add(pos)
        for ns in candidates:
            if cards:
                key = (fgd.delta(ns, cpu, mem, model, cards * WHOLE, WHOLE), ns.tier, ns.pos)
                if best_key is None or key < best_key:
                    best_key, best = key, (ns, None)
                continue
            tried: set[int] = set()
            free = ns.dev_free
            for i, m in enumerate(ns.dev_model):
                f = free[i]
                if m != model or not ns.dev_ok[i] or f < milli or f in tried:
                    continue
                tried.add(f)
                key = (fgd.delta(ns, cpu, mem, model, milli, f), ns.tier + ns.dev_tier[i], ns.pos, i)
                if best_key is None or key < best_key:
                    best_key, best = key, (ns, i)
        if best is None:
            return None
        ns, dev = best
        if cards:
            devs = choose_whole_devices(ns, model, cards)
            return (ns, cpu, mem, tuple((i, WHOLE) for i in devs)), best_key
        return (ns, cpu, mem, ((dev, milli),)), best_key
