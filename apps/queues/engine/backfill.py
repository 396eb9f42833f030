"""EASY backfill reservations (SPEC §4, policy "backfill")."""

from __future__ import annotations

from .resources import Demand


def reserve(sched, d: Demand, alts, cands, now: float):
    """EASY backfill: when would the head fit, and on which nodes (from expected ends)?"""
    ends = []
    eligible = {cv.cluster.id for cv in cands}
    for run in sched.running.values():
        dur = run.task.expected_duration_s  # run.expected_end(), inlined: this walks every running task
        if dur is not None and run.cluster_id in eligible:
            end = run.started_at + dur
            ends.append((end if end > now else now, run.seq, run))
    ends.sort()  # by end, then seq (unique: the runs themselves are never compared)
    released = []
    result = None
    for end, _seq, run in ends:
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.release(claim)
        released.append(run)
        placed = _place_uncached(sched, d, alts, cands)
        if placed is not None:
            result = (end, frozenset(c[0].pos for c in placed[2]))
            for c in placed[2]:
                placed[0].index.release(c)
            break
    for run in released:
        for claim in run.claims:
            sched.clusters[run.cluster_id].index.take(claim)
    return result


def _place_uncached(sched, d: Demand, alts, cands):
    """The engine's placement without its failure cache (for trial placements)."""
    for cv in cands:
        for alt in alts:
            if cv.index.could_fit(alt[0], alt[1], alt[2], d.instances):
                claims = sched.place_gang(cv.index, alt, d.cpu, d.memory_gib, d.instances, None, d.one_per_node)
                if claims is not None:
                    return (cv, alt, claims)
    return None
