"""The pages render for each role, create forms submit through the service, and errors land on fields."""

from datetime import timedelta
from zoneinfo import ZoneInfo

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.control.scheduling import run_cycle
from apps.tasks.models import Task
from apps.tasks.services import stop_task, submit_task

pytestmark = pytest.mark.django_db


def submit(world, user=None, **fields):
    defaults = {"name": "job", "kind": "training", "gpu_spec": "1(A100)", "command": "sleep 60"}
    return submit_task(
        user or world.member, project=world.project, queue=fields.pop("queue", "high"), **{**defaults, **fields}
    )


def training_post(world, **overrides):
    data = {
        "name": "bert",
        "project": world.project.pk,
        "kind": "training",
        "framework": "pytorch",
        "model_path": "/models/bert",
        "image": "pytorch/pytorch:2.3",
        "vdc": world.vdc.pk,
        "queue": world.medium.pk,
        "preemptible": "on",
        "expected_duration": "2h",
        "gpu_spec": "2(A100)",
        "cpu": "8",
        "memory_gib": "32",
        "instances": "1",
        "epochs": "3",
        "batch_size": "64",
        "checkpoint_path": "/ckpt",
        "max_retries": "1",
        "command": "python train.py",
        "env": "EPOCHS=3\n# comment\nLR=0.1",
        "volumes": "/data:/data:ro\nmodels-pvc:/models",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    "name",
    [
        "portal:dashboard",
        "portal:compute-tasks",
        "portal:instances",
        "portal:training-jobs",
        "portal:inference-services",
        "portal:task-queues",
        "portal:instances-new",
        "portal:training-jobs-new",
        "portal:inference-services-new",
    ],
)
def test_pages_render_for_a_member(client, world, name):
    submit(world)
    client.force_login(world.member)
    response = client.get(reverse(name))
    assert response.status_code == 200
    assert b"HCS Portal" in response.content


def test_pages_redirect_anonymous_users_to_login(client, world):
    response = client.get(reverse("portal:compute-tasks"))
    assert response.status_code == 302 and response.url.startswith("/accounts/login/")


def test_login_page_renders_and_logs_in(client, world):
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "max", "password": "pw-for-tests-1"})
    assert response.status_code == 302 and response.url == "/"


def test_training_form_submits_through_the_service_and_lands_on_monitoring(client, world):
    world.cluster.allowed_host_paths = ["/data"]
    world.cluster.save()
    client.force_login(world.member)
    response = client.post(reverse("portal:training-jobs-new"), training_post(world))
    task = Task.objects.get(name="bert")
    assert response.status_code == 302 and response.url == reverse("portal:task-monitoring", args=[task.pk])
    assert task.expected_duration == timedelta(hours=2) and task.gpu_spec == "2(A100)"
    assert task.env == {"EPOCHS": "3", "LR": "0.1"}
    assert task.volumes == [
        {"name": "vol-1", "mount_path": "/data", "read_only": True, "host_path": "/data"},
        {"name": "vol-2", "mount_path": "/models", "read_only": False, "claim_name": "models-pvc"},
    ]
    page = client.get(response.url)
    assert "queued, waiting for the next scheduling cycle" in page.content.decode()


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("env", "A-B=1", "letters, digits and underscores"),
        ("env", "CUDA_VISIBLE_DEVICES=0,1,2,3", "reserved"),
        ("env", "NVIDIA_VISIBLE_DEVICES=all", "reserved"),
        ("volumes", "/etc:/etc", "approved"),
        ("expected_duration", "999999999d", "at most 366 days"),
        ("expected_duration", "8d", "longest expected duration"),
        ("instances", "200000", "less than or equal to 1024"),
        ("cpu", "0", "greater than or equal to 0.01"),
    ],
)
def test_out_of_bounds_values_show_the_error_next_to_the_field_and_write_nothing(client, world, field, value, expected):
    client.force_login(world.member)
    response = client.post(reverse("portal:training-jobs-new"), training_post(world, **{field: value}))
    assert response.status_code == 200
    assert expected in " ".join(response.context["form"].errors[field])
    assert not Task.objects.exists()


def test_medium_queue_without_duration_shows_the_error_next_to_the_field(client, world):
    client.force_login(world.member)
    response = client.post(reverse("portal:training-jobs-new"), training_post(world, expected_duration=""))
    assert response.status_code == 200
    message = response.context["form"].errors["expected_duration"][0]
    assert "medium" in message and "expected duration" in message
    assert not Task.objects.exists()


