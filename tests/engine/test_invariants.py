"""Property-based checks of the scheduling invariants (docs/rules.md) on random snapshots."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apps.queues.engine import (
    Cluster,
    DeviceShare,
    GpuRequest,
    InstancePlacement,
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
from apps.queues.engine.resources import demand_of

from .builders import MODELS, node

RATE = {m.name: m.exchange_rate for m in MODELS}
QUEUES = (
    Queue("high", "high", policy="fifo"),
    # Medium tasks submitted more than 500 s before "now" reserve capacity across queues.
    Queue("medium", "medium", policy="drf", window_floor_s=10, reserve_after_s=500),
    Queue("low", "low", policy="backfill", max_gpu=6.0),
    Queue("low2", "low", guaranteed_gpu=1.0),
)
PROJECTS = ("p1", "p2", "p3")


@st.composite
def snapshots(draw):
    """A random but consistent snapshot: running tasks are packed onto real free capacity."""
    clusters = [Cluster("c1"), Cluster("c2", status=draw(st.sampled_from(["healthy", "degraded", "unavailable"])))]
    nodes = []
    for i in range(draw(st.integers(1, 5))):
        model = draw(st.sampled_from(["A100-80G", "T4", "V100"]))
        cards = draw(st.integers(1, 4))
        nodes.append(
            node(f"n{i}", cluster=draw(st.sampled_from(["c1", "c2"])), model=model, cards=cards, cpu=16, mem=64)
        )
    free = {(n.id, d.index): 1000 for n in nodes for d in n.devices}
    cpu_free = {n.id: 16.0 for n in nodes}
    now = 1000.0

    def make_task(tid, queued):
        q = draw(st.sampled_from(QUEUES))
        gpu = draw(st.sampled_from([0, 0.25, 0.5, 1, 1, 2, 3]))
        elastic = draw(st.booleans()) and gpu >= 1
        return Task(
            tid,
            draw(st.sampled_from(PROJECTS)),
            q.id,
            kind=draw(st.sampled_from(["training", "inference"])),
            owner="u",
            cpu=float(draw(st.integers(0, 4))),
            memory_gib=1.0,
            gpu=GpuRequest(gpu) if gpu else None,
            instances=1 if elastic else draw(st.integers(1, 2)),
            min_replicas=1 if elastic else None,
            max_replicas=3 if elastic else None,
            expected_duration_s=float(draw(st.integers(10, 2000)))
            if q.priority_class != "low" or draw(st.booleans())
            else None,
            submit_time=float(draw(st.integers(0, 900))),
            preemptible=draw(st.booleans()) or q.priority_class != "low",
            preemptions=draw(st.integers(0, 1)) if queued else 0,
        )

    running = []
    for i in range(draw(st.integers(0, 8))):
        t = make_task(f"r{i}", False)
        need = t.gpu.count if t.gpu else 0
        milli = int(need * 1000) if need < 1 else 1000
        cards = 0 if need < 1 else int(need)
        n = draw(st.sampled_from(nodes))
        if cpu_free[n.id] < t.cpu:
            continue
        devs = [
            d
            for d in n.devices
            if (free[(n.id, d.index)] >= milli if (milli < 1000 and need) else free[(n.id, d.index)] == 1000)
        ]
        if need and (
            len(devs) < max(cards, 1)
            or (milli < 1000 and not MODELS[[m.name for m in MODELS].index(n.devices[0].model)].shareable)
        ):
            continue
        chosen = devs[: max(cards, 1)] if need else []
        for d in chosen:
            free[(n.id, d.index)] -= milli
        cpu_free[n.id] -= t.cpu
        single = Task(
            **{**{f: getattr(t, f) for f in t.__slots__}, "instances": 1, "min_replicas": None, "max_replicas": None}
        )
        placement = InstancePlacement(
            n.id, tuple(DeviceShare(d.id, milli) for d in chosen), n.devices[0].model if chosen else None
        )
        placements = (placement,)
        if t.kind == "inference" and need == 1 and draw(st.booleans()):
            # A running autoscaled service: one or two replicas, its autoscaler asking for 1 to 3.
            single = Task(
                **{
                    **{f: getattr(single, f) for f in single.__slots__},
                    "min_replicas": 1,
                    "max_replicas": draw(st.integers(1, 3)),
                    "autoscaled": True,
                }
            )
            spare = [d for d in n.devices if free[(n.id, d.index)] == 1000]
            if spare and cpu_free[n.id] >= t.cpu and draw(st.booleans()):
                free[(n.id, spare[0].index)] -= 1000
                cpu_free[n.id] -= t.cpu
                placements += (InstancePlacement(n.id, (DeviceShare(spare[0].id, 1000),), n.devices[0].model),)
        started = float(draw(st.integers(0, 999)))
        window = (
            single.expected_duration_s
            if QUEUES[[q.id for q in QUEUES].index(t.queue_id)].priority_class == "medium"
            else None
        )
        running.append(RunningTask(single, n.cluster_id, placements, started, window))
    queued = [make_task(f"q{i}", True) for i in range(draw(st.integers(0, 10)))]
    quotas = [
        ProjectQuota(
            p,
            guaranteed=Resources(4, 16, draw(st.sampled_from([0.0, 1.0, 2.0]))),
            limit=draw(st.sampled_from([None, Resources(64, 256, 3.0), Resources(64, 256, 6.0)])),
            max_concurrent=draw(st.sampled_from([None, 3])),
            enforce=draw(st.booleans()),
        )
        for p in PROJECTS
    ]
    settings_ = VdcSettings(
        cluster_strategy=draw(
            st.sampled_from(["load_balancing", "resource_fit", "priority_weight", "affinity", "cost_optimized"])
        ),
        node_scorer=draw(st.sampled_from(["first_fit", "best_fit", "fgd"])),
    )
    return Snapshot(
        now, tuple(clusters), tuple(nodes), MODELS, QUEUES, tuple(quotas), tuple(running), tuple(queued), settings_
    )


def _final_allocation(s: Snapshot, d):
    """Per-device and per-node use after applying the decisions."""
    gone = {p.task_id for p in d.preemptions}
    removed = {(r.task_id, pl) for r in d.resizes for pl in r.removed}
    placements = []
    for rt in s.running:
        if rt.task.id in gone:
            continue
        for pl in rt.placements:
            if (rt.task.id, pl) not in removed:
                placements.append((rt.task, pl))
    for r in d.resizes:
        task = next(rt.task for rt in s.running if rt.task.id == r.task_id)
        placements.extend((task, pl) for pl in r.added)
    queued = {t.id: t for t in s.queued}
    for st_ in d.starts:
        placements.extend((queued[st_.task_id], pl) for pl in st_.placements)
    return placements


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(snapshots())
def test_no_node_or_device_is_over_allocated(s):
    d = schedule(s)
    dev_use: dict = {}
    cpu_use: dict = {}
    for task, pl in _final_allocation(s, d):
        cpu_use[pl.node_id] = cpu_use.get(pl.node_id, 0) + task.cpu
        for share in pl.devices:
            dev_use[share.device_id] = dev_use.get(share.device_id, 0) + share.milli
    assert all(v <= 1000 for v in dev_use.values())
    assert all(v <= 16 + 1e-9 for v in cpu_use.values())


@SETTINGS
@given(snapshots())
def test_enforced_limits_hold_for_new_work(s):
    d = schedule(s)
    quotas = {q.project_id: q for q in s.quotas}
    before: dict = {}
    for rt in s.running:
        before[rt.task.project_id] = before.get(rt.task.project_id, 0) + sum(
            sh.milli / 1000 * RATE[pl.gpu_model] for pl in rt.placements for sh in pl.devices
        )
    after: dict = {}
    count: dict = {}
    for task, pl in _final_allocation(s, d):
        after[task.project_id] = after.get(task.project_id, 0) + sum(
            sh.milli / 1000 * RATE[pl.gpu_model] for sh in pl.devices
        )
    for rt in s.running:
        if rt.task.id not in {p.task_id for p in d.preemptions}:
            count[rt.task.project_id] = count.get(rt.task.project_id, 0) + 1
    for st_ in d.starts:
        pid = next(t.project_id for t in s.queued if t.id == st_.task_id)
        count[pid] = count.get(pid, 0) + 1
    started_projects = {next(t.project_id for t in s.queued if t.id == x.task_id) for x in d.starts}
    started_projects |= {
        next(rt.task.project_id for rt in s.running if rt.task.id == r.task_id) for r in d.resizes if r.added
    }
    for pid in started_projects:
        q = quotas[pid]
        if not q.enforce:
            continue
        if q.limit is not None:
            assert after.get(pid, 0) <= max(q.limit.gpu, before.get(pid, 0)) + 1e-9
        if q.max_concurrent is not None:
            assert count[pid] <= max(q.max_concurrent, sum(1 for rt in s.running if rt.task.project_id == pid))


@SETTINGS
@given(snapshots())
def test_high_never_preempted_and_medium_never_inside_window(s):
    d = schedule(s)
    by_id = {rt.task.id: rt for rt in s.running}
    classes = {q.id: q.priority_class for q in s.queues}
    for p in d.preemptions:
        rt = by_id[p.task_id]
        cls = classes[rt.task.queue_id]
        assert cls != "high"
        if cls == "medium":
            assert s.now >= rt.started_at + rt.window_s
            assert p.new_window_s is not None and p.new_window_s >= min(10, rt.window_s)


@SETTINGS
@given(snapshots())
def test_gangs_are_all_or_nothing(s):
    d = schedule(s)
    queued = {t.id: t for t in s.queued}
    clusters = {n.id: n.cluster_id for n in s.nodes}
    for st_ in d.starts:
        t = queued[st_.task_id]
        if t.min_replicas is not None:
            assert t.min_replicas <= len(st_.placements) <= t.max_replicas
        else:
            assert len(st_.placements) == t.instances
        assert {clusters[pl.node_id] for pl in st_.placements} == {st_.cluster_id}


@SETTINGS
@given(snapshots())
def test_same_snapshot_gives_same_decisions(s):
    assert schedule(s) == schedule(s)


@SETTINGS
@given(snapshots())
def test_every_queued_task_is_started_or_explained(s):
    d = schedule(s)
    ids = {t.id for t in s.queued}
    assert {x.task_id for x in d.starts} | {w.task_id for w in d.waiting} == ids
    assert all(w.reason and w.message and w.position >= 1 for w in d.waiting)


@SETTINGS
@given(snapshots())
def test_queue_positions_are_one_to_n_per_queue(s):
    d = schedule(s)
    per_queue: dict = {}
    for w in d.waiting:
        per_queue.setdefault(w.queue_id, []).append(w.position)
    for positions in per_queue.values():
        assert positions == list(range(1, len(positions) + 1))


def _index_view(sched):
    """Free capacity and index buckets of a scheduler, comparable between instances."""
    free = {ns.node.id: (round(ns.free_cpu, 6), tuple(ns.dev_free)) for ns in sched.nodes}
    buckets = {}
    for cid, cv in sched.clusters.items():
        for m, lists in cv.index.whole.items():
            buckets[(cid, m)] = [sorted(sched.nodes[pos].node.id for _t, pos in lst) for lst in lists]
        for m, lst in cv.index.partial.items():
            buckets[(cid, m, "partial")] = sorted((f, sched.nodes[pos].node.id, i) for f, _t, pos, i in lst)
    return free, buckets


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snapshots())
def test_kept_scheduler_index_matches_a_fresh_one_after_cycles(s):
    sched = Scheduler(s)
    for step in range(3):
        sched.cycle(s.now + step * 1000)
        for tid in list(sched.running)[:1]:
            sched.finish(tid)
    rebuilt = Scheduler(
        Snapshot(
            s.now,
            s.clusters,
            s.nodes,
            s.gpu_models,
            s.queues,
            s.quotas,
            tuple(
                RunningTask(r.task, r.cluster_id, tuple(r.placements), r.started_at, r.window_s)
                for r in sched.running.values()
            ),
            (),
            s.settings,
        )
    )
    a_free, a_buckets = _index_view(sched)
    b_free, b_buckets = _index_view(rebuilt)
    assert a_free == b_free
    assert {k: v for k, v in a_buckets.items() if any(v)} == {k: v for k, v in b_buckets.items() if any(v)}


RANK = {"low": 0, "medium": 1, "high": 2}


def _gpu_eq(pl) -> float:
    return sum(sh.milli / 1000 * RATE[pl.gpu_model] for sh in pl.devices) if pl.gpu_model else 0.0


def _card_task(draw, tid, queue_ids, cards=(1,)):
    return Task(
        tid,
        draw(st.sampled_from(PROJECTS)),
        draw(st.sampled_from(queue_ids)),
        cpu=1.0,
        memory_gib=1.0,
        gpu=GpuRequest(draw(st.sampled_from(cards))),
        expected_duration_s=float(draw(st.integers(10, 3000))),
        submit_time=float(draw(st.integers(0, 1900))),
        preemptible=draw(st.integers(0, 4)) > 0,
    )


@st.composite
def contested_snapshots(draw, queue_ids=("medium", "low", "low2"), queued_cards=(1,), free_cards=(0, 1, 2)):
    """Whole-card work on nearly full A100 nodes: where reclaims and reservations happen."""
    nodes = [node(f"n{i}", cards=4, cpu=16, mem=64) for i in range(draw(st.integers(1, 3)))]
    free = [(n.id, d.id) for n in nodes for d in n.devices]
    running = []
    for i in range(max(0, len(free) - draw(st.sampled_from(free_cards)))):
        nid, dev = free.pop(draw(st.integers(0, len(free) - 1)))
        t = _card_task(draw, f"r{i}", ("high", "medium", "low", "low2"))
        window = t.expected_duration_s if t.queue_id == "medium" else None
        started = float(draw(st.integers(0, 1990)))
        placement = InstancePlacement(nid, (DeviceShare(dev),), "A100-80G")
        running.append(RunningTask(t, "c1", (placement,), started, window))
    queued = [_card_task(draw, f"q{i}", queue_ids, queued_cards) for i in range(draw(st.integers(1, 8)))]
    quotas = [ProjectQuota(p, guaranteed=Resources(4, 16, float(draw(st.integers(0, 4))))) for p in PROJECTS]
    return Snapshot(
        2000.0, (Cluster("c1"),), tuple(nodes), MODELS, QUEUES, tuple(quotas), tuple(running), tuple(queued)
    )


@SETTINGS
@given(snapshots())
def test_no_reclaim_preemption_while_free_capacity_could_serve_the_claimant(s):
    _no_reclaim_while_free_capacity_could_serve(s)


@SETTINGS
@given(contested_snapshots(("low", "low2")))
def test_no_reclaim_preemption_while_free_capacity_could_serve_the_claimant_on_full_nodes(s):
    _no_reclaim_while_free_capacity_could_serve(s)


def _no_reclaim_while_free_capacity_could_serve(s):
    """A project within its guarantee takes free capacity before a borrower does, so it never
    reclaims while a borrower started this cycle on cards that were free all along and would have served it."""
    d = schedule(s)
    reclaimers = {p.by_task_id for p in d.preemptions if p.reason == "quota_reclaim"}
    if not reclaimers:
        return
    qdef = {q.id: q for q in s.queues}
    quotas = {q.project_id: q for q in s.quotas}
    queued = {t.id: t for t in s.queued}
    gone = {p.task_id for p in d.preemptions}
    removed = {(r.task_id, pl) for r in d.resizes for pl in r.removed}
    held_before = {sh.device_id for rt in s.running for pl in rt.placements for sh in pl.devices}
    # Free cpu / memory per node at the snapshot; starts only take more, preemptions and shrinks give back.
    room = {n.id: [n.cpu, n.memory_gib] for n in s.nodes}
    for rt in s.running:
        for pl in rt.placements:
            room[pl.node_id][0] -= rt.task.cpu
            room[pl.node_id][1] -= rt.task.memory_gib
    # What surely stayed in use all cycle: running work that was neither preempted nor shrunk.
    base_p: dict = {}
    base_q: dict = {}
    for rt in s.running:
        if rt.task.id in gone:
            continue
        u = sum(_gpu_eq(pl) for pl in rt.placements if (rt.task.id, pl) not in removed)
        base_p[rt.task.project_id] = base_p.get(rt.task.project_id, 0.0) + u
        base_q[rt.task.queue_id] = base_q.get(rt.task.queue_id, 0.0) + u
    starts = {x.task_id: x for x in d.starts}
    for xid in reclaimers:
        x, xs = queued[xid], starts[xid]
        if len(xs.placements) != 1 or not x.gpu or x.gpu.count < 1 or not xs.placements[0].gpu_model:
            continue
        cards, x_rate = int(x.gpu.count), RATE[xs.placements[0].gpu_model]
        x_rank = RANK[qdef[x.queue_id].priority_class]
        for sid, ss in starts.items():
            t = queued[sid]
            q = qdef[t.queue_id]
            if sid == xid or len(ss.placements) != 1 or sid in {p.by_task_id for p in d.preemptions}:
                continue
            pl = ss.placements[0]
            if RANK[q.priority_class] > x_rank or not pl.gpu_model:
                continue
            # Room the claimant had on that node when it was considered, at the least: the snapshot's, less
            # every other start there (elastic growth comes after all starts).
            others = [
                queued[o.task_id]
                for o in d.starts
                if o.task_id not in (xid, sid)
                for p_ in o.placements
                if p_.node_id == pl.node_id
            ]
            if (
                room[pl.node_id][0] - sum(o.cpu for o in others) < x.cpu - 1e-9
                or room[pl.node_id][1] - sum(o.memory_gib for o in others) < x.memory_gib - 1e-9
            ):
                continue
            if (
                q.reserve_after_s is not None
                and q.priority_class == "medium"
                and s.now - t.submit_time > (q.reserve_after_s)
            ):
                continue  # a long-waiting medium task goes first by rule
            whole = [sh for sh in pl.devices if sh.milli == 1000 and sh.device_id not in held_before]
            if len(whole) < cards or len(whole) != len(pl.devices) or RATE[pl.gpu_model] > x_rate:
                continue
            use = _gpu_eq(pl)
            borrower_p = base_p.get(t.project_id, 0.0) + use > quotas[t.project_id].guaranteed.gpu + 1e-9
            borrower_q = q.guaranteed_gpu <= 0 or base_q.get(t.queue_id, 0.0) + use > q.guaranteed_gpu + 1e-9
            assert not (borrower_p and borrower_q), f"{xid} reclaimed while borrower {sid} took free cards"


@SETTINGS
@given(snapshots())
def test_no_lower_class_start_delays_a_reservation_it_could_not_be_preempted_from(s):
    _no_start_delays_a_reservation(s)


@SETTINGS
@given(contested_snapshots(("high", "medium", "low", "low2"), (1, 2, 4), (1, 2, 3)))
def test_no_lower_class_start_delays_a_reservation_on_busy_nodes(s):
    _no_start_delays_a_reservation(s)


def _no_start_delays_a_reservation(s):
    """Work started on a node reserved for a waiting high (or long-waiting medium) task is gone by
    the reservation's start, or the holder may preempt it then."""
    sched = Scheduler(s)
    d = sched.cycle(s.now)
    qdef = {q.id: q for q in s.queues}
    queued = {t.id: t for t in s.queued}
    for holder, (t_res, nodes) in sched.last_reservations.items():
        h_rank = RANK[qdef[queued[holder].queue_id].priority_class]
        assert holder not in {x.task_id for x in d.starts}
        for st_ in d.starts:
            t = queued[st_.task_id]
            cls = qdef[t.queue_id].priority_class
            if RANK[cls] > h_rank or (RANK[cls] == h_rank and cls == "high"):
                continue
            if not {pl.node_id for pl in st_.placements} & nodes:
                continue
            q = qdef[t.queue_id]
            if h_rank == 1 and q.reserve_after_s is not None and s.now - t.submit_time > q.reserve_after_s:
                continue  # long-waiting medium tasks go first, in queue order: it may precede the holder
            dur = t.expected_duration_s
            if dur is not None and s.now + dur <= t_res + 1e-6:
                continue
            if cls == "low" and t.preemptible and h_rank > 0:
                continue
            window = t.window_s if t.window_s is not None else dur
            if cls == "medium" and h_rank == 2 and t.preemptible and s.now + window <= t_res + 1e-6:
                continue
            raise AssertionError(f"{t.id} ({cls}) started on nodes reserved for {holder} from {t_res}")


