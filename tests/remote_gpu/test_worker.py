"""A real worker process on loopback serving tests/remote_gpu/gpufuncs.py, and clients calling it: arrays in and
out, and every refusal (no key, another project's key, skipped authentication, unknown function, malformed
arrays, oversize payloads, failing and slow functions) answered with a clear message, never a traceback."""

import json
import os
import socket
import subprocess
import sys
import time
from array import array

import pytest

from hcs_remote import RemoteError, RemoteGPU, Tensor, wire
from hcs_remote.client import parse_address
from hcs_remote.wire import Channel

from .worker_process import KEY, PROJECT, ROOT, start_worker


@pytest.fixture(scope="module")
def worker():
    started = start_worker("--max-payload-mib", "1", "--call-timeout", "5")
    yield started
    started.stop()


@pytest.fixture
def gpu(worker):
    with RemoteGPU(worker.address, key=KEY, project=PROJECT, timeout=10) as client:
        yield client


def raw_channel(worker) -> Channel:
    """An unauthenticated connection to the worker, for callers that do not follow the protocol."""
    sock = socket.create_connection(parse_address(worker.address), timeout=5)
    return Channel(sock, "client")


def test_a_client_calls_registered_functions_on_arrays(gpu):
    doubled = gpu.scale(Tensor.from_values([1, 2, 3], dtype="int32"), factor=2.5)
    assert (doubled.dtype, doubled.shape, doubled.tolist()) == ("float64", (3,), [2.5, 5.0, 7.5])
    a = Tensor.from_values([1, 2, 3, 4, 5, 6], "float32", (2, 3))
    b = Tensor.from_values([1, 0, 0, 1, 1, 1], "float32", (3, 2))
    assert gpu.call("matmul", a, b).tolist() == [[4.0, 5.0], [10.0, 11.0]]
    stats = gpu.call("stats", array("d", [0.5, 1.5, 2.0]), label="x")  # served under its exposed name
    assert {k: stats[k] for k in ("label", "sum", "shape", "dtype")} == {
        "label": "x",
        "sum": 4.0,
        "shape": [3],
        "dtype": "float64",
    }
    assert stats["first"].shape == () and stats["first"].tolist() == 0.5


def test_arrays_come_back_byte_for_byte_with_dtype_and_shape(gpu):
    sent = [
        Tensor.from_values(range(24), "uint8", (2, 3, 4)),
        Tensor.from_values([True, False, True], "bool"),
        Tensor.from_values([2**62, -5], "int64"),
        Tensor.from_values([0.1, 65504.0], "float16"),
        Tensor.from_values([], "float32", (0, 3)),
    ]
    args, kwargs = gpu.echo(*sent, n=1, nested={"t": sent[1], "xs": [1.5, None, "s"]})
    for before, after in zip(sent, args, strict=True):
        assert (after.dtype, after.shape, bytes(after.data)) == (before.dtype, before.shape, bytes(before.data))
    assert kwargs["n"] == 1 and kwargs["nested"]["xs"] == [1.5, None, "s"]
    assert kwargs["nested"]["t"].tolist() == [True, False, True]


def test_large_arrays_cross_intact_both_ways(gpu):
    noise = os.urandom(900_000)  # above the one-write size: sent from the array's own memory
    sent = Tensor.checked("float32", (225, 1000), memoryview(noise))
    (back,), _ = gpu.echo(sent)
    assert (back.dtype, back.shape) == ("float32", (225, 1000)) and bytes(back.data) == noise


def test_the_client_sees_only_what_the_worker_registers(gpu):
    assert set(gpu.functions) == {"scale", "matmul", "stats", "echo", "explode", "sleep", "unsendable"}
    assert gpu.functions["matmul"] == "Matrix product of two 2-D float tensors."
    with pytest.raises(AttributeError):
        gpu.not_exposed  # noqa: B018


