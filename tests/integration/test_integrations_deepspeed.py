"""A plain DeepSpeed loop watched with ``ranksight.watch(engine, optimizer, loader)``: 2 ranks on
gloo under torchrun, DeepSpeed on CPU (``DS_ACCELERATOR=cpu``), ZeRO stages 1, 2 and 3, gradient
accumulation 2, a DataLoader whose dataset sleeps per item, ``engine.save_checkpoint`` every 4
optimizer steps. Each rank's hello names its strategy and ZeRO stage (ranksight_rank_parallel_info).
Each stage's run trains two engines one after the other, each its own job: one
with a client ``torch.optim.AdamW``, one with DeepSpeed's AdamW from the config. Read from a real
agent after the run has ended."""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

import pytest

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[test]' installs it)")

from integration_workloads.harness import launch, rank_series, torchrun, worker_env  # noqa: E402

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from ranksight import catalog  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "deepspeed_worker.py")
STEPS, ACCUM, BATCH, SLEEP, SAVE_EVERY = 10, 2, 2, 0.01, 4
OPTIMIZERS = ("client", "config")
W = 64  # the worker's --width: Embedding(64, W), three Linear layers W -> W -> W -> 64
PARAMS = 64 * W + 2 * (W * W + W) + (W * 64 + 64)


def run_stage(agent: Any, out: str, stage: int,
              entry: str = "watch") -> Dict[str, Tuple[Dict[int, Any], Dict[int, Dict[str, float]]]]:
    """One 2-rank run of ZeRO ``stage``, the engine watched through ``entry`` (the worker's
    ``--entry``): optimizer -> (rank -> RESULT, rank -> the agent's series)."""
    a = agent()
    base = f"ds-zero{stage}-{entry}"
    args = [WORKER, "--out", out, "--job", base, "--stage", str(stage), "--steps", str(STEPS), "--accum", str(ACCUM),
            "--batch", str(BATCH), "--sleep", str(SLEEP), "--save-every", str(SAVE_EVERY),
            "--optimizers", ",".join(OPTIMIZERS), "--entry", entry]
    run = launch(torchrun(2) + args, worker_env(a.ingest, base, {"DS_ACCELERATOR": "cpu"}))
    assert run["rc"] == 0, run["err"][-4000:]
    text = a.metrics_text()
    out_: Dict[str, Tuple[Dict[int, Any], Dict[int, Dict[str, float]]]] = {}
    for which in OPTIMIZERS:
        job = f"{base}-{which}"
        results = {r["rank"]: r for r in run["results"] if r["job"] == job}
        assert sorted(results) == [0, 1], run["out"][-2000:]
        # the hello's strategy and ZeRO stage (sent again once watch() alone adopted the engine)
        assert parallel_info(text, job) == {0: ("deepspeed", str(stage)), 1: ("deepspeed", str(stage))}, job
        series = rank_series(text, job)
        assert sorted(series) == [0, 1], (job, series)
        out_[which] = (results, series)
    return out_


def parallel_info(text: str, job: str) -> Dict[int, Tuple[str, str]]:
    """rank -> (strategy, zero_stage) of the job's ranksight_rank_parallel_info series."""
    out: Dict[int, Tuple[str, str]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == catalog.RANK_PARALLEL.name and s.labels.get("job") == job and s.value == 1:
                out[int(s.labels["rank"])] = (s.labels["strategy"], s.labels["zero_stage"])
    return out


def comm_share(s: Dict[str, float]) -> float:
    return s[catalog.COMM_SECONDS.name] / s[catalog.STEP_SECONDS.name]


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stage_two_ranks(agent, tmp_path, stage):
    check_run(run_stage(agent, str(tmp_path), stage))


@pytest.mark.slow
@pytest.mark.parametrize("entry,stage", [("start", 2), ("discover", 3)])
def test_entry_points_route_the_engine(agent, tmp_path, entry, stage):
    """``watcher.start(engine, ...)`` (the integrations' entry point) and ``ranksight.watch()`` given
    nothing (discovery adopts the engine at its first forward, dropping the global optimizer hooks
    that would count the optimizer inside it) watch the engine as ``ranksight.watch(engine, ...)``
    does: the same exact counts, each model step once."""
    check_run(run_stage(agent, str(tmp_path), stage, entry))


def check_run(run: Dict[str, Tuple[Dict[int, Any], Dict[int, Dict[str, float]]]]) -> None:
    for which, (results, series) in run.items():
        for rank, res in results.items():
            s = series[rank]
            where = (which, rank)
            assert res["steps"] == STEPS and res["micro"] == STEPS * ACCUM, res  # DeepSpeed's own counts
            assert res["after"] == res["before"] and res["restored"], res  # the engine's and DeepSpeed's own again
            assert res["inner"] == "AdamW", res
            assert s.get(catalog.STEPS.name) == STEPS, (where, s)
            assert s.get(catalog.MICROBATCHES.name) == STEPS * ACCUM, (where, s)
            wait, injected = s[catalog.DATALOADER_WAIT.name] / STEPS, ACCUM * BATCH * SLEEP
            assert abs(wait - injected) <= 0.25 * injected, (where, wait, injected)
            assert comm_share(s) > 0, (where, s)
            assert s.get(catalog.EXPOSED_COMM_SECONDS.name, 0) > 0, (where, s)
            # the checkpoints: the wall time around each engine.save_checkpoint, measured in the worker;
            # each falls inside a step (saves after steps 4 and 8 of 10), so the steps' share holds it too
            saves = res["saves"]
            assert len(saves) == STEPS // SAVE_EVERY
            assert s.get(catalog.CHECKPOINT_WRITE.count) == len(saves), (where, s)
            for name in (catalog.CHECKPOINT_WRITE.sum, catalog.CHECKPOINT_SECONDS.name):
                assert abs(s[name] - sum(saves)) <= 0.25 * sum(saves), (where, name, s[name], saves)
            assert s.get(catalog.CHECKPOINT_BYTES.name, 0) > 0, (where, s)  # every rank writes its ZeRO shard
            # 6N, N the model's parameters in full: ZeRO-3's partitioned ones by their ds_numel
            assert s.get(catalog.MODEL_FLOPS_PER_TOKEN.name) == 6 * PARAMS, (where, s)
            assert s.get(catalog.HOOK_ERRORS.name) == 0, (where, s)
            assert s.get(catalog.RANK_FINISHED.name) == 1, (where, s)
