"""The README's commands, run as a reader types them.

The "by hand" block is run line by line, unchanged, in one bash shell after
`. .venv/bin/activate` (the README says to do that once), from a directory that holds
`examples/` like the repo root, in a private network namespace (the block uses the fixed
default ports): the real exporter, a real Prometheus and Alertmanager (`ranksight stack`),
a real 2-rank torchrun job and `ranksight triage`. A renamed flag, a changed default or a
command that stops working fails it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import List, Tuple

import pytest

from conftest import private_network, require_binary

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"


def section(title: str) -> str:
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def sh_block(title: str) -> List[str]:
    """The command lines of the first ```sh block of a README section."""
    m = re.search(r"```sh\n(.*?)```", section(title), re.S)
    assert m, f"README section {title!r} has no sh block"
    return [ln for ln in m.group(1).splitlines() if ln.strip()]


def activate() -> Path:
    """The venv's activate script, as the README says: `. .venv/bin/activate`."""
    assert ". .venv/bin/activate" in section("Quick start without Docker, by hand")
    act = Path(sys.executable).parent / "activate"
    assert act.is_file(), f"the tests run outside a venv ({sys.executable}): no {act}"
    return act


def run_block(lines: List[str], cwd: Path, timeout: float) -> Tuple[List[int], str]:
    """Each line unchanged, then its exit status on a marker line; at the end, wait for every
    background job the block started (the block itself must stop them)."""
    script = [f". {activate()}"]
    for i, line in enumerate(lines):
        script += [line, f'echo "::rc $? {i}"']
    script.append("wait")
    p = subprocess.run(private_network() + ["bash", "-c", "\n".join(script)], cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    out = p.stdout + p.stderr
    codes = {int(i): int(rc) for rc, i in re.findall(r"^::rc (\d+) (\d+)$", p.stdout, re.M)}
    assert sorted(codes) == list(range(len(lines))), out
    return [codes[i] for i in range(len(lines))], out


@pytest.mark.slow
def test_by_hand_block_runs_as_written(tmp_path):
    require_binary("prometheus"), require_binary("alertmanager")
    lines = sh_block("Quick start without Docker, by hand")
    (tmp_path / "examples").symlink_to(REPO / "examples")  # "from the repo root", with run/ in tmp_path
    codes, out = run_block(lines, tmp_path, timeout=240)
    for ln, rc in zip(lines, codes):
        if ln.startswith("ranksight triage"):  # exit 1: it found a problem, the injected one (below)
            assert rc == 1, f"{ln!r} exited {rc}\n{out}"
        else:
            assert rc == 0, f"{ln!r} exited {rc}\n{out}"
    assert "prometheus    http://127.0.0.1:9090" in out and "alertmanager  http://127.0.0.1:9093" in out, out
    assert "ranksight step time, job" in out and "train_ddp: step" in out, out  # the job ran, instrumented
    assert "cause: RanksightStraggler" in out and re.search(r"Straggler rank .*rank=1", out), out
    assert "also abnormal and unexplained" not in out, out  # one cause: the peer's comm share is its symptom
    assert re.search(r"^prometheus +running", out, re.M) and "ranksight stack: stopped" in out, out
    assert not list(tmp_path.glob("run/stack/*.pid")), "the block left the stack running"


def test_readme_names_every_demo_fault_and_command():
    """The README lists every fault `ranksight demo --fault` takes, and every subcommand."""
    from ranksight import cli
    from ranksight.tools import demo

    text = README.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("`ranksight demo [--fault "))
    assert set(re.search(r"--fault ([a-z|-]+)\]", line).group(1).split("|")) == set(demo.FAULTS)
    quick = section("Quick start")
    for fault in demo.FAULTS:
        assert f"`{fault}`" in quick, fault
    for name in cli.SUBCOMMANDS:
        assert f"| `ranksight {name}" in text, name


@pytest.mark.parametrize("argv", [
    ["triage", "--prometheus", "http://127.0.0.1:1", "--timeout", "1"],
    ["triage", "--prometheus", "http://127.0.0.1:1", "--since", "forever"],
    ["demo", "--duration", "-1"],
    ["demo", "--fault", "meteor"],
    ["stack", "up", "--prometheus-port", "0"],
    ["config", "--config", "/nonexistent/ranksight.yml"],
    ["rules", "--out", "/proc/ranksight"],
    ["bench"],
    ["exporter", "--listen", "nowhere"],
    ["k8s", "--namespace", "Not_A_Label", "--out", "k8s"],
])
def test_every_subcommand_has_one_error_prefix(argv, tmp_path):
    p = subprocess.run([sys.executable, "-m", "ranksight", *argv], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("ranksight: error: "), (p.returncode,
                                                                                                 p.stderr)
