"""How the package's modules import each other, read from the source with ``ast`` (nothing is imported).

* No circle inside a folder: for every folder of the package (ranksight/, each ranksight/*/, hooks/,
  hooks/lints/, exporter/, exporter/collectors/, alerts/, dashboards/) the graph of its modules'
  imports of each other (the folder's ``__init__`` included) has no cycle. Imports inside function
  bodies count too: an import moved into a function still ties the two modules together, it only
  hides the circle until the call. What is left out is an ``if TYPE_CHECKING:`` block, which never
  runs (annotations only).
* Rooms: the contract at the package root (ranksight/*.py) imports neither ranksight.tools nor
  ranksight.report; ranksight.report does not import ranksight.tools (both stand on ranksight.common);
  ranksight.common imports nothing of the package; the triage table (ranksight.triage) imports
  only the contract (catalog, config, errors).
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
# folder -> its import name (pyproject.toml's [tool.setuptools.package-dir])
TOP = {"ranksight": "ranksight", "hooks": "ranksight.hooks", "exporter": "ranksight.exporter",
       "alerts": "ranksight.alerts", "dashboards": "ranksight.dashboards"}


def folders() -> Dict[Path, str]:
    """Every folder of the package that holds modules -> its dotted name."""
    out: Dict[Path, str] = {}
    for top, name in TOP.items():
        for init in sorted((ROOT / top).rglob("__init__.py")):
            rel = init.parent.relative_to(ROOT / top)
            out[init.parent] = ".".join([name, *rel.parts]) if rel.parts else name
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports(tree: ast.Module) -> Iterator[ast.stmt]:
    """Every import statement of a module, those in functions and classes included, but not those under
    ``if TYPE_CHECKING:`` (its ``else`` branch runs, so it counts)."""
    def walk(body: List[ast.AST]) -> Iterator[ast.stmt]:
        for node in body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            elif isinstance(node, ast.If) and _is_type_checking(node):
                yield from walk(node.orelse)
            else:
                yield from walk(list(ast.iter_child_nodes(node)))
    yield from walk(list(tree.body))


def targets(node: ast.stmt, package: str) -> Iterator[str]:
    """The absolute names a statement imports: ``a.b`` for ``import a.b``, ``p.m`` and ``p.m.x`` for
    ``from p.m import x`` (x may be a module)."""
    if isinstance(node, ast.Import):
        for a in node.names:
            yield a.name
        return
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        parts = package.split(".")
        base_parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    yield base
    for a in node.names:
        yield f"{base}.{a.name}"


def module_name(path: Path, package: str) -> str:
    return package if path.name == "__init__.py" else f"{package}.{path.stem}"


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def folder_graph(folder: Path, package: str) -> Dict[str, Set[str]]:
    """module -> the modules of the same folder it imports ("__init__" is the folder's own)."""
    files = sorted(folder.glob("*.py"))
    names = {module_name(p, package): ("__init__" if p.name == "__init__.py" else p.stem) for p in files}
    graph: Dict[str, Set[str]] = {}
    for p in files:
        me = names[module_name(p, package)]
        edges: Set[str] = set()
        for node in imports(parse(p)):
            found = [names[t] for t in targets(node, package) if t in names]
            # `from . import x` names the package and its module x: the module is the edge
            edges.update(n for n in found if n != "__init__" or found == ["__init__"])
        edges.discard(me)
        graph[me] = edges
    return graph


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    state: Dict[str, int] = {}
    stack: List[str] = []

    def visit(n: str) -> Optional[List[str]]:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


FOLDERS = folders()


def test_the_scan_sees_every_folder():
    rel = {p.relative_to(ROOT).as_posix() for p in FOLDERS}
    assert {"ranksight", "ranksight/triage", "ranksight/tools", "ranksight/report", "ranksight/common", "hooks",
            "hooks/lints", "exporter", "exporter/collectors", "alerts", "dashboards"} <= rel


@pytest.mark.parametrize("folder", sorted(FOLDERS), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_import_cycle_inside_a_folder(folder: Path):
    graph = folder_graph(folder, FOLDERS[folder])
    cycle = find_cycle(graph)
    assert cycle is None, f"{folder.relative_to(ROOT)}: import cycle {' -> '.join(cycle or [])}"


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _package_imports(folder: Path) -> Iterator[Tuple[str, str]]:
    """(file, imported name) for every import of the package's own modules in folder (not below it)."""
    package = FOLDERS[folder]
    for p in sorted(folder.glob("*.py")):
        for node in imports(parse(p)):
            for t in targets(node, package):
                if t == "ranksight" or t.startswith("ranksight."):
                    yield p.relative_to(ROOT).as_posix(), t


def _reaches(folder: str, rooms: Tuple[str, ...]) -> List[str]:
    return sorted({f"{f} imports {t}" for f, t in _package_imports(ROOT / folder)
                   if any(t == r or t.startswith(r + ".") for r in rooms)})


def test_the_contract_at_the_root_imports_no_room_above_it():
    assert _reaches("ranksight", ("ranksight.tools", "ranksight.report")) == []


def test_report_imports_common_not_tools():
    assert _reaches("ranksight/report", ("ranksight.tools",)) == []


def test_common_imports_nothing_of_the_package():
    assert [f"{f} imports {t}" for f, t in _package_imports(ROOT / "ranksight" / "common")
            if not t.startswith("ranksight.common")] == []


def test_the_triage_table_imports_only_the_contract():
    """ranksight.triage reads the catalog, the step record's declaration and the config (and their
    errors); nothing else of the package."""
    below = {"ranksight.triage", "ranksight.catalog", "ranksight.record", "ranksight.config", "ranksight.errors"}
    assert sorted({f"{f} imports {t}" for f, t in _package_imports(ROOT / "ranksight" / "triage")
                   if t != "ranksight" and ".".join(t.split(".")[:2]) not in below}) == []
