"""The framework integrations on the real GPU (bench/gpu/integrations.py, and the lifecycle
worker of the CPU suite with the model on CUDA):

* the HF Trainer and Lightning with ``RanksightCallback`` add no device synchronization: after
  3 warm-up steps, under ``torch.cuda.set_sync_debug_mode("warn")``, no recorded sync has a
  ranksight frame on its stack (the frameworks' own syncs are counted in both runs, watched and
  not), and every optimizer step is a step record;
* Lightning under DDPStrategy and FSDPStrategy on one GPU (NCCL, world size 1) records the
  same steps, micro-batches and phases (FSDP cannot run on CPU: Lightning refuses FSDPStrategy
  with accelerator="cpu", and torch's FSDP needs an accelerator device);
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


LIGHTNING_WORKER = os.path.join(REPO, "tests", "integration_workloads", "lightning_worker.py")
STEPS, ACCUM, BATCH, SLEEP = 6, 2, 2, 0.05
WRAPPER = {"ddp": "DistributedDataParallel", "fsdp": "FullyShardedDataParallel"}


@pytest.mark.parametrize("strategy", ("ddp", "fsdp"))
def test_lightning_strategy_on_one_gpu_records_steps_microbatches_and_phases(agent, tmp_path, strategy):
    """Lightning with ``RanksightCallback`` on one GPU under DDPStrategy and FSDPStrategy (NCCL,
    world size 1; FSDP cannot run on CPU): the same records under both, read from the step
    datagrams and from a real agent after the run: one step per optimizer step, each of
    ``accumulate_grad_batches`` micro-batches, forward, backward and optimizer phases timed (on
    every step once the first timed step resolved), the
    data wait per step within 25% of the injected delay, and ModelCheckpoint's saves timed."""
    pytest.importorskip("lightning")
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from integration_workloads.harness import check_rank, launch, rank_series, worker_env
    from ranksight.tools.receiver import DETAIL_ENV, Receiver

    a = agent()
    host, port = a.ingest[len("udp://"):].rsplit(":", 1)
    job = f"lightning-gpu-{strategy}"
    with Receiver(forward=(host, int(port))) as rx:
        run = launch([sys.executable, LIGHTNING_WORKER, "--out", str(tmp_path), "--accelerator", "gpu", "--devices", "1",
                      "--strategy", strategy, "--steps", str(STEPS), "--accum", str(ACCUM), "--batch", str(BATCH),
                      "--sleep", str(SLEEP), "--save-every", "3"], worker_env(rx.url, job, DETAIL_ENV), timeout=300)
        assert run["rc"] == 0, run["err"][-4000:]
        rx.wait_for(lambda: rx.of("bye"), 10)
    assert not rx.invalid, rx.invalid[:3]
    res = run["results"][0]
    assert res["model"] == WRAPPER[strategy], res
    assert res["global_step"] == STEPS and res["batches"] == STEPS * ACCUM, res
    assert res["ckpts"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"], res
    assert res["after"] == res["before"] and not res["watcher_left"], res
    steps = rx.steps()
    assert [s["seq"] for s in steps] == list(range(1, STEPS + 1)), [s["seq"] for s in steps]
    assert all(s["micro"] == ACCUM for s in steps), [s["micro"] for s in steps]
    # the default sampled timing: no phases before the first timed step (the second) resolved, a
    # step or two later; the timed steps' shares of each step's own time from then on
    known = next((i for i, s in enumerate(steps) if s["fwd"] > 0), len(steps))
    assert known <= STEPS // 2, [s["fwd"] for s in steps]
    for phase in ("fwd", "bwd", "opt"):
        assert all(s[phase] > 0 for s in steps[known:]), (phase, [s[phase] for s in steps])
    hello = rx.of("hello")
    assert hello and hello[0]["info"]["backend"] == "nccl" and hello[0]["info"]["gpus"] >= 1, hello[:1]
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == [0], series
    check_rank(series[0], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=True)