def test_an_unknown_function_is_refused_by_name_and_the_connection_goes_on(gpu):
    for name in ("not_exposed", "__import__", "os.system"):
        with pytest.raises(RemoteError, match=f"unknown function '{name}': this worker serves echo, explode") as e:
            gpu.call(name)
        assert e.value.kind == "unknown_function"
    assert gpu.scale(Tensor.from_values([1.0], "float64")).tolist() == [2.0]


def test_a_client_without_a_key_is_refused(worker, monkeypatch):
    monkeypatch.delenv("HCS_REMOTE_GPU_KEY", raising=False)
    with pytest.raises(RemoteError, match="no HCS_REMOTE_GPU_KEY") as refused:
        RemoteGPU(worker.address)
    assert refused.value.kind == "auth"
    with pytest.raises(RemoteError, match="hexadecimal"):
        RemoteGPU(worker.address, key="my password")


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([], "authenticate first: expected a hello with the client's nonce"),
        ([Tensor.from_values([1], "int8")], "authenticate first: no arrays before the handshake"),
    ],
)
def test_a_caller_that_skips_authentication_is_refused(worker, tensors, message):
    channel = raw_channel(worker)
    channel.send({"op": "call", "id": 1, "fn": "scale", "args": [{"$tensor": 0}]}, tensors)
    header, _ = channel.receive(5, 5)
    assert (header["op"], header["kind"], header["error"]) == ("error", "auth", message)
    with pytest.raises(RemoteError, match="closed the connection"):
        channel.receive(5, 5)


def test_a_stranger_cannot_send_large_headers_before_authenticating(worker):
    channel = raw_channel(worker)
    channel.send({"op": "hello", "version": 1, "nonce": wire.new_nonce(), "padding": "x" * 5000})
    header, _ = channel.receive(5, 5)
    assert header["kind"] == "too_large"
    assert header["error"].endswith("this end accepts at most 4096 before authentication")


def test_a_key_of_another_project_is_refused_by_the_worker(worker):
    other_key = bytes.fromhex("c3" * 32)
    channel = raw_channel(worker)
    nonce = wire.new_nonce()
    channel.send({"op": "hello", "version": 1, "nonce": nonce, "project": ""})
    challenge, _ = channel.receive(5, 5)
    assert challenge["op"] == "challenge" and challenge["project"] == PROJECT
    channel.send({"op": "auth", "proof": wire.proof(other_key, "client", nonce, challenge["nonce"])})
    header, _ = channel.receive(5, 5)
    assert (header["op"], header["kind"]) == ("error", "auth")
    assert header["error"] == (
        "authentication failed: the caller's key is not the key of project 'alpha'; only "
        "tasks of that project may call this worker"
    )
    with pytest.raises(RemoteError, match="closed the connection"):
        channel.receive(5, 5)


@pytest.mark.parametrize("proof", ["é" * 64, 12345, None, ["a"]])
def test_a_proof_that_is_no_hex_string_is_refused_like_a_wrong_one(worker, proof):
    channel = raw_channel(worker)
    channel.send({"op": "hello", "version": 1, "nonce": wire.new_nonce(), "project": PROJECT})
    channel.receive(5, 5)
    channel.send({"op": "auth", "proof": proof})
    header, _ = channel.receive(5, 5)
    assert header["kind"] == "auth" and header["error"].startswith("authentication failed")


@pytest.mark.parametrize(
    ("hello", "message"),
    [
        ({"op": "hello", "version": 2, "nonce": "n" * 32}, "protocol version 2: this worker speaks 1"),
        ({"op": "hello", "version": 1, "nonce": 7}, "expected a nonce of 16 to 128 characters"),
        ({"op": "hello", "version": 1, "nonce": "short"}, "expected a nonce of 16 to 128 characters"),
    ],
)
def test_a_hello_that_breaks_the_protocol_is_refused(worker, hello, message):
    channel = raw_channel(worker)
    channel.send(hello)
    header, _ = channel.receive(5, 5)
    assert header["op"] == "error" and message in header["error"]


