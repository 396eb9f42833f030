"""Drop lint and format suppressions that do nothing, then format what they held (CONTRIBUTING.md, "Suppressions").

1. ``noqa`` codes that name rules the linter does not select go (those ``ruff check --extend-select RUF100``
   reports); an explanation after the dropped codes stays as a plain comment.
2. ``# fmt: skip`` stays only on statements laid out as a table: at least two lines whose tokens are aligned in
   columns (two or more spaces between tokens on a line), or one line aligned with its neighbours. Every other
   ``# fmt: skip`` goes, and ``ruff format`` formats those statements.

Run from the repository root, after merging: ``.venv/bin/python scripts/tidy_suppressions.py [paths...]``
(default: the whole repository). It prints how many of each it removed and kept; run the tests after it.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

RUFF = str(Path(sys.executable).with_name("ruff"))
SKIP = re.compile(r"\s*#\s*fmt:\s*skip\s*$")
EXCLUDED = ("migrations", ".venv", "var", "static", "node_modules")


def python_files(paths: list[str]) -> list[Path]:
    """The Python files under ``paths`` that ruff formats (migrations are left as makemigrations wrote them)."""
    files: list[Path] = []
    for root in map(Path, paths):
        candidates = [root] if root.is_file() else sorted(root.rglob("*.py"))
        files += [p for p in candidates if p.suffix == ".py" and not set(p.parts) & set(EXCLUDED)]
    return files


def aligned_lines(source: str, first: int, last: int) -> int:
    """How many of the lines ``first``..``last`` (1-based) have two tokens set apart by two or more spaces."""
    segment = source.splitlines(keepends=True)[first - 1 : last]
    aligned: set[int] = set()
    previous = None
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO("".join(segment)).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return 0
    for token in tokens:
        if token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            previous = None
            continue
        if token.type == tokenize.COMMENT:
            continue
        if previous is not None and previous.end[0] == token.start[0] and token.start[1] - previous.end[1] >= 2:
            aligned.add(token.start[0])
        previous = token
    return len(aligned)


def statement_spans(tree: ast.AST) -> dict[int, int]:
    """For each line a statement ends on, the first line of the innermost statement ending there."""
    spans: dict[int, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node.end_lineno is not None:
            start = node.lineno
            if getattr(node, "decorator_list", None):
                start = min(d.lineno for d in node.decorator_list)
            spans[node.end_lineno] = max(spans.get(node.end_lineno, 0), start)
    return spans


def is_table(source: str, lines: list[str], first: int, last: int) -> bool:
    """A statement laid out as a table: two aligned lines, or one aligned line next to another aligned one."""
    if aligned_lines(source, first, last) >= 2:
        return True
    if first == last and aligned_lines(source, first, last) == 1:
        neighbours = [n for n in (first - 1, last + 1) if 1 <= n <= len(lines)]
        return any(SKIP.search(lines[n - 1]) and aligned_lines(source, n, n) for n in neighbours)
    return False


def drop_fmt_skips(path: Path) -> tuple[int, int]:
    """Remove the ``# fmt: skip`` of every statement in ``path`` that is not a table; (removed, kept)."""
    source = path.read_text()
    if "fmt: skip" not in source:
        return 0, 0
    lines = source.splitlines()
    spans = statement_spans(ast.parse(source))
    removed = kept = 0
    for number, line in enumerate(lines, start=1):
        if not SKIP.search(line):
            continue
        first = spans.get(number, number)
        if is_table(source, lines, first, number):
            kept += 1
            continue
        lines[number - 1] = SKIP.sub("", line)
        removed += 1
    if removed:
        path.write_text("\n".join(lines) + ("\n" if source.endswith("\n") else ""))
    return removed, kept


NOQA = re.compile(r"#\s*noqa:\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*)(?P<rest>.*)$")


def drop_unused_noqa(files: list[Path]) -> int:
    """Remove the codes ruff reports as unused (RUF100 with the project's selection); a comment's explanation
    after the codes stays as a plain comment. Returns how many codes went."""
    report = subprocess.run(
        [RUFF, "check", "--extend-select", "RUF100", "--output-format", "json", "--exit-zero", *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    unused: dict[str, dict[int, set[str]]] = {}
    for item in json.loads(report):
        if item["code"] != "RUF100":
            continue
        codes = set(re.findall(r"`([A-Z]+[0-9]+)`", item["message"]))
        unused.setdefault(item["filename"], {}).setdefault(item["location"]["row"], set()).update(codes)
    removed = 0
    for filename, rows in unused.items():
        path = Path(filename)
        source = path.read_text()
        lines = source.splitlines()
        for row, codes in rows.items():
            line = lines[row - 1]
            match = NOQA.search(line)
            if match is None:
                continue
            kept = [c.strip() for c in match["codes"].split(",") if c.strip() not in codes]
            removed += len(match["codes"].split(",")) - len(kept)
            rest = match["rest"].strip().lstrip("-:;").strip()
            if kept:
                comment = f"# noqa: {', '.join(kept)}" + (f" - {rest}" if rest else "")
            else:
                comment = f"# {rest}" if rest else ""
            lines[row - 1] = (line[: match.start()].rstrip() + ("  " + comment if comment else "")).rstrip()
        path.write_text("\n".join(lines) + ("\n" if source.endswith("\n") else ""))
    return removed


def main(paths: list[str]) -> None:
    files = python_files(paths or ["."])
    noqa_removed = drop_unused_noqa(files)
    removed = kept = 0
    for path in files:
        r, k = drop_fmt_skips(path)
        removed, kept = removed + r, kept + k
    subprocess.run([RUFF, "format", "-q", *map(str, files)], check=True)
    print(f"noqa: {noqa_removed} unused codes removed; fmt: skip: {removed} removed, {kept} kept on tables")


if __name__ == "__main__":
    main(sys.argv[1:])
