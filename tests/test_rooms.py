"""Rooms of one job: no module of the daemon over MODULE_LINES lines (the upstream simulators in
daemon/fakes/ aside: each speaks one whole wire format), no function over FUNCTION_LINES. A room
that grows past them is a sign it does several jobs; split it by responsibility rather than
raising the limits."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE_LINES = 600
FUNCTION_LINES = 80
SIMULATORS = "daemon/fakes/"


def _modules() -> list[tuple[str, str]]:
    return [
        (path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
        for path in sorted((ROOT / "daemon").rglob("*.py"))
    ]


def long_functions(source: str, where: str) -> list[str]:
    """`where:line name (n lines)` of each function or method in `source` over FUNCTION_LINES."""
    found = []
    for node in ast.walk(ast.parse(source, where)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines > FUNCTION_LINES:
                found.append(f"{where}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_module_over_the_limit() -> None:
    big = [
        f"{where} ({len(source.splitlines())} lines)"
        for where, source in _modules()
        if not where.startswith(SIMULATORS) and len(source.splitlines()) > MODULE_LINES
    ]
    assert not big, f"modules over {MODULE_LINES} lines: split them:\n" + "\n".join(big)


def test_no_function_over_the_limit() -> None:
    long = [f for where, source in _modules() for f in long_functions(source, where)]
    assert not long, f"functions over {FUNCTION_LINES} lines: split them:\n" + "\n".join(long)


def test_a_long_function_is_found() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(FUNCTION_LINES))
    source = f"def short():\n    return 1\n\nclass C:\n    async def long(self):\n{body}"
    assert long_functions(source, "m.py") == [f"m.py:5 long ({FUNCTION_LINES + 1} lines)"]
