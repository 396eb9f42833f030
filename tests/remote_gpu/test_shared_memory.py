"""Callers on the worker's host: they move from TCP to the worker's unix socket and arrays travel through shared
memory, with the same results; callers without the offer stay on TCP; strangers, other projects and peers
breaking the protocol get no segment and cannot make the worker map a bad one; a caller killed mid-session
leaves nothing mapped in the worker."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from hcs_remote import RemoteError, RemoteGPU, Tensor, shm, wire
from hcs_remote.wire import Channel, Staged

from .worker_process import KEY, PROJECT, ROOT, start_worker

pytestmark = pytest.mark.skipif(not shm.AVAILABLE, reason="shared memory between processes needs Linux (memfd)")

BIG = 3 << 20  # bytes: well above the size that travels inline in a frame


@pytest.fixture(scope="module")
def worker():
    started = start_worker("--max-payload-mib", "16", "--call-timeout", "5")
    yield started
    started.stop()


def wait_for(condition, timeout: float = 10.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, f"{what} did not come within {timeout:g} s"
        time.sleep(0.05)
    return result


def mapped_segments(pid: int | str) -> list[str]:
    """The shared segments process ``pid`` maps (memfds have no path: only this label)."""
    return [line for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if shm.SEGMENT_NAME in line]


def segments_of(pid: int | str) -> list[str]:
    """The shared segments process ``pid`` maps or holds open."""
    proc = Path(f"/proc/{pid}")
    mapped = mapped_segments(pid)
    held = []
    for fd in os.listdir(proc / "fd"):
        try:
            if shm.SEGMENT_NAME in os.readlink(proc / "fd" / fd):
                held.append(fd)
        except OSError:
            pass  # closed meanwhile
    return mapped + held


def offered_socket(worker) -> str:
    """The abstract unix socket the worker offers (from its log)."""
    found = wait_for(lambda: re.search(r"unix socket @(hcs-remote-gpu-[0-9a-f]{32})", worker.log()), what="the offer")
    return found.group(1)


def arrays() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [
        rng.standard_normal(BIG // 8),
        np.arange(BIG // 4, dtype=np.int32).reshape(-1, 256),
        rng.integers(0, 255, size=100, dtype=np.uint8),
        np.asfortranarray(rng.standard_normal((300, 400))),
        np.array(2.5, dtype=np.float16),
        np.zeros((0, 3), dtype=np.float32),
    ]


def test_a_caller_on_the_workers_host_moves_to_shared_memory_with_the_same_results_as_tcp(worker):
    sent = arrays()
    with (
        RemoteGPU(worker.address, key=KEY, project=PROJECT) as local,
        RemoteGPU(worker.address, key=KEY, project=PROJECT, shared_memory=False) as tcp,
    ):
        assert (local.transport, tcp.transport) == ("shared memory", "tcp")
        assert local._channel.sock.family == socket.AF_UNIX and tcp._channel.sock.family == socket.AF_INET
        by_shm, by_tcp = local.echo(*sent, k=sent[0]), tcp.echo(*sent, k=sent[0])
        assert local.stats(sent[1], label="x") == tcp.stats(sent[1], label="x")
    for args, kwargs in (by_shm, by_tcp):
        for before, after in zip(sent, args, strict=True):
            assert after.dtype == before.dtype and after.shape == before.shape and np.array_equal(after, before)
            assert after.flags.c_contiguous and after.flags.writeable
        assert np.array_equal(kwargs["k"], sent[0])
    assert "authenticated (shared memory)" in worker.log()


def test_large_arrays_go_through_segments_that_are_reused_and_never_change_while_held(worker):
    before = len(mapped_segments("self"))
    with RemoteGPU(worker.address, key=KEY, project=PROJECT) as gpu:
        first = gpu.echo(np.full(BIG // 8, 1.0))[0][0]
        held = first.copy()
        for i in range(8):  # each result dropped before the next-but-one call: two segments a direction suffice
            result = gpu.echo(np.full(BIG // 8, float(i)))[0][0]
            assert result[0] == i and result[-1] == i
        assert np.array_equal(first, held)  # the segment under `first` was lent to it all along
        # This end's segment for arguments (back with each answer) and the worker's three for results (the one
        # under `first`, the last result, the new one): not one per call.
        assert len(mapped_segments("self")) - before <= 4
        assert len(gpu._channel.segments._own) == 1 and len(gpu._channel.segments._peer) == 3
        assert shm.SEGMENT_NAME not in " ".join(os.listdir("/dev/shm"))  # nothing named anywhere
        first[:] = -1.0  # results are writable; what is written stays with the caller
        assert gpu.echo(np.full(BIG // 8, 5.0))[0][0][0] == 5.0
    del first, result
    wait_for(lambda: len(mapped_segments("self")) <= before, what="this end unmapping its segments")


def test_without_the_offer_callers_stay_on_tcp_with_the_same_calls():
    plain = start_worker("--no-shared-memory")  # as a caller on another host sees it: no reachable socket
    try:
        with RemoteGPU(plain.address, key=KEY, project=PROJECT) as gpu:
            assert gpu.transport == "tcp"
            sent = arrays()
            back = gpu.echo(*sent)[0]
            assert all(np.array_equal(a, b) for a, b in zip(sent, back, strict=True))
        assert "unix socket" not in plain.log() and "shared memory" not in plain.log()
        assert not segments_of(plain.process.pid)
    finally:
        plain.stop()


def test_an_offer_of_a_socket_this_host_does_not_have_leaves_the_caller_on_tcp(worker):
    with RemoteGPU(worker.address, key=KEY, project=PROJECT, shared_memory=False) as gpu:
        # What a caller on another host does with the offer: the name does not exist in its network namespace.
        gpu._move_to_shared_memory({"socket": "hcs-remote-gpu-" + "0" * 32, "ticket": "t" * 32}, 1 << 30, 5)
        assert gpu.transport == "tcp"
        assert np.array_equal(gpu.echo(np.arange(BIG // 8))[0][0], np.arange(BIG // 8))


def local_channel(worker) -> Channel:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect("\0" + offered_socket(worker))
    return Channel(sock, "client", local=True)


def handshake(channel: Channel, key: bytes, ticket: str | None = None) -> dict:
    nonce = wire.new_nonce()
    channel.send({"op": "hello", "version": wire.PROTOCOL_VERSION, "nonce": nonce, "project": PROJECT})
    challenge, _ = channel.receive(5, 5)
    channel.send({"op": "auth", "proof": wire.proof(key, "client", nonce, challenge["nonce"]), "ticket": ticket})
    channel.secure(wire.session_key(key, nonce, challenge["nonce"]))
    return channel.receive(5, 5)[0]


def nothing_more_comes(sock: socket.socket) -> bool:
    """True when the worker closed ``sock`` having passed no descriptor."""
    while True:
        data, ancillary, _, _ = sock.recvmsg(4096, socket.CMSG_SPACE(64))
        if ancillary:
            return False
        if not data:
            return True


@pytest.mark.parametrize(
    ("key", "ticket", "message"),
    [
        (bytes.fromhex("c3" * 32), None, "authentication failed: the caller's key is not the key of project 'alpha'"),
        (bytes.fromhex(KEY), None, "a shared-memory connection needs the ticket its socket connection was offered"),
        (bytes.fromhex(KEY), "f" * 32, "a shared-memory connection needs the ticket its socket connection was offered"),
    ],
    ids=["another-projects-key", "no-ticket", "forged-ticket"],
)
def test_a_stranger_on_the_unix_socket_is_refused_and_gets_no_segment(worker, key, ticket, message):
    channel = local_channel(worker)
    with channel.sock:
        try:
            answer = handshake(channel, key, ticket)
        except RemoteError:  # a wrong key: the refusal comes without a MAC (no session), so it reads as broken here
            pass
        else:
            assert (answer["op"], answer["kind"]) == ("error", "auth") and message in answer["error"]
        assert not channel._fds and nothing_more_comes(channel.sock)
    assert message in worker.log()
    assert not segments_of(worker.process.pid)  # no caller holds one: the worker has none mapped


def test_a_descriptor_passed_before_authenticating_is_refused(worker):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect("\0" + offered_socket(worker))
    fd = os.memfd_create("bait")
    with sock:
        frame = wire.PREFIX.pack(wire.MAGIC, 2, 0) + b"{}"
        sock.sendmsg([frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, np.array([fd], np.int32).tobytes())])
        answer = Channel(sock, "client").receive(5, 5)[0]
        assert answer["kind"] == "auth" and answer["error"] == "authenticate first: no arrays before the handshake"
    os.close(fd)


def moved_caller(worker) -> RemoteGPU:
    gpu = RemoteGPU(worker.address, key=KEY, project=PROJECT, timeout=5)
    assert gpu.transport == "shared memory"
    return gpu


def bad_segment(kind: str, tmp_path) -> tuple[int, int]:
    """A descriptor a peer breaking the protocol might pass, and the size it claims."""
    if kind == "pipe":
        read, write = os.pipe()
        os.close(write)
        return read, BIG
    if kind == "file":
        path = tmp_path / "segment"
        path.write_bytes(bytes(BIG))
        return os.open(path, os.O_RDWR), BIG
    fd = os.memfd_create("bad", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4 << 20 if kind == "unsealed" else 32 << 20)
    if kind == "oversize":
        import fcntl  # Linux only, like the test

        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, shm.SEALS)
        return fd, 17 << 20
    return fd, BIG


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("unsealed", "the segment passed can still shrink or grow"),
        ("pipe", "is no memory segment"),
        ("file", "is no sealable memory segment|can still shrink or grow"),
        ("oversize", "the arrays are 17825792 bytes; this end accepts at most 16777216"),
    ],
)
def test_a_segment_the_worker_cannot_trust_is_refused_and_the_connection_closed(worker, tmp_path, kind, message):
    gpu = moved_caller(worker)
    fd, size = bad_segment(kind, tmp_path)
    declared = [{"dtype": "uint8", "shape": [size]}]
    staged = Staged(declared, [], {"segment": 1000, "size": size, "new": True}, fd)
    gpu._channel.send({"op": "call", "id": 1, "fn": "echo", "args": [{"$tensor": 0}]}, staged)
    with pytest.raises(RemoteError, match=message):
        gpu._checked(gpu._receive(5)[0], "result")
    with pytest.raises(RemoteError, match="closed|broke"):
        gpu.echo(1)
    gpu.close()
    wait_for(lambda: not segments_of(worker.process.pid), what="the worker unmapping everything")


def test_a_worker_of_another_project_never_receives_a_segment():
    other = start_worker(key="c3" * 32, project="")  # serves another project's key, names no project
    try:
        with pytest.raises(RemoteError, match="could not prove it holds this project's key"):
            RemoteGPU(other.address, key=KEY, project=PROJECT)
        assert "unix socket @" in other.log() and "authenticated" not in other.log()
        assert not segments_of(other.process.pid)
    finally:
        other.stop()


CALLER = """
import sys, time
import numpy as np
from hcs_remote import RemoteGPU
gpu = RemoteGPU(sys.argv[1], key=sys.argv[2], project="alpha")
kept = gpu.echo(np.ones(3 << 17))  # 3 MiB there and back: a segment each way
print(gpu.transport, kept[0][0].sum(), flush=True)
time.sleep(60)
"""


def test_a_caller_killed_mid_session_leaves_no_segment_in_the_worker(worker):
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, worker.address, KEY],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
    )
    try:
        assert caller.stdout.readline().split() == ["shared", "memory", "393216.0"]
        assert segments_of(worker.process.pid)  # the caller's segment mapped, the worker's result one kept
        assert segments_of(caller.pid)
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)
        wait_for(lambda: not segments_of(worker.process.pid), what="the worker unmapping the dead caller's segments")
        with RemoteGPU(worker.address, key=KEY, project=PROJECT) as gpu:  # and it serves the next caller
            assert gpu.transport == "shared memory" and gpu.echo(np.ones(3 << 17))[0][0].sum() == 3 << 17
    finally:
        caller.kill()
        caller.wait()


def test_a_peer_keeping_every_array_gets_them_in_the_stream_beyond_the_budget(monkeypatch):
    monkeypatch.setattr(shm, "MAX_LENT", 8 << 20)  # two 3 MiB segments fit, a third does not
    left, right = socket.socketpair(socket.AF_UNIX)
    caller, worker = Channel(left, "client", 1 << 30, local=True), Channel(right, "worker", 1 << 30, local=True)
    caller.secure(bytes(32))
    worker.secure(bytes(32))

    def send_results():
        for i in range(5):
            worker.send({"op": "result"}, [Tensor.checked("uint8", (BIG,), memoryview(bytes([i]) * BIG))])

    sender = threading.Thread(target=send_results)
    sender.start()
    kept = [caller.receive(5, 5)[1] for _ in range(5)]  # bodies held: the worker's segments stay lent
    sender.join()
    assert [bytes(body[:1]) * BIG == bytes(body) for body in kept] == [True] * 5
    assert [bytes(body[:1]) for body in kept] == [bytes([i]) for i in range(5)]
    assert len(worker.segments._own) == 2  # the other three went in the stream
    del kept
    caller.send({"op": "call"})  # tells the worker its segments came back
    assert worker.receive(5, 5)[0] == {"op": "call"} and not worker.segments._own_lent
    for channel in (caller, worker):
        channel.release()
        channel.sock.close()
