"""The node agent's NVML detector and the VRAM interceptor on a real NVIDIA card: ``python3 scripts/gpu_check.py``.

CI has no GPU, so the test suite runs both against stand-ins (a fake NVML module, a stub ``libcuda.so.1``).
This script is the check on a real host: run it on a machine with an NVIDIA card and driver, gcc and make
(PyTorch, CuPy and JAX are used when importable; ``pynvml`` comes from ``nvidia-ml-py``). No Django, no
database: it reads the card and starts CUDA processes. It prints one row per check (what was expected,
what the card gave) and an overhead table, and with ``--out DIR`` writes ``gpu_check.json`` (every row and
figure) and ``nvml_report.json`` (the node agent's report of this host, as it would be posted).

- **NVML**: the collector's report against ``nvidia-smi`` (uuid, name, memory, PCI bus, driver, CUDA version,
  MIG mode), health of a healthy card, XID event registration, and a second report while a CUDA process
  holds memory and computes (used memory and utilisation must show it). How long one report takes.
- **Interceptor, driver API**: ``native/vram/tests/vram_probe.c`` linked against the real ``libcuda.so.1``
  (the stub's tests, on the driver): over-limit allocations refused with CUDA_ERROR_OUT_OF_MEMORY while the
  card had room (the same steps without the preload succeed), every allocation path counted against one
  share (linked, ``dlsym`` on the driver's handle, ``cuGetProcAddress``, managed, async, per-thread stream,
  pitched with its padding), ``cuMemGetInfo`` reporting the share, threads that never overshoot, and an
  unreadable limit failing closed.
- **Interceptor, frameworks**: PyTorch, CuPy and JAX processes under the preload with a 4 GiB share
  (and without it, the control): what they see as the card's memory, and whether an allocation past the
  share fails with their own out-of-memory error. PyTorch's ``expandable_segments`` allocator (the virtual
  memory API, which the interceptor does not wrap: docs/vram.md) is recorded, not asserted.
- **Remote GPU**: a ``python -m hcs_remote.worker`` process serving this module's PyTorch functions on the card
  (docs/remote-gpu.md), called over loopback with numpy arrays of several layouts and byte orders: results
  against numpy's, a CUDA out-of-memory error relayed as the function's error with the worker still serving,
  and the round trip of a 64 MiB array.
- **Overhead**: 1 MiB allocate/free pairs on the card, without the preload, preloaded without a limit and
  with one, in alternating processes (median of several), against the 5 % target
  (docs/rules.md#resources-and-gpu-requests).
"""

from __future__ import annotations

import argparse
import ctypes.util
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hcs_remote import RemoteError, RemoteGPU, expose  # noqa: E402 - after the path is set (standard library only)

SOURCES = REPO / "native" / "vram" / "tests"
GIB = 2**30
MIB = 2**20
DEFAULT_LIBRARY = REPO / "native" / "vram" / "build" / "libhcsvram.so"  # what `make vram` builds
LIMIT_ENV = "HCS_VRAM_LIMIT_BYTES"  # as apps.clusters.executors.vram sets it (kept free of Django here)
SHARE_ENV = "HCS_VRAM_SHARE_FILE"
OUT_OF_MEMORY = "2"
SHARE = 8 * GIB  # the driver-API checks' limit
FRAMEWORK_SHARE = 4 * GIB
TARGET_PERCENT = 5.0
ROUNDS, BLOCKS, PAIRS = 3, 60, 200  # overhead: processes per mode, block pairs in each, pairs per block

rows: list[dict] = []
figures: dict = {}


def record(section: str, check: str, expected, got, ok: bool | None) -> None:
    """One row: ok None is a recorded observation, not a pass/fail check."""
    rows.append({"section": section, "check": check, "expected": str(expected), "got": str(got), "ok": ok})
    mark = {True: "ok", False: "FAIL", None: "note"}[ok]
    print(f"[{mark:>4}] {section:<10} {check}: expected {expected}; got {got}", flush=True)


def guarded(section: str):
    """Run one section; an exception is a failed row, and the other sections still run."""

    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # report and go on with the next section
                record(section, "section ran to the end", "no exception", f"{type(exc).__name__}: {exc}", False)
                return None

        return run

    return wrap


# ---- NVML: the node agent's report against nvidia-smi ----------------------------------------------------


def nvidia_smi() -> tuple[list[dict], str]:
    fields = "index,uuid,name,memory.total,memory.used,pci.bus_id,driver_version,mig.mode.current"
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    cards = [
        dict(zip(fields.split(","), (c.strip() for c in line.split(",")), strict=True))
        for line in out.splitlines()
        if line.strip()
    ]
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return cards, cuda.group(1) if cuda else ""


