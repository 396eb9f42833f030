"""The remote-GPU wire format on its own: array declarations are checked against the bytes, only plain values
encode, and frames carry a MAC that catches tampering and reordering."""

import socket
from array import array

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_remote import wire
from hcs_remote.wire import Channel, RemoteError, Tensor

KEY = bytes(range(32))


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        ("bool", [True, False]),
        ("int8", [-1, 2]),
        ("uint8", [0, 255]),
        ("int16", [-300, 7]),
        ("uint16", [65535, 1]),
        ("int32", [-(2**31), 5]),
        ("uint32", [2**32 - 1, 0]),
        ("int64", [-(2**63), 1]),
        ("uint64", [2**64 - 1, 3]),
        ("float16", [0.5, -2.0]),
        ("float32", [1.5, -0.25]),
        ("float64", [1e300, -1e-300]),
    ],
)
def test_every_dtype_round_trips_its_values(dtype, values):
    tensor = Tensor.from_values(values, dtype=dtype)
    assert tensor.data.nbytes == wire.DTYPES[dtype][0] * len(values)
    assert tensor.tolist() == values


def test_values_that_do_not_fit_the_dtype_are_refused():
    with pytest.raises(ValueError, match="values that are no uint8"):
        Tensor.from_values([256], "uint8")
    with pytest.raises(ValueError, match="needs 12 bytes, got 8"):
        Tensor.from_values([1, 2], "int32", (3,))


def test_shapes_nest_in_c_order_and_zero_d_is_a_number():
    assert Tensor.from_values(range(6), "int32", (2, 3)).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert Tensor.from_values([], "int32", (2, 0)).tolist() == [[], []]
    assert Tensor.from_values([7], "int64", ()).tolist() == 7


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"dtype": "object", "shape": [1]}, "unsupported dtype 'object'"),
        ({"dtype": ["float32"], "shape": [1]}, "unsupported dtype \\['float32'\\]"),
        ({"dtype": "float32", "shape": [-1]}, "non-negative integers"),
        ({"dtype": "float32", "shape": [True]}, "non-negative integers"),
        ({"dtype": "float32", "shape": [1.0]}, "non-negative integers"),
        ({"dtype": "float32", "shape": [1] * 33}, "at most 32 sizes"),
        ({"dtype": "float32", "shape": "3"}, "at most 32 sizes"),
        ({"dtype": "float32", "shape": [1], "pickle": True}, "expected an array declaration"),
        ("float32", "expected an array declaration"),
    ],
)
def test_declarations_that_are_not_plain_arrays_are_refused(declared, message):
    with pytest.raises(ValueError, match=message):
        wire.split_body([declared], memoryview(b"\0" * 4))


def test_declared_sizes_must_account_for_every_byte():
    body = memoryview(bytes(24))
    a, b = wire.split_body([{"dtype": "float32", "shape": [2]}, {"dtype": "int64", "shape": [2]}], body)
    assert (a.shape, b.shape, a.data.nbytes, b.data.nbytes) == ((2,), (2,), 8, 16)
    with pytest.raises(ValueError, match="need 16 bytes, the frame carries 24"):
        wire.split_body([{"dtype": "float64", "shape": [2]}], body)
    with pytest.raises(ValueError, match="need 32 bytes, the frame carries 24"):
        wire.split_body([{"dtype": "float64", "shape": [4]}], body)
    with pytest.raises(ValueError, match="needs 16 bytes, got 8"):
        Tensor.checked("float64", (2,), memoryview(bytes(8)))


def test_values_encode_as_json_with_arrays_by_reference():
    floats = array("d", [1.0, 2.0])
    structure, tensors = wire.encode({"args": [floats, 3, "x", None, [True]], "kwargs": {"t": floats}})
    assert structure == {"args": [{"$tensor": 0}, 3, "x", None, [True]], "kwargs": {"t": {"$tensor": 1}}}
    assert [t.dtype for t in tensors] == ["float64", "float64"]
    back = wire.decode(structure, tensors, as_numpy=False)
    assert back["args"][0].tolist() == [1.0, 2.0] and back["args"][1:] == [3, "x", None, [True]]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({1, 2}, "cannot send a set"),
        (object(), "cannot send a object"),
        (b"raw", "cannot send a bytes"),
        ({1: "a"}, "string keys"),
        ({"$tensor": 0}, "other than '\\$tensor'"),
        (array("l", [1]), "no fixed-size dtype"),
    ],
)
def test_only_plain_values_encode(value, message):
    with pytest.raises(ValueError, match=message):
        wire.encode(value)


