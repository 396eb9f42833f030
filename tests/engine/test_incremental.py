"""A long-lived Scheduler decides exactly what a fresh ``schedule(snapshot)`` of the same state decides.

The Scheduler keeps caches (failed placements, release lists, eligible clusters) and computes waiting
positions and estimates lazily; none of that may change a decision. Random workloads (submits,
finishes, cancellations, time steps) run through one Scheduler, and after every cycle a fresh
snapshot of its state is scheduled from scratch and must give the same starts, preemptions,
resizes, waiting positions, estimates and reasons.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from apps.queues.engine import (
    Cluster,
    GpuRequest,
    ProjectQuota,
    Queue,
    Reason,
    Resources,
    RunningTask,
    Scheduler,
    Snapshot,
    Task,
    VdcSettings,
    schedule,
)

from .builders import MODELS, node, running, snap, started, task, waiting

QUEUES = (
    Queue("high", "high", policy="fifo"),
    Queue("high-bf", "high", policy="backfill"),
    Queue("medium", "medium", policy="drf", window_floor_s=10),
    Queue("medium-bf", "medium", policy="backfill", window_floor_s=10),
    Queue("low", "low", policy="backfill", max_gpu=6.0),
    Queue("low2", "low", guaranteed_gpu=1.0),
)
PROJECTS = ("p1", "p2", "p3", "p4")


def _config(rnd: random.Random):
    clusters = (
        Cluster("c1"),
        Cluster("c2", type="slurm", resizable=False, max_total_tasks=rnd.choice([None, 6])),
        Cluster("c3", status=rnd.choice(["healthy", "degraded"])),
    )
    nodes = tuple(
        node(
            f"n{i}",
            cluster=rnd.choice(["c1", "c2", "c3"]),
            model=rnd.choice(["A100-80G", "T4", "V100"]),
            cards=rnd.choice([2, 4, 8]),
            cpu=32,
            mem=128,
        )
        for i in range(rnd.randint(3, 8))
    )
    quotas = tuple(
        ProjectQuota(
            p,
            guaranteed=Resources(4, 16, rnd.choice([0.0, 1.0, 2.0, 4.0])),
            limit=rnd.choice([None, Resources(64, 256, 4.0), Resources(64, 256, 10.0)]),
            max_concurrent=rnd.choice([None, 4]),
            enforce=rnd.random() < 0.5,
            priority=rnd.choice([0, 0, 1]),
        )
        for p in PROJECTS
    )
    settings = VdcSettings(
        cluster_strategy=rnd.choice(
            ["load_balancing", "resource_fit", "priority_weight", "affinity", "cost_optimized"]
        ),
        node_scorer=rnd.choice(["first_fit", "best_fit"]),
    )
    return clusters, nodes, quotas, settings


def _task(rnd: random.Random, tid: str, now: float) -> Task:
    q = rnd.choice(QUEUES)
    gpu = rnd.choice([0, 0.25, 0.5, 1, 1, 1, 2, 4, 8])
    elastic = gpu >= 1 and rnd.random() < 0.15
    return Task(
        tid,
        rnd.choice(PROJECTS),
        q.id,
        kind=rnd.choice(["training", "inference"]),
        owner=rnd.choice(["u1", "u2"]),
        cpu=float(rnd.randint(0, 4)),
        memory_gib=1.0,
        gpu=GpuRequest(gpu, rnd.choice([(), (), ("A100-80G",), ("T4", "V100")])) if gpu else None,
        instances=1 if elastic else rnd.choice([1, 1, 1, 2]),
        min_replicas=1 if elastic else None,
        max_replicas=3 if elastic else None,
        expected_duration_s=float(rnd.randint(20, 3000)) if q.priority_class != "low" or rnd.random() < 0.7 else None,
        submit_time=now + rnd.randint(0, 5),
        preemptible=rnd.random() < 0.8 or q.priority_class != "low",
    )


def _snapshot_of(sched: Scheduler, now: float, clusters, nodes, quotas, settings) -> Snapshot:
    """The scheduler's state as a snapshot: running work in start order, queued work in submit order."""
    running = tuple(
        RunningTask(r.task, r.cluster_id, tuple(r.placements), r.started_at, r.window_s)
        for r in sorted(sched.running.values(), key=lambda r: r.seq)
    )
    return Snapshot(now, clusters, nodes, MODELS, QUEUES, quotas, running, tuple(sched.queued.values()), settings)


