"""pytest imports test modules by their basename (the test folders are on its pythonpath, see
pyproject.toml), so two test files of one name in different folders stop the whole run at
collection. Each test module's name is unique across tests/."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_every_test_module_name_is_unique():
    by_name = defaultdict(list)
    for p in TESTS.rglob("test_*.py"):
        if "__pycache__" not in p.parts:
            by_name[p.name].append(str(p.relative_to(TESTS)))
    assert {n: ps for n, ps in by_name.items() if len(ps) > 1} == {}
