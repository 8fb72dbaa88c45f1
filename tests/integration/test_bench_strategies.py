"""bench/gpu/strategies.py's CPU smoke: every strategy (DDP, FSDP, DeepSpeed ZeRO-1/2/3, a pipeline of
one stage and one of two stages on the rank) in its own gloo subprocess, plain and watched runs in
ABBA pairs; its JSON holds each strategy's pairs, positive ratios, no hook errors and the hooks'
exact step count; bad arguments are one `error:` line and exit 2. No speed is asserted: the figures
are the GPU run's."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu" / "strategies.py"
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3", "pipeline", "pipeline2")
PAIRS, STEPS, WARM = 2, 4, 3


def _run(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


@pytest.mark.slow
def test_cpu_smoke_runs_every_strategy_with_exact_steps_and_no_hook_errors(tmp_path):
    out = tmp_path / "strategies.json"
    r = _run("--device", "cpu", "--agent", "off", "--pairs", str(PAIRS), "--steps", str(STEPS), "--out", str(out),
             "--strategies", ",".join(STRATEGIES))
    assert r.returncode == 0, r.stderr[-3000:]
    res = {s["strategy"]: s for s in json.loads(out.read_text())["strategies"]}
    assert sorted(res) == sorted(STRATEGIES)
    has_ds = importlib.util.find_spec("deepspeed") is not None
    for name, s in res.items():
        if "skipped" in s:  # only DeepSpeed's, and only where it is not installed
            assert not has_ds and name.startswith("zero"), (name, s["skipped"])
            assert isinstance(s["skipped"], str) and s["skipped"], s
            continue
        assert s["pairs"] == PAIRS and len(s["ratios"]) == PAIRS, s
        assert len(s["plain_ms"]) == len(s["instrumented_ms"]) == PAIRS
        assert all(x > 0 for x in s["ratios"] + s["plain_ms"] + s["instrumented_ms"]), s
        assert s["ratio_min"] <= s["ratio_p25"] <= s["ratio_median_of_pairs"] <= s["ratio_p75"] <= s["ratio_max"]
        # what each run ran under: the CPU it last ran on (no GPU here, so no NVML clocks)
        assert [len(s["run_states"][k]) for k in ("plain", "watched")] == [PAIRS, PAIRS], s
        assert all(isinstance(st.get("cpu"), int) for k in ("plain", "watched") for st in s["run_states"][k]), s
        lo, hi = s["ratio_median_ci95"]  # the median's bootstrap interval holds it, within the pairs' range
        assert s["ratio_min"] <= lo <= s["ratio_median_of_pairs"] <= hi <= s["ratio_max"], s
        assert s["hook_errors"] == 0, s
        assert s["hook_steps"] == [WARM + STEPS] * PAIRS and s["exact_steps"], s
        assert name in r.stdout  # a table row each
    saw = {n: s["hooks_saw"] for n, s in res.items() if "skipped" not in s}
    assert saw["ddp"]["parallel"]["strategy"] == "ddp"
    assert saw["fsdp"]["parallel"]["strategy"] == "fsdp"
    assert saw["pipeline"]["pipeline"] is True and saw["pipeline2"]["pipeline"] is True
    for stage in (1, 2, 3):
        if f"zero{stage}" in saw:
            assert saw[f"zero{stage}"]["parallel"] == {"strategy": "deepspeed", "zero_stage": str(stage)}
    assert "ratio" in r.stdout and "1 stage (world size 1)" in r.stdout and "2 stages on the one rank" in r.stdout


@pytest.mark.parametrize("args", [("--pairs", "0"), ("--steps", "0"), ("--strategies", "ddp,tp")])
def test_bad_arguments_are_one_error_line_and_exit_2(args):
    r = _run("--device", "cpu", "--agent", "off", *args, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert len([ln for ln in r.stderr.splitlines() if "error:" in ln]) == 1, r.stderr
    assert "Traceback" not in r.stderr
