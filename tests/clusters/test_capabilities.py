"""What each cluster type declares it can run, and what a task needs of its cluster (docs/rules.md "Placement")."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from apps.clusters.capabilities import HOST_COMMAND, IMAGE, capabilities, kind_need, needs_of, refusal
from apps.clusters.gpuspec import parse_gpu_spec
from apps.clusters.services import catalog

KINDS = {"dev_env", "training", "fine_tuning", "inference"}


def a_task(**fields):
    values = {"kind": "training", "image": "", "command": "python train.py", "is_elastic": False}
    return SimpleNamespace(**{**values, **fields})


def test_each_cluster_type_declares_what_it_runs():
    kube, slurm, local = capabilities("kubernetes"), capabilities("slurm"), capabilities("local")
    assert (kube.images, kube.host_commands, kube.resize, kube.share_vendors) == (
        True,
        False,
        True,
        frozenset({"nvidia", "hygon"}),
    )
    for host in (slurm, local):
        assert (host.images, host.host_commands, host.resize, host.share_vendors) == (False, True, False, None)
    assert kube.kinds == slurm.kinds == local.kinds == KINDS
    with pytest.raises(ValueError, match="unknown cluster type 'nomad'; expected one of"):
        capabilities("nomad")


@pytest.mark.parametrize(
    "fields, needs",
    [
        ({}, {HOST_COMMAND}),  # a command alone runs on a host
        ({"image": "pytorch:2"}, set()),  # an image and a command run anywhere
        ({"image": "pytorch:2", "command": ""}, {IMAGE}),  # the image's entrypoint needs a container runtime
        ({"kind": "dev_env", "command": ""}, {HOST_COMMAND}),  # its IDE on a host
        ({"kind": "dev_env", "command": "", "image": "jupyter"}, set()),
    ],
)
def test_a_task_needs_its_kind_and_what_runs_its_command(fields, needs):
    task = a_task(**fields)
    task_needs = needs_of(task.kind, task.image, task.command)
    assert task_needs == {kind_need(task.kind), *needs}
    runners = {name for name in ("kubernetes", "slurm", "local") if task_needs <= capabilities(name).names()}
    assert runners == (
        {"slurm", "local"} if HOST_COMMAND in needs else {"kubernetes"} if needs else {"kubernetes", "slurm", "local"}
    )


@pytest.mark.django_db
def test_a_backend_that_lacks_a_kind_of_workload_refuses_it_with_the_reason():
    no_services = dataclasses.replace(capabilities("slurm"), kinds=frozenset(KINDS - {"inference"}))
    gpu_catalog = catalog()
    request = parse_gpu_spec("1", gpu_catalog)
    assert refusal(a_task(kind="inference"), request, gpu_catalog, no_services) == (
        "kind",
        "Slurm does not run inference tasks",
    )
    assert refusal(a_task(), request, gpu_catalog, no_services) is None
    assert kind_need("inference") not in no_services.names()
