"""The portal's autoscaler loop (apps/control/autoscaling.py): metrics in, desired count and event out, the
engine grants the replicas, billing sees what runs."""

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.control import autoscaling
from apps.control.scheduling import run_cycle
from apps.tasks import request_rate
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.control.drive import intent
from tests.factories import ClusterFactory


def service(world, queue="high", name="svc", **fields):
    fields = {"autoscale_min": 1, "autoscale_max": 3, "autoscale_rps": 10, "gpu_spec": "1(A100)", **fields}
    task = submit_task(
        world.member,
        project=world.project,
        queue=queue,
        kind="inference",
        name=name,
        command="serve",
        port=8000,
        **fields,
    )
    run_cycle(world.vdc.pk)
    Task.objects.filter(pk=task.pk).update(status="running")
    task.refresh_from_db()
    request_rate.forget(task.pk)
    return task


def load(task, rps, now, seconds=30):
    """``rps`` requests a second for the ``seconds`` before ``now``, as the proxy counts them."""
    for s in range(int(now) - seconds, int(now)):
        for _ in range(rps):
            request_rate.count(task.pk, now=s)


def test_a_rising_request_rate_asks_for_replicas_with_its_reason_and_the_engine_grants_them(world):
    svc = service(world)
    now = time.time()
    load(svc, 25, now)
    [outcome] = autoscaling.run_autoscaler(now)
    assert (outcome.running, outcome.desired, outcome.changed) == (1, 3, True)
    svc.refresh_from_db()
    assert svc.autoscale_desired == 3
    event = svc.events.get(kind="autoscaled")
    assert "25.0 requests/s for a target of 10 per replica" in event.message
    assert event.data["desired"] == 3 and event.data["metric"] == "rps"
    run_cycle(world.vdc.pk)
    svc.refresh_from_db()
    assert len(svc.placement) == 3 and svc.replicas == 3
    assert float(svc.allocated_gpu) == 3.0  # quotas and billing count the granted replicas
    assert svc.events.filter(kind="resized").exists()


def test_slow_requests_ask_for_replicas_on_concurrency_and_the_timeline_names_it(world):
    svc = service(world, autoscale_rps=10, autoscale_concurrency=2)
    now = time.time()
    for s in range(int(now) - 30, int(now)):  # 5 requests a second, each busy 1.2 s: 6 in flight, 5 req/s
        for i in range(5):
            request_rate.count(svc.pk, now=s)
            request_rate.busy(svc.pk, s + i / 5, s + i / 5 + 1.2)
    [outcome] = autoscaling.run_autoscaler(now)
    assert (outcome.running, outcome.desired, outcome.changed) == (1, 3, True)
    event = svc.events.get(kind="autoscaled")
    assert "6.0 requests in flight for a target of 2 per replica" in event.message
    assert (event.data["metric"], event.data["value"], event.data["target"]) == ("concurrency", 6.0, 2)


def test_requests_slower_than_the_latency_target_ask_for_replicas_and_the_timeline_names_it(world):
    svc = service(world, autoscale_rps=None, autoscale_latency_ms=200)
    now = time.time()
    for s in range(int(now) - 10, int(now)):  # a request a second, each 600 ms
        request_rate.count(svc.pk, now=s)
        request_rate.busy(svc.pk, s, s + 0.6)
    [outcome] = autoscaling.run_autoscaler(now)
    assert (outcome.running, outcome.desired, outcome.changed) == (1, 3, True)
    event = svc.events.get(kind="autoscaled")
    assert "requests took 600 ms on average for a target of 200 ms" in event.message


def test_a_concurrency_reading_without_a_target_is_not_used(world):
    svc = service(world, autoscale_rps=None, autoscale_gpu_percent=None)
    now = time.time()
    request_rate.busy(svc.pk, now - 20, now)  # one request in flight all along, but no concurrency target
    [outcome] = autoscaling.run_autoscaler(now)
    assert (outcome.desired, outcome.reason) == (1, "no metric reading")


def test_gpu_utilisation_of_its_cards_scales_a_service_up(world):
    svc = service(world, autoscale_rps=None, autoscale_gpu_percent=50)
    device_ids = [d["id"] for p in svc.placement for d in p["devices"]]
    world.node.devices.filter(pk__in=device_ids).update(utilization=100)
    world.node.last_report = timezone.now() - timedelta(seconds=200)
    world.node.save()
    [stale] = autoscaling.run_autoscaler(time.time())
    assert (stale.desired, stale.reason) == (1, "no metric reading")  # the agent went quiet: no reading
    world.node.last_report = timezone.now()
    world.node.save()
    [outcome] = autoscaling.run_autoscaler(time.time())
    assert outcome.desired == 2
    assert "GPU utilisation 100% for a target of 50%" in outcome.reason


