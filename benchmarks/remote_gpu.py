"""Remote GPU on one host: round-trip latency and throughput of ``hcs_remote`` calls for a few array sizes,
over the socket path (TCP on loopback, what callers on other hosts use) and the shared-memory path (what a
caller on the worker's host moves to), side by side, against bare TCP moving the same bytes.

The worker is a real ``python -m hcs_remote.worker`` process serving ``identity`` (the array comes back as it
went), so each call moves a numpy array there and back; no GPU is involved, this measures the transport.

    python -m benchmarks.remote_gpu [--sizes 0,4096,1048576,16777216,67108864] [--seconds 2]
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.table import print_table
from hcs_remote import RemoteGPU, expose

ROOT = Path(__file__).resolve().parents[1]
KEY = "be" * 32


@expose
def identity(x):
    """The array, back as it came."""
    return x


def _bare_echo_server() -> tuple[socket.socket, int]:
    """A thread echoing length-prefixed messages: the floor any protocol over loopback TCP pays."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            while True:
                head = _read(conn, 8)
                if head is None:
                    return
                body = _read(conn, struct.unpack(">Q", head)[0])
                conn.sendall(head)
                conn.sendall(body)

    threading.Thread(target=serve, daemon=True).start()
    return listener, listener.getsockname()[1]


def _read(conn: socket.socket, size: int):
    buffer = bytearray(size)
    view, got = memoryview(buffer), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if n == 0:
            return None
        got += n
    return buffer


def _timed(call, seconds: float, at_least: int = 7) -> list[float]:
    """Round-trip times of ``call`` repeated for about ``seconds`` (at least ``at_least`` calls, after one
    warm-up)."""
    call()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < at_least or time.perf_counter() < deadline:
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _start_worker() -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "HCS_REMOTE_GPU_KEY": KEY, "HCS_PROJECT": "bench", "PYTHONPATH": str(ROOT)}
    argv = [
        sys.executable,
        "-m",
        "hcs_remote.worker",
        "--module",
        "benchmarks.remote_gpu",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-payload-mib",
        "1024",
    ]
    worker = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = worker.stdout.readline()
    if "listening on " not in line:
        worker.kill()
        raise SystemExit(f"the worker did not start: {line!r}")
    return worker, line.split("listening on ", 1)[1].split(",", 1)[0]


def _label(size: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g} {unit}"
    return f"{size} B"


def _rate(size: int, seconds: float, unit: float):
    return 2 * size / seconds / unit if size else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="0,4096,1048576,16777216,67108864", help="array sizes in bytes")
    parser.add_argument("--seconds", type=float, default=2.0, help="time spent on each size and path")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    worker, address = _start_worker()
    listener, bare_port = _bare_echo_server()
    bare = socket.create_connection(("127.0.0.1", bare_port))
    bare.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rows = []
    try:
        with (
            RemoteGPU(address, key=KEY, project="bench", shared_memory=False) as tcp,
            RemoteGPU(address, key=KEY, project="bench") as local,
        ):
            if (tcp.transport, local.transport) != ("tcp", "shared memory"):
                raise SystemExit(
                    f"expected one caller on TCP and one on shared memory: {tcp.transport}, {local.transport}"
                )
            for size in sizes:
                array = np.arange(size // 4, dtype=np.float32)
                payload = bytes(size)

                def bare_round_trip(payload=payload):
                    bare.sendall(struct.pack(">Q", len(payload)))
                    bare.sendall(payload)
                    _read(bare, 8)
                    _read(bare, len(payload))

                if not np.array_equal(tcp.identity(array), local.identity(array)):
                    raise SystemExit(f"the two paths disagree on a {_label(size)} array")
                gc.collect()  # the garbage of one path must not be collected while the other one is timed
                socket_path = _timed(lambda array=array: tcp.identity(array), args.seconds)
                shared = _timed(lambda array=array: local.identity(array), args.seconds)
                floor = _timed(bare_round_trip, args.seconds)
                p50_tcp, p50_shm, p50_bare = (statistics.median(t) for t in (socket_path, shared, floor))
                rows.append(
                    [
                        _label(size),
                        len(socket_path),
                        p50_tcp * 1e3,
                        _rate(size, p50_tcp, 1 << 20),
                        len(shared),
                        p50_shm * 1e3,
                        _rate(size, p50_shm, 1 << 20),
                        _rate(size, p50_shm, 1e9),
                        p50_bare * 1e3,
                        _rate(size, p50_bare, 1 << 20),
                    ]
                )
    finally:
        bare.close()
        listener.close()
        worker.terminate()
        worker.wait()
    print(
        "hcs_remote round trips on one host: a float32 numpy array there and back, median of the calls "
        "(throughput counts both directions)\n"
    )
    print_table(
        [
            "array",
            "socket calls",
            "socket p50 ms",
            "socket MiB/s",
            "shm calls",
            "shm p50 ms",
            "shm MiB/s",
            "shm GB/s",
            "bare TCP p50 ms",
            "bare TCP MiB/s",
        ],
        rows,
    )


if __name__ == "__main__":
    main()