def test_the_client_refuses_a_worker_that_cannot_prove_the_key_and_names_the_project(worker):
    with pytest.raises(RemoteError, match="could not prove it holds this project's key") as refused:
        RemoteGPU(worker.address, key="c3" * 32, project=PROJECT)
    assert refused.value.kind == "auth"
    with pytest.raises(RemoteError, match="this worker serves project 'alpha', not 'beta'"):
        RemoteGPU(worker.address, key="c3" * 32, project="beta")


@pytest.mark.parametrize(
    ("tensors", "body", "args", "message"),
    [
        (
            [{"dtype": "float32", "shape": [4]}],
            bytes(8),
            [{"$tensor": 0}],
            "malformed call of scale: the declared arrays need 16 bytes, the frame carries 8",
        ),
        ([{"dtype": "object", "shape": [1]}], bytes(8), [{"$tensor": 0}], "unsupported dtype 'object'"),
        ([{"dtype": {"descr": "O"}, "shape": [1]}], bytes(8), [{"$tensor": 0}], "unsupported dtype {'descr': 'O'}"),
        ([{"dtype": "float64", "shape": [-1]}], b"", [{"$tensor": 0}], "expected a shape of non-negative integers"),
        ([{"dtype": "float64", "shape": [1]}], bytes(8), [{"$tensor": 3}], "names array 3; the frame has 1"),
        ([], b"", {"not": "a list"}, "expected 'args' as a list"),
        ("numpy.load", b"", [], "expected 'tensors' as a list"),
    ],
)
def test_malformed_arrays_are_refused_with_what_was_expected(gpu, tensors, body, args, message):
    header = {"op": "call", "id": 99, "fn": "scale", "args": args, "tensors": tensors}
    head = json.dumps(header).encode()
    prefix = wire.PREFIX.pack(wire.MAGIC, len(head), len(body))
    channel = gpu._channel
    channel.sock.sendall(prefix + head + body + channel._mac(channel._out_tag, channel._sent, [prefix, head, body]))
    channel._sent += 1
    answer, _ = channel.receive(5, 5)
    assert (answer["op"], answer["kind"], answer["id"]) == ("error", "bad_request", 99)
    assert message in answer["error"]
    assert gpu.scale(Tensor.from_values([3.0], "float64")).tolist() == [6.0]  # the connection goes on


def test_an_oversize_payload_is_refused_without_being_sent_or_read(worker, gpu):
    assert gpu.max_payload == 1 << 20
    big = Tensor.from_values([0.0] * ((1 << 17) + 1), "float64")  # 1 MiB + 8 bytes
    with pytest.raises(RemoteError, match=f"are {(1 << 20) + 8} bytes; the worker accepts at most 1048576") as e:
        gpu.scale(big)
    assert e.value.kind == "too_large"
    # A client that ignores the limit: the worker answers from the frame's prefix alone and hangs up.
    channel = gpu._channel
    channel.sock.sendall(wire.PREFIX.pack(wire.MAGIC, 10, 8 << 30))
    with pytest.raises(RemoteError, match="^the arrays are 8589934592 bytes; this end accepts at most 1048576$") as e:
        gpu._checked(gpu._receive(5)[0], "result")
    assert e.value.kind == "too_large"
    with pytest.raises(RemoteError, match="the other end closed the connection|broke") as e:
        gpu.scale(Tensor.from_values([1.0], "float64"))
    assert e.value.kind == "connection"


def test_a_failing_function_answers_its_error_and_keeps_the_traceback_in_the_worker_log(worker, gpu):
    with pytest.raises(RemoteError) as failed:
        gpu.explode("device-side assert 7f3a")
    assert failed.value.kind == "function_error"
    assert str(failed.value) == "explode failed: RuntimeError: device-side assert 7f3a"
    with pytest.raises(RemoteError, match="unsendable returned what cannot be sent: cannot send a set"):
        gpu.unsendable()
    with pytest.raises(RemoteError, match=r"matmul failed: ValueError: shapes \[1, 2\] and \[3, 1\] do not chain"):
        gpu.matmul(Tensor.from_values([1, 2], "float32", (1, 2)), Tensor.from_values([1, 2, 3], "float32", (3, 1)))
    assert gpu.scale(Tensor.from_values([1.0], "float64")).tolist() == [2.0]
    log = worker.log()
    assert "Traceback" in log and "device-side assert 7f3a" in log and "gpufuncs.py" in log


