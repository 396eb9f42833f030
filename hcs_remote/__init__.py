"""Remote GPU for HCS Portal: a task without a GPU calls named functions that a GPU worker task of the same
project serves, with plain arrays as data and a per-project key as the credential (docs/remote-gpu.md)."""

from .client import RemoteGPU
from .registry import expose
from .wire import DTYPES, RemoteError, Tensor

__all__ = ["DTYPES", "RemoteError", "RemoteGPU", "Tensor", "expose"]
