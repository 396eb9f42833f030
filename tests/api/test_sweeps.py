"""Parameter sweeps through the API: grid and list expansion, the bound, all or nothing, price, stop, counts, roles."""

from __future__ import annotations

from decimal import Decimal

from apps.billing.models import PriceRule
from apps.clusters.executors.base import parameter_environment
from apps.control.jobspec import job_spec
from apps.tasks.models import Sweep, Task
from apps.tasks.sweeps import SWEEP_MAX
from tests.api.base import client_for

SWEEPS = "/api/v1/sweeps/"


def sweep(world, user=None, **fields):
    body = {
        "project": "alpha",
        "queue": "high",
        "name": "lr-search",
        "kind": "training",
        "command": 'python train.py --lr "$HCS_PARAM_LR"',
        "parameters": {"lr": [0.1, 0.01], "batch_size": [32, 64]},
        **fields,
    }
    return client_for(user or world.member).post(SWEEPS, body, format="json")


def test_a_grid_creates_its_cartesian_product(world):
    response = sweep(world)
    assert response.status_code == 201, response.data
    data = response.data
    assert data["size"] == 4 and data["dry_run"] is False
    assert [e["values"] for e in data["elements"]] == [
        {"lr": "0.1", "batch_size": "32"},
        {"lr": "0.1", "batch_size": "64"},
        {"lr": "0.01", "batch_size": "32"},
        {"lr": "0.01", "batch_size": "64"},
    ]
    assert [e["name"] for e in data["elements"]] == [f"lr-search-{n}" for n in range(1, 5)]
    assert data["elements"][0]["variables"] == {"HCS_PARAM_LR": "0.1", "HCS_PARAM_BATCH_SIZE": "32"}
    created = Sweep.objects.get()
    assert data["id"] == created.pk and created.created_by == world.member and data["project_name"] == "alpha"
    tasks = list(created.tasks.order_by("pk"))
    assert [t.pk for t in tasks] == [e["task"] for e in data["elements"]]
    assert all(t.status == "queued" and t.command.startswith("python train.py") for t in tasks)
    assert data["elements"][0]["url"] == f"/task-monitoring/{tasks[0].pk}/"
    detail = client_for(world.viewer).get(f"{SWEEPS}{created.pk}/").data
    assert detail["counts"] == {"total": 4, "waiting": 4, "active": 0, "finished": 0, "by_status": {"queued": 4}}


def test_each_element_job_gets_its_values_as_variables(world):
    sweep(world, parameters=[{"lr": 0.1}, {"lr": "3e-4", "warmup": 100}])
    task = Task.objects.get(name="lr-search-2")
    task.cluster = world.cluster
    spec = job_spec(task, "test")
    env = parameter_environment(spec)
    assert env["HCS_PARAM_LR"] == "3e-4" and env["HCS_PARAM_WARMUP"] == "100"


def test_an_explicit_list_is_taken_as_given(world):
    response = sweep(world, parameters=[{"lr": 0.1, "batch_size": 32}, {"lr": 0.5}])
    assert response.status_code == 201, response.data
    assert [e["values"] for e in response.data["elements"]] == [{"lr": "0.1", "batch_size": "32"}, {"lr": "0.5"}]


def test_more_elements_than_the_bound_are_refused(world):
    response = sweep(world, parameters={"a": list(range(11)), "b": list(range(10))})
    assert response.status_code == 400
    assert f"at most {SWEEP_MAX}" in str(response.data["parameters"][0]) and "110" in str(response.data)
    assert not Sweep.objects.exists() and not Task.objects.exists()


def test_malformed_parameters_say_what_was_expected(world):
    for bad in ({}, [], {"lr": []}, {"lr": 0.1}, {"9x": [1]}, [{"lr": [1, 2]}], "lr=0.1", {"lr": [True]}):
        response = sweep(world, parameters=bad)
        assert response.status_code == 400, bad
        assert "parameters" in response.data, (bad, response.data)
    response = sweep(world, parameters=None)
    assert response.status_code == 400
    body = {"project": "alpha", "queue": "high", "name": "x", "kind": "training"}
    response = client_for(world.member).post(SWEEPS, body, format="json")
    assert response.status_code == 400 and "Required" in str(response.data["parameters"][0])
    assert not Sweep.objects.exists() and not Task.objects.exists()


def test_task_fields_are_checked_as_a_submission(world):
    response = sweep(world, gpus=2, status="running")
    assert response.status_code == 400
    assert {"gpus", "status"} <= set(response.data)


def test_one_refused_element_refuses_the_whole_sweep(world):
    """The project may hold 3 unfinished training tasks: the 4th element is refused, and nothing is written."""
    world.quota.max_training_tasks = 3
    world.quota.save()
    response = sweep(world)
    assert response.status_code == 400, response.data
    message = str(response.data["kind"][0])
    assert message.startswith("Sweep element 4 of 4 (lr=0.01, batch_size=64) refused") and "limit" in message
    assert not Sweep.objects.exists() and not Task.objects.exists()
    assert sweep(world, parameters={"lr": [1, 2, 3]}).status_code == 201