def _decisions(d):
    return (d.starts, d.preemptions, d.resizes, tuple(d.waiting))


@pytest.mark.parametrize("seed", range(40))
def test_kept_scheduler_decides_like_a_fresh_schedule_every_cycle(seed):
    rnd = random.Random(seed)
    clusters, nodes, quotas, settings = _config(rnd)
    now = 1000.0
    initial = [_task(rnd, f"t{i}", now - 100) for i in range(rnd.randint(0, 15))]
    sched = Scheduler(Snapshot(now, clusters, nodes, MODELS, QUEUES, quotas, (), tuple(initial), settings))
    n = len(initial)
    for _cycle in range(25):
        expected = schedule(_snapshot_of(sched, now, clusters, nodes, quotas, settings))
        got = sched.cycle(now)
        assert (got.starts, got.preemptions, got.resizes) == (expected.starts, expected.preemptions, expected.resizes)
        # Waiting entries are computed as they are read: read a first page now and the rest only after the
        # scheduler has moved on, which must not change them.
        page = rnd.randint(0, 3)
        assert got.waiting[:page] == tuple(expected.waiting)[:page]
        # Between cycles: a few arrivals, some running work ends, now and then a queued task is cancelled.
        now += rnd.choice([1.0, 30.0, 300.0, 2000.0])
        for _ in range(rnd.choice([0, 0, 1, 2, 5])):
            sched.submit(_task(rnd, f"t{n}", now))
            n += 1
        for tid in list(sched.running):
            if rnd.random() < 0.15:
                sched.finish(tid)
        if sched.queued and rnd.random() < 0.1:
            sched.finish(rnd.choice(list(sched.queued)))
        assert _decisions(got) == _decisions(expected)


def _loaded_scheduler():
    rnd = random.Random(7)
    clusters, nodes, quotas, settings = _config(rnd)
    queued = tuple(_task(rnd, f"t{i}", 900.0) for i in range(40))
    snap = Snapshot(1000.0, clusters, nodes, MODELS, QUEUES, quotas, (), queued, settings)
    return snap, Scheduler(snap)


def test_waiting_entries_are_computed_only_as_far_as_they_are_read(monkeypatch):
    from apps.queues.engine import estimate

    calls = []
    real = estimate.Estimator.next
    monkeypatch.setattr(estimate.Estimator, "next", lambda self, *a: calls.append(1) or real(self, *a))
    snap, sched = _loaded_scheduler()
    d = sched.cycle(snap.now)
    assert len(d.waiting) > 10 and not calls
    first = d.waiting[:3]
    assert len(first) == 3 and len(calls) == 3
    assert d.waiting[1] == first[1] and len(calls) == 3
    assert tuple(d.waiting) == schedule(snap).waiting


def test_waiting_list_reads_like_a_tuple():
    import pickle

    snap, sched = _loaded_scheduler()
    w = sched.cycle(snap.now).waiting
    eager = schedule(snap).waiting
    assert isinstance(eager, tuple)
    assert w == eager and eager == w and w == list(eager)
    assert w[-1] == eager[-1] and w[2:5] == eager[2:5] and w[::-2] == eager[::-2]
    assert hash(w) == hash(eager)
    assert pickle.loads(pickle.dumps(w)) == eager
    assert [x.position for x in w if x.queue_id == "low"] == list(range(1, 1 + sum(x.queue_id == "low" for x in w)))
    with pytest.raises(IndexError):
        w[len(w)]


