"""Property-based checks of the §4 invariants on random snapshots."""

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
    Resources,
    RunningTask,
    Scheduler,
    Snapshot,
    Task,
    VdcSettings,
    schedule,
)

from .builders import MODELS, node

RATE = {m.name: m.exchange_rate for m in MODELS}
QUEUES = (
    Queue("high", "high", policy="fifo"),
    Queue("medium", "medium", policy="drf", window_floor_s=10),
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
        started = float(draw(st.integers(0, 999)))
        window = (
            single.expected_duration_s
            if QUEUES[[q.id for q in QUEUES].index(t.queue_id)].priority_class == "medium"
            else None
        )
        running.append(RunningTask(single, n.cluster_id, (placement,), started, window))
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