LOAD = textwrap.dedent("""
    import sys, time, torch
    held = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda")
    x = torch.randn(8192, 8192, device="cuda")
    print("ready", flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        y = x @ x
        torch.cuda.synchronize()
""")


@guarded("nvml")
def check_nvml(out: Path | None) -> None:
    from apps.clusters.detectors import NodeCollector, detectors_for

    cards, cuda = nvidia_smi()
    detectors = detectors_for("auto")
    record(
        "nvml",
        "detectors found on this host",
        "nvml",
        ",".join(d.name for d in detectors),
        "nvml" in [d.name for d in detectors],
    )
    collector = NodeCollector([d for d in detectors if d.name == "nvml"])
    record("nvml", "collector started", True, collector.start() or collector.reason, bool(collector.started))
    nvml = collector.started[0]
    record("nvml", "XID critical-error events registered", "an NVML event set", nvml._events is not None, None)
    started = time.perf_counter()
    report = collector.collect()
    figures["nvml_report_ms"] = round((time.perf_counter() - started) * 1000, 1)
    record("nvml", "devices reported", len(cards), len(report.devices), len(report.devices) == len(cards))
    record("nvml", "report message", "(empty)", report.message or "(empty)", not report.message)
    record("nvml", "driver", cards[0]["driver_version"], report.driver, report.driver == cards[0]["driver_version"])
    record("nvml", "CUDA version (runtime)", cuda, report.runtime, report.runtime == cuda)
    for device, card in zip(report.devices, cards, strict=False):
        n = f"GPU {card['index']}"
        record("nvml", f"{n} uuid", card["uuid"], device.uuid, device.uuid == card["uuid"])
        record("nvml", f"{n} name", card["name"], device.name, device.name == card["name"])
        total = round(float(card["memory.total"]) / 1024, 2)
        record(
            "nvml", f"{n} memory total GiB", total, device.vram_total_gib, abs(device.vram_total_gib - total) <= 0.01
        )
        used = float(card["memory.used"]) / 1024
        record(
            "nvml",
            f"{n} memory used GiB",
            round(used, 2),
            device.vram_used_gib,
            abs(device.vram_used_gib - used) <= 0.1,
        )
        record(
            "nvml",
            f"{n} PCI bus id",
            card["pci.bus_id"],
            device.pci_bus_id,
            device.pci_bus_id.lower() == card["pci.bus_id"].lower(),
        )
        mig = card["mig.mode.current"] == "Enabled"
        record("nvml", f"{n} MIG mode", mig, device.mig_mode, device.mig_mode == mig)
        health = f"{device.health_score} {device.health_reasons or ''}"
        record(
            "nvml",
            f"{n} health of a card with no errors",
            100,
            health,
            device.health_score == 100 or bool(device.ecc_uncorrected or device.xid_errors),
        )
        record(
            "nvml",
            f"{n} temperature, ECC, NUMA, links",
            "read",
            f"{device.temperature_c} C, ECC {device.ecc_uncorrected}/{device.ecc_corrected}, "
            f"NUMA {device.numa_node}, links {device.links}",
            None,
        )
    idle = report
    if out:
        (out / "nvml_report.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
    if not _importable("torch"):
        record("nvml", "report under load", "PyTorch to make load", "not installed", None)
        return
    load = subprocess.Popen([sys.executable, "-c", LOAD, "12"], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout.readline().strip() == "ready", "the load process did not start"
        time.sleep(3)  # NVML's utilisation is an average over its sample period
        busy = collector.collect()
    finally:
        load.kill()
        load.wait()
    before, after = idle.devices[0], busy.devices[0]
    record(
        "nvml",
        "GPU 0 memory used under load GiB",
        f">= {before.vram_used_gib + 6}",
        after.vram_used_gib,
        after.vram_used_gib >= before.vram_used_gib + 6,
    )
    record("nvml", "GPU 0 utilisation under load %", "> 50", after.utilization, after.utilization > 50)
    record("nvml", "GPU 0 temperature under load C", f"read (idle {before.temperature_c})", after.temperature_c, None)
    collector.stop()


def _importable(name: str) -> bool:
    return subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True).returncode == 0


# ---- the interceptor on the driver API ------------------------------------------------------------------


def build_library() -> None:
    """``make vram``, or its one gcc line where the host has no make."""
    if shutil.which("make"):
        subprocess.run(["make", "-s", "vram"], cwd=REPO, check=True)
        return
    DEFAULT_LIBRARY.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            shutil.which("gcc") or "cc",
            "-O2",
            "-g",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
            "-o",
            str(DEFAULT_LIBRARY),
            str(REPO / "native" / "vram" / "hcsvram.c"),
            "-ldl",
            "-lpthread",
        ],
        check=True,
    )


