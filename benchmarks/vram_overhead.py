"""What the VRAM interceptor costs an allocate/free pair: ``python -m benchmarks.vram_overhead``.

Builds the interceptor (``make vram``), the stub CUDA driver of its tests and a C loop of cuMemAlloc_v2 /
cuMemFree_v2 pairs of 1 MiB. In one process, blocks of pairs through the stub's unwrapped aliases (the
baseline) alternate with blocks through the driver's names, which the preloaded interceptor wraps: with a
limit (counting; per process, and job-wide through a share file) and without one (pass-through); without the
preload both are the stub (the control, ~0 %).
Alternating blocks keeps the comparison fair on a busy machine. The stub's own calls cost almost nothing
(a host malloc), so the first rows show the interceptor's absolute cost; ``HCS_STUB_SPIN`` then makes each
stub call spin, so that a pair costs microseconds as on a real card (allocations there map pages), which is
what the relative overhead is about. Seed 004's target: under 5 %.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

from .table import print_table

REPO = Path(__file__).resolve().parents[1]
SOURCES = REPO / "native" / "vram" / "tests"
LIBRARY = REPO / "native" / "vram" / "build" / "libhcsvram.so"
TARGET_PERCENT = 5.0
REPEATS = 3
BLOCKS = 200
# (stub spin per call in loop turns, pairs per block, threads, how the loop found the calls)
CASES = [
    (0, 5_000, 1, "linked"),
    (0, 5_000, 1, "getproc"),
    (0, 5_000, 2, "linked"),
    (1_000, 500, 1, "linked"),
    (1_000, 500, 1, "getproc"),
    (1_000, 500, 2, "linked"),
    (5_000, 100, 1, "linked"),
]
# "limit, share file": the job-wide share (HCS_VRAM_SHARE_FILE): a process-shared lock per call.
MODES = {"no preload": "none", "preload, no limit": "pass", "preload, limit": "limit", "limit, share file": "share"}


def build(directory: Path) -> Path:
    """The interceptor, the stub driver and the loop; returns the loop's path."""
    subprocess.run(["make", "-s", "vram"], cwd=REPO, check=True)
    gcc = shutil.which("gcc") or "cc"
    subprocess.run(
        [
            gcc,
            "-O2",
            "-fPIC",
            "-shared",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",
            "-o",
            "libcuda.so.1",
            str(SOURCES / "stub_cuda.c"),
            "-lpthread",
        ],
        cwd=directory,
        check=True,
    )
    (directory / "libcuda.so").symlink_to("libcuda.so.1")
    subprocess.run(
        [
            gcc,
            "-O2",
            "-o",
            "vram_bench",
            str(SOURCES / "vram_bench.c"),
            "-L.",
            "-Wl,-rpath,$ORIGIN",
            "-lcuda",
            "-ldl",
            "-lpthread",
        ],
        cwd=directory,
        check=True,
    )
    return directory / "vram_bench"


def timed(loop: Path, mode: str, spin: int, pairs: int, threads: int, how: str) -> tuple[float, float, float]:
    """Median nanoseconds per pair of one run: baseline, through the driver's names, and the median
    difference of the two within a pair of neighbouring blocks (what the interceptor adds)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HCS_STUB_SPIN": str(spin)}
    if mode != "none":
        env["LD_PRELOAD"] = str(LIBRARY)
    if mode in ("limit", "share"):
        env["HCS_VRAM_LIMIT_BYTES"] = str(64 * 2**30)
    argv = [str(loop), str(BLOCKS), str(pairs), str(1 << 20), str(threads), how]
    with tempfile.TemporaryDirectory() as tmp:
        if mode == "share":
            env["HCS_VRAM_SHARE_FILE"] = str(Path(tmp) / "share")
        out = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    bare, wrapped, added = (float(v) for v in out.stdout.split())
    return bare, wrapped, added


def run() -> list[list]:
    """Time every case in each mode (median of ``REPEATS`` runs) and print the table."""
    with tempfile.TemporaryDirectory() as tmp:
        loop = build(Path(tmp))
        rows = []
        for spin, pairs, threads, how in CASES:
            for label, mode in MODES.items():
                runs = [timed(loop, mode, spin, pairs, threads, how) for _ in range(REPEATS)]
                bare = statistics.median(r[0] for r in runs)
                wrapped = statistics.median(r[1] for r in runs)
                added = statistics.median(r[2] for r in runs)
                rows.append([spin, how, threads, label, bare, wrapped, added, added / bare * 100])
    print_table(
        ["stub spin", "calls via", "threads", "mode", "ns/pair stub", "ns/pair wrapped", "added ns", "overhead %"],
        rows,
    )
    print(f"target: under {TARGET_PERCENT:g} % where a pair costs microseconds, as on a card (stub spin > 0)")
    return rows


if __name__ == "__main__":
    run()
