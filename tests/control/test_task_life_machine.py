"""A stateful property test of a task's life over the real services, database and a Kubernetes API emulator.

Hypothesis drives submissions (whole cards, shares, gangs, elastic tasks, services that scale to zero, three
classes), scheduling cycles, launches, the backend running and losing work, reconciliation, stops, services falling
asleep and woken, and node agent reports that drop, bring back, add and renumber cards. After every step:

- no card is held beyond its capacity, neither by the active tasks' placements nor by the jobs on the backend;
- the capacity ledger stored on each active task is what its placement holds, and the sum over active tasks is
  what the API, /metrics and the quota admin show;
- no card a task or a job holds is ever deleted, and nothing new is placed on a missing card;
- no task waits to launch while the capacity it was given is free (it waits only for jobs no live attempt wants);
- every active task is on a cluster whose type can run it (a command without an image never goes to Kubernetes).
"""

from __future__ import annotations

import os
from decimal import Decimal

import pytest
from django.contrib.admin.sites import site
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import Client, RequestFactory
from hypothesis import HealthCheck
from hypothesis import settings as machine_settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule, run_state_machine_as_test
from prometheus_client.parser import text_string_to_metric_families

from apps.clusters.capabilities import capabilities, refusal
from apps.clusters.gpuspec import parse_gpu_spec
from apps.clusters.models import Device
from apps.clusters.services import apply_node_report, catalog
from apps.control import reconcile
from apps.control.models import HOLDING, BackendObject, ObjectState
from apps.control.scheduling import run_cycle
from apps.tasks import ledger
from apps.tasks.choices import ACTIVE, TaskStatus
from apps.tasks.models import Task
from apps.tasks.services import requeue_task, scale_to_zero, stop_task, submit_task, wake
from apps.vdc.models import ProjectQuota
from tests.api.base import client_for
from tests.control.test_kubernetes_control import controller
from tests.executors_k8s.conftest import emulator  # noqa: F401 - the kmock fixture
from tests.factories import ClusterFactory, NodeFactory

SCRAPE_TOKEN = "task-life-machine"
NS = "gpu-jobs"
IMAGE = "busybox:1.36"
# What a submission asks for: (gpu spec, instances, elastic bounds, image).
SHAPES = [
    ("1(A100)", 1, None, IMAGE),
    ("2(A100)", 1, None, IMAGE),
    ("0.5(A100)", 1, None, IMAGE),
    ("0.25(A100)", 1, None, IMAGE),
    ("1(A100)", 2, None, IMAGE),  # a gang
    ("1(A100)", 1, (1, 3), IMAGE),  # elastic
    ("", 1, None, IMAGE),  # cpu only
    ("1(A100)", 1, None, ""),  # a command without an image: only the local cluster (in maintenance) runs it
    ("1(A100)", 1, "service", IMAGE),  # an inference service that scales to zero
]
CONTEXT: dict = {}
NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "k8s-node-1"},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def _report(uuids: list[str]) -> dict:
    return {
        "node": "k8s-node-1",
        "cpu": 64,
        "memory_gib": 512.0,
        "devices": [
            {
                "index": index,
                "uuid": uuid,
                "name": "NVIDIA A100-SXM4-80GB",
                "vram_total_gib": 80.0,
                "vram_used_gib": 0.0,
                "utilization": 0,
            }
            for index, uuid in enumerate(uuids)
        ],
    }


