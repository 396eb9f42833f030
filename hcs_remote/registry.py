"""Which functions a worker serves: those its module marks with :func:`expose`, by name."""

from __future__ import annotations

from collections.abc import Callable

EXPOSED_ATTR = "__hcs_remote_name__"


def expose(function: Callable | None = None, *, name: str | None = None):
    """Mark a function as callable by remote clients, under its own name or ``name``."""

    def mark(f: Callable) -> Callable:
        setattr(f, EXPOSED_ATTR, name or f.__name__)
        return f

    return mark(function) if function is not None else mark


def exposed_functions(module) -> dict[str, Callable]:
    """The functions ``module`` marked with :func:`expose`, by their remote names."""
    found = {}
    for value in vars(module).values():
        remote_name = getattr(value, EXPOSED_ATTR, None)
        if callable(value) and isinstance(remote_name, str):
            if remote_name in found and found[remote_name] is not value:
                raise ValueError(f"two functions of {module.__name__} are exposed as {remote_name!r}")
            found[remote_name] = value
    return found
