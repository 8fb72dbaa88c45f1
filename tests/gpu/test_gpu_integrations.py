"""The framework integrations on the real GPU (bench/gpu/integrations.py, and the lifecycle
worker of the CPU suite with the model on CUDA):

* the HF Trainer and Lightning with ``RanksightCallback`` add no device synchronization: after
  3 warm-up steps, under ``torch.cuda.set_sync_debug_mode("warn")``, no recorded sync has a
  ranksight frame on its stack (the frameworks' own syncs are counted in both runs, watched and
  not), and every optimizer step is a step record;
* 100 watch/unwatch cycles with the model on CUDA, a persistent-workers DataLoader, and a new
  DataLoader with freshly forked workers every 4 cycles right after ``watch()`` (the fork races the
  watch's background thread start: NVML self-check): every worker exits 0, nothing is left behind.

The overhead figures (``python bench/gpu/integrations.py overhead_hf|overhead_lightning``) are a
benchmark, not a test: they go to bench/RESULTS.md.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Dict

import pytest

from gpu_fixtures import REPO, gpu_results, run_script_once  # noqa: F401  (fixture; puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

_CACHE: Dict[str, Dict[str, Any]] = {}


@pytest.fixture(scope="module")
def case(tmp_path_factory, gpu_results):
    d = tmp_path_factory.mktemp("integrations")

    def run(name: str) -> Dict[str, Any]:
        pytest.importorskip("lightning" if "lightning" in name else "transformers")
        return run_script_once(_CACHE, name, ["integrations.py", name], d / f"{name}.json", gpu_results,
                               f"integrations_{name}", 400, env=dict(os.environ, RANKSIGHT_AGENT="off"))

    return run


@pytest.mark.parametrize("name", ("sync_hf", "sync_lightning"))
def test_callback_adds_no_device_sync(case, name):
    r = case(name)
    assert r["ranksight_syncs"] == [], json.dumps(r["ranksight_syncs"][:2], indent=1)
    w = r["watched"]
    assert w["global_step"] == r["plain"]["global_step"] == 12
    assert w["stats"]["gpu"] is True and w["stats"]["herr"] == 0, w["stats"]
    assert w["stats"]["steps"] >= 11  # the last step closes at unwatch, after these stats were read


def test_hundred_cycles_on_cuda_with_freshly_forked_workers(tmp_path, gpu_results):
    worker = os.path.join(REPO, "tests", "integration_workloads", "lifecycle_worker.py")
    env = dict(os.environ, RANKSIGHT_AGENT="off", RANKSIGHT__hooks__table_every_steps="0",
               RANKSIGHT__hooks__table_every_seconds="0", PYTHONPATH=str(REPO))
    p = subprocess.run([sys.executable, worker, "--cycles", "100", "--workers", "2", "--device", "cuda",
                        "--fresh-every", "4", "--agent", "off", "--tmp", str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=400)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and lines, p.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    gpu_results["integrations_lifecycle_cuda"] = r
    assert r["cycle_fresh_exitcodes"] and set(r["cycle_fresh_exitcodes"]) == {0}, r["cycle_fresh_exitcodes"]
    assert r["cycle_fresh_batches"] == [4] * 25
    assert r["fresh_worker_exitcodes"] == [0, 0]
    assert r["after"] == r["before"] and r["state_after"] == r["state_before"] and r["watchers_alive"] == 0, r