def test_bad_gpu_spec_shows_the_parser_message_on_the_gpu_field(client, world):
    client.force_login(world.member)
    response = client.post(reverse("portal:training-jobs-new"), training_post(world, gpu_spec="2(A100"))
    errors = response.context["form"].errors
    assert "gpu_spec" in errors and errors["gpu_spec"][0]
    assert 'id="id_gpu_spec-errors"' in response.content.decode()


def test_bad_env_line_is_rejected_with_its_line_number(client, world):
    client.force_login(world.member)
    response = client.post(reverse("portal:training-jobs-new"), training_post(world, env="EPOCHS=3\nnot a pair"))
    assert "Line 2" in response.context["form"].errors["env"][0]


def test_dev_env_and_inference_forms_submit(client, world):
    client.force_login(world.member)
    common = {
        "project": world.project.pk,
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "gpu_spec": "1(A100)",
        "cpu": "2",
        "memory_gib": "8",
        "instances": "1",
        "preemptible": "on",
    }
    dev = {**common, "name": "nb", "ide_type": "jupyter", "image": "jupyter/pytorch-notebook:latest"}
    assert client.post(reverse("portal:instances-new"), dev).status_code == 302
    inference = {
        **common,
        "name": "svc",
        "model_path": "/models/qwen",
        "port": "8000",
        "image": "vllm/vllm-openai",
        "command": "vllm serve /models/qwen --port 8000",
        "max_tokens": "1024",
        "temperature": "0.5",
        "autoscale_min": "1",
        "autoscale_max": "3",
        "autoscale_gpu_percent": "70",
        "autoscale_concurrency": "16",
        "autoscale_schedule": "Mon-Fri 08:00-20:00 2 Europe/Berlin\n\nSat 10:00-14:00 3",
    }
    assert client.post(reverse("portal:inference-services-new"), inference).status_code == 302
    kinds = dict(Task.objects.values_list("name", "kind"))
    assert kinds == {"nb": "dev_env", "svc": "inference"}
    svc = Task.objects.get(name="svc")
    assert (svc.autoscale_gpu_percent, svc.autoscale_concurrency) == (70, 16)
    assert svc.autoscale_schedule_text == "Mon-Fri 08:00-20:00 2 Europe/Berlin; Sat 10:00-14:00 3 UTC"


def test_the_inference_form_names_the_bad_schedule_line_and_an_entry_out_of_bounds(client, world):
    client.force_login(world.member)
    inference = {
        "project": world.project.pk,
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "gpu_spec": "1(A100)",
        "cpu": "2",
        "memory_gib": "8",
        "instances": "1",
        "name": "svc",
        "model_path": "/models/qwen",
        "port": "8000",
        "image": "vllm/vllm-openai",
        "command": "serve",
        "autoscale_min": "1",
        "autoscale_max": "3",
        "autoscale_schedule": "Mon-Fri 08:00-20:00 2\nweekends 4",
    }
    response = client.post(reverse("portal:inference-services-new"), inference)
    assert "Line 2: Expected DAYS HH:MM-HH:MM N" in response.context["form"].errors["autoscale_schedule"][0]
    response = client.post(
        reverse("portal:inference-services-new"), {**inference, "autoscale_schedule": "Sat 10:00-14:00 5"}
    )
    assert "replicas 1..3, got 5" in response.context["form"].errors["autoscale_schedule"][0]
    assert not Task.objects.filter(name="svc").exists()


def test_queued_task_shows_its_position_and_estimated_start(client, world):
    blocker = submit(world, gpu_spec="8(A100)")
    run_cycle(world.vdc.pk)
    waiting = submit(world, name="second", queue="medium", expected_duration=timedelta(hours=1))
    run_cycle(world.vdc.pk)
    waiting.refresh_from_db()
    assert waiting.queue_position == 1
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[waiting.pk])).content.decode()
    assert "queued, position 1, estimated start" in page
    assert f"#{blocker.pk}" in client.get(reverse("portal:compute-tasks")).content.decode()


def test_monitoring_page_explains_preemptions_and_requeues(client, world):
    task = submit(world)
    data = {"by_task": 99, "reason": "window_expired", "new_window_s": 1800}
    task.events.create(
        kind="preempted", message="Preempted for a high task", from_status="running", to_status="preempted", data=data
    )
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert "for task #99" in page and "reason: window expired" in page and "window of 0:30:00" in page


def test_task_list_filters_by_status_and_kind(client, world):
    submit(world, name="keep-me")
    stopped = submit(world, name="gone")
    stop_task(stopped, world.member)
    client.force_login(world.member)
    page = client.get(reverse("portal:compute-tasks"), {"status": "queued"}).content.decode()
    assert "keep-me" in page and ">gone<" not in page
    page = client.get(reverse("portal:compute-tasks"), {"kind": "inference"}).content.decode()
    assert "keep-me" not in page


