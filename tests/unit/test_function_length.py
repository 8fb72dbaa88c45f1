"""No function of the package or the benchmarks is over MAX_LINES lines (its def to its last line,
decorators and docstring included) unless a comment says why: ``# long: <reason>`` at the end of its
``def`` line or on the line above it (above its decorators, if any). Read with ``ast``; nothing is
imported."""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("ranksight", "hooks", "exporter", "alerts", "dashboards", "bench")
MAX_LINES = 120
REASON = "# long:"


def functions(path: Path) -> Iterator[Tuple[ast.AST, int]]:
    """Every function and method of a file (nested ones included), with its first line: its first
    decorator's, or its def's."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node, first


def has_reason(lines: List[str], node: ast.AST, first: int) -> bool:
    """A ``# long:`` comment on the def line (the ``def`` statement's first line) or the line above
    the function (above its decorators)."""
    own = lines[node.lineno - 1]
    above = lines[first - 2] if first >= 2 else ""
    return REASON in own or above.strip().startswith(REASON)


def long_functions() -> List[Tuple[str, str, int]]:
    out = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            lines = path.read_text().splitlines()
            for node, first in functions(path):
                n = node.end_lineno - first + 1
                if n > MAX_LINES and not has_reason(lines, node, first):
                    out.append((path.relative_to(ROOT).as_posix(), node.name, n))
    return out


def test_no_function_over_the_limit_without_a_reason():
    over = [f"{f}:{name} ({n} lines)" for f, name, n in long_functions()]
    assert over == [], (f"functions over {MAX_LINES} lines: split them into named pieces, or say why not with "
                        f"'{REASON} <reason>' on the def line or the line above: " + "; ".join(over))

