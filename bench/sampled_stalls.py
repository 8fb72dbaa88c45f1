"""Sampled GPU timing against every-step timing when rare long steps hold much of the time, on CPU.

    python bench/sampled_stalls.py [--stall every32|random] [--runs 4] [--steps 4000]

The hooks watch a CPU model (4 layers 256 wide, AdamW) on the stand-in CUDA timeline of
``bench/hooks_methods.py`` (an event is reached the moment it is recorded: GPU time = host time,
so every-step timing is the truth), while the optimizer phase sleeps ``--stall-ms`` on every 32nd
step (work a loop does every N steps: a synchronizing log line) or on 1 step in 20 at random (a
host stall). Three arms, interleaved run by run:

* ``every``: every step timed (``hooks.gpu_timing_every: 1``);
* ``latest``: one step in 16 at a fixed stride, every step getting the latest timed step's shares
  (``SpanShares`` of one row, the gap fixed at 16): how sampled timing worked before;
* ``sampled``: one step in 16 at drawn gaps, the shares of the timed steps of the last 30 s;
* ``auto``: the gap chosen from the events' measured cost (``hooks.gpu_timing_every: 0``, the
  budget 0.5% of the step time), each event record costing the host ``--record-us`` (12, what a
  mark costs inside a training loop on an H100) on the stand-in.

``--record-us`` applies to the ``auto`` arm only, so that the others' shares stay those of the
code they describe.

It prints each run's forward, backward and optimizer shares of step time (sum of the phase over
the sum of the step durations of the measured records: what the rules' rates read) and, per arm,
the median share less the every-step median.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "gpu"))

PHASES = ("fwd", "bwd", "opt")
ARMS = ("every", "latest", "sampled", "auto")
EVERY = 16
WARM = 8


def one_run(arm: str, stall: str, stall_s: float, steps: int, seed: int, record_s: float) -> Dict[str, float]:
    import torch
    import torch.nn as nn

    import gpu_workload as W
    import ranksight
    from hooks_methods import use_stand_in_timeline
    from ranksight import hooks as rs_hooks
    from ranksight.hooks.timing import SpanShares

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 256)
    every = 1 if arm == "every" else 0 if arm == "auto" else EVERY
    rec = W.Receiver()
    cfg = dict(W.QUIET_HOOKS, hooks=dict(W.QUIET_HOOKS["hooks"], gpu_timing_every=every, gpu_timing_seconds=1e6))
    loader = ranksight.watch(model, opt, [x] * (WARM + steps), agent=rec.url, config=cfg)
    w = rs_hooks.current()
    tl = use_stand_in_timeline(w, seed=seed, record_s=record_s if arm == "auto" else 0.0)
    if arm == "latest":
        tl._draw = lambda lo, hi: EVERY
        w._gshares = SpanShares(w._gshare, rows=1)
    rnd, n = random.Random(seed), [0]

    def stall_hook(o: Any, a: Any, k: Any) -> None:  # after the hooks' own: inside the optimizer phase
        n[0] += 1
        if (stall == "every32" and n[0] % 32 == 0) or (stall == "random" and rnd.random() < 1 / 20):
            time.sleep(stall_s)

    h = opt.register_step_pre_hook(stall_hook)
    try:
        for xb in loader:
            model(xb).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    finally:
        h.remove()
    W.flush_step(opt)
    rec.wait_step(WARM + steps + 1, timeout=10)
    ranksight.unwatch()
    time.sleep(0.2)
    recs = rec.steps()
    rec.close()
    sm = W.sum_fields(recs, WARM + 1, WARM + steps + 1, fields=("dur",) + PHASES)
    out = {k: sm[k] / sm["dur"] for k in PHASES}
    out["every"] = tl.every  # the mean gap at the end (auto: the one it chose)
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stall", choices=("every32", "random"), default="every32")
    p.add_argument("--stall-ms", type=float, default=30.0, help="the stall's length (default 30)")
    p.add_argument("--runs", type=int, default=4, help="runs of each arm, interleaved (default 4)")
    p.add_argument("--steps", type=int, default=4000, help="measured steps a run (default 4000)")
    p.add_argument("--record-us", type=float, default=12.0,
                   help="the auto arm's host cost of one event record on the stand-in (default 12)")
    a = p.parse_args(argv)
    if a.runs < 1 or a.steps < 64 or a.stall_ms < 0 or a.record_us < 0:
        p.error("--runs >= 1, --steps >= 64, --stall-ms >= 0 and --record-us >= 0")
    import torch

    torch.set_num_threads(1)
    runs: Dict[str, List[Dict[str, float]]] = {arm: [] for arm in ARMS}
    for r in range(a.runs):
        for arm in (ARMS if r % 2 == 0 else tuple(reversed(ARMS))):
            runs[arm].append(one_run(arm, a.stall, a.stall_ms / 1e3, a.steps, seed=r, record_s=a.record_us / 1e6))
    print(f"stall {a.stall_ms:g} ms in the optimizer phase, {a.stall}; {a.runs} runs x {a.steps} steps an arm")
    med = {arm: {k: statistics.median(d[k] for d in rs) for k in PHASES} for arm, rs in runs.items()}
    for arm, rs in runs.items():
        print(f"{arm:8s} " + " | ".join(" ".join(f"{k} {d[k]:.3f}" for k in PHASES) + f" (gap {d['every']})"
                                         for d in rs))
    for arm in ARMS[1:]:
        print(f"{arm:8s} median - every: " + " ".join(f"{k} {med[arm][k] - med['every'][k]:+.3f}" for k in PHASES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
