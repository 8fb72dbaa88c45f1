"""A hand-written Accelerate loop with the zero-argument ``watch()``: 2 ranks on gloo under
``accelerate launch``, ``accelerator.accumulate`` over 2 micro-batches, a prepared DataLoader
whose dataset sleeps 50 ms per item, ``save_state`` every 3 steps. Read from a real agent after
the run has ended."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("accelerate")

from integration_workloads.harness import accelerate_launch, check_rank, launch, rank_series, worker_env  # noqa: E402

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
