"""Connections that never authenticate cannot hold a worker: every accepted connection has a deadline for its
handshake, strangers waiting in it are capped apart from callers, and callers are served while they wait."""

import socket
import time

import pytest

from hcs_remote import RemoteError, RemoteGPU, Tensor, wire
from hcs_remote.client import parse_address
from hcs_remote.wire import Channel

from .worker_process import KEY, PROJECT, start_worker


def idle_connections(worker, count: int) -> list[socket.socket]:
    """``count`` connections that say nothing, each accepted by the worker (its accept queue is not their limit)."""
    socks = [socket.create_connection(parse_address(worker.address), timeout=10) for _ in range(count)]
    time.sleep(0.5)  # the worker has accepted them and their handler threads wait for a hello
    return socks


def closed_by_worker(sock: socket.socket, within: float) -> bool:
    """True when the worker closes ``sock`` within ``within`` seconds (whatever it says before closing)."""
    sock.settimeout(within)
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline:
            if not sock.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return False


def call(worker) -> float:
    """One real caller's call; returns how long connecting, the handshake and the call took."""
    began = time.monotonic()
    with RemoteGPU(worker.address, key=KEY, project=PROJECT, timeout=10, connect_timeout=10) as gpu:
        assert gpu.scale(Tensor.from_values([1.0, 2.0], "float64")).tolist() == [2.0, 4.0]
    return time.monotonic() - began


def test_idle_connections_that_never_send_the_key_do_not_keep_callers_out():
    worker = start_worker()  # the defaults: 16 callers at once
    idle = idle_connections(worker, 24)
    try:
        assert call(worker) < 2
        assert all(not closed_by_worker(sock, 0.05) for sock in idle)  # still within their deadline
    finally:
        for sock in idle:
            sock.close()
        worker.stop()


def test_a_connection_that_does_not_authenticate_in_time_is_closed():
    worker = start_worker("--auth-timeout", "1.5")
    idle = idle_connections(worker, 20)
    slow = Channel(socket.create_connection(parse_address(worker.address), timeout=10), "client")
    try:
        # A stranger that sends its hello and then nothing: the deadline covers the whole handshake.
        slow.send({"op": "hello", "version": wire.PROTOCOL_VERSION, "nonce": wire.new_nonce(), "project": PROJECT})
        assert slow.receive(5, 5)[0]["op"] == "challenge"
        began = time.monotonic()
        assert all(closed_by_worker(sock, 5) for sock in [*idle, slow.sock])
        assert time.monotonic() - began < 4
        assert call(worker) < 2
        assert "did not authenticate within 1.5 s" in worker.log()
    finally:
        for sock in [*idle, slow.sock]:
            sock.close()
        worker.stop()


def test_a_stranger_dribbling_bytes_does_not_stretch_the_deadline():
    worker = start_worker("--auth-timeout", "1.5")
    sock = socket.create_connection(parse_address(worker.address), timeout=10)
    began = time.monotonic()
    try:
        with pytest.raises(OSError):
            for byte in wire.MAGIC * 100:  # one byte every 0.2 s: each read is quick, the whole never ends
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
                if time.monotonic() - began > 10:
                    pytest.fail("the worker kept a dribbling stranger for 10 s")
        assert time.monotonic() - began < 4
    finally:
        sock.close()
        worker.stop()


def test_strangers_beyond_the_cap_push_out_the_oldest_and_callers_still_get_in():
    worker = start_worker("--max-unauthenticated", "4", "--auth-timeout", "30")
    first = idle_connections(worker, 4)
    later = idle_connections(worker, 4)
    try:
        assert all(closed_by_worker(sock, 2) for sock in first)
        assert not any(closed_by_worker(sock, 0.05) for sock in later)
        assert call(worker) < 2
        assert "4 connections waiting to authenticate" in worker.log()
    finally:
        for sock in [*first, *later]:
            sock.close()
        worker.stop()


def test_authenticated_callers_beyond_the_limit_are_told_busy():
    worker = start_worker("--max-connections", "2")
    try:
        with RemoteGPU(worker.address, key=KEY, project=PROJECT), RemoteGPU(worker.address, key=KEY, project=PROJECT):
            with pytest.raises(RemoteError, match="the worker serves at most 2 connections at once") as refused:
                RemoteGPU(worker.address, key=KEY, project=PROJECT)
            assert refused.value.kind == "busy"
        assert call(worker) < 2  # the two left: their places are free again
    finally:
        worker.stop()