def test_logs_endpoint_says_when_nothing_runs_yet(client, world):
    task = submit(world)
    client.force_login(world.member)
    body = client.get(reverse("portal:task-logs", args=[task.pk])).json()
    assert body["status"] == "queued" and "not started" in body["note"]


def test_queue_admin_changes_policy_and_closes_a_queue(client, world):
    client.force_login(world.admin)
    page = client.get(reverse("portal:task-queues")).content.decode()
    assert 'name="policy"' in page
    client.post(reverse("portal:queue-policy", args=[world.high.pk]), {"policy": "drf"})
    client.post(reverse("portal:queue-open", args=[world.high.pk]), {"open": "0"})
    world.high.refresh_from_db()
    assert world.high.policy == "drf" and not world.high.is_open


def test_queue_page_counts_and_charts(client, world):
    submit(world, gpu_spec="8(A100)")
    run_cycle(world.vdc.pk)
    submit(world, name="w")
    run_cycle(world.vdc.pk)
    client.force_login(world.member)
    response = client.get(reverse("portal:task-queues"))
    high = next(q for q in response.context["queues"] if q.pk == world.high.pk)
    assert high.counts == {"waiting": 1, "running": 1, "gpu_in_use": "8.00"}
    running, waiting, gpus = high.chart["lines"]
    assert (running["now"], waiting["now"], gpus["now"]) == (1, 1, 8)
    assert "<svg" in response.content.decode() and 'name="policy"' not in response.content.decode()


def test_an_ended_task_holds_no_devices_and_a_high_one_is_never_preemptible(client, world):
    # A stopped task listed its GPU under resource usage; "preemptible: yes" on a high task.
    task = submit(world, gpu_spec="1(A100)")
    run_cycle(world.vdc.pk)
    client.force_login(world.member)
    url = reverse("portal:task-monitoring", args=[task.pk])
    assert "A100-80G</td>" in client.get(url).content.decode()
    stop_task(Task.objects.get(pk=task.pk), world.member)
    page = client.get(url).content.decode()
    assert "A100-80G</td>" not in page
    assert "the task has ended and its devices went back to the pool" in page
    assert "high-class tasks are never preempted" in page


def test_stopping_a_colleagues_task_asks_first_and_names_its_owner(client, world):
    task = submit(world, user=world.owner, kind="dev_env", name="notebook", command="", image="jupyter/base")
    client.force_login(world.member)
    page = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert f'data-confirm="Stop olivia&#x27;s dev environment #{task.pk} “notebook”?' in page
    listing = client.get(reverse("portal:instances")).content.decode()
    assert 'data-confirm="Stop olivia&#x27;s dev environment' in listing
    client.force_login(world.owner)
    own = client.get(reverse("portal:task-monitoring", args=[task.pk])).content.decode()
    assert f'data-confirm="Stop dev environment #{task.pk} “notebook”?' in own


def test_times_on_the_monitoring_page_carry_their_zone(client, world, settings):
    # Never a bare time; the portal shows its configured zone (HCS_TIME_ZONE) by name.
    settings.TIME_ZONE = "Asia/Shanghai"
    task = submit_task(
        world.member,
        project=world.project,
        queue="high",
        name="t",
        kind="training",
        gpu_spec="1(A100)",
        command="sleep 1",
    )
    client.force_login(world.member)
    page = client.get(f"/task-monitoring/{task.pk}/").content.decode()
    local = timezone.localtime(task.submitted_at, ZoneInfo("Asia/Shanghai"))
    assert f"{local:%Y-%m-%d %H:%M:%S} CST" in page  # submitted, and the timeline's first event


def test_the_training_form_sets_elastic_bounds_and_shows_their_errors(client, world):
    from tests.factories import ClusterFactory, node_with_every_model

    # Elastic jobs run where the backend resizes them: the VDC gets a Kubernetes cluster.
    node_with_every_model(ClusterFactory(vdc=world.vdc, name="k8s-1", cluster_type="kubernetes"))
    client.force_login(world.member)
    url = reverse("portal:training-jobs-new")
    page = client.get(url).content.decode()
    assert 'name="elastic_min"' in page and 'name="elastic_max"' in page
    refused = client.post(url, training_post(world, elastic_min="2"))
    assert refused.status_code == 200
    assert "Expected both elastic_min and elastic_max, or neither." in refused.content.decode()
    response = client.post(url, training_post(world, name="elastic", elastic_min="1", elastic_max="4", volumes=""))
    assert response.status_code == 302, response.context["form"].errors
    task = Task.objects.get(name="elastic")
    assert (task.elastic_min, task.elastic_max) == (1, 4)