def find_libcuda() -> Path:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.strip().startswith("libcuda.so.1 ") and "=>" in line:
            return Path(line.split("=>")[-1].strip())
    for folder in ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/cuda/compat"):
        if (Path(folder) / "libcuda.so.1").exists():
            return Path(folder) / "libcuda.so.1"
    raise RuntimeError(f"no libcuda.so.1 found (ldconfig: {ctypes.util.find_library('cuda')})")


def build_probe(directory: Path, libcuda: Path) -> Path:
    gcc = shutil.which("gcc") or "cc"
    for args in (
        ["-o", "libnexta.so", str(SOURCES / "next_a.c"), "-ldl"],
        ["-o", "libnextb.so", str(SOURCES / "next_b.c")],
    ):
        subprocess.run([gcc, "-O2", "-fPIC", "-shared", *args], cwd=directory, check=True)
    subprocess.run(
        [
            gcc,
            "-O2",
            "-Wall",
            "-o",
            "vram_probe",
            str(SOURCES / "vram_probe.c"),
            "-L.",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--no-as-needed",
            "-lnexta",
            "-lnextb",
            str(libcuda),
            "-ldl",
            "-lpthread",
        ],
        cwd=directory,
        check=True,
    )
    return directory / "vram_probe"


class Probe:
    def __init__(self, path: Path, libcuda: Path):
        self.path, self.libcuda = path, libcuda
        self.stderr = ""

    def env(self, limit=None, preload: bool = True, share: Path | None = None) -> dict[str, str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(self.libcuda.parent)}
        if preload:
            env["LD_PRELOAD"] = str(DEFAULT_LIBRARY)
        if limit is not None:
            env[LIMIT_ENV] = str(limit)
        if share is not None:
            env[SHARE_ENV] = str(share)
        return env

    def __call__(self, *steps: str, init: bool = True, **env) -> list[list[str]]:
        """The probe's lines for ``steps``, after "init" (a context) unless ``init`` is False."""
        argv = [str(self.path), *(["init"] if init else []), *steps]
        result = subprocess.run(argv, env=self.env(**env), capture_output=True, text=True, timeout=300)
        self.stderr = result.stderr
        if result.returncode != 0:
            raise RuntimeError(f"probe {' '.join(steps)} exited {result.returncode}: {result.stderr.strip()}")
        lines = [line.split() for line in result.stdout.splitlines()]
        if not init:
            return lines
        if lines[0] != ["init", "0"]:
            raise RuntimeError(f"the driver did not start: {lines[0]}")
        return lines[1:]

    def start(self, *steps: str, **env) -> subprocess.Popen:
        """The probe in the background, after "init" (end the steps with "hold" to keep it until told)."""
        return subprocess.Popen(
            [str(self.path), "init", *steps],
            env=self.env(**env),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def until_hold(proc: subprocess.Popen) -> list[list[str]]:
    """A background probe's lines up to its "hold" (after "init")."""
    lines = []
    while (line := proc.stdout.readline()) and line.split() != ["hold"]:
        lines.append(line.split())
    if not line:
        raise RuntimeError(f"the probe ended before holding: {proc.stderr.read().strip()}")
    return lines[1:]


def results(lines: list[list[str]]) -> list[str]:
    return [line[1] for line in lines]


@guarded("driver")
def check_driver(probe: Probe) -> None:
    section = "driver"
    # The control: without the interceptor the card gives both 6 GiB blocks.
    lines = probe(f"alloc:{6 * GIB}", f"alloc:{6 * GIB}", "info", preload=False)
    card_total = int(lines[2][3])
    figures["card_total_bytes"] = card_total
    record(section, "no preload: 6 GiB + 6 GiB", "0 0", " ".join(results(lines[:2])), results(lines[:2]) == ["0", "0"])
    lines = probe(f"alloc:{6 * GIB}", f"alloc:{6 * GIB}", f"alloc:{2 * GIB}", "info", limit=SHARE)
    record(
        section,
        "8 GiB share: 6, 6, 2 GiB",
        "0 2 0",
        " ".join(results(lines[:3])),
        results(lines[:3]) == ["0", OUT_OF_MEMORY, "0"],
    )
    record(
        section, "cuMemGetInfo on a full share", f"0 {SHARE}", " ".join(lines[3][2:]), lines[3][2:] == ["0", str(SHARE)]
    )
    record(
        section,
        "refusal is said on stderr",
        "hcsvram: refused ...",
        probe.stderr.strip()[:80],
        "refused a GPU allocation of 6442450944 bytes" in probe.stderr,
    )
    lines = probe(
        "which:cuMemAlloc_v2",
        "which_proc:cuMemAlloc",
        "which_proc:cuMemGetInfo",
        "which_proc:cuMemAllocAsync",
        "which:cuInit",
        limit=SHARE,
    )
    got = [line[2] for line in lines]
    record(
        section,
        "dlsym / cuGetProcAddress hand out",
        "hcsvram x4, driver for cuInit",
        " ".join(got),
        got == ["libhcsvram.so"] * 4 + [lines[4][2]] and lines[4][2] != "libhcsvram.so",
    )
    lines = probe("which:cuMemAlloc_v2", "which_proc:cuMemAlloc", limit=None)
    got = [line[2] for line in lines]
    record(section, "no limit: the driver's own functions", "libcuda x2", " ".join(got), "libhcsvram.so" not in got)
    steps = (
        f"getproc:{3 * GIB}",
        f"dlsym:{3 * GIB}",
        f"managed:{GIB}",
        f"async:{512 * MIB}",
        f"getproc_ptsz:{512 * MIB}",
        f"alloc:{MIB}",
        "info",
        "info_getproc",
        "free:0",
        f"getproc_ptsz:{GIB}",
        "info",
    )
    lines = probe(*steps, limit=SHARE)
    got = results(lines[:6]) + [results(lines[8:10])[1]]
    record(
        section,
        "getproc 3G, dlsym 3G, managed 1G, async, ptsz, +1 MiB, free, ptsz 1G",
        "0 0 0 0 0 2 0",
        " ".join(got),
        got == ["0", "0", "0", "0", "0", OUT_OF_MEMORY, "0"],
    )
    share_info = [lines[6][2:], lines[7][2:], lines[10][2:]]
    record(
        section,
        "info / info through getproc / after the free",
        f"0 {SHARE}, 0 {SHARE}, {2 * GIB} {SHARE}",
        share_info,
        share_info == [["0", str(SHARE)], ["0", str(SHARE)], [str(2 * GIB), str(SHARE)]],
    )
    # A pitched allocation counts the driver's real padding: used = pitch * height.
    lines = probe("pitch:1000000:1024", "info", limit=SHARE)
    pitch = int(lines[0][2])
    used = SHARE - int(lines[1][2])
    figures["pitch_for_1000000_byte_rows"] = pitch
    record(
        section,
        "pitched 1,000,000 x 1024 counts pitch x height",
        f"{pitch} x 1024 = {pitch * 1024}",
        used,
        lines[0][1] == "0" and used == pitch * 1024 and pitch >= 1_000_000,
    )
    lines = probe("threads:8:268435456:2000", "info", limit=SHARE)
    exact = lines[0] == ["held", str(SHARE)] and lines[1] == ["after", "0"]
    record(
        section,
        "8 threads, 256 MiB blocks until refused",
        f"held {SHARE}, after 0",
        f"{lines[0][1]}, {lines[1][1]}",
        exact,
    )
    # The virtual memory API's physical allocations (PyTorch's expandable segments) and memory pools count too.
    lines = probe(
        f"create:{6 * GIB}",
        f"create:{6 * GIB}",
        "info",
        "free:0",
        f"create:{6 * GIB}",
        f"create_host:{6 * GIB}",
        limit=SHARE,
    )
    got = [*results(lines[:2]), lines[2][2], *results(lines[3:5])]
    want = ["0", OUT_OF_MEMORY, str(2 * GIB), "0", "0"]
    record(section, "cuMemCreate 6, 6 GiB; info; release; 6 GiB", want, got, got == want)
    record(
        section,
        "cuMemCreate on the host (not the card's memory)",
        "not refused (driver's answer)",
        results(lines[5:6]),
        None,
    )
    lines = probe(f"pool:{6 * GIB}", f"pool:{6 * GIB}", "free:0", f"pool:{6 * GIB}", "info", limit=SHARE)
    got = [*results(lines[:4]), lines[4][2]]
    want = ["0", OUT_OF_MEMORY, "0", "0", str(2 * GIB)]
    record(section, "cuMemAllocFromPoolAsync 6, 6 GiB; free; 6 GiB; info", want, got, got == want)
    lines = probe(f"alloc:{MIB}", limit="16G")
    record(
        section,
        "limit '16G' (not bytes) fails closed",
        OUT_OF_MEMORY,
        results(lines)[0],
        results(lines) == [OUT_OF_MEMORY],
    )
    lines = probe("info", limit=card_total * 2)
    record(
        section, "share larger than the card: info", f"total {card_total}", lines[0][3], int(lines[0][3]) <= card_total
    )


@guarded("share")
def check_share(probe: Probe, work: Path) -> None:
    """Every process of a job that names one share file (HCS_VRAM_SHARE_FILE) draws on one share."""
    section = "share"
    share = work / "share-1"
    first = probe.start(f"alloc:{6 * GIB}", "hold", limit=SHARE, share=share)
    try:
        held = until_hold(first)
        lines = probe("info", f"alloc:{6 * GIB}", f"alloc:{2 * GIB}", "info", limit=SHARE, share=share)
    finally:
        first.communicate("\n", timeout=60)
    got = [results(held)[0], *results(lines[1:3])]
    record(
        section, "process A holds 6 GiB; process B asks 6, then 2 GiB", "0; 2 0", got, got == ["0", OUT_OF_MEMORY, "0"]
    )
    record(
        section,
        "B's cuMemGetInfo before / after",
        f"{2 * GIB} {SHARE}, 0 {SHARE}",
        [lines[0][2:], lines[3][2:]],
        [lines[0][2:], lines[3][2:]] == [[str(2 * GIB), str(SHARE)], ["0", str(SHARE)]],
    )
    lines = probe(f"alloc:{SHARE}", limit=SHARE, share=share)
    record(section, "after both exited: the whole share", "0", results(lines), results(lines) == ["0"])
    # A child with a context of its own (a context does not survive fork: spawned before the parent's "init").
    steps = (f"spawn:{6 * GIB}", "init", f"alloc:{4 * GIB}", "info", "kill", f"alloc:{4 * GIB}", "info")
    lines = probe(*steps, init=False, limit=SHARE, share=work / "share-2")
    got = [lines[0][1], lines[2][1], lines[3][2], lines[4][1], lines[5][1], lines[6][2]]
    want = ["0", OUT_OF_MEMORY, str(2 * GIB), "0", "0", str(4 * GIB)]
    record(section, "forked child holds 6 GiB; parent asks 4; SIGKILL the child; 4 again", want, got, got == want)
    # Killed while eight threads churn allocations (most often holding the share's lock).
    churn = probe.start(f"threads:8:{256 * MIB}:100000000", limit=SHARE, share=work / "share-3")
    time.sleep(5)
    churn.kill()
    churn.wait()
    lines = probe("info", f"alloc:{SHARE}", limit=SHARE, share=work / "share-3")
    got = [lines[0][2], lines[1][1]]
    record(
        section,
        "after a process was killed mid-churn: free, whole share",
        [str(SHARE), "0"],
        got,
        got == [str(SHARE), "0"],
    )
    if _importable("torch"):
        check_share_torch(work / "share-torch")


TORCH_HOLDER = """
import sys, torch
a = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
print("hold", flush=True)
sys.stdin.readline()
"""
TORCH_OTHER = """
import json, torch
free, total = torch.cuda.mem_get_info()
try:
    b = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); over = "allocated"
except torch.cuda.OutOfMemoryError:
    over = "OutOfMemoryError"
c = torch.empty(2**29, dtype=torch.uint8, device="cuda")  # what is left of the share is still usable
print(json.dumps({"free": free, "total": total, "over": over}))
"""


def check_share_torch(share: Path) -> None:
    """Two PyTorch processes on one 4 GiB share: the first holds 3 GiB, the second sees and gets the rest."""
    env = {**os.environ, "LD_PRELOAD": str(DEFAULT_LIBRARY), LIMIT_ENV: str(FRAMEWORK_SHARE), SHARE_ENV: str(share)}
    holder = subprocess.Popen(
        [sys.executable, "-c", TORCH_HOLDER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if holder.stdout.readline().strip() != "hold":
            raise RuntimeError(f"the holding process failed: {holder.stderr.read().strip()[-300:]}")
        other = subprocess.run(
            [sys.executable, "-c", TORCH_OTHER], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        holder.communicate("\n", timeout=120)
    if other.returncode != 0:
        raise RuntimeError(f"the second process failed: {other.stderr.strip()[-300:]}")
    got = json.loads(other.stdout.strip().splitlines()[-1])
    figures["torch two processes, one share"] = got
    ok = got["total"] == FRAMEWORK_SHARE and got["free"] <= GIB and got["over"] == "OutOfMemoryError"
    record(
        "share",
        "PyTorch: A holds 3 GiB of 4; B's mem_get_info, 2 GiB more",
        "total 4 GiB, free <= 1 GiB, OOM",
        f"total {got['total']}, free {got['free']}, {got['over']}",
        ok,
    )


@guarded("overhead")
def check_overhead(probe: Probe) -> None:
    """1 MiB pairs on the card, inside one process: blocks through the driver's own functions (found in its ELF
    symbol table, which no preload wraps) alternate with blocks through the linked names (the interceptor's
    wrappers when preloaded). Separate processes differ by up to 15 % from one another on the same card, so
    only the comparison within one process resolves what the interceptor adds."""
    share = Path(tempfile.mkdtemp()) / "share"
    modes = {
        "no preload (control)": {"preload": False},
        "preload, no limit": {"limit": None},
        "preload, limit": {"limit": 64 * GIB},
        "limit, share file": {"limit": 64 * GIB, "share": share},
    }
    runs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    objects = {}
    for _ in range(ROUNDS):
        for mode, kwargs in modes.items():
            line = probe("time:200:1048576", f"pairs:{BLOCKS}:{PAIRS}:1048576", **kwargs)[1]  # 200 pairs warm up
            if line[1] == "none":
                raise RuntimeError("the driver's own cuMemAlloc_v2 was not found in its symbol table")
            objects[mode] = (line[1], line[2])
            runs[mode].append((float(line[3]), float(line[4]), float(line[5])))
    print(
        f"\n1 MiB cuMemAlloc_v2 + cuMemFree_v2 pairs, {ROUNDS} processes per mode x {BLOCKS} block pairs of "
        f"{PAIRS}; medians"
    )
    print(f"{'mode':<22}{'driver ns/pair':>16}{'linked ns/pair':>16}{'added ns':>10}{'overhead %':>12}  linked to")
    table = []
    for mode, values in runs.items():
        own = statistics.median(v[0] for v in values)
        linked = statistics.median(v[1] for v in values)
        added = statistics.median(v[2] for v in values)
        table.append(
            {
                "mode": mode,
                "driver_ns": own,
                "linked_ns": linked,
                "added_ns": added,
                "overhead_percent": added / own * 100,
                "linked_to": objects[mode][1],
            }
        )
        print(f"{mode:<22}{own:>16,.0f}{linked:>16,.0f}{added:>10,.0f}{added / own * 100:>12.3f}  {objects[mode][1]}")
    print()
    figures["overhead_1mib_pairs"] = table
    record(
        "overhead",
        "timed through",
        "the driver's own / the wrappers",
        objects["preload, limit"],
        objects["preload, limit"] == ("libcuda.so.1", "libhcsvram.so"),
    )
    for row in table[2:]:
        added = row["overhead_percent"]
        record(
            "overhead", f"1 MiB pair, {row['mode']}", f"< {TARGET_PERCENT} %", f"{added:.3f} %", added < TARGET_PERCENT
        )


# ---- the interceptor under frameworks -------------------------------------------------------------------

FRAMEWORKS = {
    "torch": """
        import json, torch
        free, total = torch.cuda.mem_get_info()
        a = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")
        try:
            b = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda"); over = "allocated"
        except torch.cuda.OutOfMemoryError:
            over = "OutOfMemoryError"
        del a
        torch.cuda.empty_cache()
        c = torch.empty(3 * 2**30, dtype=torch.uint8, device="cuda")  # what was freed is usable again
        x = torch.randn(2048, 2048, device="cuda")
        ok = bool(torch.isfinite((x @ x).sum()).item())
        print(json.dumps({"total": total, "free": free, "over_share": over, "after_free": "allocated", "compute": ok}))
    """,
    "cupy": """
        import json, cupy
        free, total = cupy.cuda.runtime.memGetInfo()
        a = cupy.empty(3 * 2**30, dtype=cupy.uint8)
        try:
            b = cupy.empty(2 * 2**30, dtype=cupy.uint8); over = "allocated"
        except cupy.cuda.memory.OutOfMemoryError:
            over = "OutOfMemoryError"
        del a
        cupy.get_default_memory_pool().free_all_blocks()
        c = cupy.empty(3 * 2**30, dtype=cupy.uint8)
        print(json.dumps({"total": total, "free": free, "over_share": over, "after_free": "allocated",
                          "compute": True}))
    """,
    "jax": """
        import json, jax, jax.numpy as jnp
        d = jax.devices()[0]
        stats = d.memory_stats() or {}
        limit = stats.get("bytes_limit", 0)
        a = jnp.zeros(3 * 2**30, dtype=jnp.uint8).block_until_ready()
        try:
            b = jnp.zeros(2 * 2**30, dtype=jnp.uint8).block_until_ready(); over = "allocated"
        except Exception as exc:
            over = type(exc).__name__ + (" RESOURCE_EXHAUSTED" if "RESOURCE_EXHAUSTED" in str(exc) else "")
        print(json.dumps({"total": limit, "free": None, "over_share": over, "after_free": None, "compute": True}))
    """,
}


@guarded("framework")
def check_frameworks() -> None:
    for name, code in FRAMEWORKS.items():
        if not _importable(name):
            record("framework", f"{name}", "importable", "not installed", None)
            continue
        runs = {
            "control (no preload)": {},
            f"{FRAMEWORK_SHARE // GIB} GiB share": {
                "LD_PRELOAD": str(DEFAULT_LIBRARY),
                LIMIT_ENV: str(FRAMEWORK_SHARE),
            },
        }
        if name == "torch":
            runs["share, expandable_segments"] = {
                **runs[f"{FRAMEWORK_SHARE // GIB} GiB share"],
                "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
            }
        if name == "jax":  # JAX takes a fraction of what the card reports up front; let it size from the share
            for env in runs.values():
                env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.95"
        for label, extra in runs.items():
            env = {**os.environ, **extra}
            result = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
            )
            if result.returncode != 0:
                tail = result.stderr.strip().splitlines()[-3:]
                record("framework", f"{name}, {label}", "ran", f"exit {result.returncode}: {' | '.join(tail)}", False)
                continue
            got = json.loads(result.stdout.strip().splitlines()[-1])
            figures[f"{name} {label}"] = got
            if label.startswith("control"):
                record(
                    "framework",
                    f"{name}, {label}: 3 GiB then 2 GiB",
                    "allocated",
                    got["over_share"],
                    got["over_share"] == "allocated",
                )
            elif "expandable" in label:  # the virtual memory API (cuMemCreate), counted like the rest
                record(
                    "framework",
                    f"{name}, {label}: total seen, 2 GiB past 3",
                    f"total {FRAMEWORK_SHARE}, OutOfMemoryError",
                    f"total {got['total']}, {got['over_share']}",
                    got["total"] == FRAMEWORK_SHARE and "OutOfMemory" in got["over_share"],
                )
            else:
                seen_ok = name == "jax" or got["total"] == FRAMEWORK_SHARE
                record(
                    "framework",
                    f"{name}, {label}: memory seen",
                    f"total {FRAMEWORK_SHARE}",
                    f"total {got['total']}, free {got['free']}",
                    seen_ok,
                )
                refused = "OutOfMemory" in got["over_share"] or "RESOURCE_EXHAUSTED" in got["over_share"]
                record(
                    "framework",
                    f"{name}, {label}: 2 GiB past 3 GiB",
                    "its out-of-memory error",
                    got["over_share"],
                    refused,
                )
                if name != "jax":
                    record(
                        "framework",
                        f"{name}, {label}: after a free, compute",
                        "allocated, True",
                        f"{got['after_free']}, {got['compute']}",
                        got["compute"] is True,
                    )


# ---- remote GPU: a worker serving functions on the card -------------------------------------------------

REMOTE_KEY = "9c" * 32


def _cuda(array):
    import torch  # only the worker process imports it

    return torch.tensor(array, device="cuda")


@expose
def cuda_name() -> str:
    """The card's name, as PyTorch sees it."""
    import torch

    return torch.cuda.get_device_name(0)


@expose
def cuda_matmul(a, b):
    """a @ b on the card."""
    return (_cuda(a) @ _cuda(b)).cpu().numpy()


@expose
def cuda_scale(x, factor: float = 2.0):
    """x * factor on the card."""
    return (_cuda(x) * factor).cpu().numpy()


@expose
def cuda_allocate(gib: float) -> float:
    """Take ``gib`` GiB on the card (and give it back): past the card, CUDA's out-of-memory error."""
    import torch

    torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
    return gib


@guarded("remote")
def check_remote() -> None:
    import numpy as np  # the device hosts have it; the portal's own tests do not need this

    env = {
        **os.environ,
        "HCS_REMOTE_GPU_KEY": REMOTE_KEY,
        "HCS_PROJECT": "gpu-check",
        "PYTHONPATH": os.pathsep.join([str(REPO / "scripts"), str(REPO)]),
    }
    argv = [
        sys.executable,
        "-m",
        "hcs_remote.worker",
        "--module",
        "gpu_check",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-payload-mib",
        "256",
    ]
    worker = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = worker.stdout.readline()
        if "listening on " not in line:
            raise RuntimeError(f"the worker did not start: {line!r}")
        address = line.split("listening on ", 1)[1].split(",", 1)[0]
        rng = np.random.default_rng(7)
        a, b = rng.standard_normal((512, 384), dtype=np.float32), rng.standard_normal((384, 256), dtype=np.float32)
        with RemoteGPU(address, key=REMOTE_KEY, project="gpu-check", timeout=120) as gpu:
            names = sorted(gpu.functions)
            record(
                "remote",
                "functions served",
                "cuda_allocate cuda_matmul cuda_name cuda_scale",
                " ".join(names),
                names == ["cuda_allocate", "cuda_matmul", "cuda_name", "cuda_scale"],
            )
            card = nvidia_smi()[0][0]["name"]
            got = gpu.cuda_name()
            record("remote", "the worker computes on", card, got, got == card)
            cases = {
                "C order": (a, b),
                "Fortran order, big-endian": (np.asfortranarray(a), b.astype(">f4")),
                "transposed, strided": (np.ascontiguousarray(a.T).T, b[:, ::1]),
            }
            for label, (left, right) in cases.items():
                c = gpu.cuda_matmul(left, right)
                error = float(np.max(np.abs(c - a @ b)))
                record(
                    "remote",
                    f"matmul 512x384 @ 384x256, {label}",
                    "max |error| < 1e-3 vs numpy",
                    f"{c.shape} {c.dtype}, {error:.2e}",
                    c.shape == (512, 256) and error < 1e-3,
                )
            half = np.arange(1024, dtype=np.float16).reshape(32, 32)
            got = gpu.cuda_scale(half, 0.5)
            record(
                "remote",
                "float16 scale",
                "float16, values x 0.5",
                got.dtype,
                got.dtype == np.float16 and np.array_equal(got, half * np.float16(0.5)),
            )
            try:
                gpu.cuda_allocate(4096)
                outcome = "allocated"
            except RemoteError as exc:
                outcome = f"{exc.kind}: {str(exc)[:90]}"
            record(
                "remote",
                "4 TiB on an 80 GB card",
                "function_error: ... out of memory",
                outcome,
                outcome.startswith("function_error") and "out of memory" in outcome.lower(),
            )
            got = gpu.cuda_name()
            record("remote", "the worker serves after that error", card, got, got == card)
            big = rng.standard_normal(16 * 2**20, dtype=np.float32)  # 64 MiB
            times = []
            for _ in range(7):
                started = time.perf_counter()
                back = gpu.cuda_scale(big, 1.0)
                times.append(time.perf_counter() - started)
            p50 = statistics.median(times)
            figures["remote_64mib_round_trip_ms"] = round(p50 * 1000, 1)
            record(
                "remote",
                "64 MiB there and back through the card (p50 of 7)",
                "the same values",
                f"{p50 * 1000:.0f} ms, {2 * 64 / p50:.0f} MiB/s both ways ({gpu.transport})",
                np.array_equal(back, big),
            )
    finally:
        worker.kill()
        worker.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write gpu_check.json and nvml_report.json here")
    parser.add_argument(
        "--skip", action="append", default=[], choices=["nvml", "driver", "share", "overhead", "framework", "remote"]
    )
    parser.add_argument(
        "--libcuda",
        type=Path,
        help="the driver library to link the probe to (a dry run against "
        "the tests' stub: build it as tests/executors/test_vram.py does; implies --skip nvml, framework, remote)",
    )
    args = parser.parse_args()
    if args.libcuda:
        args.skip += ["nvml", "framework", "remote"]
    elif not shutil.which("nvidia-smi"):
        print("gpu_check: no nvidia-smi on this host: it needs an NVIDIA card and driver", file=sys.stderr)
        return 2
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    if not args.libcuda:
        print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
    if "nvml" not in args.skip:
        check_nvml(args.out)
    build_library()
    with tempfile.TemporaryDirectory() as work:
        libcuda = args.libcuda.resolve() if args.libcuda else find_libcuda()
        probe = Probe(build_probe(Path(work), libcuda), libcuda)
        figures["libcuda"] = str(libcuda)
        if "driver" not in args.skip:
            check_driver(probe)
        if "share" not in args.skip:
            check_share(probe, Path(work))
        if "overhead" not in args.skip:
            check_overhead(probe)
    if "framework" not in args.skip:
        check_frameworks()
    if "remote" not in args.skip:
        check_remote()
    failed = [r for r in rows if r["ok"] is False]
    passed = sum(1 for r in rows if r["ok"])
    print(f"\n{passed} checks passed, {len(failed)} failed, {sum(1 for r in rows if r['ok'] is None)} noted")
    if args.out:
        (args.out / "gpu_check.json").write_text(json.dumps({"rows": rows, "figures": figures}, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
