"""The Hugging Face Trainer with ``RanksightCallback``: 2 ranks on gloo under torchrun, a tiny
GPT-2 built from a config (nothing downloaded), gradient accumulation 2, a dataset that sleeps
50 ms per item. Read from a real agent after the run has ended.

The Trainer's ``deepspeed=`` runs on CPU as well (ZeRO-2 and ZeRO-3 below), given what the worker
sets up: ``use_cpu=False`` (with ``use_cpu`` the Trainer trains without DeepSpeed), DeepSpeed's CPU
accelerator, and the process group started as gloo in a DeepSpeed state the Trainer takes
(``use_configured_state``): left to itself the Trainer starts its state with no backend, and on a
machine without an accelerator Accelerate knows every rank then believes it is process 0 of 1
while DeepSpeed trains on 2 (each rank then saves checkpoints as the main process)."""
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


@pytest.mark.slow
@pytest.mark.parametrize("stage", [2, 3])
def test_trainer_deepspeed_zero_on_cpu(agent, tmp_path, stage):
    """``TrainingArguments(deepspeed=...)`` on CPU (``use_cpu=False``, ``ddp_backend="gloo"``,
    ``DS_ACCELERATOR=cpu``): the callback's watch adopts the Trainer's DeepSpeed engine at its
    first forward, so each optimizer step is DeepSpeed's model step, counted once (the global
    optimizer hooks that would also count the optimizer inside the engine are gone), with every
    micro-batch; the Trainer's checkpoints (DeepSpeed's save_checkpoint inside) are one write each."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[test]' installs it)")
    from test_integrations_deepspeed import parallel_info

    a = agent()
    job = f"hf-ds-zero{stage}"
    run = launch(torchrun(2) + [WORKER, "--out", str(tmp_path), "--steps", str(STEPS), "--accum", str(ACCUM),
                                "--batch", str(BATCH), "--sleep", str(SLEEP), "--save-steps", "3",
                                "--deepspeed", str(stage)],
                 worker_env(a.ingest, job, {"DS_ACCELERATOR": "cpu"}))
    assert run["rc"] == 0, run["err"][-4000:]
    assert len(run["results"]) == 2, run["out"][-2000:]
    text = a.metrics_text()
    series = rank_series(text, job)
    assert sorted(series) == [0, 1], series
    assert parallel_info(text, job) == {0: ("deepspeed", str(stage)), 1: ("deepspeed", str(stage))}
    for res in run["results"]:
        assert res["engine"] == "DeepSpeedEngine" and res["engine_steps"] == STEPS, res
        assert res["global_steps"] == [STEPS] and res["after"] == res["before"], res
        assert not res["watcher_left"]
        check_rank(series[res["rank"]], STEPS, ACCUM, ACCUM * BATCH * SLEEP, ckpts=2, writer=res["rank"] == 0)
