"""Lightning with ``RanksightCallback``: 2 ranks on gloo started by Lightning's own launcher
(``python script.py`` with strategy="ddp", devices=2 on CPU), accumulate_grad_batches=2, a
dataset that sleeps 50 ms per item, ModelCheckpoint every 3 steps. Read from a real agent after
the run has ended. And a manual-optimization module stepping two optimizers per batch."""
from __future__ import annotations

import os
import statistics
import sys

import pytest

pytest.importorskip("lightning")

from integration_workloads.harness import check_rank, launch, rank_series, worker_env  # noqa: E402

from ranksight import catalog  # noqa: E402
from ranksight.tools.receiver import DETAIL_ENV, Receiver  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "lightning_worker.py")
STEPS, ACCUM, BATCH, SLEEP = 6, 2, 2, 0.05


@pytest.mark.slow
def test_ddp_two_ranks_under_lightnings_launcher(agent, tmp_path):
    a = agent()
    job = "lightning-ddp"
    run = launch([sys.executable, WORKER, "--out", str(tmp_path), "--devices", "2", "--steps", str(STEPS),
                  "--accum", str(ACCUM), "--batch", str(BATCH), "--sleep", str(SLEEP), "--save-every", "3",
                  "--val-every", "4"],
                 worker_env(a.ingest, job))
    assert run["rc"] == 0, run["err"][-4000:]
    results = {r["rank"]: r for r in run["results"]}
    assert sorted(results) == [0, 1]
    assert results[0]["ckpts"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"]
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == [0, 1], series
    assert [series[r]["local_rank"] for r in (0, 1)] == [0, 1]  # Lightning's launcher sets LOCAL_RANK, no RANK
    for rank, res in results.items():
        assert res["global_step"] == STEPS and res["batches"] == STEPS * ACCUM
        assert res["model"] == "DistributedDataParallel", res  # the strategy's wrapper is what is watched
        assert res["validated"] == 6  # 3 validations (every 4 batches) x 2 batches: not training data wait
        assert res["after"] == res["before"] and not res["watcher_left"], res
        # ModelCheckpoint's saves (every rank enters Trainer.save_checkpoint; rank 0 writes)
        check_rank(series[rank], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=rank == 0)
        # on_train_batch_end's loss of every micro-batch (times accumulate_grad_batches), all finite
        assert series[rank][catalog.LOSS_READINGS.name] == STEPS * ACCUM, series[rank]
        assert series[rank][catalog.LOSS_SUM.name] > 0 and series[rank][catalog.LOSS_NONFINITE.name] == 0
        # the run's length from the trainer (max_steps), the ETA's denominator; no resume
        assert series[rank][catalog.TOTAL_STEPS.name] == STEPS, series[rank]
        assert series[rank][catalog.RESUME_STEP.name] == 0 and series[rank][catalog.LAST_RESUME.name] == 0


@pytest.mark.slow
def test_two_optimizers_per_batch_make_one_step(tmp_path):
    with Receiver() as rx:
        run = launch([sys.executable, WORKER, "--out", str(tmp_path), "--devices", "1", "--steps", "4",
                      "--two-optimizers", "--sleep", "0.01", "--save-every", "100"],
                     worker_env(rx.url, "lightning-gan", DETAIL_ENV))
        assert run["rc"] == 0, run["err"][-4000:]
        rx.wait_for(lambda: rx.of("bye"), 5)
    res = run["results"][0]
    # Lightning counts each optimizer's step: 4 batches x 2 optimizers
    assert res["global_step"] == 8 and res["batches"] == 4
    steps = rx.of("step")
    assert [s["seq"] for s in steps] == [1, 2, 3, 4]  # one step per batch: the last optimizer closes it
    assert all(s["micro"] == 1 for s in steps)
    # 2 items x 10 ms per batch; the median, since a prefetch shifts one and a busy box delays one
    wait = statistics.median(s["data"] for s in steps)
    assert abs(wait - 0.02) <= 0.25 * 0.02, [s["data"] for s in steps]
    assert all(s["opt"] > 0 and s["bwd"] > 0 and s["fwd"] > 0 for s in steps)
    assert res["after"] == res["before"]
