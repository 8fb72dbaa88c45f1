"""A plain DeepSpeed loop watched with ``ranksight.watch(engine, optimizer, loader)``: 2 ranks on
gloo under torchrun, DeepSpeed on CPU (``DS_ACCELERATOR=cpu``), ZeRO stages 1, 2 and 3, gradient
accumulation 2, a client ``torch.optim.AdamW`` or DeepSpeed's own AdamW from the config, a
DataLoader whose dataset sleeps per item, ``engine.save_checkpoint`` every 4 optimizer steps.
Read from a real agent after the run has ended."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("deepspeed", reason="deepspeed is not installed (the test extra installs it)")

from integration_workloads.harness import launch, rank_series, torchrun, worker_env  # noqa: E402

from ranksight import catalog  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "deepspeed_worker.py")
STEPS, ACCUM, BATCH, SLEEP, SAVE_EVERY = 10, 2, 2, 0.01, 4


def run_stage(agent, tmp_path, stage: int, ds_optimizer: bool, job: str):
    """One 2-rank run; (the per-rank RESULT lines, the agent's per-rank series)."""
    a = agent()
    args = [WORKER, "--out", str(tmp_path), "--stage", str(stage), "--steps", str(STEPS), "--accum", str(ACCUM),
            "--batch", str(BATCH), "--sleep", str(SLEEP), "--save-every", str(SAVE_EVERY)]
    if ds_optimizer:
        args.append("--ds-optimizer")
    run = launch(torchrun(2) + args, worker_env(a.ingest, job, {"DS_ACCELERATOR": "cpu"}))
    assert run["rc"] == 0, run["err"][-4000:]
    results = {r["rank"]: r for r in run["results"]}
    assert sorted(results) == [0, 1], run["out"][-2000:]
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == [0, 1], series
    return results, series


def comm_share(s):
    return s[catalog.COMM_SECONDS.name] / s[catalog.STEP_SECONDS.name]


@pytest.mark.slow
@pytest.mark.parametrize("ds_optimizer", [False, True], ids=["client-optimizer", "config-optimizer"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_two_ranks(agent, tmp_path, stage, ds_optimizer):
    job = f"ds-zero{stage}-{'config' if ds_optimizer else 'client'}"
    results, series = run_stage(agent, tmp_path, stage, ds_optimizer, job)
    for rank, res in results.items():
        s = series[rank]
        assert res["steps"] == STEPS and res["micro"] == STEPS * ACCUM, res  # DeepSpeed's own counts
        assert res["after"] == res["before"], res
        assert res["inner"] == "AdamW", res
        assert s.get(catalog.STEPS.name) == STEPS, s
        assert s.get(catalog.MICROBATCHES.name) == STEPS * ACCUM, s
        wait, injected = s[catalog.DATALOADER_WAIT.name] / STEPS, ACCUM * BATCH * SLEEP
        assert abs(wait - injected) <= 0.25 * injected, (wait, injected)
        assert comm_share(s) > 0, s
        assert s.get(catalog.EXPOSED_COMM_SECONDS.name, 0) > 0, s
        # the checkpoint: the wall time around each engine.save_checkpoint, measured in the worker
        saves = res["saves"]
        assert len(saves) == STEPS // SAVE_EVERY
        assert s.get(catalog.CHECKPOINT_WRITE.count) == len(saves), s
        for name in (catalog.CHECKPOINT_WRITE.sum, catalog.CHECKPOINT_SECONDS.name):
            assert abs(s[name] - sum(saves)) <= 0.25 * sum(saves), (name, s[name], saves)
        assert s.get(catalog.CHECKPOINT_BYTES.name, 0) > 0, s  # every rank writes its ZeRO shard
        assert s.get(catalog.HOOK_ERRORS.name) == 0, s
        assert s.get(catalog.RANK_FINISHED.name) == 1, s
