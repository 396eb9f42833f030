"""Admission: what no cluster of the VDC could ever run is refused at submit, on its field,
with every cluster's reason, in the service, the API and the pages; nothing is written."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.clusters.models import GPUModel
from apps.tasks.models import Task
from apps.tasks.services import submit_task
from tests.api.base import client_for
from tests.factories import ClusterFactory, DeviceFactory, NodeFactory


def submit(world, **fields):
    fields.setdefault("name", "job")
    fields.setdefault("kind", "training")
    fields.setdefault("command", "python train.py")
    return submit_task(world.member, project=world.project, queue=fields.pop("queue", "high"), **fields)


def refused(world, field, *words, **fields):
    before = Task.objects.count()
    with pytest.raises(ValidationError) as exc:
        submit(world, **fields)
    message = exc.value.message_dict[field][0]
    assert message.startswith("No cluster of VDC main can ever run this task"), message
    for word in words:
        assert word in message, message
    assert Task.objects.count() == before
    return message


def test_a_gang_on_the_local_cluster_is_admitted(world):
    # The local executor runs a gang as one sandbox per rank on its host.
    assert submit(world, instances=2).status == "queued"


def test_an_elastic_task_needs_a_cluster_that_resizes_running_jobs(world):
    slurm = ClusterFactory(vdc=world.vdc, name="slurm-1", cluster_type="slurm")
    DeviceFactory(node=NodeFactory(cluster=slurm, name="s1", cpu=Decimal(64), memory_gib=Decimal(512)), index=0)
    message = refused(world, "elastic_min", "Slurm cannot grow or shrink a running job", elastic_min=1, elastic_max=1)
    assert "local-1" in message


def test_a_training_job_without_a_command_is_refused_where_only_commands_run(world):
    refused(world, "command", "runs the task's command and none was given", command="")


def test_a_model_the_vdc_does_not_hold_is_refused_with_what_it_holds(world):
    refused(world, "gpu_spec", "2 V100", "its nodes hold A100-80G", gpu_spec="2(V100)")


def test_more_cards_per_instance_than_any_node_holds_is_refused(world):
    world.quota.limit_gpu = 64
    world.quota.save()
    refused(world, "gpu_spec", "no node has 9 A100-80G", gpu_spec="9(A100)")


def test_more_cores_or_memory_than_any_node_is_refused(world):
    world.quota.limit_cpu, world.quota.limit_memory_gib = 1024, 4096
    world.quota.save()
    refused(world, "cpu", "no node has 65 cores (largest 64)", cpu=Decimal(65))
    refused(world, "memory_gib", "513 GiB (largest 512)", memory_gib=Decimal(513))


def test_kubernetes_runs_an_image_without_a_command_and_needs_an_image(world, settings):
    kube = ClusterFactory(vdc=world.vdc, name="kube-1", cluster_type="kubernetes")
    node = NodeFactory(cluster=kube, name="k1", cpu=Decimal(64), memory_gib=Decimal(512))
    DeviceFactory(node=node, index=0, gpu_model=GPUModel.objects.get(name="A100-80G"))
    assert submit(world, command="", image="registry.local/train:1").status == "queued"
    refused(world, "command", "kube-1: needs a command or an image", command="", image="")


def test_a_request_any_cluster_of_the_vdc_could_run_is_admitted(world):
    other = ClusterFactory(vdc=world.vdc, name="slurm-1", cluster_type="slurm")
    node = NodeFactory(cluster=other, name="s1", cpu=Decimal(64), memory_gib=Decimal(512))
    for index in range(2):
        DeviceFactory(node=node, index=index, gpu_model=GPUModel.objects.get(name="V100-32G"))
    assert submit(world, gpu_spec="2(V100)", instances=2).status == "queued"


def test_a_vdc_without_clusters_admits_and_waits(world):
    world.cluster.enabled = False
    world.cluster.save()
    assert submit(world, instances=2).status == "queued"


def test_the_api_answers_400_on_the_field(world):
    response = client_for(world.member).post(
        "/api/v1/tasks/",
        {
            "project": "alpha",
            "queue": "high",
            "name": "job",
            "kind": "training",
            "command": "x",
            "elastic_min": 1,
            "elastic_max": 2,
        },
        format="json",
    )
    assert response.status_code == 400 and "cannot grow or shrink" in str(response.data["elastic_min"][0])


def test_the_inference_form_shows_the_refusal_on_the_command(client, world):
    client.force_login(world.member)
    form = {
        "project": world.project.pk,
        "vdc": world.vdc.pk,
        "queue": world.high.pk,
        "gpu_spec": "1(A100)",
        "cpu": "2",
        "memory_gib": "8",
        "instances": "1",
        "preemptible": "on",
        "name": "svc",
        "model_path": "/models/qwen",
        "port": "8000",
        "image": "vllm/vllm-openai",
        "max_tokens": "1024",
        "temperature": "0.5",
    }
    page = client.post(reverse("portal:inference-services-new"), form)
    assert page.status_code == 200
    assert "runs the task&#x27;s command and none was given" in page.content.decode()
    assert not Task.objects.exists()


def kubernetes_only(world, model="A100-80G"):
    world.cluster.enabled = False
    world.cluster.save()
    kube = ClusterFactory(vdc=world.vdc, name="kube-1", cluster_type="kubernetes")
    node = NodeFactory(cluster=kube, name="k1", cpu=Decimal(64), memory_gib=Decimal(512))
    DeviceFactory(node=node, index=0, gpu_model=GPUModel.objects.get(name=model))
    return kube


def test_a_command_without_an_image_is_refused_where_only_containers_run(world):
    kubernetes_only(world)
    refused(world, "image", "kube-1: Kubernetes runs containers: an image is required", image="")


def test_a_command_without_an_image_is_admitted_when_the_local_cluster_of_a_mixed_vdc_runs_it(world):
    kubernetes_only(world)
    world.cluster.enabled = True
    world.cluster.save()
    assert submit(world, image="").status == "queued"


def test_a_share_of_a_card_kubernetes_cannot_share_is_refused_there_and_whole_cards_are_not(world):
    kubernetes_only(world, model="Ascend910B")
    refused(
        world,
        "gpu_spec",
        "Kubernetes cannot run a share of a huawei card (it shares hygon, nvidia cards)",
        gpu_spec="0.5(Ascend910B)",
        image="registry.local/train:1",
    )
    assert submit(world, gpu_spec="1(Ascend910B)", image="registry.local/train:1").status == "queued"
