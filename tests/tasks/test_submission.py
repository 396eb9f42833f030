"""The submission service: validation, queue rules, quotas and permissions."""

from datetime import timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task
from tests.factories import node_with_every_model

GRAMMAR_EXAMPLES = [
    "2(V100)",
    "1(A100|H100)",
    "4(ascend910b)",
    "0.5(vgpu)",
    "0.5(T4)",
    "1(16G,50%)",
    "vram=16Gi,tflops-fp16=100",
    "1",
    "0",
    "",
]


def submit(world, user=None, **fields):
    fields.setdefault("name", "job")
    fields.setdefault("kind", "training")
    fields.setdefault("command", "echo hi")
    return submit_task(user or world.member, project=world.project, queue=fields.pop("queue", "high"), **fields)


@pytest.mark.parametrize("spec", GRAMMAR_EXAMPLES)
def test_every_grammar_example_is_accepted(world, spec):
    node_with_every_model(world.cluster)  # the grammar is under test here, not what the VDC holds
    task = submit(world, gpu_spec=spec)
    assert task.status == "queued"
    assert task.events.get().kind == "submitted"


def test_submission_without_vdc_goes_to_the_default_vdc(world):
    assert submit(world).vdc == world.vdc


def test_malformed_spec_is_rejected_with_the_parser_message_and_writes_nothing(world):
    with pytest.raises(ValidationError) as exc:
        submit(world, gpu_spec="2x(V100)")
    assert "expected" in exc.value.message_dict["gpu_spec"][0]
    assert not Task.objects.exists() and not TaskEvent.objects.exists()


def test_medium_queue_needs_an_expected_duration(world):
    with pytest.raises(ValidationError) as exc:
        submit(world, queue="medium")
    assert "expected duration" in exc.value.message_dict["expected_duration"][0]
    assert submit(world, queue="medium", expected_duration=timedelta(hours=2)).queue == world.medium


def test_unknown_queue_names_the_known_ones(world):
    with pytest.raises(ValidationError) as exc:
        submit(world, queue="urgent")
    assert "high" in exc.value.message_dict["queue"][0]


def test_closed_queue_takes_no_submissions(world):
    world.low.is_open = False
    world.low.save()
    with pytest.raises(ValidationError, match="closed"):
        submit(world, queue="low")


def test_request_over_the_project_limit_is_rejected(world):
    with pytest.raises(ValidationError) as exc:
        submit(world, gpu_spec="2(A100)", instances=5)  # 10 equivalents > limit 8
    assert "limit" in exc.value.message_dict["gpu_spec"][0]


def test_per_kind_limit(world):
    world.quota.max_dev_env_tasks = 1
    world.quota.save()
    submit(world, kind="dev_env")
    with pytest.raises(ValidationError, match="limit"):
        submit(world, kind="dev_env")


@pytest.mark.parametrize("role", ["viewer", "outsider"])
def test_viewers_and_outsiders_cannot_submit(world, role):
    with pytest.raises(PermissionDenied):
        submit(world, user=world.user(role))
    assert not Task.objects.exists()


def test_an_expected_duration_longer_than_the_queues_default_wall_time_is_refused(world):
    world.high.default_wall_time = timedelta(seconds=30)
    world.high.save(update_fields=["default_wall_time"])
    with pytest.raises(ValidationError) as exc:
        submit(world, expected_duration=timedelta(minutes=10))
    assert "stops a job after 30 s (its default wall time)" in exc.value.message_dict["wall_time"][0]
    own = submit(world, expected_duration=timedelta(minutes=10), wall_time=timedelta(minutes=15))
    assert own.wall_time == timedelta(minutes=15)
    assert submit(world, expected_duration=timedelta(seconds=20)).wall_time == timedelta(seconds=30)


def test_a_model_the_vdc_does_not_have_is_refused_as_such_not_as_over_quota(world):
    with pytest.raises(ValidationError) as exc:
        submit(world, gpu_spec="64(H100)")
    message = exc.value.message_dict["gpu_spec"][0]
    assert message.startswith(f"No cluster of VDC {world.vdc} can ever run this task")
    assert "quota" not in message and "its nodes hold A100-80G" in message
