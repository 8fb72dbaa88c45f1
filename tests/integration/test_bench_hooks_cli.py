"""`ranksight bench hooks` runs end to end (a real UDP sink, a real 2-rank gloo DDP pair) and prints
its two figures (host microseconds per step, the DDP step's overhead ratio) and the host time in
each hook method; its default run is the quick one (counted in pairs and steps); bad arguments are
one line and exit 2. No speed is asserted here: the figures are the benchmark's (bench/RESULTS.md)."""
from __future__ import annotations

import argparse
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
    r = _bench("--json", "--runs", "2", "--steps", "100", "--ddp-runs", "2", "--ddp-steps", "20", "--ddp-step-ms", "0",
               "--method-steps", "100")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["mode"] == "quick" and out["trivial_runs"] == 2 and out["trivial_steps_per_run"] == 100
    assert isinstance(out["trivial_ratio"], float) and len(out["trivial_ratio_iqr"]) == 2
    assert isinstance(out["host_us_per_step"], float)
    assert isinstance(out["overhead_ratio"], float) and out["overhead_ratio"] > 0
    assert out["ddp_runs"] == 2 and len(out["ddp_pair_ratios"]) == 2
    assert out["ddp_batch"] == 32  # --ddp-step-ms 0 keeps the batch
    assert out["ddp_step_ms"]["plain"] > 0 and out["ddp_step_ms"]["watched"] > 0


def test_bench_hooks_method_table_has_a_row_per_hook_method_on_cpu_and_on_a_stand_in_gpu():
    r = _bench("--json", "--runs", "1", "--steps", "20", "--ddp-runs", "0", "--method-steps", "200")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["overhead_ratio"] is None  # --ddp-runs 0 skips the DDP step
    cpu, gpu, sampled = out["methods"][:3]  # (two more, "cuda" and "cuda-default", where CUDA is)
    assert (cpu["gpu"], gpu["gpu"], sampled["gpu"]) == ("none", "stand-in", "stand-in-default")
    for table in (cpu, gpu, sampled):
        assert table["steps"] == 200 and table["timer_floor_ns"] > 0
        rows = {row["method"]: row for row in table["rows"]}
        for row in rows.values():
            assert set(row) == {"method", "calls_per_step", "us_per_step", "us_per_step_p50", "us_per_step_incl",
                                "us_per_call_p50"}
            assert row["us_per_step"] >= 0 and row["us_per_step_p50"] >= 0 and row["calls_per_step"] > 0
        # one call a step of each step-path hook (the loader's last next() raises StopIteration: 201 calls)
        for name in ("Watcher._fwd_pre", "Watcher._fwd_post", "Watcher._bwd_done", "Watcher._opt_pre",
                     "Watcher._opt_post", "Watcher._step_end", "backward wrapper", "batch_work"):
            assert rows[name]["calls_per_step"] == 1.0, (name, rows[name])
        assert rows["_TimedIter.__next__"]["calls_per_step"] == 1.005
        assert table["total_us_per_step"] == pytest.approx(sum(r["us_per_step"] for r in table["rows"]), abs=0.05)
        # _opt_post closes the step: its inclusive time holds _step_end's
        assert rows["Watcher._opt_post"]["us_per_step_incl"] >= rows["Watcher._step_end"]["us_per_step_incl"]
    gpu_rows = {row["method"]: row for row in gpu["rows"]}
    assert "CudaTimeline.mark" not in {row["method"] for row in cpu["rows"]}
    assert gpu_rows["CudaTimeline.mark"]["calls_per_step"] == 6.0  # the phase boundaries: fwd, bwd, opt x 2
    assert gpu_rows["CudaTimeline.push"]["calls_per_step"] == 3.0
    assert gpu_rows["CudaTimeline.resolve"]["calls_per_step"] == 1.0
    # the default timing: a timed step's bookkeeping (tens of us even with no driver call) is far
    # above 0.5% of the ~0.1 ms trivial step, so the automatic gap grows and most steps make no
    # mark at all (no row when no timed step fell in the measured steps); each step's phases come
    # from the shares (Watcher._sampled)
    sampled_rows = {row["method"]: row for row in sampled["rows"]}
    assert sampled["gpu_timing_every"] == 0 and sampled["gap"] > 1
    assert sampled_rows.get("CudaTimeline.mark", {"calls_per_step": 0.0})["calls_per_step"] < 3.0
    assert sampled_rows["Watcher._sampled"]["calls_per_step"] == 1.0
    text = _bench("--runs", "1", "--steps", "20", "--ddp-runs", "0", "--method-steps", "100")
    assert text.returncode == 0, text.stderr[-2000:]
    assert "Watcher._step_end" in text.stdout and "CudaTimeline.mark" in text.stdout and "p50" in text.stdout


def test_bench_hooks_default_is_the_quick_run_and_thorough_the_long_one():
    """Counted in pairs and steps: the quick default runs a fraction of the thorough run's steps."""
    from ranksight.tools.bench import load

    mod = load("hooks")
    p = argparse.ArgumentParser()
    mod.add_arguments(p)
    quick, thorough = mod.plan(p.parse_args([])), mod.plan(p.parse_args(["--thorough"]))

    def trivial_steps(n):  # A/B pairs, the inline-send pairs, the three method tables of a machine without CUDA
        return 2 * n["runs"] * n["steps"] + 2 * max(5, n["runs"] // 2) * n["steps"] + 3 * n["method_steps"]

    assert quick == mod.QUICK and thorough == mod.THOROUGH
    assert trivial_steps(quick) <= 12_000 and 2 * quick["ddp_runs"] * quick["ddp_steps"] <= 1_000
    assert trivial_steps(thorough) >= 3 * trivial_steps(quick)
    assert thorough["ddp_runs"] * thorough["ddp_steps"] >= 20 * quick["ddp_runs"] * quick["ddp_steps"]
    assert quick["runs"] >= 10  # the medians still come from interleaved pairs
    assert mod.plan(p.parse_args(["--thorough", "--runs", "3"]))["runs"] == 3  # an option given wins


@pytest.mark.parametrize("args", [["--runs", "0"], ["--ddp-steps", "0"], ["--ddp-runs", "-1"], ["--runs", "x"],
                                  ["--method-steps", "-1"]])
def test_bench_hooks_bad_usage_is_one_line_exit_2(args):
    r = _bench(*args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and "error" in lines[-1]
