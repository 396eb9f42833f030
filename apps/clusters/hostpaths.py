"""Host paths a task may mount: only under the prefixes an admin approved for a cluster (pure, no Django).

A task's ``host_path`` volume becomes a Kubernetes ``hostPath`` mount of the node's own file tree, so a
path nobody approved could hand a job the node's root. Submission checks paths against the approved
prefixes of the VDC's clusters, and the Kubernetes manifest builder checks them again at launch.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

MAX_PATH_LENGTH = 1024


def path_problem(path: object) -> str | None:
    """What is wrong with ``path`` as an absolute path on a node, or None when it is one.

    Paths must be written plainly (no ``..``, ``.``, doubled or trailing slashes), so that a prefix
    check on the text is a check on the directory it names.
    """
    if not isinstance(path, str) or not path:
        return "expected an absolute path such as /data, got " + (repr(path) if path != "" else "nothing")
    if "\x00" in path:
        return "expected a path without NUL characters"
    if len(path) > MAX_PATH_LENGTH:
        return f"expected a path of at most {MAX_PATH_LENGTH} characters, got {len(path)}"
    if not path.startswith("/"):
        return f"expected an absolute path (starting with /), got {path!r}"
    if posixpath.normpath(path) != path or path.startswith("//"):
        return f"expected a plain path without '..', '.', doubled or trailing slashes, got {path!r}"
    return None


def is_approved(path: str, prefixes: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``prefixes`` or lies below one (whole path components: /data allows
    /data/x, not /database)."""
    if path_problem(path) is not None:
        return False
    for prefix in prefixes:
        # "/" would approve the node's whole file tree; the Cluster model refuses it, and so does this.
        if path_problem(prefix) is not None or prefix == "/":
            continue
        if path == prefix or path.startswith(prefix + "/"):
            return True
    return False
