"""``torch.distributed.pipelining`` watched with ``ranksight.watch(schedule, optimizer, loader)``:
real processes under torchrun, gloo on CPU, one pipeline stage per rank, read from a real agent
after the run has ended.

Each stage's compute is a fixed host delay (``time.sleep`` in the layer's forward, and in its
backward through a custom autograd Function; ``integration_workloads/pipeline_worker.py``). The
machine has two cores: four ranks computing on the CPU would take turns on them and the measured
bubble would be the machine's contention, not the schedule's. Sleeping stages leave the cores
free, so each stage's busy time is known (micro-batches x (forward + backward delay)) and its
bubble share must come out at the schedule's ideal, (p-1)/(m+p-1) for p stages and m micro-batches
(GPipe and 1F1B alike), within 5 points."""
from __future__ import annotations

import os
from typing import Any, Dict, Sequence, Tuple

import pytest

from integration_workloads.harness import launch, rank_series, torchrun, worker_env

from ranksight import catalog as C

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "pipeline_worker.py")
FWD = BWD = 0.08  # seconds each stage sleeps per micro-batch, forward and backward (two stages)


def run(agent: Any, job: str, ranks: int, micro: int, schedule: str, steps: int, delay: float = FWD,
        extra: Sequence[str] = ()) -> Tuple[Dict[int, Any], Dict[int, Dict[str, float]]]:
    """One run: rank -> RESULT, rank -> the agent's series of the job."""
    a = agent()
    args = [WORKER, "--steps", str(steps), "--micro", str(micro), "--schedule", schedule, "--fwd", str(delay),
            "--bwd", str(delay), *extra]
    r = launch(torchrun(ranks) + args, worker_env(a.ingest, job), timeout=120)
    assert r["rc"] == 0, r["err"][-4000:]
    results = {x["rank"]: x for x in r["results"]}
    assert sorted(results) == list(range(ranks)), r["out"][-2000:]
    series = rank_series(a.metrics_text(), job)
    assert sorted(series) == list(range(ranks)), series
    return results, series


def bubble(s: Dict[str, float]) -> float:
    return 1.0 - s[C.PIPELINE_BUSY.name] / s[C.PIPELINE_STEP.name]


def check_stages(results: Dict[int, Any], series: Dict[int, Dict[str, float]], p: int, m: int, steps: int,
                 factor: Dict[int, float], delay: float = FWD) -> None:
    """Every stage: its place, its busy time against the injected delays, the P2P waits on the side
    the schedule makes it wait (as exposed communication, not as collective time), the hooks
    restored and no hook error."""
    for rank, s in series.items():
        res = results[rank]
        assert res["restored"] and res["after"] == res["before"], res
        assert s.get(C.HOOK_ERRORS.name) == 0, (rank, s)
        assert s.get(C.STEPS.name) == steps, (rank, s)
        assert s.get(C.PIPELINE_STAGE.name) == s.get("stage") == rank and s.get(C.PIPELINE_STAGES.name) == p, (rank, s)
        assert s.get(C.PIPELINE_MICROBATCHES.name) == m, (rank, s)
        injected = steps * m * 2 * delay * factor.get(rank, 1.0)
        busy = s[C.PIPELINE_BUSY.name]
        assert injected <= busy <= 1.15 * injected, (rank, busy, injected)
        assert s[C.PIPELINE_STEP.name] > busy, (rank, s)
        prev, nxt = s[C.PIPELINE_WAIT_PREV.name], s[C.PIPELINE_WAIT_NEXT.name]
        # the stage's P2P is no collective time (a pipeline's bubble must not read as a comm-bound job);
        # its waits are the rank's exposed communication, so its busy time stays its compute
        assert s.get(C.COMM_SECONDS.name, 0) < 0.01 * s[C.PIPELINE_STEP.name], (rank, s)
        assert abs(s[C.EXPOSED_COMM_SECONDS.name] - prev - nxt) <= 0.05 * s[C.PIPELINE_STEP.name], (rank, s)
        # the first stage waits for gradients, the last for activations, those between for both
        assert (prev > 0.5 * delay * steps) == (rank > 0), (rank, prev, nxt)
        assert (nxt > 0.5 * delay * steps) == (rank < p - 1), (rank, prev, nxt)


@pytest.mark.slow
@pytest.mark.parametrize("schedule,micro", [("gpipe", 4), ("1f1b", 8)])
def test_two_stages_bubble_at_the_ideal(agent, schedule, micro):
    p, steps = 2, 3
    results, series = run(agent, f"pp2-{schedule}", p, micro, schedule, steps)
    check_stages(results, series, p, micro, steps, {})
    ideal = (p - 1) / (micro + p - 1)
    for rank, s in series.items():
        assert abs(bubble(s) - ideal) <= 0.05, (rank, bubble(s), ideal, s)