def _numpy_round_trip(value):
    structure, tensors = wire.encode([value])
    # The bytes as they travel: the receiving side sees only the buffer, not the sender's array.
    received = [Tensor.checked(t.dtype, t.shape, memoryview(bytes(t.data))) for t in tensors]
    return wire.decode(structure, received, as_numpy=True)[0]


@pytest.mark.parametrize("dtype", list(wire.DTYPES))
def test_numpy_arrays_of_every_dtype_travel_as_they_are(dtype):
    values = np.arange(12).reshape(3, 4).astype(dtype)
    back = _numpy_round_trip(values)
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4) and np.array_equal(back, values)


@pytest.mark.parametrize(
    "make",
    [
        lambda a: a.T,
        lambda a: a[:, ::2],
        lambda a: np.asfortranarray(a),
        lambda a: a[::-1],
        lambda a: a.astype(">f4"),
        lambda a: a.astype(">i8").T,
        lambda a: np.broadcast_to(a[0], (5, 6)),
    ],
    ids=["transposed", "strided", "fortran", "reversed", "big-endian", "big-endian-transposed", "broadcast"],
)
def test_numpy_arrays_of_any_layout_and_byte_order_arrive_with_their_values_in_c_order(make):
    value = make(np.arange(30, dtype=np.float32).reshape(5, 6))
    back = _numpy_round_trip(value)
    assert back.flags.c_contiguous and back.dtype.byteorder in "=<|" and back.shape == value.shape
    assert np.array_equal(back, value)


def test_numpy_zero_d_arrays_and_scalars_keep_their_shape():
    assert _numpy_round_trip(np.array(7, dtype=np.int16)).shape == ()
    back = _numpy_round_trip(np.float32(2.5))
    assert back.shape == () and back.dtype == np.float32 and float(back) == 2.5


@pytest.mark.parametrize(
    "value",
    [
        np.zeros(2, dtype=np.complex64),
        np.array(["ab"]),
        np.array([object()]),
        np.zeros(1, dtype="datetime64[s]"),
        np.zeros(1, dtype=[("x", "i4")]),
    ],
    ids=["complex", "string", "object", "datetime", "structured"],
)
def test_numpy_arrays_that_are_not_plain_numbers_are_refused_before_anything_is_sent(value):
    with pytest.raises(ValueError, match="cannot be sent: only plain numeric arrays"):
        wire.encode({"x": value})


def test_tensor_references_must_name_an_array_of_the_frame():
    tensors = [Tensor.from_values([1], "int8")]
    for bad in ({"$tensor": 1}, {"$tensor": -1}, {"$tensor": "0"}, {"$tensor": True}, {"$tensor": 0, "extra": 1}):
        with pytest.raises(ValueError, match="tensor reference"):
            wire.decode([bad], tensors, as_numpy=False)


def test_the_key_is_hex_of_at_least_16_bytes():
    assert wire.parse_key("ab" * 32) == b"\xab" * 32
    with pytest.raises(ValueError, match="hexadecimal"):
        wire.parse_key("not-hex")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        wire.parse_key("abcd")


def test_proofs_differ_by_role_so_neither_end_can_replay_the_other():
    assert wire.proof(KEY, "client", "n1", "n2") != wire.proof(KEY, "worker", "n1", "n2")
    assert wire.proof(KEY, "client", "n1", "n2") != wire.proof(KEY, "client", "n1", "n3")
    assert wire.proof(KEY, "client", "n1", "n2") != wire.proof(bytes(32), "client", "n1", "n2")


@pytest.fixture
def pair():
    left, right = socket.socketpair()
    client, worker = Channel(left, "client", max_body=1024), Channel(right, "worker", max_body=1024)
    client.secure(KEY)
    worker.secure(KEY)
    yield client, worker
    left.close()
    right.close()


