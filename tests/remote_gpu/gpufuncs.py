"""Functions a test worker serves: plain-Python stand-ins for GPU kernels.

The worker hands them numpy arrays when numpy is installed (it is, through statsmodels), plain Tensors otherwise:
they read both.
"""

import time

from hcs_remote import Tensor, expose


def _values(x) -> list:
    """The elements of a Tensor or a numpy array as one flat list, in C order."""
    return x.flat() if isinstance(x, Tensor) else x.ravel().tolist()


@expose
def scale(x: Tensor, factor: float = 2.0) -> Tensor:
    """Multiply every element by ``factor``."""
    return Tensor.from_values([v * factor for v in _values(x)], dtype="float64", shape=x.shape)


@expose
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product of two 2-D float tensors."""
    (n, k), (k2, m) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"shapes {list(a.shape)} and {list(b.shape)} do not chain")
    left, right = a.tolist(), b.tolist()
    out = [sum(left[i][j] * right[j][c] for j in range(k)) for i in range(n) for c in range(m)]
    return Tensor.from_values(out, dtype="float32", shape=(n, m))


@expose(name="stats")
def summary(x: Tensor, label: str = "") -> dict:
    """Sum, shape and dtype of a tensor, with its first element as a 0-d tensor."""
    values = _values(x)
    return {
        "label": label,
        "sum": sum(values),
        "shape": list(x.shape),
        "dtype": str(x.dtype),
        "first": Tensor.from_values(values[:1], dtype=str(x.dtype), shape=()),
    }


@expose
def echo(*args, **kwargs):
    """Return what it was given (arrays come back as arrays)."""
    return [list(args), kwargs]


@expose
def explode(message: str = "kernel failed") -> None:
    """Raise, as a kernel that fails does."""
    raise RuntimeError(message)


@expose
def sleep(seconds: float) -> float:
    """Take ``seconds`` to answer."""
    time.sleep(seconds)
    return seconds


@expose
def unsendable() -> object:
    """Return an object that is no array or JSON value."""
    return {1, 2}


def not_exposed() -> str:
    """Present in the module but not exposed: no client may call it."""
    return "secret"
