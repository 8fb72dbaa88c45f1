"""Fixtures of tests/gpu (imported by its test modules; not a conftest, so that the suite's one
``conftest`` module name stays the root one that other tests import from).

tests/gpu covers the real GPU paths (CUDA events under sync debug mode, NCCL, NVML/GPM). They
run where CUDA exists (the project's H200 machine: ``bash bench/gpu/run_all.sh``) and are
skipped elsewhere, each with the reason. ``test_gpu_trace.py`` and ``test_gpu_nvml_fixture.py``
need no GPU and run everywhere. Importing this module puts ``bench/gpu`` on ``sys.path``
(modules ``gpu_workload``, ``gpu_trace``, ``gpu_loads``).

Figures measured by the GPU tests are collected in ``gpu_results`` and written to
``$RANKSIGHT_GPU_OUT/pytest_gpu_results.json`` when that variable is set.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCH_GPU = REPO / "bench" / "gpu"
if str(BENCH_GPU) not in sys.path:
    sys.path.insert(0, str(BENCH_GPU))


# Each test module that imports these fixtures gets its own instance of them (pytest registers an
# imported fixture per module), so the expensive results live here, once per process.
_SCENARIOS: Dict[str, Dict[str, Any]] = {}


@pytest.fixture(scope="session")
def gpu_results() -> Iterator[Dict[str, Any]]:
    results: Dict[str, Any] = {}
    yield results
    out = os.environ.get("RANKSIGHT_GPU_OUT")
    if out and results:
        p = Path(out) / "pytest_gpu_results.json"
        p.parent.mkdir(parents=True, exist_ok=True)
        merged = json.loads(p.read_text()) if p.exists() else {}
        merged.update(results)
        p.write_text(json.dumps(merged, indent=1, sort_keys=True, default=str) + "\n")


SCENARIO_TIMEOUT = 300


def run_script_once(cache: Dict[str, Dict[str, Any]], key: str, args: List[str], out: Path,
                    gpu_results: Dict[str, Any], result_key: str, timeout: float,
                    env: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    """Runs ``python bench/gpu/ARGS... --out OUT`` once per session in its own process (NCCL
    environment and sync debug mode are per process), caches its JSON under ``key`` and records it
    in ``gpu_results[result_key]``; a timeout, a missing result or a crash fails the test."""
    import subprocess

    if key in cache:
        return cache[key]
    try:
        proc = subprocess.run([sys.executable, str(BENCH_GPU / args[0]), *args[1:], "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{args[0]} {key} did not finish in {timeout:g} s: {str(e.stderr)[-2000:]}")
    if not out.exists():
        pytest.fail(f"{args[0]} {key} exited {proc.returncode} without a result:\n{proc.stderr[-4000:]}")
    r = json.loads(out.read_text())
    r["stderr_tail"] = proc.stderr[-3000:]
    cache[key] = r
    gpu_results[result_key] = r
    if "crashed" in r:
        pytest.fail(f"{args[0]} {key} crashed:\n{r['crashed']}")
    return r


@pytest.fixture(scope="session")
def scenario(tmp_path_factory: pytest.TempPathFactory, gpu_results: Dict[str, Any]):
    """``scenario(name, batch=8) -> result dict``: runs ``bench/gpu/scenarios.py NAME --batch B`` once per session in
    its own process (NCCL environment and sync debug mode are per process) and caches the result."""
    d = tmp_path_factory.mktemp("scenarios")
    trace_dir = Path(os.environ.get("RANKSIGHT_GPU_OUT") or d) / "traces"
    env = dict(os.environ, PYTHONUNBUFFERED="1", NCCL_NVLS_ENABLE="0")

    def run(name: str, batch: int = 8) -> Dict[str, Any]:
        key = f"{name}_b{batch}"
        return run_script_once(_SCENARIOS, key, ["scenarios.py", name, "--batch", str(batch), "--trace-dir",
                                                 str(trace_dir)], d / f"{key}.json", gpu_results,
                               f"scenario_{key}", SCENARIO_TIMEOUT, env=env)

    return run
