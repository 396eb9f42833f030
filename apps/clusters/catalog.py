"""Seed data for the GPU model catalog (docs/rules.md#exchange-rates).

Plain data, no Django imports: a data migration loads it into GPUModel rows and
`apps.clusters.gpuspec.Catalog.default()` builds the parser's catalog from it.

Numbers are the vendors' published peaks for one card, dense (without
structured sparsity). `tflops_fp16` is the FP16 tensor/matrix peak, the figure
that matters for training and inference; `tflops_fp32` is the plain (non-tensor)
FP32 peak. 0 means the vendor publishes no such figure (the GPUModel columns
are not nullable): such a model never satisfies a vendor-neutral request that
asks for that number.

`memory_bandwidth_gbps` is the published peak memory bandwidth in GB/s (0: the
vendor publishes none, e.g. Huawei for the 910B and Hygon for the Z100); the
node agent's device fingerprint is checked against these figures.

Exchange rates turn cards into GPU-equivalents; A100-80G is the reference (1.0).
A100-80G, A800-80G, Ascend910B, Ascend910A, DCU-Z100 and MLU370 carry the rates
of the vendor-neutral compute rates (which also price in interconnect and software maturity, hence
A800 at 0.7 despite the A100's compute). Every other rate is derived: dense FP16
TFLOPS / 312 (the A100's), rounded to 2 decimals.

`shareable` means the card can be split between tasks through HAMi (vGPU memory
and core slicing). All NVIDIA cards here are supported by HAMi's NVIDIA device
plugin. Ascend 910B is shareable because HAMi's Ascend device plugin slices it
into vNPU templates (memory + AI cores); the 910A is left whole because its
templates are too coarse to be worth a fraction. Hygon, Cambricon and AMD cards
are scheduled as whole cards through their vendors' device plugins, whose
resource names are the ones below.
"""

import re

# What a model a node agent finds but the catalog lacks starts with (the admin adjusts it when rating it).
VENDOR_DEFAULTS: dict[str, dict] = {
    "nvidia": {"resource_name": "nvidia.com/gpu", "visible_devices_env": "NVIDIA_VISIBLE_DEVICES"},
    "huawei": {"resource_name": "huawei.com/Ascend910", "visible_devices_env": "ASCEND_VISIBLE_DEVICES"},
    "hygon": {"resource_name": "hygon.com/dcu", "visible_devices_env": "HIP_VISIBLE_DEVICES"},
    "cambricon": {"resource_name": "cambricon.com/mlu", "visible_devices_env": "MLU_VISIBLE_DEVICES"},
    "amd": {"resource_name": "amd.com/gpu", "visible_devices_env": "ROCR_VISIBLE_DEVICES"},
}

