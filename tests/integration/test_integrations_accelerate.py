"""A hand-written Accelerate loop with the zero-argument ``watch()``: 2 ranks on gloo under
``accelerate launch``, ``accelerator.accumulate`` over 2 micro-batches, a prepared DataLoader
whose dataset sleeps 50 ms per item, ``save_state`` every 3 steps. Read from a real agent after
the run has ended.

Accelerate's DeepSpeed path runs on CPU too: Accelerate ignores a DeepSpeed plugin when ``cpu=True``,
but with ``cpu=False``, the process group started as gloo first (``PartialState(backend="gloo")``)
and DeepSpeed on its CPU accelerator (``DS_ACCELERATOR=cpu``), it prepares a ``DeepSpeedEngine``.
The same ``watch()`` (discovery) then adopts the engine at its first forward: ZeRO-2 and ZeRO-3
runs count exactly DeepSpeed's model steps, once each (discovery's optimizer hooks and the
engine's steps never both count one), and every micro-batch."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("accelerate")

from integration_workloads.harness import (accelerate_launch, check_rank, launch, rank_series, torchrun,  # noqa: E402
                                           worker_env)

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "accelerate_worker.py")
STEPS, ACCUM, BATCH, SLEEP = 6, 2, 2, 0.05


@pytest.mark.slow
def test_accumulate_two_ranks_under_accelerate_launch(agent, tmp_path):
    a = agent()
    job = "accelerate-loop"
    run = launch(accelerate_launch(2) + [WORKER, "--out", str(tmp_path), "--steps", str(STEPS), "--accum",
                                         str(ACCUM), "--batch", str(BATCH), "--sleep", str(SLEEP)],
                 worker_env(a.ingest, job))
    assert run["rc"] == 0, run["err"][-4000:]
    results = {r["rank"]: r for r in run["results"]}
    assert sorted(results) == [0, 1]
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == [0, 1], series
    for rank, res in results.items():
        assert res["steps"] == STEPS and res["model"] == "DistributedDataParallel"  # the wrapper prepare() made
        assert res["after"] == res["before"], res
        # save_state at steps 3 and 6
        check_rank(series[rank], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=rank == 0)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_accelerate_deepspeed_zero_on_cpu(agent, tmp_path, stage):
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[test]' installs it)")
    from test_integrations_deepspeed import parallel_info

    a = agent()
    job = f"accelerate-ds-zero{stage}"
    run = launch(torchrun(2) + [WORKER, "--out", str(tmp_path), "--steps", str(STEPS), "--accum", str(ACCUM),
                                "--batch", str(BATCH), "--sleep", str(SLEEP), "--deepspeed", str(stage)],
                 worker_env(a.ingest, job, {"DS_ACCELERATOR": "cpu"}))
    assert run["rc"] == 0, run["err"][-4000:]
    results = {r["rank"]: r for r in run["results"]}
    assert sorted(results) == [0, 1], run["out"][-2000:]
    text = a.metrics_text()
    series = rank_series(text, job)
    assert sorted(series) == [0, 1], series
    assert parallel_info(text, job) == {0: ("deepspeed", str(stage)), 1: ("deepspeed", str(stage))}
    for rank, res in results.items():
        assert res["distributed"] == "DistributedType.DEEPSPEED" and res["model"] == "DeepSpeedEngine", res
        assert res["steps"] == res["engine_steps"] == STEPS, res  # DeepSpeed's own count of model steps
        assert res["after"] == res["before"], res
        # exact steps and micro-batches (each model step once), save_state at steps 3 and 6
        check_rank(series[rank], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=rank == 0)
