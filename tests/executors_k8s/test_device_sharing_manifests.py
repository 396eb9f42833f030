"""Kubernetes manifests for MIG instances and time-sliced replicas (docs/engine.md "Device sharing")."""

from __future__ import annotations

from apps.clusters.executors import k8s_manifests as m
from apps.clusters.executors.base import GPUModelSpec
from tests.executors_k8s.specs import on_node, spec
from tests.executors_k8s.test_manifests import env_of, main_container, pod_template

MIG_1G = GPUModelSpec(
    "A100-80G-1g.10gb",
    "nvidia",
    "nvidia.com/mig-1g.10gb",
    "NVIDIA_VISIBLE_DEVICES",
    slurm_gres_type="1g.10gb",
    vram_gib=10,
    partition="mig",
)
TS4 = GPUModelSpec(
    "A100-80G-ts4", "nvidia", "nvidia.com/gpu", "NVIDIA_VISIBLE_DEVICES", vram_gib=80, partition="time_slice"
)


def test_a_mig_instance_is_requested_by_its_mixed_strategy_resource_name():
    s = spec(gpus_per_instance=1, gpu_model=MIG_1G, placements=on_node("gpu-node-1", 0, uuid="MIG-abc"))
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["limits"]["nvidia.com/mig-1g.10gb"] == "1"
    assert "nvidia.com/gpu" not in main["resources"]["limits"]
    # The device plugin picks the instance and sets the variable: the card's index would expose the whole card.
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(main)
    assert pod_template(job)["tolerations"][0]["key"] == "nvidia.com/mig-1g.10gb"


def test_two_mig_instances_per_instance_ask_for_two_of_the_resource():
    s = spec(gpus_per_instance=2, gpu_model=MIG_1G, placements=on_node("gpu-node-1", 0, 0))
    assert m.gpu_limits(s) == {"nvidia.com/mig-1g.10gb": "2"}


def test_a_time_sliced_replica_asks_for_one_of_the_cards_resource_without_hami_limits():
    s = spec(gpus_per_instance=1, gpu_model=TS4, placements=on_node("gpu-node-1", 3))
    job, _ = m.build_manifests(s, "ns")
    main = main_container(job)
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert not any(
        k.startswith("nvidia.com/gpumem") or k.startswith("nvidia.com/gpucores") for k in main["resources"]["limits"]
    )
    assert "NVIDIA_VISIBLE_DEVICES" not in env_of(main)