def test_preemption_forgets_failed_cpu_only_placements_on_the_freed_node():
    """A preemption frees cores as well as cards: a CPU-only request that failed on that cluster in an earlier
    cycle (its failure kept, nothing was given back in between) must be tried again, not remembered as failing."""
    from .builders import queues, running, snap, started, task

    busy = task("busy", queue="medium", gpu=1, cpu=8.0, expected_duration_s=1000)
    cpu_job = task("cpu-job", queue="medium", gpu=0, cpu=2.0, expected_duration_s=50)
    first = snap(
        [node("n1", cpu=8.0)],
        queued=[cpu_job],
        running=[running(busy, [("n1", [0])], window=10.0)],
        qs=queues(),
    )
    sched = Scheduler(first)
    # A medium task never preempts medium work: the CPU-only task fails and its failure is cached.
    assert started(sched.cycle(first.now)) == []
    sched.submit(task("urgent", queue="high", gpu=1, cpu=4.0))
    d = sched.cycle(first.now + 1)
    # The high task preempts the medium one past its window, which leaves 4 cores free for the CPU-only task.
    assert [p.task_id for p in d.preemptions] == ["busy"]
    assert sorted(started(d)) == ["cpu-job", "urgent"]


def test_low_tasks_decided_from_an_identical_earlier_one_decide_as_if_considered_alone(monkeypatch):
    """A low task without reclaim rights that finds no room is decided from an identical earlier task of the cycle
    (``Scheduler._remember``) until capacity is taken or given back; the decisions equal those of a scheduler that
    considers every task in full. Larger backlogs than above, so identical low tasks meet in one cycle."""
    from apps.queues.engine import engine

    lookups = {"found": 0}

    class CountingMemo(dict):
        def get(self, key, default=None):
            value = super().get(key, default)
            lookups["found"] += value is not None
            return value

    real_cycle_init = engine.Cycle.__init__

    def counting_cycle(self, now):
        real_cycle_init(self, now)
        self.low_memo = CountingMemo()

    def common_task(rnd, tid, now):
        t = _task(rnd, tid, now)
        if rnd.random() < 0.5:  # a few common low shapes, so identical low tasks meet
            gpu = GpuRequest(rnd.choice([1, 4, 8]), ()) if rnd.random() < 0.8 else None
            t = replace(t, queue_id="low", cpu=1.0, gpu=gpu, instances=1, min_replicas=None, max_replicas=None)
        return t

    monkeypatch.setattr(engine.Cycle, "__init__", counting_cycle)
    for seed in range(30):
        rnd = random.Random(1000 + seed)
        clusters, nodes, quotas, settings = _config(rnd)
        now = 1000.0
        initial = [common_task(rnd, f"t{i}", now - 100) for i in range(rnd.randint(20, 60))]
        snap = Snapshot(now, clusters, nodes, MODELS, QUEUES, quotas, (), tuple(initial), settings)
        memo, full = Scheduler(snap), Scheduler(snap)
        n = len(initial)
        for _cycle in range(15):
            got = memo.cycle(now)
            with monkeypatch.context() as m:
                m.setattr(Scheduler, "_remember", lambda *a, **k: None)
                expected = full.cycle(now)
            assert _decisions(got) == _decisions(expected), (seed, _cycle)
            now += rnd.choice([1.0, 30.0, 300.0])
            for _ in range(rnd.choice([0, 2, 5, 10])):
                t = common_task(rnd, f"t{n}", now)
                memo.submit(t)
                full.submit(t)
                n += 1
            for tid in sorted(memo.running):
                if rnd.random() < 0.15:
                    memo.finish(tid)
                    full.finish(tid)
    assert lookups["found"] > 100  # the memo was really used


