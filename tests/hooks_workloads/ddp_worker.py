"""One rank of a small gloo training job instrumented with ranksight.watch (run by tests/*/test_hooks*.py).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (world size 1 without them),
RANKSIGHT_AGENT. Prints one JSON line "RESULT {...}" on success.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import ranksight


class SleepyMLP(nn.Module):
    def __init__(self, width: int, sleep: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 4))
        self.sleep = sleep

    def forward(self, x):
        if self.sleep:
            time.sleep(self.sleep)  # extra "compute" on the slow rank
        return self.net(x)


class SleepyLoader:
    """A map-style dataset behind a loader that sleeps per batch (an input-bound rank)."""

    def __init__(self, n: int, batch: int, sleep: float, every: int = 1):
        self.n, self.batch, self.sleep, self.every = n, batch, sleep, every
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, batch, 32, generator=g)
        self.y = torch.randn(n, batch, 4, generator=g)

    def __len__(self):
        return self.n

    def __iter__(self):
        for i in range(self.n):
            if self.sleep and i % self.every == self.every - 1:
                time.sleep(self.sleep)
            yield self.x[i], self.y[i]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--slow-data-rank", type=int, default=-1)
    p.add_argument("--data-sleep", type=float, default=0.0)
    p.add_argument("--data-sleep-every", type=int, default=1, help="the slow loader sleeps on every N-th batch only")
    p.add_argument("--slow-compute-rank", type=int, default=-1)
    p.add_argument("--compute-sleep", type=float, default=0.0)
    p.add_argument("--manual", action="store_true", help="a sync and an async all_reduce per step")
    p.add_argument("--wrap", default="ddp", choices=["ddp", "none", "fsdp2"])
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--hang-rank", type=int, default=-1, help="at --hang-step this rank sleeps before an all_reduce")
    p.add_argument("--hang-step", type=int, default=3)
    p.add_argument("--hang-secs", type=float, default=0.0)
    p.add_argument("--fwd-hang-step", type=int, default=-1,
                   help="at this step --hang-rank also sleeps inside forward: the others wait in DDP's all-reduce")
    p.add_argument("--user-comm-hook", action="store_true", help="register the default all-reduce hook first")
    p.add_argument("--verify", action="store_true",
                   help="every rank sees the same batches, so DDP must match a local model trained alone")
    p.add_argument("--loss", action="store_true", help="ranksight.loss(loss) every micro-batch")
    p.add_argument("--nan-rank", type=int, default=-1,
                   help="this rank's input holds a NaN at --nan-step: its loss is NaN there, and DDP's all-reduce "
                        "carries the NaN gradients to every rank's weights")
    p.add_argument("--nan-step", type=int, default=0, help="the optimizer step (1-based) of --nan-rank's NaN")
    args = p.parse_args()

    torch.set_num_threads(1)
    ws = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if ws > 1 or args.wrap != "none":
        dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(0)
    model: nn.Module = SleepyMLP(args.width, args.compute_sleep if rank == args.slow_compute_rank else 0.0)
    if args.wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
        if args.user_comm_hook:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            model.register_comm_hook(None, allreduce_hook)
    elif args.wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in model.net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    n_batches = args.steps * args.accum
    data = SleepyLoader(n_batches, args.batch, args.data_sleep if rank == args.slow_data_rank else 0.0,
                        args.data_sleep_every)
    loader = ranksight.watch(model, opt, data)
    w = ranksight.hooks.current()
    extra = torch.ones(4)
    nan_at = 0.0
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % args.accum == 0
        inner = model.module if hasattr(model, "module") else model
        if isinstance(inner, SleepyMLP) and rank == args.hang_rank and args.fwd_hang_step >= 0:
            inner.sleep = args.hang_secs if i // args.accum == args.fwd_hang_step else 0.0
        ctx = model.no_sync() if (args.wrap == "ddp" and not last) else _null()
        if rank == args.nan_rank and i // args.accum + 1 == args.nan_step:
            x = x.clone()
            x[0, 0] = float("nan")
            nan_at = time.time()
        with ctx:
            loss = ((model(x) - y) ** 2).mean() / args.accum
            loss.backward()
        if args.loss:
            ranksight.loss(loss * args.accum)
        if last:
            if args.hang_secs and i // args.accum == args.hang_step:
                if rank == args.hang_rank:
                    time.sleep(args.hang_secs)  # "stuck" outside any collective
                dist.all_reduce(extra)  # the other ranks wait here for it
            if args.manual:
                dist.all_reduce(extra)  # sync: comm and exposed comm
                work = dist.all_reduce(extra, async_op=True)
                work.wait()
            opt.step()
            opt.zero_grad()
        if args.ckpt_dir and i == n_batches // 2 and rank == 0:
            torch.save(model.state_dict(), os.path.join(args.ckpt_dir, "mid.pt"))
    stats = w.stats() if w is not None else {}
    ranksight.unwatch()
    if args.verify:
        torch.manual_seed(0)
        ref = SleepyMLP(args.width, 0.0)
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.01)
        for i, (x, y) in enumerate(SleepyLoader(n_batches, args.batch, 0.0)):
            (((ref(x) - y) ** 2).mean() / args.accum).backward()
            if (i + 1) % args.accum == 0:
                ref_opt.step()
                ref_opt.zero_grad()
        got = model.module if hasattr(model, "module") else model
        stats["matches_local_training"] = all(
            torch.allclose(a.detach(), b.detach(), rtol=1e-4, atol=1e-6) for a, b in zip(got.parameters(), ref.parameters()))
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "stats": stats, "nan_at": nan_at}), flush=True)
    return 0


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    sys.exit(main())
