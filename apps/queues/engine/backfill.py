"""EASY backfill reservations (docs/rules.md#queue-policies, policy "backfill")."""

from __future__ import annotations

from bisect import bisect_right
from math import inf

from .resources import Demand


def reserve(sched, d: Demand, alts, cands, now: float, excluded=None):
    """EASY backfill: when would the head fit, and on which nodes (from expected ends)? ``excluded`` node
    positions (other holders' reservations) are not used."""
    eligible = {cv.cluster.id for cv in cands}
    released = []
    result = None
    for end, run in _by_end(sched.runs_by_end(), now):
        if run.cluster_id not in eligible:
            continue
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.release(claim)
        released.append(run)
        placed = _place_uncached(sched, d, alts, cands, excluded)
        if placed is not None:
            result = (end, frozenset(c[0].pos for c in placed[2]))
            for c in placed[2]:
                placed[0].index.release(c)
            break
    for run in released:
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.take(claim)
    return result


def _by_end(ends: list, now: float):
    """(end, run) in the order work is expected to end, from the scheduler's sorted (end, seq, run) list: work
    already overdue ends "now", in seq order. Read lazily: a reservation usually needs only the first few."""
    cut = bisect_right(ends, (now, inf))
    for _seq, run in sorted([(e[1], e[2]) for e in ends[:cut]]):
        yield now, run
    for i in range(cut, len(ends)):
        e = ends[i]
        yield e[0], e[2]


def _place_uncached(sched, d: Demand, alts, cands, excluded=None):
    """The engine's placement without its failure cache (for trial placements)."""
    for cv in cands:
        for alt in alts:
            if cv.index.could_fit(alt[0], alt[1], alt[2], d.instances):
                claims = sched.place_gang(cv.index, alt, d.cpu, d.memory_gib, d.instances, excluded, d.one_per_node)
                if claims is not None:
                    return (cv, alt, claims)
    return None