class TaskLife(RuleBasedStateMachine):
    tasks = Bundle("tasks")

    def __init__(self):
        super().__init__()
        self.world = CONTEXT["world"]
        self.cluster = CONTEXT["cluster"]
        self.atomic = transaction.atomic()
        self.atomic.__enter__()
        self.reported = [f"GPU-{i}" for i in range(4)]
        self.known = list(self.reported)
        apply_node_report(self.cluster, _report(self.reported))
        self.missing_at_cycle: set[int] = set()

    def teardown(self):
        # The emulator outlives the example: forget its objects, then roll the example's rows back.
        CONTEXT["emulator"].objects.clear()
        CONTEXT["emulator"].objects["v1/nodes", None, "k8s-node-1"] = NODE
        transaction.set_rollback(True)
        self.atomic.__exit__(None, None, None)

    # -- what people and machines do ---------------------------------------------------------------------

    @rule(
        target=tasks,
        shapes=st.lists(st.sampled_from(SHAPES), min_size=1, max_size=3),
        queue=st.sampled_from(["high", "medium", "low"]),
    )
    def submit(self, shapes, queue):
        submitted = []
        for spec, instances, elastic, image in shapes:
            fields = {"instances": instances, "kind": "training"}
            if elastic == "service":
                fields |= {"kind": "inference", "port": 8000, "scale_to_zero_after_s": 60}
            elif elastic:
                fields["elastic_min"], fields["elastic_max"] = elastic
            if queue == "medium":
                fields["expected_duration"] = "01:00:00"
            try:
                with transaction.atomic():
                    task = submit_task(
                        self.world.member,
                        project=self.world.project,
                        queue=queue,
                        name="t",
                        image=image,
                        command="sleep 600",
                        gpu_spec=spec,
                        **fields,
                    )
            except ValidationError:
                continue  # refused (a quota, a limit): nothing was written
            submitted.append(task.pk)
        return multiple(*submitted)

    @rule(backend_keeps_up=st.booleans())
    def control_loop_tick(self, backend_keeps_up):
        """What beat and the worker do every few seconds: a cycle, the launches it asked for, the backend running
        what it was given (or not yet), and a reconciliation; everything must hold between each of them too."""
        self.missing_at_cycle = set(Device.objects.missing().values_list("pk", flat=True))
        before = set(Task.objects.filter(status=TaskStatus.SCHEDULED).values_list("pk", flat=True))
        run_cycle(self.world.vdc.pk)
        for task in Task.objects.filter(status=TaskStatus.SCHEDULED).exclude(pk__in=before):
            assert not set(ledger.placement_devices(task.placement)) & self.missing_at_cycle, task.placement
        self.check()
        for obj in BackendObject.objects.filter(state=ObjectState.PENDING):
            if obj.wanted:
                reconcile.launch_object(obj.pk)
        self.check()
        if backend_keeps_up:
            emulated = CONTEXT["emulator"].objects
            for external_id in BackendObject.objects.filter(state=ObjectState.ACTIVE).values_list(
                "external_id", flat=True
            ):
                name = external_id.split("/")[-1]
                if ("batch/v1/jobs", NS, name) in emulated or ("apps/v1/deployments", NS, name) in emulated:
                    controller(CONTEXT["emulator"], name)
        reconcile.reconcile_cluster(self.cluster.pk)

    @rule(task=tasks)
    def stop(self, task):
        task = Task.objects.get(pk=task)
        if not task.is_final:
            stop_task(task, self.world.member)

    @rule(task=tasks)
    def node_fails_under_the_task(self, task):
        with transaction.atomic():
            task = Task.objects.select_for_update().select_related("queue").get(pk=task)
            if task.is_active:
                requeue_task(task, "node k8s-node-1 is down (test)")

    @rule(task=tasks)
    def a_service_falls_asleep_or_a_request_wakes_it(self, task):
        """A service that scales to zero: running and idle, it releases what it holds; asleep, a request wakes it
        back into its queue."""
        task = Task.objects.get(pk=task)
        if task.status == TaskStatus.RUNNING and task.scales_to_zero:
            assert scale_to_zero(task.pk, "idle (test)", {})
        elif task.is_asleep:
            assert wake(task.pk)

    @rule(change=st.sampled_from(["drop", "back", "new", "renumber"]), data=st.data())
    def the_node_agent_reports(self, change, data):
        """A card drops out of the report, every card is back, a new card is installed, or the cards are numbered
        in another order."""
        if change == "drop" and len(self.reported) > 1:
            self.reported.remove(data.draw(st.sampled_from(self.reported)))
        elif change == "back":
            self.reported = list(self.known)
        elif change == "new" and len(self.known) < 8:
            self.known.append(f"GPU-{len(self.known)}")
            self.reported.append(self.known[-1])
        elif change == "renumber":
            self.reported = data.draw(st.permutations(self.reported))
        apply_node_report(self.cluster, _report(self.reported))

    def check(self):
        self.no_card_is_held_beyond_its_capacity()
        self.the_ledger_is_what_the_placements_hold_and_every_door_shows_it()
        self.no_held_card_is_ever_deleted()
        self.no_task_waits_to_launch_on_free_capacity()
        self.every_active_task_is_on_a_cluster_that_can_run_it()

    # -- what must hold after every step ---------------------------------------------------------------------

    @invariant()
    def every_active_task_is_on_a_cluster_that_can_run_it(self):
        gpu_catalog = catalog()
        for task in Task.objects.filter(status__in=ACTIVE).select_related("cluster"):
            request = parse_gpu_spec(task.gpu_spec, gpu_catalog)
            assert refusal(task, request, gpu_catalog, capabilities(task.cluster.cluster_type)) is None, task.pk

    @invariant()
    def no_card_is_held_beyond_its_capacity(self):
        placed: dict[int, int] = {}
        for placement in Task.objects.filter(status__in=ACTIVE).values_list("placement", flat=True):
            for pk, milli in ledger.placement_devices(placement).items():
                placed[pk] = placed.get(pk, 0) + milli
        over = [pk for pk, milli in placed.items() if milli > ledger.WHOLE]
        assert not over, [
            (t.pk, t.status, t.queue.name, t.gpu_spec, t.placement, list(t.events.values_list("kind", "message")))
            for t in Task.objects.filter(status__in=ACTIVE)
            if set(ledger.placement_devices(t.placement)) & set(over)
        ]
        on_backend: dict[int, int] = {}
        for shares in BackendObject.objects.filter(state=ObjectState.ACTIVE).values_list("shares", flat=True):
            for share in shares:
                on_backend[share["id"]] = on_backend.get(share["id"], 0) + share["milli"]
        assert all(milli <= ledger.WHOLE for milli in on_backend.values()), on_backend

    @invariant()
    def the_ledger_is_what_the_placements_hold_and_every_door_shows_it(self):
        total = {"cpu": Decimal(0), "memory_gib": Decimal(0), "gpu": Decimal(0)}
        for task in Task.objects.filter(status__in=ACTIVE):
            held = ledger.held_by(task, task.placement)
            assert (task.held_cpu, task.held_memory_gib, task.allocated_gpu) == (held.cpu, held.memory_gib, held.gpu)
            total = {
                "cpu": total["cpu"] + held.cpu,
                "memory_gib": total["memory_gib"] + held.memory_gib,
                "gpu": total["gpu"] + held.gpu,
            }
        sums = Task.objects.filter(status__in=ACTIVE).aggregate(**ledger.allocation_sums())
        assert {k: sums[k] or 0 for k in total} == total
        api = client_for(self.world.member).get(f"/api/v1/vdcs/{self.world.vdc.pk}/resources/").data["allocated"]
        assert {k: Decimal(api[k]) for k in total} == total
        metrics = _scrape()
        assert {k: Decimal(str(metrics[("hcs_vdc_allocated", self.world.vdc.name, k)])) for k in total} == total
        quota = _quota_row(self.world)
        assert (quota.used_cpu, quota.used_memory, quota.used_gpu) == (total["cpu"], total["memory_gib"], total["gpu"])

    @invariant()
    def no_held_card_is_ever_deleted(self):
        held = set()
        for placement in Task.objects.filter(status__in=ACTIVE).values_list("placement", flat=True):
            held |= set(ledger.placement_devices(placement))
        for shares in BackendObject.objects.filter(state__in=HOLDING).values_list("shares", flat=True):
            held |= {share["id"] for share in shares}
        assert held <= set(Device.objects.values_list("pk", flat=True))

    @invariant()
    def no_task_waits_to_launch_on_free_capacity(self):
        """A launch waits only for jobs that still hold what no live placement counts: a job no live attempt wants,
        or the cards an elastic task gave back before its backend confirmed."""
        for obj in BackendObject.objects.filter(state=ObjectState.PENDING, task__status=TaskStatus.SCHEDULED):
            if not obj.wanted:
                continue
            mine = {share["id"] for share in obj.shares}
            for other in reconcile.device_conflicts(obj):
                if not other.wanted:
                    continue
                counted = ledger.placement_devices(other.task.placement)
                beyond = {s["id"] for s in other.shares if s["milli"] > counted.get(s["id"], 0)}
                assert beyond & mine, (str(obj), obj.shares, str(other), other.shares, other.task.placement)