def _behind_a_blocked_backfill_head(*low):
    """``low`` tasks queued behind a 4-card low backfill head on two 4-card nodes: n1 has 2 cards free until 1000
    (the head reserves n1 from then), n2 none until 5000."""
    busy = [
        running(task("a", "high", gpu=2, expected_duration_s=1000), [("n1", [0, 1])], started_at=0),
        running(task("b", "high", gpu=4, expected_duration_s=5000), [("n2", [0, 1, 2, 3])], started_at=0),
    ]
    queued = [task("head", "low", gpu=4, submit_time=1), *low]
    qs = (Queue("high", "high"), Queue("low", "low", "backfill"))
    return schedule(snap([node("n1"), node("n2")], queued, busy, qs=qs, now=50))


def test_a_short_low_task_backfills_after_an_identical_long_one_waited_for_the_reservation():
    """Two low tasks of one shape behind a blocked backfill head: the long one would delay the head's reservation
    and waits, the short one ends before it and starts. The second is not decided from the first
    (``Scheduler._remember`` keys the reserved nodes a task must keep off)."""
    d = _behind_a_blocked_backfill_head(
        task("long", "low", gpu=1, submit_time=2, expected_duration_s=5000),
        task("short", "low", gpu=1, submit_time=3, expected_duration_s=100),
    )
    assert started(d) == ["short"]
    assert waiting(d)["long"].reason == Reason.WAITING_FOR_RESERVATION


def test_a_low_task_waiting_for_a_reservation_is_not_remembered_past_a_start_that_takes_the_room():
    """A long low task waits for the backfill head's nodes (it would fit there); a short one then starts on that
    room, so the next long task of the same shape fits nowhere: it waits for capacity, not for the reservation."""
    d = _behind_a_blocked_backfill_head(
        task("long1", "low", gpu=1, submit_time=2, expected_duration_s=5000),
        task("short", "low", gpu=2, submit_time=3, expected_duration_s=100),
        task("long2", "low", gpu=1, submit_time=4, expected_duration_s=5000),
    )
    assert started(d) == ["short"]
    w = waiting(d)
    assert w["long1"].reason == Reason.WAITING_FOR_RESERVATION
    assert w["long2"].reason == Reason.INSUFFICIENT_CAPACITY


def test_a_low_task_is_not_remembered_past_a_start_that_uses_up_a_clusters_task_limit():
    """With cluster task limits a start can take a cluster out of a task's eligible ones: an identical later low
    task is decided afresh and finds no eligible cluster."""
    busy = [running(task("r", "high", gpu=3, expected_duration_s=1000), [("n1", [0, 1, 2])], started_at=0)]
    queued = [
        task("a", "low", gpu=2, submit_time=1, expected_duration_s=100),
        task("s", "low", gpu=1, submit_time=2, expected_duration_s=100),
        task("b", "low", gpu=2, submit_time=3, expected_duration_s=100),
    ]
    qs = (Queue("high", "high"), Queue("low", "low", "backfill"))
    clusters = (Cluster("c1", max_total_tasks=2),)
    d = schedule(snap([node("n1")], queued, busy, qs=qs, now=50, clusters=clusters))
    assert started(d) == ["s"]
    w = waiting(d)
    assert w["a"].reason == Reason.INSUFFICIENT_CAPACITY
    assert w["b"].reason == Reason.NO_ELIGIBLE_CLUSTER


