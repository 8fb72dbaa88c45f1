"""The test tree: the fast subset is what it says."""
from __future__ import annotations

from pathlib import Path

from conftest import REAL_PROCESS_SUITES

HERE = Path(__file__).resolve().parent


def test_every_real_process_suite_exists():
    """conftest's list names files that exist: a renamed suite would silently join the fast subset."""
    assert sorted(n for n in REAL_PROCESS_SUITES if not (HERE / n).is_file()) == []
