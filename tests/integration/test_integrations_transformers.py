"""The Hugging Face Trainer with ``RanksightCallback``: 2 ranks on gloo under torchrun, a tiny
GPT-2 built from a config (nothing downloaded), gradient accumulation 2, a dataset that sleeps
50 ms per item. Read from a real agent after the run has ended."""
from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("transformers")

from integration_workloads.harness import check_rank, launch, rank_series, torchrun, worker_env  # noqa: E402

from ranksight import catalog  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "hf_worker.py")
STEPS, ACCUM, BATCH, SLEEP = 6, 2, 2, 0.05


@pytest.mark.slow
def test_trainer_two_ranks_under_torchrun(agent, tmp_path):
    a = agent()
    job = "hf-trainer"
    run = launch(torchrun(2) + [WORKER, "--out", str(tmp_path), "--steps", str(STEPS), "--accum", str(ACCUM),
                                "--batch", str(BATCH), "--sleep", str(SLEEP), "--save-steps", "3", "--eval-steps", "2"],
                 worker_env(a.ingest, job))
    assert run["rc"] == 0, run["err"][-4000:]
    assert len(run["results"]) == 2
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == [0, 1], series
    for res in run["results"]:
        assert res["global_steps"] == [STEPS]
        assert res["evaluations"] == 3  # at steps 2, 4 and 6: their loader's fetches are not training data wait
        assert res["after"] == res["before"], res  # the callback's watch left nothing patched or running
        assert not res["watcher_left"]
    for rank in (0, 1):
        # checkpoints at steps 3 and 6: the Trainer's own _save_checkpoint, one write each
        check_rank(series[rank], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=rank == 0)
        # the run's length from the Trainer's state (max_steps), the ETA's denominator
        assert series[rank][catalog.TOTAL_STEPS.name] == STEPS, series[rank]


def test_broken_agent_address_does_not_stop_training(tmp_path):
    """One process, no launcher: an address that cannot be parsed, training runs to its end."""
    run = launch([sys.executable, WORKER, "--out", str(tmp_path), "--steps", "2", "--sleep", "0", "--save-steps", "2",
                  "--train-calls", "2"], worker_env("udp://256.1.1.1:1", "hf-broken"))
    assert run["rc"] == 0, run["err"][-4000:]
    res = run["results"][0]
    assert res["global_steps"] == [2, 4]  # train() twice with the same callback: two watches
    assert res["after"] == res["before"] and not res["watcher_left"]
    assert "256.1.1.1" in run["err"]  # said once, in the log