def test_victim_units_kept_for_the_cycle_decide_as_if_rebuilt_for_every_plan(monkeypatch):
    """Class-preemption victim units are built once per cycle and (class, cluster, models, excluded nodes) and only
    filtered for runs gone since (``preemption._units``, and by node in ``preemption._cheapest_nodes``); the decisions
    equal those of a scheduler that rebuilds them for every plan. Crowded clusters and many high / medium arrivals,
    so plans meet evicted and shrunk runs."""
    from apps.queues.engine import engine

    lookups = {"found": 0, "shrinks": 0, "nodes": 0}

    class CountingUnits(dict):
        def get(self, key, default=None):
            value = super().get(key, default)
            lookups["found"] += value is not None
            return value

    class NoUnits(dict):
        def get(self, key, default=None):
            return None

    real_cycle_init = engine.Cycle.__init__
    kept_units = {"on": True}

    def cycle_init(self, now):
        real_cycle_init(self, now)
        self.units = CountingUnits() if kept_units["on"] else NoUnits()
        if not kept_units["on"]:
            self.unit_nodes = NoUnits()

    def elastic(t):
        """Elastic low or medium work, which grows into idle cards and whose replicas plans shrink first."""
        gpu = GpuRequest(rnd.choice([1, 2]), ())
        queue = rnd.choice(["low", "low2", "medium"])
        return replace(
            t, queue_id=queue, gpu=gpu, instances=1, min_replicas=1, max_replicas=6, expected_duration_s=500.0
        )

    from apps.queues.engine import preemption

    real_cheapest = preemption._cheapest_nodes

    def checked_cheapest(sched, cv, d, alts, units, ckey, cyc):
        got = real_cheapest(sched, cv, d, alts, units, ckey, cyc)
        if ckey is not None:
            # Walked from the kept list and node table: the same nodes, in the same order, as from a fresh list.
            live = [u for u in units if sched.running.get(u[2].task.id) is u[2]]
            assert got == real_cheapest(sched, cv, d, alts, live, None, cyc)
            lookups["nodes"] += 1
        return got

    monkeypatch.setattr(preemption, "_cheapest_nodes", checked_cheapest)
    monkeypatch.setattr(engine.Cycle, "__init__", cycle_init)
    for seed in range(30):
        rnd = random.Random(2000 + seed)
        clusters, nodes, quotas, settings = _config(rnd)
        if rnd.random() < 0.5:
            quotas = ()  # no guarantees: every plan is class preemption alone
        now = 1000.0
        initial = [_task(rnd, f"t{i}", now - 100) for i in range(rnd.randint(5, 30))]
        initial = [elastic(t) if rnd.random() < 0.4 else t for t in initial]
        snap = Snapshot(now, clusters, nodes, MODELS, QUEUES, quotas, (), tuple(initial), settings)
        kept, rebuilt = Scheduler(snap), Scheduler(snap)
        n = len(initial)
        for _cycle in range(12):
            kept_units["on"] = True
            got = kept.cycle(now)
            kept_units["on"] = False
            expected = rebuilt.cycle(now)
            assert _decisions(got) == _decisions(expected), (seed, _cycle)
            lookups["shrinks"] += sum("gives replicas back" in r.message for r in got.resizes)
            now += rnd.choice([1.0, 30.0, 300.0, 2000.0])
            for _ in range(rnd.choice([2, 5, 10])):
                t = _task(rnd, f"t{n}", now)
                if rnd.random() < 0.4:
                    t = replace(t, queue_id=rnd.choice(["high", "high-bf", "medium"]))
                    if not t.expected_duration_s:
                        t = replace(t, expected_duration_s=100.0)
                elif rnd.random() < 0.5:
                    t = elastic(t)
                kept.submit(t)
                rebuilt.submit(t)
                n += 1
            for tid in sorted(kept.running):
                if rnd.random() < 0.1:
                    kept.finish(tid)
                    rebuilt.finish(tid)
    # The kept units were really read again, and plans shrank replicas (which must clear them).
    assert lookups["found"] > 500 and lookups["shrinks"] > 5 and lookups["nodes"] > 500