def test_a_call_over_the_time_limit_answers_a_timeout():
    slow = start_worker("--call-timeout", "0.5")
    try:
        with RemoteGPU(slow.address, key=KEY, project=PROJECT) as gpu:
            with pytest.raises(RemoteError, match="sleep did not finish within 0.5 s") as e:
                gpu.sleep(2)
            assert e.value.kind == "timeout"
            # The abandoned call still holds the worker (a running kernel cannot be stopped from outside).
            with pytest.raises(RemoteError, match="busy: sleep waited 0.5 s for earlier calls") as e:
                gpu.sleep(0.01)
            assert e.value.kind == "busy"
            time.sleep(1.5)
            assert gpu.sleep(0.01) == 0.01  # once the slow call is done, the worker serves again
    finally:
        slow.stop()


def test_the_client_gives_up_on_a_worker_that_does_not_answer():
    slow = start_worker("--call-timeout", "30")
    try:
        with RemoteGPU(slow.address, key=KEY, project=PROJECT, timeout=0.5) as gpu:
            with pytest.raises(RemoteError, match="no answer from the worker within 0.5 s") as e:
                gpu.sleep(2)
            assert e.value.kind == "timeout"
            # Its late answer must not pass for the next call's: the connection is done.
            with pytest.raises(RemoteError, match=r"the connection is closed \(no answer from the worker within"):
                gpu.sleep(0)
    finally:
        slow.stop()


def test_arguments_that_are_not_plain_values_never_leave_the_client(gpu):
    with pytest.raises(RemoteError, match="cannot send a builtin_function_or_method") as e:
        gpu.echo(print)
    assert e.value.kind == "bad_request"


def test_nothing_answers_at_a_wrong_address():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: the connection is refused
        with pytest.raises(RemoteError, match=f"cannot reach the worker at 127.0.0.1:{port}"):
            RemoteGPU(f"127.0.0.1:{port}", key=KEY)
    with pytest.raises(RemoteError, match="expected a worker address as host:port"):
        RemoteGPU("localhost", key=KEY)


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ({}, ["--module", "tests.remote_gpu.gpufuncs", "--port", "0"], "HCS_REMOTE_GPU_KEY is not set"),
        ({"HCS_REMOTE_GPU_KEY": KEY}, ["--module", "tests.remote_gpu.gpufuncs"], "no port"),
        ({"HCS_REMOTE_GPU_KEY": KEY}, ["--module", "json", "--port", "0"], "json exposes no functions"),
        ({"HCS_REMOTE_GPU_KEY": KEY}, ["--module", "no_such_mod", "--port", "0"], "cannot load no_such_mod"),
    ],
)
def test_the_worker_refuses_to_start_without_what_it_needs(env, argv, message):
    clean = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env}
    done = subprocess.run(
        [sys.executable, "-m", "hcs_remote.worker", *argv],
        cwd=ROOT,
        env=clean,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert message in done.stderr


def test_the_client_command_lists_a_workers_functions_or_says_why_not(worker):
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(ROOT),
        "HCS_REMOTE_GPU_KEY": KEY,
        "HCS_PROJECT": PROJECT,
        "REMOTE_GPU_ADDRESS": worker.address,
    }
    argv = [sys.executable, "-m", "hcs_remote"]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"worker {worker.address} of project alpha serves:"
    assert "  matmul: Matrix product of two 2-D float tensors." in done.stdout.splitlines()
    refused = subprocess.run(
        argv, cwd=ROOT, env={**env, "HCS_PROJECT": "beta"}, capture_output=True, text=True, timeout=30
    )
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "refused (auth): this worker serves project 'alpha', not 'beta': only tasks of 'alpha' may call it"
    )
