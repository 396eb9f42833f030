"""JSON documents from clients, bounded in nesting so a deep one is a clear error, never a RecursionError.

The API's JSON parser and the admin's JSON form fields check documents with :func:`depth_exceeds`. No
field of the portal nests deeper than a few levels; MAX_DEPTH leaves room for credentials and labels.
"""

from __future__ import annotations

from typing import Any

MAX_DEPTH = 32


class TooDeep(ValueError):
    """The document nests objects and arrays deeper than :data:`MAX_DEPTH`."""

    def __init__(self) -> None:
        super().__init__(f"Expected JSON nested at most {MAX_DEPTH} levels deep.")


def depth_exceeds(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether objects and arrays in ``value`` nest deeper than ``limit`` (iterative: any depth is safe)."""
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return False