def test_kept_victims_are_walked_by_each_nodes_cheapest_live_victim(monkeypatch):
    """Two high tasks preempt from six nodes full of 1-card low work, the cheapest victim of n<i> having run i + 1 s
    and every other one 90 s. The first evicts n0's cheapest; the second reads the kept list, where n0 still comes
    first by its gone victim: it must rank by its next one (90 s) and leave the four candidate nodes to n1-n4."""
    from apps.queues.engine import preemption

    from .builders import node, preempted, running, snap, started, task

    seen = []
    real = preemption._cheapest_nodes

    def recording(sched, cv, d, alts, units, ckey, cyc):
        got = real(sched, cv, d, alts, units, ckey, cyc)
        seen.append(sorted({c[0].node.id for lst in got for u in lst[:1] for c in preemption._claims_of(u)}))
        return got

    monkeypatch.setattr(preemption, "_cheapest_nodes", recording)
    busy = []
    for i in range(6):
        for card in range(4):
            t = task(f"l{i}-{card}", "low", gpu=1)
            busy.append(running(t, [(f"n{i}", [card])], started_at=99.0 - i if card == 0 else 10.0))
    queued = [task("h1", "high", gpu=1, submit_time=1), task("h2", "high", gpu=1, submit_time=2)]
    d = schedule(snap([node(f"n{i}") for i in range(6)], queued, busy))
    assert sorted(started(d)) == ["h1", "h2"]
    assert sorted(preempted(d)) == ["l0-0", "l1-0"]
    assert seen == [["n0", "n1", "n2", "n3"], ["n1", "n2", "n3", "n4"]]


