"""A pipeline-parallel training job on CPU (gloo) with ``torch.distributed.pipelining``,
instrumented with ranksight. One stage per rank; the integration is two lines, marked below::

    import ranksight
    loader = ranksight.watch(schedule, optimizer, loader)

Run it with torchrun (start ``ranksight exporter`` first to get metrics; without an agent the
hooks still print their step table)::

    torchrun --standalone --nproc-per-node 2 examples/train_pipeline.py --steps 20

The model is a stack of MLP blocks split evenly over the ranks; ``--schedule`` picks GPipe, 1F1B
or the interleaved 1F1B (``--per-rank`` stages on each rank) and ``--micro`` the micro-batches per
step. The agent then exposes, per stage (the ``stage`` label), ``ranksight_pipeline_busy_seconds_
total`` (its forward and backward compute), ``ranksight_pipeline_step_seconds_total`` (its time in
``schedule.step()``), and its P2P waits on the previous and next stage; the ranks dashboard draws
each stage's bubble share, 1 - busy / step, against the schedule's ideal (p-1)/(m+p-1).
``--slow-stage S`` makes stage S's blocks twice as wide: RanksightPipelineStraggler names it.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

import ranksight  # ranksight line 1 of 2

WIDTH, BLOCKS_PER_STAGE = 256, 2


def block(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, width), torch.nn.GELU(), torch.nn.Linear(width, WIDTH))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro", type=int, default=8, help="micro-batches per step")
    ap.add_argument("--batch", type=int, default=64, help="samples per step (split into the micro-batches)")
    ap.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"), default="1f1b")
    ap.add_argument("--per-rank", type=int, default=2, help="stages per rank with --schedule interleaved")
    ap.add_argument("--slow-stage", type=int, default=-1, help="this stage's blocks are twice as wide")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    v = a.per_rank if a.schedule == "interleaved" else 1
    n_stages = world * v
    stages = []
    for j in range(v):
        index = rank + j * world
        torch.manual_seed(index)
        width = WIDTH * (2 if index == a.slow_stage else 1)
        module = torch.nn.Sequential(*(block(width) for _ in range(BLOCKS_PER_STAGE)))
        stages.append(PipelineStage(module, index, n_stages, torch.device("cpu")))

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, y)

    if a.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=a.micro, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], n_microbatches=a.micro, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW([p for s in stages for p in s.submod.parameters()], lr=1e-3)
    g = torch.Generator().manual_seed(0)
    target = torch.nn.Linear(WIDTH, WIDTH)
    batches = []
    for _ in range(a.steps):
        x = torch.randn(a.batch, WIDTH, generator=g)
        batches.append((x, target(x).detach()))
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)

    loader = ranksight.watch(schedule, optimizer, batches)  # ranksight line 2 of 2
    for x, y in loader:
        optimizer.zero_grad()
        losses: list = []
        kw = {"target": y, "losses": losses} if last else {}
        schedule.step(x, **kw) if first else schedule.step(**kw)
        optimizer.step()
        if last and losses:
            ranksight.loss(torch.stack(losses).mean())
    if last:
        print(f"rank {rank}: {a.steps} steps of {a.schedule}, last loss {torch.stack(losses).mean().item():.4f}")
    ranksight.unwatch()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
