"""DeepSpeed on the real GPU (bench/gpu/deepspeed_gpu.py, one rank, NCCL world 1, bf16):

* a plain engine, ZeRO-2 and ZeRO-3, watched with ``ranksight.watch(engine, optimizer, loader)``:
  every measured step is a step record, the engine's model steps and the hooks' agree, no hook
  error, no synchronization from a ranksight frame, and the forward, backward (with its exposed
  tail) and optimizer (the model step) agree within 15% with the profiler's event span of each
  phase's range, and with its kernel span, except the optimizer's, which exceeds its kernel span by
  the GPU's measured wait for the engine's host work before its first kernel, and by nothing else;
* the Hugging Face Trainer with ``deepspeed=`` ZeRO-2 and ZeRO-3 and ``RanksightCallback``: the
  callback's watch adopts the Trainer's engine, so the step records are exactly the Trainer's
  optimizer steps and DeepSpeed's model steps (no double counting: the global optimizer hooks that
  would count the optimizer inside the engine are gone), each with its 2 micro-batches, and no
  synchronization comes from a ranksight frame.

Sync debug mode: DeepSpeed (ZeRO's bookkeeping) and the Trainer (its logging) synchronize on their
own, so ``set_sync_debug_mode("error")`` would stop them, not the hooks. The measured steps run
under "warn" instead and every synchronization is recorded with its stack; one with a ranksight
frame on it is the hooks' (``bench/gpu/integrations.py``'s ``SyncRecorder``, as the HF and
Lightning GPU checks do).

What runs on CPU instead (tests/integration/): the plain engine with ZeRO 1-3 and both optimizers
(client and config), ``watcher.start`` and ``watch()`` alone, Accelerate's DeepSpeed plugin and the
Trainer's ``deepspeed=`` with ZeRO-2 and ZeRO-3, all 2 ranks on gloo.

How deepspeed gets to the GPU machine (torch + CUDA there, no network, no deepspeed): here, run
``bash bench/gpu/deepspeed_prepare.sh``: it copies this venv's deepspeed (installed with
``DS_BUILD_OPS=0``: pure Python; nothing here builds an op: the client ``torch.optim.AdamW``, no
fused kernel) with the pure-Python packages it imports into ``.devbin/py-deepspeed/``, and
pydantic with its compiled core for CPython 3.11 (this venv's) and 3.12 (the GPU machine's: a wheel
from the package index) into ``.devbin/py-deepspeed-cp311/`` and ``-cp312/``. The device call
carries ``.devbin`` (``carry=[".devbin"]``). There, the subprocesses get ``.devbin/py-deepspeed`` on
their ``PYTHONPATH`` when ``import deepspeed`` fails without it, and the folder of the running
CPython where it has no pydantic of its own (``gpu_workload.with_deepspeed``);
``bench/gpu/checkout_env.sh`` makes the checkout importable as ``ranksight`` as for every GPU test. The HF cases need transformers there too.
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

TOLERANCE = 0.15  # hook phase times agree with torch.profiler within 15%
STAGES = (2, 3)
_CACHE: Dict[str, Dict[str, Any]] = {}
_ENV: Dict[str, Dict[str, str]] = {}


def deepspeed_env() -> Dict[str, str]:
    """The subprocesses' environment: deepspeed importable, from ``.devbin`` where it is not installed.
    Probed once per session (the probe imports deepspeed and torch in a new process: ~6 s)."""
    if "env" in _ENV:
        return _ENV["env"]
    env = W.with_deepspeed(dict(os.environ, RANKSIGHT_AGENT="off"))
    probe = subprocess.run([sys.executable, "-c", "import deepspeed"], env=env, capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.fail("deepspeed is not importable here: run `bash bench/gpu/deepspeed_prepare.sh` where it is "
                    "installed (DS_BUILD_OPS=0) and carry .devbin to this machine; the import said: "
                    + (probe.stderr.strip().splitlines() or ["nothing"])[-1], pytrace=False)
    _ENV["env"] = env
    return env


@pytest.fixture(scope="module")
def case(tmp_path_factory, gpu_results):
    d = tmp_path_factory.mktemp("deepspeed")

    def run(kind: str, stage: int) -> Dict[str, Any]:
        if kind == "hf":
            pytest.importorskip("transformers")
        key = f"{kind}_zero{stage}"
        if key in _CACHE:
            return _CACHE[key]
        return run_script_once(_CACHE, key, ["deepspeed_gpu.py", kind, "--stage", str(stage)], d / f"{key}.json",
                               gpu_results, f"deepspeed_{key}", 400, env=deepspeed_env())

    return run


@pytest.mark.parametrize("stage", STAGES)
def test_engine_steps_records_and_no_sync_from_the_hooks(case, stage):
    r = case("engine", stage)
    assert r["errors"] == [], r["errors"][0]
    assert r["records_complete"], "the step records did not all arrive"
    assert r["invalid_datagrams"] == [] and r["hook_errors"] == 0, r
    assert r["ranksight_syncs"] == [], json.dumps(r["ranksight_syncs"][:2], indent=1)
    st = r["stats_end"]
    assert st["gpu"] is True, "the hooks did not take the CUDA event path"
    assert r["engine_steps"] == r["warmup"] + r["steps"]  # DeepSpeed's own count
    assert st["steps"] == r["engine_steps"] + 2  # and the two steps with no GPU work that flush the records
    assert r["hooks"]["records"] == r["steps"] + 1


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("phase", ("fwd", "bwd_plus_tail", "opt"))
@pytest.mark.parametrize("span", ("event", "kernel"))
def test_engine_phases_agree_with_the_profiler(case, stage, phase, span):
    r = case("engine", stage)
    c = r["compare"][f"{phase}_event" if span == "event" else phase]
    assert c["profiler_s"] > 0, f"the profiler saw no GPU work in the {phase} ranges"
    msg = (f"ZeRO-{stage} {phase}: hooks {c['hooks_s'] * 1e3:.3f} ms vs profiler {span} span "
           f"{c['profiler_s'] * 1e3:.3f} ms over {r['steps']} steps ({c['rel_diff']:.1%} apart)")
    if phase == "opt" and span == "kernel":
        # the engine's step starts with host work (ZeRO's partition bookkeeping, the gradient norm)
        # before its first kernel: the event pair counts the GPU waiting for it, the kernel span does
        # not. As for DDP's optimizer (test_gpu_hooks.py), the difference must be that measured wait
        # (the profiler's event span less its kernel span) and nothing else
        ev = r["compare"]["opt_event"]
        wait = ev["profiler_s"] - c["profiler_s"]
        extra = c["hooks_s"] - c["profiler_s"]
        assert wait >= 0 and abs(extra - wait) <= TOLERANCE * c["profiler_s"], (
            msg + f"; the GPU waited {wait * 1e3:.3f} ms for the host")
        return
    assert c["rel_diff"] <= TOLERANCE, msg


@pytest.mark.parametrize("stage", STAGES)
def test_trainer_deepspeed_counts_each_step_once(case, stage):
    r = case("hf", stage)
    from deepspeed_gpu import HF_ACCUM, HF_STEPS

    assert r["engine"] == "DeepSpeedEngine", r
    assert r["global_step"] == r["engine_steps"] == HF_STEPS, r
    assert r["stats"]["model"] == "DeepSpeedEngine" and r["stats"]["optimizer"] == "EngineSteps", r["stats"]
    assert r["stats"]["gpu"] is True and r["stats"]["herr"] == 0, r["stats"]
    assert r["step_records"] == HF_STEPS and r["micro"] == HF_STEPS * HF_ACCUM, r
    assert r["invalid_datagrams"] == []
    assert r["ranksight_syncs"] == [], json.dumps(r["ranksight_syncs"][:2], indent=1)