# Waits that hold low work off the models the waiting high / medium task wants (capacity, queue order, reservations).
_CAPACITY_WAITS = (
    Reason.INSUFFICIENT_CAPACITY,
    Reason.HOLDS_RESERVATION,
    Reason.WAITING_FOR_RESERVATION,
    Reason.QUEUE_ORDER,
    Reason.CAPACITY_RESERVED,
)


def _could_fit_before(s: Snapshot, d, w: Task, w_cls: str, node_id: str, horizon: float) -> bool:
    """Whether one instance of the waiting task ``w`` fits on the node once every holder of it after the decisions
    ``d`` that ``w`` may preempt, or that may end before ``horizon`` (by its expected duration; at any time without
    one, or as an elastic task), is gone."""
    cls = {q.id: q.priority_class for q in QUEUES}
    start_of = {rt.task.id: (rt.started_at, rt.window_s) for rt in s.running}
    for st_ in d.starts:
        start_of[st_.task_id] = (s.now, st_.window_s)
    n = next(x for x in s.nodes if x.id == node_id)
    cpu, mem = n.cpu, n.memory_gib
    free = {dev.id: 1000 for dev in n.devices}
    for t, pl in _final_allocation(s, d):
        if pl.node_id != node_id:
            continue
        began, window = start_of[t.id]
        c = cls[t.queue_id]
        if t.expected_duration_s is None or t.max_replicas is not None or (c == "low" and t.preemptible):
            continue  # may be gone at once
        end = began + t.expected_duration_s
        if c == "medium" and w_cls == "high" and t.preemptible and window is not None:
            end = min(end, began + window)
        if end < horizon:
            continue
        cpu -= t.cpu
        mem -= t.memory_gib
        for share in pl.devices:
            free[share.device_id] -= share.milli
    dem = demand_of(w, {m.name: m for m in MODELS})
    if cpu + 1e-9 < dem.cpu or mem + 1e-9 < dem.memory_gib:
        return False
    for model, cards, milli, _eq in dem.alternatives:
        if model is None:
            return True
        ok = [free[dev.id] for dev in n.devices if dev.model == model]
        if (cards and sum(1 for f in ok if f >= 1000) >= cards) or (milli and any(f >= milli for f in ok)):
            return True
    return False


