"""The newcomer's path, end to end, as the README tells it: a clean clone named ``ranksight``, its
demo set-up (``scripts/setup --demo``: a fresh venv with torch, numpy and the project), a real node
agent from that venv, and the README's two-line integration in a script of one's own written beside
the clone (``~/ranksight`` and ``~/train.py``, the layout where the clone folder stands first on
``sys.path``). The agent must count every step the script took, under the job name the script's
name gives.

About a minute on the 2-core machine: most of it is pip building the fresh venv.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from ranksight.common.plumbing import free_port

REPO = Path(__file__).resolve().parents[2]
STEPS = 12


def _clone(dest: Path) -> None:
    """A clean clone of the committed tree (what CI and a newcomer get), or a copy of the tracked
    files where the tests run from an export without .git."""
    if (REPO / ".git").exists():
        subprocess.run(["git", "clone", "-q", str(REPO), str(dest)], check=True, timeout=120)
        return
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if not files:
        pytest.fail("no git checkout to clone and no tracked file list", pytrace=False)
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, dest / f)


def _two_lines() -> str:
    """The README's two-line integration, taken from the README itself."""
    readme = (REPO / "README.md").read_text()
    block = re.search(r"## Two-line integration\n+```python\n(.*?)```", readme, re.S)
    assert block, "README has no python block under 'Two-line integration'"
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert lines[0] == "import ranksight" and "ranksight.watch(model, optimizer, loader)" in lines[1], lines
    return "\n".join(lines)


def test_clean_clone_demo_setup_and_the_two_lines_beside_it(tmp_path: Path) -> None:
    home = tmp_path / "home"
    clone = home / "ranksight"
    clone.mkdir(parents=True)
    _clone(clone)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "RANKSIGHT"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if "/.venv/" not in p)
    setup = subprocess.run(["./scripts/setup", "--demo"], cwd=clone, env=env, capture_output=True, text=True,
                           timeout=600)
    assert setup.returncode == 0, f"scripts/setup --demo failed:\n{setup.stdout[-2000:]}\n{setup.stderr[-2000:]}"
    py = clone / ".venv" / "bin" / "python"

    port, ingest = free_port(), free_port(udp=True)
    agent_env = {**env, "RANKSIGHT__agent__listen": f"127.0.0.1:{port}",
                 "RANKSIGHT__agent__ingest": f"udp://127.0.0.1:{ingest}",
                 "RANKSIGHT__agent__collectors": "network,disk,ranks"}
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen([str(clone / ".venv" / "bin" / "ranksight"), "exporter"], cwd=home, env=agent_env,
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        script = home / "train.py"
        script.write_text(textwrap.dedent("""\
            import torch
            from torch.utils.data import DataLoader, TensorDataset

            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            loader = DataLoader(TensorDataset(torch.randn({n}, 16), torch.randint(0, 4, ({n},))), batch_size=8)
            {two_lines}
            for x, y in loader:
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            ranksight.unwatch()
            """).format(n=8 * STEPS, two_lines=_two_lines()))
        # the script's folder (home) comes first on sys.path, and the clone folder ranksight/ is in it
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
                break
            except OSError:
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-2000:]
                time.sleep(0.2)
        run = subprocess.run([str(py), "train.py"], cwd=home, capture_output=True, text=True, timeout=120,
                             env={**env, "RANKSIGHT_AGENT": f"udp://127.0.0.1:{ingest}"})
        assert run.returncode == 0, f"train.py failed:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
        assert "Traceback" not in run.stderr, run.stderr[-3000:]

        def steps() -> float:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            m = re.search(r'^ranksight_steps_total\{[^}]*job="train"[^}]*\} (\S+)$', text, re.M)
            return float(m.group(1)) if m else -1.0
        deadline = time.monotonic() + 15
        while steps() != STEPS and time.monotonic() < deadline:
            time.sleep(0.3)
        assert steps() == STEPS, (steps(), run.stderr[-2000:], (tmp_path / "agent.log").read_text()[-2000:])
    finally:
        agent.terminate()
        try:
            agent.wait(10)
        except subprocess.TimeoutExpired:
            agent.kill()
        log.close()
