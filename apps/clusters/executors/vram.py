"""VRAM shares where no HAMi enforces them (local and Slurm jobs): the LD_PRELOAD interceptor.

``native/vram/hcsvram.c``, built by ``make vram``, wraps the CUDA driver's memory calls and holds the
processes of a job to ``HCS_VRAM_LIMIT_BYTES`` together: they count in one share file,
``HCS_VRAM_SHARE_FILE`` (docs/vram.md). The executors preload it into every process of a job that runs on
part of one NVIDIA card; Kubernetes shares are enforced by HAMi's own interceptor instead.
"""

from __future__ import annotations

import math
from pathlib import Path

from .base import ExecutorError, JobSpec

LIMIT_ENV = "HCS_VRAM_LIMIT_BYTES"
# The file every process of one instance counts its GPU memory in (created by the first that allocates).
SHARE_ENV = "HCS_VRAM_SHARE_FILE"
# A local job's: in the sandbox's own /tmp, a memory file system private to that instance's sandbox.
SANDBOX_SHARE_FILE = "/tmp/.hcs-vram-share"
LIBRARY_NAME = "libhcsvram.so"
# Where ``make vram`` builds it, in the portal's own tree.
DEFAULT_LIBRARY = Path(__file__).resolve().parents[3] / "native" / "vram" / "build" / LIBRARY_NAME
# Where a local job sees it: bound read-only into the sandbox, which shows none of the portal's tree.
SANDBOX_LIBRARY = "/run/hcs-vram/" + LIBRARY_NAME

# The interceptor wraps the CUDA driver API: it limits NVIDIA cards only.
_VENDORS = ("nvidia",)


def vram_limit_bytes(spec: JobSpec) -> int | None:
    """The VRAM a job on part of one NVIDIA card may allocate, in bytes; None when nothing is to be limited.

    ``1(16G,50%)`` gets its 16 GiB; a fraction such as ``0.5(vgpu)`` gets that part of the card's memory.
    Raises a non-retryable ExecutorError when the share cannot be sized (a model with no memory figure).
    """
    model = spec.gpu_model
    if spec.gpus_per_instance <= 0 or model is None or model.vendor.lower() not in _VENDORS:
        return None
    slot = next((s for p in spec.placements for s in p.devices), None)
    fraction = spec.gpus_per_instance if spec.gpus_per_instance < 1 else (slot.fraction if slot else 1.0)
    vram_gib = slot.vram_gib if slot is not None else None
    if vram_gib is not None:
        return int(vram_gib * 2**30)
    if fraction >= 1:
        return None  # whole cards: nothing to share
    if model.vram_gib <= 0:
        raise ExecutorError(
            f"cannot limit a {fraction:g} share of a {model.name} card: the catalog gives the model no memory "
            "size (set vram_gib on the GPU model)",
            retryable=False,
        )
    return math.floor(fraction * model.vram_gib * 2**30)


def preload_environment(library: str, limit: int, env: dict[str, str], share_file: str) -> dict[str, str]:
    """The variables that load the interceptor with ``limit`` for all the processes that count in ``share_file``:
    it comes first, any preload of the task after it."""
    own = env.get("LD_PRELOAD", "").strip()
    return {"LD_PRELOAD": f"{library}:{own}" if own else library, LIMIT_ENV: str(limit), SHARE_ENV: share_file}


def check_library(path: Path) -> Path:
    """The interceptor at ``path``, readable by any job user; a non-retryable ExecutorError saying how to build
    it otherwise (a share must never run unlimited)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        raise ExecutorError(
            f"this job holds part of a card, and its VRAM limit needs {path}, which is missing: run `make vram`",
            retryable=False,
        )
    if not mode & 0o004:
        raise ExecutorError(f"{path} must be readable by every user (chmod 0644) for jobs to load it", retryable=False)
    return path
