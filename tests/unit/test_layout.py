"""The test tree mirrors the code: unit tests under tests/unit/, real-process suites under
tests/integration/ and tests/e2e/, and the fast subset is what it says."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List

import pytest

import conftest

TESTS = Path(__file__).resolve().parents[1]


@dataclass
class Item:
    """What conftest's collection hook reads of a collected test: its file, and the markers it adds."""
    fspath: Path
    markers: List[str] = field(default_factory=list)

    def add_marker(self, mark: pytest.MarkDecorator) -> None:
        self.markers.append(mark.name)


def test_no_test_file_sits_directly_in_tests():
    """Every suite lives in unit/, integration/, e2e/ or gpu/: a file left at the top would join no group."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_integration_and_e2e_are_slow_and_unit_is_not():
    """conftest's hook marks every test file under tests/integration/ and tests/e2e/ `slow`, and none
    under tests/unit/, so `pytest -m "not slow"` is the unit tests."""
    slow = sorted((TESTS / "integration").glob("test_*.py")) + sorted((TESTS / "e2e").glob("test_*.py"))
    fast = sorted((TESTS / "unit").glob("test_*.py"))
    assert slow and fast
    items = [Item(p) for p in slow + fast]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.fspath.name for i in items[:len(slow)] if i.markers != ["slow"]] == []
    assert [i.fspath.name for i in items[len(slow):] if i.markers] == []