@pytest.mark.slow
@pytest.mark.parametrize("schedule,micro", [("gpipe", 4), ("1f1b", 8)])
def test_four_stages_bubble_at_the_ideal(agent, schedule, micro):
    p, steps, delay = 4, 3, 0.1
    results, series = run(agent, f"pp4-{schedule}", p, micro, schedule, steps, delay)
    check_stages(results, series, p, micro, steps, {}, delay)
    ideal = (p - 1) / (micro + p - 1)
    for rank, s in series.items():
        assert abs(bubble(s) - ideal) <= 0.05, (rank, bubble(s), ideal, s)


@pytest.mark.slow
def test_interleaved_two_stages_per_rank(agent):
    """Two ranks, two stages each (v=2, ``ScheduleInterleaved1F1B``): the micro-batch gauge is v*m,
    the busy time both stages' chunks, and the bubble at the interleaved ideal (p-1)/(v*m+p-1)."""
    p, v, m, steps, delay = 2, 2, 4, 3, 0.06
    results, series = run(agent, "pp2-interleaved", p, m, "interleaved", steps, delay, ["--per-rank", str(v)])
    ideal = (p - 1) / (v * m + p - 1)
    for rank, s in series.items():
        assert results[rank]["restored"] and s.get(C.HOOK_ERRORS.name) == 0, (rank, s)
        assert s.get(C.PIPELINE_STAGE.name) == rank and s.get(C.PIPELINE_MICROBATCHES.name) == v * m, (rank, s)
        injected = steps * v * m * 2 * delay
        assert injected <= s[C.PIPELINE_BUSY.name] <= 1.15 * injected, (rank, s)
        assert abs(bubble(s) - ideal) <= 0.05, (rank, bubble(s), ideal, s)


@pytest.mark.slow
def test_a_slow_stage_has_the_largest_busy_time_and_the_others_wait(agent):
    """Stage 2 of 4 computes twice as long: its busy time is the largest (twice its peers'), it
    waits least, and every other stage's bubble rises above the schedule's ideal."""
    p, m, steps, delay, slow = 4, 4, 2, 0.04, 2
    results, series = run(agent, "pp4-slow", p, m, "1f1b", steps, delay,
                          ["--slow-stage", str(slow), "--slow-factor", "2"])
    busy = {r: s[C.PIPELINE_BUSY.name] for r, s in series.items()}
    assert max(busy, key=busy.get) == slow, busy
    for r in busy:
        if r != slow:
            assert 1.7 <= busy[slow] / busy[r] <= 2.3, busy
            assert bubble(series[r]) > bubble(series[slow]) + 0.2, {k: bubble(s) for k, s in series.items()}


@pytest.mark.slow
def test_deepspeed_pipeline_engine_two_stages(agent):
    """A DeepSpeed ``PipelineModule`` of two sleeping stages (DS_ACCELERATOR=cpu, gloo), its engine
    watched: ``train_batch`` runs 4 micro-batches through DeepSpeed's 1F1B schedule: each stage's busy
    time is the injected delays, its waits on the side the schedule makes it wait, and its bubble at
    least (p-1)/(m+p-1) less 5 points and at most 10 points above it: ``train_batch``, the step, also
    loads the micro-batches, steps the optimizer and broadcasts the loss, none of it stage compute."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[test]' installs it)")
    p, m, steps = 2, 4, 3
    a = agent()
    args = [WORKER, "--deepspeed", "--steps", str(steps), "--micro", str(m), "--fwd", str(FWD), "--bwd", str(BWD)]
    r = launch(torchrun(p) + args, worker_env(a.ingest, "pp-ds", {"DS_ACCELERATOR": "cpu"}), timeout=180)
    assert r["rc"] == 0, r["err"][-4000:]
    results = {x["rank"]: x for x in r["results"]}
    series = rank_series(a.metrics_text(), "pp-ds")
    assert sorted(results) == sorted(series) == [0, 1], (r["out"][-2000:], series)
    ideal = (p - 1) / (m + p - 1)
    for rank, s in series.items():
        res = results[rank]
        assert res["restored"] and res["after"] == res["before"], res
        assert s.get(C.HOOK_ERRORS.name) == 0 and s.get(C.STEPS.name) == steps, (rank, s)
        assert s.get(C.PIPELINE_STAGE.name) == s.get("stage") == res["stage"] == rank, (rank, s)
        assert s.get(C.PIPELINE_STAGES.name) == p and s.get(C.PIPELINE_MICROBATCHES.name) == m, (rank, s)
        injected = steps * m * (FWD + BWD)
        assert injected <= s[C.PIPELINE_BUSY.name] <= 1.15 * injected, (rank, s)
        assert ideal - 0.05 <= bubble(s) <= ideal + 0.10, (rank, bubble(s), ideal, s)
        prev, nxt = s[C.PIPELINE_WAIT_PREV.name], s[C.PIPELINE_WAIT_NEXT.name]
        assert (prev > 0.5 * FWD * steps) == (rank > 0) and (nxt > 0.5 * BWD * steps) == (rank < p - 1), (rank, s)
