"""`ranksight demo` end to end: real 2-rank gloo DDP, a real agent, real Prometheus and Alertmanager."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import require_binary

REPO = Path(__file__).resolve().parents[1]


def demo(*args: str, env=None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight", "demo", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=REPO)


def _no_leftovers(run_dir: Path) -> None:
    out = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True, check=True).stdout
    left = [ln for ln in out.splitlines() if str(run_dir) in ln and not ln.startswith("Z") and "ps -eo" not in ln]
    assert not left, left


def test_demo_healthy_run_fires_nothing(tmp_path):
    require_binary("prometheus"), require_binary("alertmanager")
    run_dir = tmp_path / "demo"
    p = demo("--fault", "none", "--duration", "20", "--run-dir", str(run_dir))
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert re.search(r"prometheus +http://127\.0\.0\.1:\d+", out) and re.search(r"alertmanager +http://", out)
    assert "ranksight step time, job demo" in out  # the hooks' console table, from rank 0
    assert "job exit codes: [0, 0]" in out
    # the pipeline really ran: Prometheus scraped steps of both ranks through the agent
    steps = dict(re.findall(r"rank (\d+): (\d+)", out.split("steps Prometheus saw:")[1].splitlines()[0]))
    assert set(steps) == {"0", "1"} and min(int(v) for v in steps.values()) > 0, out
    assert "alerts: none fired" in out and "verdict: healthy run" in out
    _no_leftovers(run_dir)


def test_demo_kill_rank_names_the_cause(tmp_path):
    require_binary("prometheus"), require_binary("alertmanager")
    run_dir = tmp_path / "demo"
    p = demo("--fault", "kill-rank", "--duration", "20", "--fault-after", "5", "--run-dir", str(run_dir))
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert "job exit codes:" in out and "-9" in out.split("job exit codes:")[1].splitlines()[0]
    verdict = next(ln for ln in out.splitlines() if ln.startswith("verdict:"))
    assert re.match(r"verdict: Ranksight(RankDown|HeartbeatMissed) on job=demo rank=1 ", verdict), out
    assert "names the injected cause (kill-rank" in verdict
    _no_leftovers(run_dir)


def test_demo_without_binaries_runs_agent_and_job(tmp_path):
    run_dir = tmp_path / "demo"
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no /usr/bin: no prometheus
    p = demo("--fault", "none", "--duration", "4", "--run-dir", str(run_dir), env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("ranksight demo: no local stack")]
    assert len(lines) == 1 and "apt-get install prometheus" in lines[0]
    assert "job exit codes: [0, 0]" in p.stdout and "alerts: not evaluated" in p.stdout
    _no_leftovers(run_dir)


def test_demo_bad_usage_is_one_line():
    p = demo("--fault", "meteor")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "meteor" in p.stderr
    p = demo("--duration", "-1")
    assert p.returncode == 2 and p.stderr.strip().startswith("ranksight: error:")
