"""`ranksight bench hooks` runs end to end (a real UDP sink, a real 2-rank gloo DDP pair) and prints
its two figures (host microseconds per step, the DDP step's overhead ratio); bad arguments are one
line and exit 2. No speed is asserted here: the figures are the benchmark's (bench/RESULTS.md)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight", "bench", "hooks", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


def test_bench_hooks_prints_the_two_figures_from_real_runs():
    r = _bench("--json", "--runs", "2", "--steps", "100", "--ddp-runs", "2", "--ddp-steps", "20", "--ddp-step-ms", "0")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert isinstance(out["host_us_per_step"], float)
    assert isinstance(out["overhead_ratio"], float) and out["overhead_ratio"] > 0
    assert out["ddp_runs"] == 2 and len(out["ddp_pair_ratios"]) == 2
    assert out["ddp_batch"] == 32  # --ddp-step-ms 0 keeps the batch
    assert out["ddp_step_ms"]["plain"] > 0 and out["ddp_step_ms"]["watched"] > 0


@pytest.mark.parametrize("args", [["--runs", "0"], ["--ddp-steps", "0"], ["--ddp-runs", "-1"], ["--runs", "x"]])
def test_bench_hooks_bad_usage_is_one_line_exit_2(args):
    r = _bench(*args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and "error" in lines[-1]
