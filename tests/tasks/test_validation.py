"""Submission bounds and shapes (apps.tasks.validation): every bad value is a field error and writes nothing."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.tasks.forms import DurationInput
from apps.tasks.models import Task, TaskEvent
from apps.tasks.services import submit_task
from apps.tasks.validation import parse_duration_text
from tests.factories import ClusterFactory


def submit(world, **fields):
    fields = {"name": "job", "kind": "training", "command": "echo hi", **fields}
    return submit_task(world.member, project=world.project, queue=fields.pop("queue", "high"), **fields)


def refused(world, **fields) -> dict:
    """Submit, expect a ValidationError, check nothing was written; return its messages by field."""
    with pytest.raises(ValidationError) as exc:
        submit(world, **fields)
    assert not Task.objects.exists() and not TaskEvent.objects.exists()
    return exc.value.message_dict


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("expected_duration", {"expected_duration": timedelta(days=999_999_999)}),
        ("expected_duration", {"expected_duration": timedelta(hours=-1)}),
        ("expected_duration", {"expected_duration": timedelta(0)}),
        ("expected_duration", {"expected_duration": timedelta(days=8)}),  # the queue allows 7 days
        ("instances", {"instances": 200_000, "cpu": Decimal("0.01"), "memory_gib": Decimal("0.01")}),
        ("cpu", {"cpu": Decimal("0")}),
        ("cpu", {"cpu": Decimal("5000")}),
        ("memory_gib", {"memory_gib": Decimal("0")}),
        ("memory_gib", {"memory_gib": Decimal("99999")}),
        ("elastic_min", {"elastic_min": 0, "elastic_max": 2}),
        ("elastic_max", {"elastic_min": 1, "elastic_max": 5000}),
        ("elastic_max", {"elastic_min": 3, "elastic_max": 2}),
        ("autoscale_max", {"kind": "inference", "autoscale_min": 1, "autoscale_max": 100_000}),
        ("autoscale_max", {"kind": "inference", "autoscale_min": 4, "autoscale_max": 2}),
        ("epochs", {"epochs": 10**9}),
        ("batch_size", {"batch_size": 10**8}),
        ("max_tokens", {"kind": "inference", "max_tokens": 10**9}),
        ("max_retries", {"max_retries": 1000}),
        ("command", {"command": "x" * 70_000}),
        ("name", {"name": "a\x00b"}),
        ("image", {"image": "busybox\x00"}),
    ],
    ids=lambda v: v if isinstance(v, str) else ",".join(v),
)
def test_counts_durations_and_text_out_of_bounds_are_refused(world, field, fields):
    errors = refused(world, **fields)
    assert field in errors
    assert "xpected" in errors[field][0]


@pytest.mark.parametrize(
    ("value", "says"), [(0, "greater than or equal to 1"), (10_001, "less than or equal to 10000")]
)
def test_a_concurrency_target_out_of_its_range_is_refused_with_the_range(world, value, says):
    errors = refused(world, kind="inference", autoscale_min=1, autoscale_max=2, autoscale_concurrency=value)
    assert says in errors["autoscale_concurrency"][0]


def test_the_queue_maximum_is_the_admins_to_raise(world):
    world.high.max_expected_duration = timedelta(days=30)
    world.high.save()
    assert submit(world, expected_duration=timedelta(days=30)).expected_duration == timedelta(days=30)
    message = refused_after(world, expected_duration=timedelta(days=31))
    assert "30 days" in message


def refused_after(world, **fields) -> str:
    with pytest.raises(ValidationError) as exc:
        submit(world, **fields)
    return exc.value.message_dict["expected_duration"][0]


@pytest.mark.parametrize(
    "env",
    [
        {"A=B": "1"},
        {"": "1"},
        {"1ABC": "1"},
        {"A B": "1"},
        {"A": "x\x00y"},
        {"A": 1},
        {"A": {"nested": "x"}},
        {f"V{i}": "x" for i in range(200)},
        {"A": "x" * 40_000},
        ["A=1"],
    ],
    ids=[
        "equals-in-name",
        "empty-name",
        "leading-digit",
        "space",
        "nul-value",
        "number-value",
        "object-value",
        "too-many",
        "value-too-long",
        "not-an-object",
    ],
)
def test_env_that_would_break_the_launch_is_refused(world, env):
    assert "env" in refused(world, env=env)


@pytest.mark.parametrize(
    "name",
    [
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "cuda_visible_devices",
        "ASCEND_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ASCEND_RT_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_REQUIRE_CUDA",
        "HCS_TASK_ID",
        "HCS_ANYTHING",
    ],
)
def test_device_visibility_and_platform_variables_are_reserved(world, name):
    message = refused(world, gpu_spec="1(A100)", env={name: "0,1,2,3"})["env"][0]
    assert name in message and "reserved" in message


def test_a_catalog_models_own_visibility_variable_is_reserved(world):
    from apps.clusters.models import GPUModel

    GPUModel.objects.filter(name="A100-80G").update(visible_devices_env="ACME_CARDS")
    assert "ACME_CARDS" in refused(world, env={"ACME_CARDS": "all"})["env"][0]


def test_loader_and_ordinary_variables_stay_allowed(world):
    env = {"LD_LIBRARY_PATH": "/opt/lib", "LD_PRELOAD": "libx.so", "EPOCHS": "3", "NCCL_DEBUG": "INFO", "EMPTY": ""}
    assert submit(world, env=env).env == env


def test_required_labels_must_be_strings(world):
    assert "required_labels" in refused(world, required_labels={"gpu": ["a100"]})


@pytest.mark.parametrize(
    "volumes",
    [
        [1, "a"],
        [{"mount_path": "/data", "claim_name": "datasets"}],
        [{"name": "", "mount_path": "/data", "claim_name": "datasets"}],
        [{"name": "Data_Set", "mount_path": "/data", "claim_name": "datasets"}],
        [{"name": "hcs-shm", "mount_path": "/data", "claim_name": "datasets"}],
        [{"name": "data", "mount_path": "data", "claim_name": "datasets"}],
        [{"name": "data", "mount_path": "/data/../etc", "claim_name": "datasets"}],
        [{"name": "data", "mount_path": "/", "claim_name": "datasets"}],
        [{"name": "data", "mount_path": "/data"}],
        [{"name": "data", "mount_path": "/data", "claim_name": "datasets", "host_path": "/data"}],
        [{"name": "data", "mount_path": "/data", "claim_name": "Not A Claim"}],
        [{"name": "data", "mount_path": "/data", "claim_name": "datasets", "read_only": "yes"}],
        [{"name": "data", "mount_path": "/data", "claim_name": "datasets", "size": "1Ti"}],
        [
            {"name": "data", "mount_path": "/a", "claim_name": "x"},
            {"name": "data", "mount_path": "/b", "claim_name": "y"},
        ],
        [
            {"name": "a", "mount_path": "/data", "claim_name": "x"},
            {"name": "b", "mount_path": "/data", "claim_name": "y"},
        ],
        [{"name": f"v{i}", "mount_path": f"/v{i}", "claim_name": "x"} for i in range(40)],
        {"name": "data"},
    ],
    ids=[
        "not-objects",
        "no-name",
        "empty-name",
        "not-a-dns-name",
        "reserved-name",
        "relative-mount",
        "dotdot-mount",
        "root-mount",
        "no-source",
        "two-sources",
        "bad-claim",
        "read-only-not-bool",
        "unknown-key",
        "duplicate-name",
        "duplicate-mount",
        "too-many",
        "not-a-list",
    ],
)
def test_volumes_that_would_break_the_launch_are_refused(world, volumes):
    message = refused(world, volumes=volumes)["volumes"][0]
    assert "xpected" in message or "twice" in message


def test_a_host_path_must_be_approved_by_every_enabled_cluster_of_the_vdc(world):
    volume = {"name": "data", "mount_path": "/data", "host_path": "/srv/data/team-a", "read_only": True}
    assert "local-1" in refused(world, volumes=[volume])["volumes"][0]

    world.cluster.allowed_host_paths = ["/srv/data"]
    world.cluster.save()
    other = ClusterFactory(vdc=world.vdc, name="k8s-1", cluster_type="kubernetes", endpoint="https://k8s")
    message = refused(world, volumes=[volume])["volumes"][0]
    assert "k8s-1" in message and "local-1" not in message

    other.enabled = False
    other.save()
    assert submit(world, volumes=[volume]).volumes == [volume]


@pytest.mark.parametrize("path", ["/srv/database", "/srv/data/../../etc", "/", "/etc", "srv/data"])
def test_host_paths_outside_the_approved_prefixes_are_refused(world, path):
    world.cluster.allowed_host_paths = ["/srv/data"]
    world.cluster.save()
    assert "volumes" in refused(world, volumes=[{"name": "d", "mount_path": "/d", "host_path": path}])


def test_valid_volumes_are_kept_as_given(world):
    volumes = [
        {"name": "data", "mount_path": "/data", "claim_name": "datasets", "read_only": True},
        {"name": "models", "mount_path": "/models", "claim_name": "models.team-a"},
    ]
    assert submit(world, volumes=volumes).volumes == volumes


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10m", 600), ("1h30m", 5400), ("2d", 172800), ("02:00:00", 7200), ("1 00:00:30", 86430), ("1.5h", 5400)],
)
def test_pages_and_api_read_durations_alike(text, seconds):
    assert parse_duration_text(text).total_seconds() == seconds
    assert DurationInput().clean(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["10x", "1h 30", "00:61:00", "9999999d", "1e400h"])
def test_a_duration_neither_door_reads_says_what_is_expected(text):
    with pytest.raises(ValueError, match="Expected"):
        parse_duration_text(text)