def _gang_reference(sched, now: float, d):
    """The gang clock worked out eagerly from the scheduler's state as it is now: every node's room per pool key
    and every running task's releases, by (end clamped to now, seq) (what ``estimate.Clocks`` freezes lazily)."""
    from apps.queues.engine.estimate import EPS, WHOLE

    nodes: dict = {}
    for cid, cv in sched.clusters.items():
        if not cv.usable:
            continue
        per = nodes[cid] = {}
        for ns in cv.index.schedulable:
            room = {"cpu": max(ns.free_cpu, 0.0)}
            for i, m in enumerate(ns.dev_model):
                if ns.dev_ok[i]:
                    room[m] = room.get(m, 0.0) + ns.dev_free[i]
            per[ns.pos] = room
    events = []
    for run in sched.running.values():
        end = run.expected_end()
        if end is None:
            continue
        for ns, cpu, _mem, devs in run.claims:
            if not devs:
                events.append((max(end, now), run.seq, ns.cluster_id, ns.pos, "cpu", cpu))
            for i, milli in devs:
                events.append((max(end, now), run.seq, ns.cluster_id, ns.pos, ns.dev_model[i], milli))
    events.sort(key=lambda e: (e[0], e[1]))
    best = (None, None)
    for model, cards, milli, _eq in d.alternatives:
        key = model or "cpu"
        need = d.cpu if model is None else (cards * WHOLE if cards else milli)
        if need <= 0:
            continue
        for cid, per in nodes.items():
            room = {pos: r.get(key, 0.0) for pos, r in per.items()}
            fit = sum(int((v + EPS) // need) for v in room.values())
            if fit >= d.instances:
                best = (now, None)
                break
            for end, seq, ecid, pos, ekey, amount in events:
                if best[0] is not None and end >= best[0]:
                    break
                if ecid != cid or ekey != key or pos not in room:
                    continue
                before = int((room[pos] + EPS) // need)
                room[pos] += amount
                fit += int((room[pos] + EPS) // need) - before
                if fit >= d.instances:
                    best = (end, seq)
                    break
        if best == (now, None):
            break
    return best


@pytest.mark.parametrize("seed", range(30))
def test_gang_clock_read_late_equals_the_eager_clock_of_the_cycle(seed):
    """The gang clock freezes the nodes' room and the running tasks when the cycle ends and works out the rooms
    and releases only when a gang's estimate is read: read after later cycles (elastic tasks grown or shrunk,
    work finished, time passed), it gives what the eager computation at the end of the cycle gave."""
    from apps.queues.engine.estimate import Clocks
    from apps.queues.engine.resources import Demand

    rnd = random.Random(500 + seed)
    clusters, nodes, quotas, settings = _config(rnd)

    def gang_task(tid, now):
        t = _task(rnd, tid, now)
        if rnd.random() < 0.3 and t.gpu is not None and t.gpu.count >= 1:
            t = replace(t, instances=1, min_replicas=1, max_replicas=4)  # elastic: its claims change later
        return replace(t, expected_duration_s=float(rnd.choice([50, 400, 3000])))

    now = 1000.0
    initial = [gang_task(f"t{i}", now - 100) for i in range(rnd.randint(10, 40))]
    sched = Scheduler(Snapshot(now, clusters, nodes, MODELS, QUEUES, quotas, (), tuple(initial), settings))
    n = len(initial)
    for _cycle in range(8):
        sched.cycle(now)
        shapes = {}
        for t in list(sched.queued.values()) + [_task(rnd, f"probe{k}", now) for k in range(6)]:
            for inst in (1, 2, 3, 5, 8):
                d = sched.demand(t, instances=inst)
                if isinstance(d, Demand):
                    shapes[(id(d), inst)] = d
        demands = list(shapes.values())
        expected = [_gang_reference(sched, now, d) for d in demands]
        clocks = Clocks(sched, list(sched.running.values()), now, True, False)
        # Read some now and the rest after the scheduler moved on.
        cut = rnd.randint(0, len(demands))
        assert [clocks.gang(d) for d in demands[:cut]] == expected[:cut]
        now += rnd.choice([1.0, 30.0, 300.0, 2000.0])
        for _ in range(rnd.choice([1, 3, 6])):
            sched.submit(gang_task(f"t{n}", now))
            n += 1
        for tid in list(sched.running):
            if rnd.random() < 0.2:
                sched.finish(tid)
        sched.cycle(now)
        assert [clocks.gang(d) for d in demands[cut:]] == expected[cut:]


def test_gang_clock_takes_releases_already_due_in_start_order():
    """Two running tasks past their expected ends both count as giving back now, in start order (seq): the one
    started second completes a 4-card request, whatever their ends were."""
    from apps.queues.engine.estimate import Clocks

    a = running(task("a", gpu=2, expected_duration_s=50), [("n1", [0, 1])])
    b = running(task("b", gpu=2, expected_duration_s=10), [("n1", [2, 3])])
    sched = Scheduler(snap([node("n1")], running=[a, b], now=100))
    d = sched.demand(task("g", gpu=4))
    seq_b = sched.running["b"].seq
    assert sched.running["a"].seq < seq_b
    assert Clocks(sched, list(sched.running.values()), 100.0, True, False).gang(d) == (100.0, seq_b)
    assert _gang_reference(sched, 100.0, d) == (100.0, seq_b)


def test_gang_clock_keeps_an_elastic_tasks_replicas_as_they_were_when_frozen():
    """An elastic task's replicas change after the cycle (one is given back): the clock read later still counts
    the replicas it had when the cycle ended."""
    from apps.queues.engine.estimate import Clocks

    svc = task("svc", gpu=2, expected_duration_s=200, min_replicas=1, max_replicas=2)
    sched = Scheduler(snap([node("n1")], running=[running(svc, [("n1", [0, 1]), ("n1", [2, 3])])], now=100))
    d = sched.demand(task("g", gpu=4))
    run = sched.running["svc"]
    clocks = Clocks(sched, list(sched.running.values()), 100.0, True, False)
    expected = _gang_reference(sched, 100.0, d)
    assert expected == (200.0, run.seq)
    run.claims.pop()  # as a shrink does (Scheduler._shrink)
    assert clocks.gang(d) == expected


def test_cycle_shortcuts_decide_as_the_long_way_round(monkeypatch):
    """A task behind the blocked head of a strict queue waits without the checks that cannot stop it, a wait's
    demand is marked as starving once per class and cycle, and a preemptible low task skips the scan of the
    cross-class reservations (every holder is high or medium and may preempt it). Schedulers taking the long way
    round (every check, every wait marked, every reservation scanned) decide the same, cycle after cycle."""
    from apps.queues.engine import engine
    from apps.queues.engine.model import CLASS_RANK, HIGH, MEDIUM
    from apps.queues.engine.resources import EPS

    class Forgetful(dict):
        def get(self, key, default=None):
            return None

    def held_off_long_way(self, task, cls, cyc):
        if cls == HIGH:
            return None
        rank = CLASS_RANK[cls]
        now = cyc.now
        dur = task.expected_duration_s
        end = None if dur is None else now + dur
        window_end = None
        if cls == MEDIUM and task.preemptible:
            window = task.window_s if task.window_s is not None else dur
            window_end = None if window is None else now + window
        out: set = set()
        for t_res, nodes, holder_rank, holder in cyc.class_res:
            if holder_rank < rank or holder == task.id:
                continue
            if end is not None and end <= t_res + EPS:
                continue
            if cls == "low" and task.preemptible and holder_rank > rank:
                continue
            if window_end is not None and holder_rank == CLASS_RANK[HIGH] and window_end <= t_res + EPS:
                continue
            out |= nodes
        return frozenset(out) if out else None

    real_cycle_init = engine.Cycle.__init__

    def long_way_cycle(self, now):
        real_cycle_init(self, now)
        self.starving_marked = Forgetful()

    queues = QUEUES + (Queue("high-long", "high", policy="fifo"), Queue("medium-wait", "medium", reserve_after_s=60))
    for seed in range(30):
        rnd = random.Random(3000 + seed)
        clusters, nodes, quotas, settings = _config(rnd)

        def mixed(tid, now, rnd=rnd):
            t = _task(rnd, tid, now)
            r = rnd.random()
            if r < 0.3:
                t = replace(t, queue_id=rnd.choice(["high-long", "medium-wait"]), expected_duration_s=600.0)
            elif r < 0.6:  # one model each, so waits for different models meet low work that could use them
                gpu = GpuRequest(rnd.choice([1, 2, 4]), (rnd.choice(["A100-80G", "T4", "V100"]),))
                t = replace(t, gpu=gpu, instances=1, min_replicas=None, max_replicas=None)
            return t

        now = 1000.0
        initial = [mixed(f"t{i}", now - rnd.choice([10, 100, 1000])) for i in range(rnd.randint(20, 60))]
        snap_ = Snapshot(now, clusters, nodes, MODELS, queues, quotas, (), tuple(initial), settings)
        short, long_way = Scheduler(snap_), Scheduler(snap_)
        n = len(initial)
        for _cycle in range(12):
            got = short.cycle(now)
            with monkeypatch.context() as m:
                m.setattr(engine.Cycle, "__init__", long_way_cycle)
                m.setattr(Scheduler, "_held_off", held_off_long_way)
                m.setattr(Scheduler, "_consider", Scheduler._consider_full)
                expected = long_way.cycle(now)
                assert _decisions(got) == _decisions(expected), (seed, _cycle)
            now += rnd.choice([1.0, 30.0, 300.0])
            for _ in range(rnd.choice([0, 2, 5, 10])):
                t = mixed(f"t{n}", now)
                short.submit(t)
                long_way.submit(t)
                n += 1
            for tid in sorted(short.running):
                if rnd.random() < 0.15:
                    short.finish(tid)
                    long_way.finish(tid)


def test_waits_for_different_models_each_keep_low_work_off_their_model():
    """Two high tasks wait, one for T4 cards, one for V100 cards (marked once per demand, not once per class):
    a non-preemptible low task that would fit on the free V100 cards keeps off them."""
    busy = [
        running(task("r1", gpu=4, models=("T4",), expected_duration_s=900), [("n1", [0, 1, 2, 3])], model="T4"),
        running(task("r2", gpu=2, models=("V100",), expected_duration_s=900), [("n2", [0, 1])], model="V100"),
    ]
    queued = [
        task("h-t4", gpu=4, models=("T4",), submit_time=1),
        task("h-v100", gpu=4, models=("V100",), submit_time=2),
        task("low", "low", gpu=1, models=("V100",), submit_time=3, preemptible=False),
    ]
    d = schedule(snap([node("n1", model="T4"), node("n2", model="V100")], queued, busy))
    assert started(d) == []
    assert waiting(d)["low"].reason == Reason.WAITING_FOR_HIGHER_CLASS
