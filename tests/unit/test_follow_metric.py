"""CONTRIBUTING.md's "Follow a metric" table names real places: every file exists, every symbol is
defined in it (a function, class, method, assignment, or an attribute a class's methods set on
``self``), every text it quotes appears in the symbol or the generated file, and each metric it
follows has every stage, from where it is measured to its alert and its panel."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Follow a metric"
STAGES = {"measured", "declared", "exposed", "alert", "panel"}
METRICS = {"dataloader wait", "checkpoint duration"}
REF = re.compile(r'^(?P<path>[\w./-]+)::(?:"(?P<text>[^"]+)"|(?P<name>[\w.]+)(?:\["(?P<inner>[^"]+)"\])?)$')


def rows() -> List[Tuple[str, str, str]]:
    """(metric, stage, reference) of each table row of the section (it is the file's last)."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert SECTION in text, f"CONTRIBUTING.md has no {SECTION!r} section"
    body = text.split(SECTION, 1)[1]
    assert "\n## " not in body, f"{SECTION!r} is the last section"
    out = []
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) < 3 or cells[0] in ("metric", "") or set(cells[0]) <= {"-"}:
            continue
        out.append((cells[0], cells[1], cells[2].strip("`")))
    return out


def _defined(tree: ast.AST) -> Dict[str, ast.AST]:
    """Names bound at the top of a module or class body, each with its node."""
    got: Dict[str, ast.AST] = {}
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            got[node.name] = node
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                for n in ast.walk(t):
                    if isinstance(n, ast.Name):
                        got[n.id] = node
    return got


def _self_attrs(cls: ast.ClassDef) -> Dict[str, ast.AST]:
    """Attributes the class's methods assign on ``self``."""
    got: Dict[str, ast.AST] = {}
    for n in ast.walk(cls):
        if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                for a in ast.walk(t):
                    if isinstance(a, ast.Attribute) and isinstance(a.value, ast.Name) and a.value.id == "self":
                        got.setdefault(a.attr, n)
    return got


def resolve(path: Path, dotted: str) -> Optional[ast.AST]:
    """The node defining ``dotted`` (``Name`` or ``Class.member``) in the Python file, or None."""
    node: ast.AST = ast.parse(path.read_text())
    for part in dotted.split("."):
        scope = _defined(node)
        if isinstance(node, ast.ClassDef):
            scope = {**_self_attrs(node), **scope}
        nxt = scope.get(part)
        if nxt is None:
            return None
        node = nxt
    return node


def check(ref: str) -> None:
    m = REF.match(ref)
    assert m, f"not file::symbol: {ref!r}"
    path = ROOT / m["path"]
    assert path.is_file(), f"{m['path']} does not exist"
    source = path.read_text()
    if m["text"] is not None:
        assert m["text"] in source, f"{m['path']} has no {m['text']!r}"
        return
    assert path.suffix == ".py", f"{ref}: a symbol is looked up in a Python file; quote text for others"
    node = resolve(path, m["name"])
    assert node is not None, f"{m['path']} defines no {m['name']}"
    if m["inner"] is not None:
        assert m["inner"] in ast.get_source_segment(source, node), f"{m['name']} in {m['path']} has no {m['inner']!r}"


TABLE = rows()


@pytest.mark.parametrize("metric,stage,ref", TABLE, ids=[f"{m}:{s}:{r}" for m, s, r in TABLE])
def test_each_named_file_and_symbol_exists(metric, stage, ref):
    assert stage in STAGES, f"unknown stage {stage!r}"
    check(ref)


def test_each_metric_is_followed_from_measurement_to_alert_and_panel():
    stages: Dict[str, set] = {}
    for metric, stage, _ in TABLE:
        stages.setdefault(metric, set()).add(stage)
    assert set(stages) >= METRICS
    for metric, got in stages.items():
        assert got == STAGES, f"{metric}: missing {sorted(STAGES - got)}"


def test_the_checker_fails_on_what_does_not_exist():
    for ref in ("hooks/nowhere.py::x", "hooks/steppath.py::no_such_function", "hooks/steppath.py::StepPath.nope",
                'ranksight/record.py::FIELDS["no_such_key"]', 'alerts/ranksight-rules.yml::"RanksightNoSuchAlert"'):
        with pytest.raises(AssertionError):
            check(ref)
    check("hooks/watcher.py::Watcher._data")  # an attribute set on self in a method