GPU_CATALOG: list[dict] = [
    {
        "name": "A100-80G",
        "vendor": "nvidia",
        "aliases": ["a100", "a100-80g", "a100-sxm4-80gb", "nvidia-a100-80gb"],
        "vram_gib": 80,
        "tflops_fp16": 312.0,
        "tflops_fp32": 19.5,
        "memory_bandwidth_gbps": 2039,
        "exchange_rate": 1.0,
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "a100_80g",
    },
    {
        "name": "A800-80G",
        "vendor": "nvidia",
        "aliases": ["a800", "a800-80g", "a800-sxm4-80gb"],
        "vram_gib": 80,
        "tflops_fp16": 312.0,
        "tflops_fp32": 19.5,
        "memory_bandwidth_gbps": 2039,
        "exchange_rate": 0.7,
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "a800_80g",
    },
    {
        "name": "H100",
        "vendor": "nvidia",
        "aliases": ["h100", "h100-80g", "h100-sxm", "h100-sxm5-80gb"],
        "vram_gib": 80,
        "tflops_fp16": 989.4,
        "tflops_fp32": 67.0,
        "memory_bandwidth_gbps": 3350,
        "exchange_rate": 3.17,  # 989.4 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "h100",
    },
    {
        "name": "H800",
        "vendor": "nvidia",
        "aliases": ["h800", "h800-80g", "h800-sxm"],
        "vram_gib": 80,
        "tflops_fp16": 989.4,
        "tflops_fp32": 67.0,
        "memory_bandwidth_gbps": 3350,
        "exchange_rate": 3.17,  # 989.4 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "h800",
    },
    {
        "name": "H20",
        "vendor": "nvidia",
        "aliases": ["h20", "h20-96g"],
        "vram_gib": 96,
        "tflops_fp16": 148.0,
        "tflops_fp32": 44.0,
        "memory_bandwidth_gbps": 4000,
        "exchange_rate": 0.47,  # 148 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "h20",
    },
    {
        "name": "L40S",
        "vendor": "nvidia",
        "aliases": ["l40s", "l40s-48g"],
        "vram_gib": 48,
        "tflops_fp16": 362.05,
        "tflops_fp32": 91.6,
        "memory_bandwidth_gbps": 864,
        "exchange_rate": 1.16,  # 362.05 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "l40s",
    },
    {
        "name": "A10",
        "vendor": "nvidia",
        "aliases": ["a10", "a10-24g"],
        "vram_gib": 24,
        "tflops_fp16": 125.0,
        "tflops_fp32": 31.2,
        "memory_bandwidth_gbps": 600,
        "exchange_rate": 0.40,  # 125 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "a10",
    },
    {
        "name": "T4",
        "vendor": "nvidia",
        "aliases": ["t4", "tesla-t4", "t4-16g"],
        "vram_gib": 16,
        "tflops_fp16": 65.0,
        "tflops_fp32": 8.1,
        "memory_bandwidth_gbps": 320,
        "exchange_rate": 0.21,  # 65 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "t4",
    },
    {
        # SXM2 figures; "v100" alone matches both V100 sizes.
        "name": "V100-16G",
        "vendor": "nvidia",
        "aliases": ["v100", "tesla-v100", "v100-16g", "v100-sxm2-16gb"],
        "vram_gib": 16,
        "tflops_fp16": 125.0,
        "tflops_fp32": 15.7,
        "memory_bandwidth_gbps": 900,
        "exchange_rate": 0.40,  # 125 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "v100_16g",
    },
    {
        "name": "V100-32G",
        "vendor": "nvidia",
        "aliases": ["v100", "tesla-v100", "v100-32g", "v100-sxm2-32gb"],
        "vram_gib": 32,
        "tflops_fp16": 125.0,
        "tflops_fp32": 15.7,
        "memory_bandwidth_gbps": 900,
        "exchange_rate": 0.40,  # 125 / 312
        "resource_name": "nvidia.com/gpu",
        "visible_devices_env": "NVIDIA_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "v100_32g",
    },
    {
        # 910B ships in variants (B2/B3/B4) between roughly 280 and 376 FP16
        # TFLOPS; the lowest published figure keeps vendor-neutral requests safe.
        # The 910B4 has 32 GB, not 64: it is no alias here, so it arrives as a
        # new model to rate rather than a 910B reporting half its memory.
        # Huawei publishes no plain FP32 peak. The MindX device plugin reports
        # 910 and 910B alike as huawei.com/Ascend910.
        "name": "Ascend910B",
        "vendor": "huawei",
        "aliases": ["ascend910b", "910b", "ascend-910b", "atlas-800t-a2", "910b1", "910b2", "910b3"],
        "vram_gib": 64,
        "tflops_fp16": 280.0,
        "tflops_fp32": 0,
        "memory_bandwidth_gbps": 0,
        "exchange_rate": 0.6,
        "resource_name": "huawei.com/Ascend910",
        "visible_devices_env": "ASCEND_VISIBLE_DEVICES",
        "shareable": True,
        "slurm_gres_type": "ascend910b",
    },
    {
        "name": "Ascend910A",
        "vendor": "huawei",
        "aliases": ["ascend910a", "910a", "ascend910", "ascend-910"],
        "vram_gib": 32,
        "tflops_fp16": 256.0,
        "tflops_fp32": 0,
        "memory_bandwidth_gbps": 1200,
        "exchange_rate": 0.5,
        "resource_name": "huawei.com/Ascend910",
        "visible_devices_env": "ASCEND_VISIBLE_DEVICES",
        "shareable": False,
        "slurm_gres_type": "ascend910a",
    },
    {
        # Hygon publishes no FP16/FP32 peaks for the Z100; its DTK stack is
        # HIP-based, so HIP_VISIBLE_DEVICES selects cards.
        "name": "DCU-Z100",
        "vendor": "hygon",
        "aliases": ["z100", "dcu-z100", "hygon-z100"],
        "vram_gib": 32,
        "tflops_fp16": 0,
        "tflops_fp32": 0,
        "memory_bandwidth_gbps": 0,
        "exchange_rate": 0.4,
        "resource_name": "hygon.com/dcu",
        "visible_devices_env": "HIP_VISIBLE_DEVICES",
        "shareable": False,
        "slurm_gres_type": "z100",
    },
    {
        # The MLU370-X8 training card (two chips, 48 GB LPDDR5).
        "name": "MLU370",
        "vendor": "cambricon",
        "aliases": ["mlu370", "mlu370-x8", "mlu-370"],
        "vram_gib": 48,
        "tflops_fp16": 96.0,
        "tflops_fp32": 32.0,
        "memory_bandwidth_gbps": 614.4,
        "exchange_rate": 0.35,
        "resource_name": "cambricon.com/mlu",
        "visible_devices_env": "MLU_VISIBLE_DEVICES",
        "shareable": False,
        "slurm_gres_type": "mlu370",
    },
    {
        # ROCR_VISIBLE_DEVICES (not HIP_) so every ROCm runtime in the
        # container sees the same cards; Slurm sets the same variable.
        "name": "MI250X",
        "vendor": "amd",
        "aliases": ["mi250x", "instinct-mi250x"],
        "vram_gib": 128,
        "tflops_fp16": 383.0,
        "tflops_fp32": 47.9,
        "memory_bandwidth_gbps": 3276.8,
        "exchange_rate": 1.23,  # 383 / 312
        "resource_name": "amd.com/gpu",
        "visible_devices_env": "ROCR_VISIBLE_DEVICES",
        "shareable": False,
        "slurm_gres_type": "mi250x",
    },
    {
        "name": "MI300X",
        "vendor": "amd",
        "aliases": ["mi300x", "instinct-mi300x"],
        "vram_gib": 192,
        "tflops_fp16": 1307.4,
        "tflops_fp32": 163.4,
        "memory_bandwidth_gbps": 5300,
        "exchange_rate": 4.19,  # 1307.4 / 312
        "resource_name": "amd.com/gpu",
        "visible_devices_env": "ROCR_VISIBLE_DEVICES",
        "shareable": False,
        "slurm_gres_type": "mi300x",
    },
]

