"""Print who imports whom: the apps (and the project package) as one table, the control plane's modules as another.

Run from the repository root: ``PYTHONPATH=. .venv/bin/python scripts/import_picture.py``. Function-level imports
count like the others. docs/architecture.md shows the output; `lint-imports` checks the rules.
"""

from __future__ import annotations

from collections import defaultdict

import grimp

PACKAGES = ("apps", "hcsportal", "celery_app")


def owner(module: str, depth: int) -> str:
    """The package a module belongs to at ``depth`` (``apps.tasks.models`` -> ``apps.tasks`` at depth 2)."""
    parts = module.split(".")
    return ".".join(parts[:depth]) if parts[0] == "apps" else parts[0]


def table(graph: grimp.ImportGraph, depth: int, within: str | None = None) -> dict[str, set[str]]:
    """Importer -> imported, between packages at ``depth`` (only those under ``within`` when given)."""
    edges: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        importer = owner(module, depth)
        if within and not importer.startswith(within + "."):
            continue
        edges.setdefault(importer, set())
        for imported in graph.find_modules_directly_imported_by(module):
            target = owner(imported, depth)
            if target != importer and (within is None or target.startswith(within + ".")):
                edges[importer].add(target)
    return edges


def show(title: str, edges: dict[str, set[str]], prefix: str = "") -> None:
    print(f"\n| {title} | imports |\n|---|---|")
    for importer in sorted(edges, key=lambda name: (-len(edges[name]), name)):
        names = ", ".join(sorted(name.removeprefix(prefix) for name in edges[importer])) or "—"
        print(f"| `{importer.removeprefix(prefix)}` | {names} |")


def main() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, cache_dir=None)
    show("package", table(graph, 2))
    show("apps.control module", table(graph, 3, within="apps.control"), prefix="apps.control.")


if __name__ == "__main__":
    main()
