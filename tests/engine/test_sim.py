"""The simulator, the trace loaders and the stateful Scheduler the simulator drives."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.queues.engine import GpuRequest, Queue, Scheduler, Task
from apps.queues.engine.sim import SimTask, inflation, jain, percentile, replay
from apps.queues.engine.trace import TRACE_DIR, load_nodes, load_pods, to_task

from .builders import MODELS, node, running, snap, task

HAVE_TRACE = (TRACE_DIR / "openb_pod_list_default.csv").exists()


@pytest.mark.skipif(not HAVE_TRACE, reason="trace files not present")
def test_trace_nodes_load_with_their_cards():
    nodes = load_nodes()
    assert len(nodes) == 1213
    assert sum(len(n.devices) for n in nodes) == 6212


@pytest.mark.skipif(not HAVE_TRACE, reason="trace files not present")
def test_trace_pods_map_qos_to_classes_and_synthetic_tenants():
    pods = load_pods()
    by_qos = {p.qos: p.priority_class for p in pods}
    assert by_qos == {"LS": "high", "BE": "low", "Burstable": "medium", "Guaranteed": "high"}
    first = pods[1]  # openb-pod-0001: 1 GPU at 460 milli
    assert first.gpu == pytest.approx(0.46)
    assert first.tenant.startswith("syn-p") and first.tenant == load_pods()[1].tenant
    t = to_task(first, "x", {"high": "h", "medium": "m", "low": "l"}, 0.0, first.duration)
    assert t.queue_id == "h" and t.gpu.count == pytest.approx(0.46)


def test_trace_loader_reads_a_small_file(tmp_path: Path):
    f = tmp_path / "pods.csv"
    f.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
        "p0,4000,8192,2,1000,V100M16|V100M32,BE,Succeeded,10,110,20\n"
        "p1,1000,1024,0,0,,Burstable,Pending,5,50,\n"
    )
    p0, p1 = load_pods(f)
    assert (p0.gpu, p0.models, p0.duration, p0.priority_class) == (2.0, ("V100M16", "V100M32"), 90.0, "low")
    assert p1.duration is None and p1.gpu == 0


def test_percentile_and_jain():
    assert percentile([1, 2, 3, 4], 50) == 2
    assert percentile([], 99) == 0
    assert jain([1, 1, 1]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)


def _sim_task(tid, arrival, duration, queue="high", gpu=1):
    return SimTask(task(tid, queue, gpu=gpu, expected_duration_s=duration, submit_time=arrival), arrival, duration, gpu)


def test_replay_runs_every_task_to_completion():
    tasks = [_sim_task(f"t{i}", i * 10.0, 100.0) for i in range(6)]
    q = (Queue("high", "high"), Queue("medium", "medium"), Queue("low", "low"))
    r = replay("fifo", [node("n1", cards=2)], MODELS, q, tasks)
    assert r.finished == 6
    assert r.wait_p50["high"] > 0  # two cards, six tasks: some wait
    assert 0 < r.gpu_allocation <= 1


def test_replay_preempted_low_task_resumes_and_finishes():
    tasks = [_sim_task("low", 0.0, 100.0, "low"), _sim_task("hi", 10.0, 50.0)]
    q = (Queue("high", "high"), Queue("medium", "medium"), Queue("low", "low"))
    r = replay("fifo", [node("n1", cards=1)], MODELS, q, tasks)
    assert r.preemptions == 1
    assert r.finished == 2


def test_inflation_reports_unallocated_gpus_per_level():
    shapes = [Task("s", "p", "q", cpu=1, memory_gib=1, gpu=GpuRequest(0.5))]
    points = inflation([node("n1", cards=2)], MODELS, shapes, "best_fit", checkpoints=(0.5, 1.0))
    assert [p.arrived_pct for p in points] == [50, 100]
    assert points[-1].unallocated_gpus == pytest.approx(0.0)


def test_scheduler_requeues_preempted_medium_with_its_place_and_new_window():
    med = task("med", "medium", expected_duration_s=100, submit_time=3)
    s = Scheduler(snap([node("n1", cards=1)], [task("hi")], [running(med, [("n1", [0])], started_at=0)], now=200))
    d = s.cycle(200)
    assert [p.task_id for p in d.preemptions] == ["med"]
    requeued = s.queued["med"]
    assert requeued.window_s == 50 and requeued.submit_time == 3


def test_estimated_start_is_none_when_a_task_can_never_fit():
    from apps.queues.engine import schedule

    d = schedule(snap([node("n1", cards=2)], [task("big", gpu=4)]))
    assert d.waiting[0].estimated_start is None


def test_running_elastic_task_grows_with_a_resize():
    el = task("el", min_replicas=1, max_replicas=3)
    from apps.queues.engine import schedule

    d = schedule(snap([node("n1", cards=2)], [], [running(el, [("n1", [0])])]))
    assert [(r.task_id, r.replicas, len(r.added)) for r in d.resizes] == [("el", 2, 1)]


def test_simulator_runs_an_elastic_task_at_the_speed_of_its_size():
    # Linear scaling: grown from 1 to 4 replicas at once, 4000 s of work at one replica take 1000 s. With the default
    # sub-linear curve (4 replicas: 3.48x) it takes longer; shrunk back to 1 when another task arrives, it slows down.
    q = (Queue("high", "high"), Queue("low", "low"))
    nodes = [node("n1", cards=4)]

    def run(scaling, extra=()):
        el = task("el", "low", min_replicas=1, max_replicas=4, scaling=scaling)
        tasks = [SimTask(el, 0.0, 4000.0, 1.0), *extra]
        return replay("el", nodes, MODELS, q, tasks).finish_times["el"]

    assert run(1.0) == pytest.approx(1000.0)
    assert run(None) == pytest.approx(4000.0 / 3.4782608, rel=1e-4)
    # A 3-card high task arriving at 500 takes three replicas back (shrinks come before preemption): 2000 of the
    # 4000 s of work are done by then, the rest runs at one replica until the other task ends at 1500, then at four.
    other = SimTask(task("other", "high", gpu=3, expected_duration_s=1000.0, submit_time=500.0), 500.0, 1000.0, 3.0)
    assert run(1.0, [other]) == pytest.approx(1500.0 + (2000.0 - 1000.0) / 4)
