"""The training loss across real rank processes: 2-rank gloo DDP (tests/hooks_workloads/ddp_worker.py
--loss) against a real node agent. One rank's input holds a NaN at a known step: the agent names
that rank and step within seconds, and the NaN gradients reach the other rank's weights through
DDP's all-reduce, so its first non-finite loss is one step later. A healthy run records every
step's finite loss on both ranks and no non-finite one."""
from __future__ import annotations

import threading
import time
from typing import Dict, Optional

import pytest

pytest.importorskip("torch")

from ranksight import catalog as C  # noqa: E402

from hooks_workloads.harness import per_rank, run_ranks  # noqa: E402

STEPS, NAN_STEP = 30, 5
ARGS = ["--steps", str(STEPS), "--loss", "--slow-data-rank", "0", "--data-sleep", "0.05"]  # about 50 ms a step



@pytest.mark.slow
def test_a_nan_loss_names_its_rank_and_step_within_seconds(agent):
    a = agent()
    seen: Dict[int, float] = {}
    stop = threading.Event()

    def poll():  # when the agent first shows each rank's non-finite step
        while not stop.is_set():
            try:
                for r, v in per_rank(a.metrics_text(), C.LOSS_FIRST_NONFINITE_STEP).items():
                    if v > 0 and r not in seen:
                        seen[r] = time.time()
            except OSError:
                pass
            time.sleep(0.05)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        res = run_ranks("ddp_worker.py", ARGS + ["--nan-rank", "1", "--nan-step", str(NAN_STEP)], 2, a.ingest,
                        timeout=120)
        for r in res:
            assert r["rc"] == 0 and r["result"], r["err"][-3000:]
        deadline = time.time() + 5
        while len(seen) < 2 and time.time() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        t.join(5)
    text = a.metrics_text()
    assert per_rank(text, C.LOSS_FIRST_NONFINITE_STEP) == {1: NAN_STEP, 0: NAN_STEP + 1}
    # every loss from its first NaN on is non-finite: the weights are NaN on both ranks
    assert per_rank(text, C.LOSS_NONFINITE) == {1: STEPS - NAN_STEP + 1, 0: STEPS - NAN_STEP}
    assert per_rank(text, C.LOSS_READINGS) == {1: NAN_STEP - 1, 0: NAN_STEP}
    nan_at = res[1]["result"]["nan_at"]
    latency = seen[1] - nan_at
    print(f"agent showed rank 1's non-finite step {latency:.2f} s after its NaN input")
    assert 0 < latency < 3.0, latency
    assert res[0]["result"]["stats"]["herr"] == res[1]["result"]["stats"]["herr"] == 0


@pytest.mark.slow
def test_a_healthy_run_records_finite_losses_on_both_ranks(agent):
    a = agent()
    res = run_ranks("ddp_worker.py", ARGS, 2, a.ingest, timeout=120)
    for r in res:
        assert r["rc"] == 0 and r["result"], r["err"][-3000:]
    text: Optional[str] = None
    deadline = time.time() + 5
    while time.time() < deadline:  # the final totals arrive with the bye
        text = a.metrics_text()
        if per_rank(text, C.LOSS_READINGS) == {0: STEPS, 1: STEPS}:
            break
        time.sleep(0.1)
    assert per_rank(text, C.LOSS_READINGS) == {0: STEPS, 1: STEPS}
    sums = per_rank(text, C.LOSS_SUM)
    assert sorted(sums) == [0, 1] and all(0 < s < 100 * STEPS for s in sums.values()), sums
    # the worker's loader has no sampler: both ranks read the same batches, and DDP keeps their weights
    # equal, so their losses are identical (what a missing DistributedSampler looks like)
    assert sums[0] == sums[1]
    assert per_rank(text, C.LOSS_NONFINITE) == {0: 0, 1: 0}
    assert per_rank(text, C.LOSS_FIRST_NONFINITE_STEP) == {0: 0, 1: 0}