# --- device sharing: MIG profiles and time-slicing (docs/engine.md "Device sharing") -----------------------------

# MIG profiles each card model can be partitioned into: (profile, compute slices of 7, memory GiB). NVIDIA's MIG
# user guide lists them per product; "+me" (media extension) profiles are left out. A card model of this table that
# the catalog lacks (the A100-40G) gets its profile rows once an admin adds the card model.
_MIG_80GB = (
    ("1g.10gb", 1, 10),
    ("1g.20gb", 1, 20),
    ("2g.20gb", 2, 20),
    ("3g.40gb", 3, 40),
    ("4g.40gb", 4, 40),
    ("7g.80gb", 7, 80),
)
MIG_PROFILES: dict[str, tuple[tuple[str, int, int], ...]] = {
    "A100-80G": _MIG_80GB,
    "A800-80G": _MIG_80GB,
    "H100": _MIG_80GB,
    "H800": _MIG_80GB,
    "A100-40G": (
        ("1g.5gb", 1, 5),
        ("1g.10gb", 1, 10),
        ("2g.10gb", 2, 10),
        ("3g.20gb", 3, 20),
        ("4g.20gb", 4, 20),
        ("7g.40gb", 7, 40),
    ),
}
MIG_SLICES = 7  # compute slices of a MIG-capable card


def unit_name(card: str, profile: str) -> str:
    """The catalog name of one MIG profile of a card model, e.g. A100-80G-1g.10gb (what a GPU spec names)."""
    return f"{card}-{profile}"


def time_slice_name(card: str, replicas: int) -> str:
    """The catalog name of one time-sliced replica of a card shared ``replicas`` ways, e.g. A100-80G-ts4."""
    return f"{card}-ts{replicas}"


def parent_of(name: str, partition: str) -> str:
    """The card model a unit's catalog name is built on ("A100-80G-1g.10gb" -> "A100-80G"); "" for a card.

    Unit rows are named by :func:`unit_name` / :func:`time_slice_name` (GPUModel.clean keeps them so), which lets a
    catalog be built from rows without loading each unit's parent row.
    """
    if partition == "mig":
        return re.sub(r"-\d+g\.\d+gb\Z", "", name)
    if partition == "time_slice":
        return re.sub(r"-ts\d+\Z", "", name)
    return ""


def mig_share(card: dict, slices: int, memory_gib: int) -> float:
    """The part of the card a MIG instance is worth: the larger of its compute and its memory share, as a
    ``1(16G,50%)`` HAMi share counts (so 1g.20gb is worth more than 1g.10gb)."""
    card_memory = float(card["vram_gib"]) or memory_gib
    return max(slices / MIG_SLICES, memory_gib / card_memory)


def mig_catalog_entry(card: dict, profile: str, slices: int, memory_gib: int) -> dict:
    """The catalog entry of one MIG profile of ``card``: its own exchange rate (the card's x its share), the
    Kubernetes resource name of the NVIDIA device plugin's "mixed" strategy, and the profile as the Slurm gres type
    (what slurm.conf's AutoDetect=nvml names MIG gres)."""
    share = mig_share(card, slices, memory_gib)
    return {
        "name": unit_name(card["name"], profile),
        "vendor": card["vendor"],
        "aliases": [unit_name(alias, profile) for alias in card["aliases"]],
        "vram_gib": memory_gib,
        "tflops_fp16": round(card["tflops_fp16"] * slices / MIG_SLICES, 2),
        "tflops_fp32": round(card["tflops_fp32"] * slices / MIG_SLICES, 2),
        "memory_bandwidth_gbps": 0,
        "exchange_rate": max(0.001, round(card["exchange_rate"] * share, 3)),
        "resource_name": f"nvidia.com/mig-{profile}",
        "visible_devices_env": card["visible_devices_env"],
        "shareable": False,
        "slurm_gres_type": profile,
        "partition": "mig",
        "parent": card["name"],
        "mig_profile": profile,
    }


MIG_CATALOG: list[dict] = [
    mig_catalog_entry(card, profile, slices, memory)
    for card in GPU_CATALOG
    for profile, slices, memory in MIG_PROFILES.get(card["name"], ())
]