def test_secured_frames_carry_header_and_arrays(pair):
    client, worker = pair
    client.send({"op": "call", "fn": "f"}, [Tensor.from_values([1, 2], "int16")])
    header, body = worker.receive(1, 1)
    assert header == {"op": "call", "fn": "f", "tensors": [{"dtype": "int16", "shape": [2]}]}
    assert bytes(body) == b"\x01\x00\x02\x00"


class Recorder:
    """A socket stand-in that keeps what a channel sends instead of sending it."""

    def __init__(self):
        self.sent = b""

    def sendall(self, data) -> None:
        self.sent += bytes(data)


def recorded_frame(header: dict) -> bytes:
    """The bytes of one secured client frame (its first), as they would go on the wire."""
    recorder = Recorder()
    channel = Channel(recorder, "client")
    channel.secure(KEY)
    channel.send(header)
    return recorder.sent


def test_a_tampered_frame_fails_its_check(pair):
    _, worker = pair
    frame = recorded_frame({"op": "call", "fn": "f"})
    pair[0].sock.sendall(frame.replace(b'"f"', b'"g"'))
    with pytest.raises(RemoteError, match="failed its authentication check"):
        worker.receive(1, 1)


def test_a_replayed_frame_fails_its_check(pair):
    client, worker = pair
    frame = recorded_frame({"op": "call", "fn": "f"})
    client.sock.sendall(frame)
    assert worker.receive(1, 1)[0] == {"op": "call", "fn": "f"}
    client.sock.sendall(frame)  # the same bytes again: the sequence number moved on
    with pytest.raises(RemoteError, match="failed its authentication check"):
        worker.receive(1, 1)


def test_frames_over_the_limits_are_refused_before_their_body_is_read(pair):
    client, worker = pair
    client.sock.sendall(wire.PREFIX.pack(wire.MAGIC, 2, 1 << 40))
    with pytest.raises(RemoteError, match="at most 1024") as refused:
        worker.receive(1, 1)
    assert refused.value.kind == "too_large"
    client.sock.sendall(wire.PREFIX.pack(b"GET ", 2, 0))
    with pytest.raises(RemoteError, match="not a remote-GPU frame"):
        worker.receive(1, 1)


def test_before_the_handshake_a_channel_takes_small_headers_and_no_arrays():
    left, right = socket.socketpair()
    with left, right:
        worker = Channel(right, "worker", max_body=1 << 20)
        left.sendall(wire.PREFIX.pack(wire.MAGIC, 2, 8))  # refused from the prefix: nothing more is read
        with pytest.raises(RemoteError, match="authenticate first: no arrays before the handshake"):
            worker.receive(1, 1)
        left.sendall(wire.PREFIX.pack(wire.MAGIC, 5000, 0))
        with pytest.raises(RemoteError, match="at most 4096 before authentication"):
            worker.receive(1, 1)
        worker.secure(KEY)  # once the peer proved itself, the worker's own limits apply
        assert (worker.max_body, worker.max_header) == (1 << 20, wire.MAX_HEADER_BYTES)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(["$tensor", "dtype", "shape", "k"]), inner, max_size=3)
    ),
    max_leaves=12,
)


declarations = st.lists(
    st.fixed_dictionaries(
        {"dtype": st.sampled_from([*wire.DTYPES, "object", "V8"]), "shape": st.lists(st.integers(-1, 3), max_size=3)}
    ),
    max_size=3,
)
tensor_refs = st.recursive(
    st.fixed_dictionaries({"$tensor": st.integers(-1, 3)}) | json_values,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(declared=declarations | json_values, structure=tensor_refs, body=st.binary(max_size=40))
def test_any_header_and_body_decode_to_plain_values_or_a_value_error(declared, structure, body):
    # Whatever a peer sends, decoding either refuses it with ValueError or yields plain values and Tensors.
    try:
        tensors = wire.split_body(declared, memoryview(body))
        value = wire.decode(structure, tensors, as_numpy=False)
    except ValueError:
        return
    assert sum(t.data.nbytes for t in tensors) == len(body)

    def plain(item) -> bool:
        if isinstance(item, list):
            return all(plain(x) for x in item)
        if isinstance(item, dict):
            return all(isinstance(k, str) and plain(v) for k, v in item.items())
        return item is None or isinstance(item, bool | int | float | str | Tensor)

    assert plain(value)