def test_a_dry_run_checks_and_prices_without_creating(world):
    PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.5"))
    response = sweep(world, dry_run=True, cpu=2, expected_duration="1h30m")
    assert response.status_code == 200, response.data
    data = response.data
    assert data["dry_run"] is True and data["id"] is None and data["created_at"] is None and data["size"] == 4
    assert [e["task"] for e in data["elements"]] == [None] * 4
    assert Decimal(data["price"]["hourly_price_per_task"]) == Decimal("1")
    assert Decimal(data["price"]["hourly_price"]) == Decimal("4")
    assert Decimal(data["price"]["estimated_cost"]) == Decimal("6")
    assert not Sweep.objects.exists() and not Task.objects.exists()
    world.quota.max_training_tasks = 1
    world.quota.save()
    assert sweep(world, dry_run=True).status_code == 400


def test_the_answer_prices_the_sweep(world):
    data = sweep(world).data
    assert data["price"]["hourly_price"] is None  # no price rule
    PriceRule.objects.create(resource_type="cpu", price_per_hour=Decimal("0.25"))
    data = sweep(world, name="again").data
    assert Decimal(data["price"]["hourly_price"]) == Decimal("1")
    assert data["price"]["estimated_cost"] is None  # no expected duration


def test_viewers_cannot_create_and_outsiders_cannot_see(world):
    response = sweep(world, user=world.viewer)
    assert response.status_code == 403 and "Viewers" in str(response.data)
    assert sweep(world, user=world.outsider).status_code == 400  # the project is not theirs to name
    assert not Sweep.objects.exists() and not Task.objects.exists()
    created = sweep(world).data
    url = f"{SWEEPS}{created['id']}/"
    assert client_for(world.viewer).get(url).status_code == 200
    assert client_for(world.outsider).get(url).status_code == 404
    assert client_for(world.outsider).get(SWEEPS).data["count"] == 0
    assert client_for(world.outsider).post(f"{url}stop/", {}, format="json").status_code == 404
    assert client_for(world.viewer).post(f"{url}stop/", {}, format="json").status_code == 403
    assert Task.objects.filter(status="queued").count() == 4


def test_stop_stops_every_unfinished_task_and_counts_follow(world):
    created = sweep(world).data
    tasks = list(Task.objects.filter(sweep_id=created["id"]).order_by("pk"))
    Task.objects.filter(pk=tasks[0].pk).update(status="completed")
    Task.objects.filter(pk=tasks[1].pk).update(status="running", cluster=world.cluster)
    detail = client_for(world.owner).get(f"{SWEEPS}{created['id']}/").data
    assert detail["counts"] == {
        "total": 4,
        "waiting": 2,
        "active": 1,
        "finished": 1,
        "by_status": {"queued": 2, "running": 1, "completed": 1},
    }
    assert [e["status"] for e in detail["elements"]] == ["completed", "running", "queued", "queued"]
    response = client_for(world.owner).post(f"{SWEEPS}{created['id']}/stop/", {"reason": "enough"}, format="json")
    assert response.status_code == 200, response.data
    assert response.data["counts"]["by_status"] == {"stopped": 3, "completed": 1}
    assert [t.status for t in Task.objects.filter(sweep_id=created["id"]).order_by("pk")] == [
        "completed",
        "stopped",
        "stopped",
        "stopped",
    ]
    listed = client_for(world.member).get(SWEEPS).data["results"]
    assert listed[0]["counts"]["finished"] == 4 and listed[0]["name"] == "lr-search"


def test_the_goal_picks_the_best_reported_metric(world):
    created = sweep(world, goal="min", parameters={"lr": [1, 2, 3]}).data
    assert created["goal"] == "min"
    url = f"{SWEEPS}{created['id']}/"
    assert client_for(world.member).get(url).data["best"] is None
    for name, value in (("lr-search-1", 0.3), ("lr-search-2", 0.1), ("lr-search-3", 0.2)):
        Task.objects.filter(name=name).update(metric_name="loss", metric_value=value)
    best = client_for(world.member).get(url).data["best"]
    assert (best["name"], best["metric_name"], best["metric_value"], best["values"]) == (
        "lr-search-2",
        "loss",
        0.1,
        {"lr": "2"},
    )
    Sweep.objects.filter(pk=created["id"]).update(goal="max")
    assert client_for(world.member).get(url).data["best"]["name"] == "lr-search-1"
    response = sweep(world, goal="lowest")
    assert response.status_code == 400 and "goal" in response.data


def test_a_retried_submit_with_an_idempotency_key_creates_one_sweep(world):
    body = {"project": "alpha", "queue": "high", "name": "once", "kind": "training", "command": "true"}
    body["parameters"] = {"lr": [1, 2]}
    client = client_for(world.member)
    first = client.post(SWEEPS, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    again = client.post(SWEEPS, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true" and again.data["id"] == first.data["id"]
    assert Sweep.objects.count() == 1 and Task.objects.count() == 2
    other = client.post(SWEEPS, {**body, "name": "twice"}, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert other.status_code == 422 and Sweep.objects.count() == 1