@SETTINGS
@given(snapshots())
def test_low_work_started_beside_waiting_higher_class_work_can_be_suspended_for_it(s):
    """docs/rules.md#priority-classes: low runs only on otherwise idle capacity and is suspended at once when a high or
    medium
    task needs its resources; a preempted low task starts again only when none that could use them waits. So a low
    task started while a high / medium task waits for its GPU models (or cpu) is preemptible, and if it was
    preempted before, no waiting high / medium task could fit on its nodes before it is expected to end: no waiting
    higher-class task is overtaken by low work it could not preempt, and a restarted one is not in their way."""
    d = schedule(s)
    cls = {q.id: q.priority_class for q in QUEUES}
    catalog = {m.name: m for m in MODELS}
    by_id = {t.id: t for t in s.queued}
    wanted: set = set()
    waiters = []
    for w in d.waiting:
        t = by_id[w.task_id]
        if cls[t.queue_id] == "low" or w.reason not in _CAPACITY_WAITS or "larger than any node" in w.message:
            continue
        dem = demand_of(t, catalog)
        wanted |= dem.models or {"cpu"}
        waiters.append(t)
    for st_ in d.starts:
        t = by_id[st_.task_id]
        if cls[t.queue_id] != "low":
            continue
        got = {p.gpu_model or "cpu" for p in st_.placements}
        if got & wanted:
            assert t.preemptible, (t.id, got, wanted)
            if t.preemptions:
                horizon = s.now + (t.expected_duration_s if t.expected_duration_s is not None else float("inf"))
                for w in waiters:
                    for pl in st_.placements:
                        assert not _could_fit_before(s, d, w, cls[w.queue_id], pl.node_id, horizon), (t.id, w.id)
