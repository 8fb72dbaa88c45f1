"""One rank of a 2-rank gloo DDP job that checkpoints, stops, and resumes (run by
tests/integration/test_resume.py).

``--phase first``: a job that has trained for a while: ``--warm`` steps of a noisy linear regression
with AdamW before ``watch()`` (not recorded; the same batches on every rank, so the ranks stay
equal), then ``--steps`` watched steps recording each step's loss (``ranksight.loss``); rank 0 saves
model, optimizer, LR scheduler, step and epoch to ``--ckpt`` and every rank exits.
``--phase resume``: every rank restores the model from the checkpoint (``torch.load`` and the DDP
module's ``load_state_dict``, while watched) and the optimizer and the scheduler too, except
``--broken-rank`` (-1: none; ``all``: every rank), which restores the model only (the broken
resume: its AdamW starts with empty moments, its weights leave its peers'), then trains ``--steps``
more. With lr 0.05 a full restore continues at the loss before it (0.99x of the last 40 steps'
mean in-process) and a model-only one runs 3.6x above it over the next 30. ``--step-sleep`` paces the steps; ``--total`` declares the run's length. Prints one JSON line
"RESULT {...}": the rank, the partial_resume lint's state, the restore the hooks saw and the mean
loss of the steps.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANKSIGHT_AGENT.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ranksight
from ranksight.hooks.active_watch import active

DIM = 32


def batches(rank: int, start: int, n: int, w_true: torch.Tensor):
    """Step ``start + i``'s batch of this rank: the same at every run (seeded by rank and step)."""
    for i in range(start, start + n):
        g = torch.Generator().manual_seed(1000 * rank + i)
        x = torch.randn(64, DIM, generator=g)
        yield x, x @ w_true + 0.1 * torch.randn(64, 1, generator=g)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["first", "resume"], required=True)
    p.add_argument("--broken-rank", default="-1")
    p.add_argument("--warm", type=int, default=200)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--total", type=int, default=None, help="watch(total_steps=): the run's length, for its ETA")
    args = p.parse_args()
    rank, ws = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    w_true = torch.randn(DIM, 1, generator=torch.Generator().manual_seed(7))
    model = DDP(nn.Linear(DIM, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0)
    start = 0
    if args.phase == "first":
        for x, y in batches(0, -args.warm, args.warm, w_true):
            nn.functional.mse_loss(model.module(x), y).backward()
            opt.step()
            opt.zero_grad()
    ranksight.watch(model, opt, None, total_steps=args.total)
    if args.phase == "resume":
        ck = torch.load(args.ckpt)
        model.module.load_state_dict(ck["model"])
        if args.broken_rank not in ("all", str(rank)):
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["sched"])
        start = ck["step"]
    losses = []
    for x, y in batches(rank, start, args.steps, w_true):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        ranksight.loss(loss)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if args.phase == "first" and rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(), "sched": sched.state_dict(),
                    "step": start + args.steps, "epoch": 0, "rng": torch.get_rng_state()}, args.ckpt)
    dist.barrier()
    w = active()
    time.sleep(1.0)  # the lints thread's last tick, the last records out
    lints = getattr(w, "lints", None)
    lint = lints.state("partial_resume") if lints is not None else None
    last = w.resumes.last if w is not None else None
    res = {"rank": rank, "lint": lint, "resume_step": last.step if last else None,
           "mean_loss_first10": sum(losses[:10]) / 10, "mean_loss": sum(losses) / len(losses),
           "mean_loss_last10": sum(losses[-10:]) / 10, "herr": w.herr if w is not None else None}
    ranksight.unwatch()
    dist.destroy_process_group()
    print("RESULT " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