def test_no_load_scales_down_only_after_the_stabilisation_window(world):
    svc = service(world, autoscale_min=1, autoscale_max=3)
    now = time.time()
    load(svc, 30, now)
    autoscaling.run_autoscaler(now)
    run_cycle(world.vdc.pk)
    request_rate.forget(svc.pk)
    window = autoscaling.BEHAVIOUR.down_window_s
    for step in range(1, int(window // 15)):
        [o] = autoscaling.run_autoscaler(now + 15 * step)
        assert o.desired == 3, f"scaled down after {15 * step} s"
    [o] = autoscaling.run_autoscaler(now + window + 15)
    assert o.desired == 1 and o.changed
    run_cycle(world.vdc.pk)
    svc.refresh_from_db()
    # The two replicas leave its placement (and its bill) now; its job keeps their cards until the backend confirms.
    assert len(svc.placement) == 1 and len(intent(svc).device_ids) == 3


def test_scale_up_stops_at_the_project_quota(world):
    world.quota.limit_gpu = 2
    world.quota.save()
    svc = service(world, autoscale_max=4)
    now = time.time()
    load(svc, 40, now)
    [o] = autoscaling.run_autoscaler(now)
    assert o.desired == 2
    assert "quota leaves room for 1 more" in o.reason


@pytest.mark.parametrize("cluster_type", ["kubernetes", "slurm"])
def test_a_service_on_kubernetes_or_slurm_is_left_to_its_backend(world, cluster_type):
    svc = service(world)
    Task.objects.filter(pk=svc.pk).update(cluster=ClusterFactory(vdc=world.vdc, cluster_type=cluster_type))
    assert autoscaling.run_autoscaler(time.time()) == []  # the HPA scales it, or nothing can (Slurm)
    svc.refresh_from_db()
    assert svc.autoscale_desired is None


def test_a_local_cluster_whose_jobs_share_the_hosts_network_keeps_services_at_their_size(world, monkeypatch):
    service(world)
    monkeypatch.setattr("apps.clusters.executors.local.LocalExecutor.scales_services", False)
    assert autoscaling.run_autoscaler(time.time()) == []


def test_a_requeued_service_forgets_its_desired_count(world):
    svc = service(world)
    Task.objects.filter(pk=svc.pk).update(autoscale_desired=3, status="queued")
    autoscaling.run_autoscaler(time.time())
    svc.refresh_from_db()
    assert svc.autoscale_desired is None


def test_a_backend_that_refuses_new_autoscaling_settings_says_so_on_the_timeline(world, monkeypatch):
    from apps.clusters.executors.base import ExecutorError

    class Refusing:
        def update_autoscaling(self, external_id, spec):
            raise ExecutorError("forbidden: horizontalpodautoscalers", retryable=False)

    svc = service(world)
    Task.objects.filter(pk=svc.pk).update(external_id="hcs/deployment/svc")
    monkeypatch.setattr("apps.control.autoscaling.executor_for", lambda cluster: Refusing())
    autoscaling.apply_to_backend(svc.pk)
    event = svc.events.get(kind="backend_error")
    assert "did not reach local-1: forbidden" in event.message


def test_a_burst_in_the_last_seconds_panics_and_scales_on_the_short_window_at_once(world):
    svc = service(world, autoscale_max=8)
    now = float(int(time.time()))
    load(svc, 5, now - 3, seconds=12)  # 5 req/s, then 60 req/s over the last 3 s
    load(svc, 60, now, seconds=3)
    [o] = autoscaling.run_autoscaler(now)
    # The 15 s mean (16 req/s) asks for 2 and the ordinary step allows 5; the panic window asks for 6.
    assert o.desired == 6
    assert "panic: 60.0 req/s over the last 3 s for a target of 10 per replica" in o.reason
    history = autoscaling._load_histories([svc.pk])[svc.pk]
    assert history[-1].panic  # kept, so the next passes know a panic holds


# Wednesday 25 November 2026, in UTC.
WEDNESDAY = datetime(2026, 11, 25, tzinfo=UTC)
OFFICE_HOURS = [{"days": "Mon-Fri", "from": "08:00", "to": "20:00", "timezone": "UTC", "min_replicas": 3}]


def test_the_loop_raises_the_floor_at_the_scheduled_time_and_says_why(world):
    svc = service(world, autoscale_max=4, autoscale_schedule=OFFICE_HOURS)
    before = (WEDNESDAY + timedelta(hours=7, minutes=59)).timestamp()
    [o] = autoscaling.run_autoscaler(before)
    assert o.desired == 1
    [o] = autoscaling.run_autoscaler(before + 65)
    assert (o.desired, o.changed) == (3, True)
    assert o.reason == "the scheduled minimum is 3"
    assert "the scheduled minimum is 3" in svc.events.get(kind="autoscaled").message


def test_a_kubernetes_service_gets_its_settings_again_when_its_scheduled_minimum_changes(world, monkeypatch):
    from hcsportal import redis_guard

    svc = service(world, autoscale_max=4, autoscale_schedule=OFFICE_HOURS)
    Task.objects.filter(pk=svc.pk).update(
        cluster=ClusterFactory(vdc=world.vdc, cluster_type="kubernetes"), external_id="hcs/deployment/svc"
    )
    redis_guard.client().delete(autoscaling.FLOOR_KEY.format(task_id=svc.pk))
    queued = []
    monkeypatch.setattr("apps.control.triggers.enqueue", lambda name, *args, **kw: queued.append((name, args)))
    at = (WEDNESDAY + timedelta(hours=7, minutes=50)).timestamp()
    assert autoscaling.push_scheduled_floors(at) == [svc.pk]  # first seen: its HPA gets the minimum now
    assert autoscaling.push_scheduled_floors(at + 60) == []  # unchanged
    assert autoscaling.push_scheduled_floors(at + 600) == [svc.pk]  # 08:00: the entry starts
    assert autoscaling.push_scheduled_floors(at + 660) == []
    assert [name for name, _ in queued] == ["apps.control.jobs.apply_autoscaling"] * 2


def test_a_kubernetes_service_gets_its_forecast_as_the_hpa_floor_only_while_the_forecast_earns_its_place(
    world, monkeypatch
):
    from apps.queues.engine.forecast import Backtest
    from apps.tasks.models import ServiceLoadSample
    from hcsportal import redis_guard

    svc = service(world, autoscale_max=5, autoscale_predictive=True)
    Task.objects.filter(pk=svc.pk).update(
        cluster=ClusterFactory(vdc=world.vdc, cluster_type="kubernetes"), external_id="hcs/deployment/svc"
    )
    svc.refresh_from_db()
    redis_guard.client().delete(autoscaling.FLOOR_KEY.format(task_id=svc.pk))
    queued = []
    monkeypatch.setattr("apps.control.triggers.enqueue", lambda name, *args, **kw: queued.append((name, args)))
    now = time.time()
    bucket = autoscaling.bucket_start(now)
    ServiceLoadSample.objects.bulk_create(
        ServiceLoadSample(task=svc, start=bucket + timedelta(seconds=autoscaling.BUCKET_S * i), forecast_rps=35.0)
        for i in range(3)
    )
    assert autoscaling.push_scheduled_floors(now) == [svc.pk]  # first seen: no forecast earns its place yet
    assert autoscaling.backend_floor(svc, now) == (1, "the minimum is 1")

    autoscaling._keep_backtest(svc.pk, bucket, Backtest(24, 0.05, 0.2, 0.3))  # the forecast beats both
    assert autoscaling.push_scheduled_floors(now + 5) == [svc.pk]
    floor, why = autoscaling.backend_floor(svc, now + 5)
    assert floor == 4 and "forecast: 35.0 req/s within 10 min for a target of 10 per replica" in why
    event = svc.events.filter(kind="autoscaled").latest("pk")
    assert "keeps at least 4 replicas: forecast" in event.message and event.data["from"] == 1
    assert autoscaling.push_scheduled_floors(now + 10) == []  # unchanged

    autoscaling._keep_backtest(svc.pk, bucket, Backtest(24, 0.25, 0.2, 0.3))  # "last value" does better
    assert autoscaling.push_scheduled_floors(now + 15) == [svc.pk]
    assert autoscaling.backend_floor(svc, now + 15)[0] == 1
    assert [name for name, _ in queued] == ["apps.control.jobs.apply_autoscaling"] * 3
    assert ServiceLoadSample.objects.filter(task=svc, samples__gt=0).exists()  # its measured rate is recorded


def test_the_hpa_minimum_is_the_scheduled_one_while_an_entry_holds(world, monkeypatch):
    from apps.control import jobspec

    svc = service(world, autoscale_max=4, autoscale_schedule=OFFICE_HOURS)
    monkeypatch.setattr(jobspec.timezone, "now", lambda: WEDNESDAY + timedelta(hours=9))
    assert jobspec._autoscaling(svc)["min_replicas"] == 3
    monkeypatch.setattr(jobspec.timezone, "now", lambda: WEDNESDAY + timedelta(hours=21))
    assert jobspec._autoscaling(svc)["min_replicas"] == 1
