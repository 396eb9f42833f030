"""A sweep's metrics with real processes on the local cluster: each element's job prints
``HCS_METRIC name=value`` lines built from its HCS_PARAM_* variables; when its run ends the reconciliation records
the last one, and the sweep names the best element by its goal."""

from __future__ import annotations

import pytest

from apps.control.scheduling import run_cycle
from apps.tasks import sweeps
from apps.tasks.models import Task
from tests.api.base import client_for
from tests.control.drive import launch, wait_objects_ended, wait_status

pytestmark = pytest.mark.django_db(transaction=True)

COMMAND = 'echo "HCS_METRIC loss=9"; echo "HCS_METRIC loss=$HCS_PARAM_LR"; echo done'


@pytest.fixture(autouse=True)
def local_jobs_dir(settings, tmp_path):
    settings.HCS_LOCAL_EXECUTOR_DIR = tmp_path / "local-jobs"


def test_each_run_reports_its_metric_and_the_sweep_names_the_best(world):
    sweep, _tasks = sweeps.create_sweep(
        world.member,
        project=world.project,
        name="lr",
        parameters={"lr": [0.5, 0.125, 2]},
        goal="min",
        queue="high",
        kind="training",
        gpu_spec="1(A100)",
        command=COMMAND,
    )
    silent, _ = sweeps.create_sweep(
        world.member,
        project=world.project,
        name="quiet",
        parameters=[{"lr": 1}],
        queue="high",
        kind="training",
        gpu_spec="1(A100)",
        command="echo HCS_METRIC loss=not-a-number",
    )
    run_cycle(world.vdc.pk)
    tasks = list(Task.objects.order_by("pk"))
    for task in tasks:
        task.refresh_from_db()
        assert task.status == "scheduled", task.pending_message
        launch(task)
    for task in tasks:
        wait_status(task, "completed")
    wait_objects_ended(world.cluster)
    recorded = {t.name: (t.metric_name, t.metric_value) for t in Task.objects.all()}
    assert recorded == {
        "lr-1": ("loss", 0.5),
        "lr-2": ("loss", 0.125),
        "lr-3": ("loss", 2.0),
        "quiet-1": ("", None),
    }
    detail = client_for(world.member).get(f"/api/v1/sweeps/{sweep.pk}/").data
    assert detail["goal"] == "min"
    assert (detail["best"]["name"], detail["best"]["metric_value"]) == ("lr-2", 0.125)
    assert [e["metric_value"] for e in detail["elements"]] == [0.5, 0.125, 2.0]
    assert client_for(world.member).get(f"/api/v1/sweeps/{silent.pk}/").data["best"] is None
    sweep.goal = "max"
    sweep.save()
    assert client_for(world.member).get(f"/api/v1/sweeps/{sweep.pk}/").data["best"]["name"] == "lr-3"


def test_the_last_metric_line_counts():
    assert sweeps.last_metric("HCS_METRIC acc=0.5\nHCS_METRIC acc=0.75\nbye\n") == ("acc", 0.75)
    assert sweeps.last_metric("HCS_METRIC acc=0.5\nHCS_METRIC acc=nan\nHCS_METRIC acc=x\n") == ("acc", 0.5)
    assert sweeps.last_metric("  HCS_METRIC val/loss=1e-3 \n") == ("val/loss", 0.001)
    assert sweeps.last_metric("echo HCS_METRIC acc=1\nHCS_METRIC\n") is None