def _scrape() -> dict[tuple[str, str, str], float]:
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPE_TOKEN}")
    assert response.status_code == 200
    return {
        (sample.name, sample.labels.get("vdc", ""), sample.labels.get("resource", "")): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
        if sample.name == "hcs_vdc_allocated"
    }


def _quota_row(world):
    """The quota row as the admin's change list computes it."""
    request = RequestFactory().get("/admin/vdc/projectquota/")
    request.user = world.admin
    return site._registry[ProjectQuota].get_queryset(request).get(pk=world.quota.pk)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # its 25 examples of 25 steps take several minutes on 2 busy cores
def test_a_tasks_life_keeps_cards_ledger_and_doors_in_line(world, emulator, settings):  # noqa: F811
    settings.METRICS_TOKEN = SCRAPE_TOKEN
    # The Kubernetes cluster takes the work; the local one, in maintenance, admits what only it could run (a
    # command without an image), which must then wait rather than go to Kubernetes.
    world.cluster.status = "maintenance"
    world.cluster.save()
    cluster = ClusterFactory(
        vdc=world.vdc, name="k8s", cluster_type="kubernetes", endpoint=str(emulator.url).rstrip("/"), namespace=NS
    )
    cluster.set_credentials({"token": "emulated"})
    cluster.save()
    NodeFactory(cluster=cluster, name="k8s-node-1", cpu=Decimal(64), memory_gib=Decimal(512))
    emulator.objects["v1/nodes", None, "k8s-node-1"] = NODE
    world.quota.limit_gpu = world.quota.guaranteed_gpu = Decimal(6)
    world.quota.save()
    CONTEXT.update(world=world, cluster=cluster, emulator=emulator)
    run_state_machine_as_test(TaskLife, settings=MACHINE_SETTINGS)


# Fixed examples (derandomized) so that CI runs the same steps every time; more examples find more, slower
# (HCS_MACHINE_EXAMPLES=200 for a longer search with fresh examples).
MACHINE_SETTINGS = machine_settings(
    max_examples=int(os.environ.get("HCS_MACHINE_EXAMPLES", "25")),
    stateful_step_count=25,
    deadline=None,
    derandomize="HCS_MACHINE_EXAMPLES" not in os.environ,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
