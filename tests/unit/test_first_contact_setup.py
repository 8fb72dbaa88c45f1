"""scripts/setup: `--demo` installs what the demo runs, the full set-up what the tests run, and a
venv the demo set up is completed by the full one. Run on a copy of the script with stand-ins for
pip, the venv's python and apt-get that log their arguments (nothing is installed)."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[2]

LOGGER = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "setup", root / "scripts" / "setup")
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    log = tmp_path / "log"
    for d, names in ((root / ".venv" / "bin", ("pip",)), (stubs, ("apt-get", "sudo"))):
        d.mkdir(parents=True, exist_ok=True)
        for name in names:
            (d / name).write_text(LOGGER.format(log=log))
            (d / name).chmod(0o755)
    # the venv's python: torch is there (the find_spec check exits 0)
    (root / ".venv" / "bin" / "python").write_text("#!/bin/sh\nexit 0\n")
    (root / ".venv" / "bin" / "python").chmod(0o755)
    return root


def setup(root: Path, *args: str) -> List[str]:
    log = root.parent / "log"
    log.write_text("")
    env = dict(os.environ, PATH=f"{root.parent / 'stubs'}:{os.environ['PATH']}")
    p = subprocess.run([str(root / "scripts" / "setup"), *args], cwd=root, env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return [ln for ln in log.read_text().splitlines() if not ln.startswith(("apt-get", "sudo"))]


def test_demo_then_full_then_nothing(checkout):
    assert setup(checkout, "--demo") == ["pip install -q -e .[report] numpy>=1.24"]  # no test extras
    assert setup(checkout, "--demo") == []  # nothing changed since: pip does not run
    assert setup(checkout) == ["pip install -q -e .[test]"]  # the full set-up completes the demo's venv
    assert setup(checkout) == [] and setup(checkout, "--demo") == []  # the full venv has what the demo runs


def test_a_changed_pyproject_runs_pip_again(checkout):
    setup(checkout)
    with open(checkout / "pyproject.toml", "a") as f:
        f.write("\n# changed\n")
    assert setup(checkout, "--demo") == ["pip install -q -e .[report] numpy>=1.24"]
    assert setup(checkout) == ["pip install -q -e .[test]"]


def test_bad_usage_is_one_line_and_exit_2(checkout):
    p = subprocess.run([str(checkout / "scripts" / "setup"), "--full"], cwd=checkout, capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.strip() == "usage: scripts/setup [--demo]"

