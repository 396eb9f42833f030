"""The VRAM interceptor (native/vram, docs/vram.md) against a stub CUDA driver built here with gcc.

``make vram`` builds the real library; the stub driver (native/vram/tests/stub_cuda.c) is a libcuda.so.1
with the driver's memory calls over a fake pool, and vram_probe.c drives those calls the three ways
programs reach a driver: linked symbols, dlsym on the driver's handle, and cuGetProcAddress.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from apps.clusters.executors.vram import DEFAULT_LIBRARY, LIMIT_ENV, SHARE_ENV

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "native" / "vram" / "tests"
GIB = 2**30
OUT_OF_MEMORY = "2"


def build_stub(directory: Path) -> Path:
    """The stub driver, the two RTLD_NEXT libraries and the probe, compiled into ``directory``."""
    gcc = shutil.which("gcc")
    assert gcc, "the interceptor's tests need gcc (apt-get install gcc)"
    directory.mkdir(parents=True, exist_ok=True)
    steps = [
        # -Bsymbolic: like the real driver, cuGetProcAddress hands out the driver's own functions.
        [
            "-fPIC",
            "-shared",
            "-Wl,-soname,libcuda.so.1",
            "-Wl,-Bsymbolic",
            "-o",
            "libcuda.so.1",
            str(SOURCES / "stub_cuda.c"),
            "-lpthread",
        ],
        ["-fPIC", "-shared", "-o", "libnexta.so", str(SOURCES / "next_a.c"), "-ldl"],
        ["-fPIC", "-shared", "-o", "libnextb.so", str(SOURCES / "next_b.c")],
    ]
    for args in steps:
        subprocess.run([gcc, "-O2", "-Wall", "-Werror", *args], cwd=directory, check=True)
    (directory / "libcuda.so").symlink_to("libcuda.so.1")
    subprocess.run(
        [
            gcc,
            "-O2",
            "-Wall",
            "-Werror",
            "-o",
            "vram_probe",
            str(SOURCES / "vram_probe.c"),
            "-L.",
            "-Wl,-rpath,$ORIGIN",
            "-Wl,--no-as-needed",
            "-lnexta",
            "-lnextb",
            "-lcuda",
            "-ldl",
            "-lpthread",
        ],
        cwd=directory,
        check=True,
    )
    return directory / "vram_probe"


@pytest.fixture(scope="session")
def library() -> Path:
    """The interceptor as ``make vram`` builds it."""
    subprocess.run(["make", "-s", "vram"], cwd=REPO, check=True)
    assert DEFAULT_LIBRARY.is_file()
    return DEFAULT_LIBRARY


@pytest.fixture(scope="session")
def probe(tmp_path_factory) -> Path:
    return build_stub(tmp_path_factory.mktemp("vram-stub"))


@pytest.fixture
def run(library, probe):
    """Run the probe's steps with the interceptor preloaded and ``limit`` (None: no limit); its output lines."""

    def run_steps(*steps: str, limit: int | str | None, preload: bool = True, **env: str):
        environment = {"PATH": os.environ["PATH"], **env}
        if preload:
            environment["LD_PRELOAD"] = str(library)
        if limit is not None:
            environment[LIMIT_ENV] = str(limit)
        result = subprocess.run([str(probe), *steps], env=environment, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        run_steps.stderr = result.stderr
        return [line.split() for line in result.stdout.splitlines()]

    return run_steps


def test_allocation_over_the_limit_fails_with_out_of_memory_and_nothing_is_taken(run):
    lines = run("alloc:" + str(6 * GIB), "alloc:" + str(6 * GIB), "alloc:" + str(4 * GIB), "info", limit=10 * GIB)
    assert lines[0] == ["alloc", "0"]
    assert lines[1] == ["alloc", OUT_OF_MEMORY]
    assert lines[2] == ["alloc", "0"]  # the refused one left the share as it was: 6 + 4 fit in 10
    assert lines[3] == ["info", "0", "0", str(10 * GIB)]
    assert "refused a GPU allocation of 6442450944 bytes" in run.stderr


def test_free_gives_the_memory_back(run):
    lines = run(f"alloc:{8 * GIB}", f"alloc:{8 * GIB}", "free:0", f"alloc:{8 * GIB}", "free:1", "info", limit=10 * GIB)
    assert [line[1] for line in lines[:5]] == ["0", OUT_OF_MEMORY, "0", "0", "0"]
    assert lines[5] == ["info", "0", str(10 * GIB), str(10 * GIB)]


def test_mem_get_info_reports_the_share_and_never_more_than_the_card_has_free(run):
    lines = run(f"alloc:{3 * GIB}", "info", "info_v1", "info_getproc", limit=16 * GIB)
    share = ["0", str(13 * GIB), str(16 * GIB)]
    assert lines[1] == ["info", *share]
    assert lines[3] == ["info_getproc", *share]
    assert lines[2] == ["info_v1", "0", str(2**32 - 1), str(2**32 - 1)]  # 32-bit fields: clamped by the driver
    # A card with less free than the share (other tenants): the card's own figure.
    lines = run(f"alloc:{3 * GIB}", "info", limit=16 * GIB, HCS_STUB_POOL_BYTES=str(12 * GIB))
    assert lines[1] == ["info", "0", str(9 * GIB), str(12 * GIB)]


def test_cu_get_proc_address_hands_out_the_wrappers(run):
    lines = run(
        "which_proc:cuMemAlloc",
        "which_proc:cuMemFree",
        "which_proc:cuMemGetInfo",
        "which_proc:cuMemAllocAsync",
        "which_proc:cuGetProcAddress",
        "which_proc:cuMemHostAlloc",
        f"getproc:{6 * GIB}",
        f"getproc:{6 * GIB}",
        "free_getproc:0",
        f"getproc:{6 * GIB}",
        "info",
        limit=10 * GIB,
    )
    assert [line[2] for line in lines[:5]] == ["libhcsvram.so"] * 5
    assert lines[5] == ["which_proc", "cuMemHostAlloc", "none"]  # the stub has no such call; nothing invented
    assert [line[1] for line in lines[6:10]] == ["0", OUT_OF_MEMORY, "0", "0"]
    assert lines[10] == ["info", "0", str(4 * GIB), str(10 * GIB)]


def test_dlsym_on_the_driver_handle_hands_out_the_wrappers(run):
    lines = run(
        "which:cuMemAlloc_v2",
        "which:cuGetProcAddress_v2",
        "which:cuMemFree_v2",
        "which:cuInit",
        "which:cuMemHostAlloc",
        f"dlsym:{6 * GIB}",
        f"dlsym:{6 * GIB}",
        limit=10 * GIB,
    )
    assert [line[2] for line in lines[:3]] == ["libhcsvram.so"] * 3
    assert lines[3] == ["which", "cuInit", "libcuda.so.1"]  # a call it does not wrap: the driver's own
    assert lines[4] == ["which", "cuMemHostAlloc", "none"]  # one the driver lacks: nothing invented
    assert [line[1] for line in lines[5:]] == ["0", OUT_OF_MEMORY]


def test_every_allocation_call_counts_against_one_share(run):
    mib = 2**20
    lines = run(
        f"managed:{400 * mib}",
        f"async:{300 * mib}",
        f"getproc_ptsz:{200 * mib}",
        "alloc_v1:" + str(100 * mib),
        "alloc:1",
        "free:1",
        "free:2",
        "free:3",
        "info",
        limit=1000 * mib,
    )
    assert [line[1] for line in lines[:8]] == ["0", "0", "0", "0", OUT_OF_MEMORY, "0", "0", "0"]
    assert lines[8] == ["info", "0", str(600 * mib), str(1000 * mib)]


def test_pitched_allocation_counts_its_padding(run):
    # 1000-byte rows are padded to 1024 by the driver: 4 rows take 4096 bytes, not 4000.
    assert run("pitch:1000:4", "info", limit=4096) == [["pitch", "0", "1024"], ["info", "0", "0", "4096"]]
    # The rows fit, the padding does not: the allocation is given back and refused.
    assert run("pitch:1000:4", "info", limit=4050) == [["pitch", OUT_OF_MEMORY, "0"], ["info", "0", "4050", "4050"]]


def test_virtual_memory_api_allocations_count_and_host_ones_do_not(run):
    # cuMemCreate is how PyTorch's expandable segments (and other allocators that map memory themselves) get it.
    lines = run(
        "which_proc:cuMemCreate",
        "which_proc:cuMemRelease",
        "which:cuMemCreate",
        f"create:{6 * GIB}",
        f"create:{6 * GIB}",
        "info",
        "free:0",
        f"create:{6 * GIB}",
        "info",
        f"create_host:{6 * GIB}",
        f"create_host:{6 * GIB}",
        "info",
        limit=8 * GIB,
    )
    assert [line[2] for line in lines[:3]] == ["libhcsvram.so"] * 3
    assert [line[1] for line in lines[3:5]] == ["0", OUT_OF_MEMORY]
    assert lines[5] == ["info", "0", str(2 * GIB), str(8 * GIB)]
    assert lines[6:8] == [["free", "0"], ["create", "0"]]  # released: its bytes came back
    assert lines[8] == ["info", "0", str(2 * GIB), str(8 * GIB)]
    assert [line[1] for line in lines[9:11]] == ["0", "0"]  # on the host: not the card's memory
    assert lines[11] == ["info", "0", str(2 * GIB), str(8 * GIB)]


def test_a_retained_handle_keeps_the_memory_counted_until_its_last_release(run):
    lines = run(
        f"create:{6 * GIB}", "retain:0", "free:0", f"create:{6 * GIB}", "free:1", f"create:{6 * GIB}", limit=8 * GIB
    )
    # Two references to one allocation: after the first release the memory is still there, and still counted.
    assert [line[1] for line in lines] == ["0", "0", "0", OUT_OF_MEMORY, "0", "0"]


def test_memory_pool_allocations_count(run):
    lines = run(
        "which_proc:cuMemAllocFromPoolAsync",
        f"pool:{6 * GIB}",
        f"pool:{6 * GIB}",
        "free:0",
        f"pool:{6 * GIB}",
        f"alloc:{2 * GIB}",
        "alloc:1",
        limit=8 * GIB,
    )
    assert lines[0][2] == "libhcsvram.so"
    assert [line[1] for line in lines[1:]] == ["0", OUT_OF_MEMORY, "0", "0", "0", OUT_OF_MEMORY]


@pytest.mark.parametrize("shared", [False, True], ids=["per process", "share file"])
def test_threads_allocating_at_once_never_overshoot_and_leave_nothing_counted(run, tmp_path, shared):
    env = {SHARE_ENV: str(tmp_path / "share")} if shared else {}
    lines = run("threads:8:1000000:20000", "info", limit=1_000_000_000, **env)
    assert lines[0] == ["held", "1000000000"]  # exactly the share, never a block more
    assert lines[1] == ["after", "0"]
    assert lines[2] == ["info", "0", "1000000000", "1000000000"]


def test_the_probe_sets_up_a_context_and_times_pairs_as_on_a_real_driver(run):
    # scripts/gpu_check.py runs this probe against a real card: "init" makes a context current (for the
    # threads too) and "time" times allocate/free pairs; against the stub both must hold the share too.
    lines = run("init", "time:1000:1048576", "threads:4:1000000:100", "info", limit=100_000_000)
    assert lines[0] == ["init", "0"]
    assert lines[1][0] == "time" and float(lines[1][1]) > 0
    assert lines[2:] == [["held", "100000000"], ["after", "0"], ["info", "0", "100000000", "100000000"]]


@pytest.mark.parametrize(
    ("preload", "limit", "linked_to"), [(False, None, "libcuda.so.1"), (True, GIB, "libhcsvram.so")]
)
def test_the_probe_times_the_drivers_own_functions_beside_the_wrappers_in_one_process(run, preload, limit, linked_to):
    # How scripts/gpu_check.py measures the interceptor on a card: the driver's own cuMemAlloc_v2, found in its
    # ELF symbol table, is out of the preload's reach; the linked name is the wrapper when preloaded.
    (line,) = run("pairs:10:100:1048576", "info", limit=limit, preload=preload)[:1]
    assert line[:3] == ["pairs", "libcuda.so.1", linked_to]
    assert all(float(x) > 0 for x in line[3:5])


def test_without_a_limit_every_call_passes_through(run):
    lines = run("which:cuMemAlloc_v2", "which_proc:cuMemAlloc", f"alloc:{70 * GIB}", "info", limit=None)
    assert lines[0][2] == "libcuda.so.1"
    assert lines[1][2] == "libcuda.so.1"
    assert lines[2] == ["alloc", "0"]
    assert lines[3] == ["info", "0", str(10 * GIB), str(80 * GIB)]


def test_a_limit_that_cannot_be_read_refuses_every_allocation(run):
    for bad in ("16G", "-1", " 5", "1e9", "99999999999999999999999"):
        assert run("alloc:1", limit=bad) == [["alloc", OUT_OF_MEMORY]]
        assert "is not a whole number of bytes" in run.stderr


def test_rtld_next_lookups_of_other_libraries_still_find_the_next_library(run):
    assert run("next", limit=GIB) == [["next", "b"]]
    assert run("next", limit=GIB, preload=False) == [["next", "b"]]


# -- one share for every process of a job (HCS_VRAM_SHARE_FILE) ----------------------------------------------


@pytest.fixture
def start(library, probe):
    """Start the probe with the interceptor and a limit in the background; returns the process (steps end with
    "hold" to keep it alive until its stdin is closed)."""
    started = []

    def start_steps(*steps: str, limit: int, share: Path) -> subprocess.Popen:
        env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(library), LIMIT_ENV: str(limit), SHARE_ENV: str(share)}
        proc = subprocess.Popen(
            [str(probe), *steps],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    yield start_steps
    for proc in started:
        proc.kill()
        proc.wait()


def held_lines(proc: subprocess.Popen) -> list[list[str]]:
    """The process's lines up to its "hold"."""
    lines = []
    while (line := proc.stdout.readline()) and line.split() != ["hold"]:
        lines.append(line.split())
    assert line, f"the probe ended before holding: {proc.stderr.read()}"
    return lines


def test_processes_naming_one_share_file_draw_on_one_share(run, start, tmp_path):
    share = tmp_path / "share"
    first = start(f"alloc:{6 * GIB}", "hold", limit=8 * GIB, share=share)
    assert held_lines(first) == [["alloc", "0"]]
    # A second process of the job: what the first holds counts, in what it may take and in what it is told.
    lines = run("info", f"alloc:{6 * GIB}", f"alloc:{2 * GIB}", "info", limit=8 * GIB, **{SHARE_ENV: str(share)})
    assert lines == [
        ["info", "0", str(2 * GIB), str(8 * GIB)],
        ["alloc", OUT_OF_MEMORY],
        ["alloc", "0"],
        ["info", "0", "0", str(8 * GIB)],
    ]
    assert "the job's processes hold 6442450944 of its 8589934592 byte share" in run.stderr
    # The second process ended (its 2 GiB went back with it); once the first ends, the whole share is free.
    assert run("info", limit=8 * GIB, **{SHARE_ENV: str(share)}) == [["info", "0", str(2 * GIB), str(8 * GIB)]]
    first.communicate("\n", timeout=30)
    assert first.returncode == 0
    assert run(f"alloc:{8 * GIB}", limit=8 * GIB, **{SHARE_ENV: str(share)}) == [["alloc", "0"]]
    # Without the file each process counts on its own, as before.
    assert run(f"alloc:{6 * GIB}", limit=8 * GIB) == [["alloc", "0"]]


def test_a_forked_child_counts_in_the_share_and_a_killed_one_gives_it_back(run, tmp_path):
    lines = run(
        f"spawn:{6 * GIB}",
        f"alloc:{4 * GIB}",
        "info",
        "kill",
        f"alloc:{4 * GIB}",
        "info",
        limit=8 * GIB,
        **{SHARE_ENV: str(tmp_path / "share")},
    )
    assert lines == [
        ["spawn", "0"],
        ["alloc", OUT_OF_MEMORY],  # the child's 6 GiB count
        ["info", "0", str(2 * GIB), str(8 * GIB)],
        ["kill", "0"],  # SIGKILL: no exit handler ran, the slot is found dead
        ["alloc", "0"],
        ["info", "0", str(4 * GIB), str(8 * GIB)],
    ]


def test_processes_allocating_at_once_fill_the_share_exactly(start, tmp_path):
    share, block = tmp_path / "share", 2**28
    procs = [start(f"fill:{block}", "hold", limit=8 * GIB, share=share) for _ in range(3)]
    filled = [int(held_lines(p)[0][1]) for p in procs]
    assert sum(filled) == 8 * GIB  # never a block more, never a block left
    for p in procs:
        p.communicate("\n", timeout=30)


def test_a_process_killed_while_it_allocates_leaves_the_share_usable(run, start, tmp_path):
    # Eight threads churning allocations for a long while: killed at some point, perhaps holding the share's
    # lock (a robust mutex: the next process takes it over and counts again from the slots).
    share = tmp_path / "share"
    churn = start("threads:8:1000000:100000000", limit=1_000_000_000, share=share)
    time.sleep(0.5)
    churn.kill()
    churn.wait()
    lines = run("info", "alloc:1000000000", limit=1_000_000_000, **{SHARE_ENV: str(share)})
    assert lines == [["info", "0", "1000000000", "1000000000"], ["alloc", "0"]]


def test_the_share_is_the_one_its_file_was_made_with(run, tmp_path):
    share = tmp_path / "share"
    assert run(f"alloc:{GIB}", limit=8 * GIB, **{SHARE_ENV: str(share)}) == [["alloc", "0"]]
    lines = run("info", f"alloc:{9 * GIB}", limit=16 * GIB, **{SHARE_ENV: str(share)})
    assert lines == [["info", "0", str(8 * GIB), str(8 * GIB)], ["alloc", OUT_OF_MEMORY]]
    assert "differs from the share's 8589934592 bytes" in run.stderr


@pytest.mark.parametrize("problem", ["no directory", "wrong size", "a directory", "a symbolic link"])
def test_a_share_file_that_cannot_be_used_refuses_every_allocation(run, tmp_path, problem):
    share = tmp_path / "share"
    if problem == "no directory":
        share = tmp_path / "absent" / "share"
    elif problem == "wrong size":
        share.write_bytes(b"not a share")
    elif problem == "a directory":
        share.mkdir()
    else:
        (tmp_path / "elsewhere").write_bytes(b"")
        share.symlink_to(tmp_path / "elsewhere")
    assert run("alloc:1", limit=GIB, **{SHARE_ENV: str(share)}) == [["alloc", OUT_OF_MEMORY]]
    assert "every GPU allocation of this process will be refused" in run.stderr
