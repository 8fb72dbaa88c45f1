"""No function of the package or the benchmarks is over MAX_LINES lines (its def to its last line,
decorators and docstring included) unless a comment says why: ``# long: <reason>`` at the end of its
``def`` line or on the line above it (above its decorators, if any). No tracked .py file outside
tests/ is over MAX_FILE_LINES lines: a longer one is split into modules by what they hold. Read
with ``ast`` and ``git ls-files``; nothing is imported."""
from __future__ import annotations

import ast
import subprocess
from pathlib import Path
from typing import Iterator, List, Tuple

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("ranksight", "hooks", "exporter", "alerts", "dashboards", "bench")
MAX_LINES = 120
MAX_FILE_LINES = 600
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



def tracked_sources(root: Path = ROOT) -> List[Path]:
    """The .py files git tracks under root, those under tests/ left out."""
    out = subprocess.run(["git", "ls-files", "-z", "--", "*.py"], cwd=root, capture_output=True, text=True,
                         check=True).stdout
    return [root / f for f in out.split("\0") if f and not f.startswith("tests/") and (root / f).is_file()]


def long_files(paths: List[Path], root: Path = ROOT) -> List[str]:
    """``file (N lines)`` for each of paths over MAX_FILE_LINES lines, file relative to root."""
    over = []
    for path in paths:
        n = len(path.read_text().splitlines())
        if n > MAX_FILE_LINES:
            over.append(f"{path.relative_to(root).as_posix()} ({n} lines)")
    return over


def test_no_tracked_source_file_over_the_limit():
    paths = tracked_sources()
    assert any(p.name == "watcher.py" for p in paths), "git ls-files found no sources: is ROOT the checkout?"
    over = long_files(paths)
    assert over == [], (f"files over {MAX_FILE_LINES} lines: move whole, self-contained groups of functions or "
                        "classes into a module named by what it holds: " + "; ".join(over))


def test_the_file_check_lists_each_file_over_the_limit(tmp_path):
    for name, n in (("at_limit.py", MAX_FILE_LINES), ("over.py", MAX_FILE_LINES + 1), ("far_over.py", 900)):
        (tmp_path / name).write_text("x = 1\n" * n)
    assert long_files(sorted(tmp_path.glob("*.py")), tmp_path) == ["far_over.py (900 lines)", "over.py (601 lines)"]
