"""One rank of a small gloo training job with setup mistakes switched on by flags (run by
tests/integration/test_lints.py through harness.run_job). Prints "RESULT {...}" with the lints' states.

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANKSIGHT_AGENT, RANKSIGHT__lints__*.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import namedtuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

import ranksight
from ranksight.hooks import atomic_save, checkpoint_timer

_HELD = []  # memory a DataLoader worker keeps alive (the "leak")


def _alloc_worker(mb: int):
    def init(worker_id: int) -> None:
        _HELD.append(bytearray(b"\x01") * (mb << 20))  # written, so private (USS) pages

    return init


class Stream(IterableDataset):
    """An iterable dataset; ``sharded`` splits the stream by rank, else every rank reads it all."""

    def __init__(self, n: int, sharded: bool):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randn(n, 4, generator=g)
        self.sharded = sharded

    def __iter__(self):
        r, w = (dist.get_rank(), dist.get_world_size()) if self.sharded else (0, 1)
        for i in range(r, len(self.x), w):
            yield self.x[i], self.y[i]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--data", choices=["map", "stream-same", "stream-sharded"], default="map")
    p.add_argument("--sampler", choices=["dist", "random"], default="dist")
    p.add_argument("--seed-by-rank", action="store_true", help="DistributedSampler(seed=rank)")
    p.add_argument("--replicas", type=int, default=0, help="DistributedSampler(num_replicas=this)")
    p.add_argument("--n", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--no-set-epoch", action="store_true")
    p.add_argument("--wrap", choices=["ddp", "manual"], default="ddp")
    p.add_argument("--init-seed-by-rank", action="store_true")
    p.add_argument("--perturb-rank", type=int, default=-1, help="this rank changes a weight after the DDP wrap")
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--scheduler", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--worker-alloc-mb", type=int, default=0)
    p.add_argument("--wait-memory", action="store_true", help="train until the workers' memory was checked")
    p.add_argument("--ckpt", choices=["none", "full", "model-only", "split", "timer-model-only"], default="none")
    p.add_argument("--ckpt-dir", default="")
    p.add_argument("--numa-sysfs", default="")
    p.add_argument("--numa-bus", default="")
    p.add_argument("--fake-free", type=int, default=-1, help="the checkpoint dir's filesystem reports this many free bytes")
    args = p.parse_args()

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=ws)
    torch.manual_seed(rank if args.init_seed_by_rank else 0)
    model: nn.Module = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    if args.wrap == "ddp":
        model = nn.parallel.DistributedDataParallel(model)
        if rank == args.perturb_rank:
            with torch.no_grad():
                model.module[2].weight.add_(0.01)  # e.g. a checkpoint loaded on this rank only, after the wrap
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100) if args.scheduler else None

    if args.data == "map":
        g = torch.Generator().manual_seed(1)
        ds = TensorDataset(torch.randn(args.n, 16, generator=g), torch.randn(args.n, 4, generator=g))
        if args.sampler == "dist":
            rep = dict(num_replicas=args.replicas, rank=min(rank, args.replicas - 1)) if args.replicas else {}
            sampler = DistributedSampler(ds, shuffle=True, seed=rank if args.seed_by_rank else 0,
                                         drop_last=args.drop_last, **rep)
        else:
            sampler = torch.utils.data.RandomSampler(ds)
        kw = dict(num_workers=args.workers, persistent_workers=args.workers > 0)
        if args.worker_alloc_mb:
            kw["worker_init_fn"] = _alloc_worker(args.worker_alloc_mb)
        loader = DataLoader(ds, batch_size=args.batch, sampler=sampler, drop_last=args.drop_last, **kw)
    else:
        sampler = None
        loader = DataLoader(Stream(args.n, args.data == "stream-sharded"), batch_size=args.batch)

    loader = ranksight.watch(model, opt, loader)
    w = ranksight.hooks.current()
    lints = w.lints
    if args.fake_free >= 0 and args.ckpt_dir:
        real = lints.disk_usage
        ckd = os.path.realpath(args.ckpt_dir)
        Usage = namedtuple("Usage", "total used free")

        def fake(path):
            u = real(path)
            return Usage(u.total, u.used, args.fake_free) if os.path.realpath(path) == ckd else u

        lints.disk_usage = fake
    if args.numa_sysfs:
        lints.check_numa(sysfs=args.numa_sysfs, bus_id=args.numa_bus)

    step = 0
    epoch = 0
    t_end = time.monotonic() + 60.0
    mem_base = None
    while True:
        if sampler is not None and isinstance(sampler, DistributedSampler) and not args.no_set_epoch:
            sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            loss = ((model(x) - y) ** 2).mean() / args.accum
            loss.backward()
            if (i + 1) % args.accum == 0:
                if args.wrap == "manual":
                    for prm in model.parameters():
                        dist.all_reduce(prm.grad)
                        prm.grad /= ws
                opt.step()
                opt.zero_grad()
                if sched is not None:
                    sched.step()
                step += 1
                if step == 2 and args.ckpt != "none" and rank == 0:
                    save(args, model, opt, sched, sampler, epoch, step)
        epoch += 1
        if epoch < args.epochs:
            continue
        if not args.wait_memory or not lints.on("dataloader_workers_rss"):
            break
        # Batches flowed on every rank, so every worker ran its init (the allocation). Wait for a
        # check on every rank after that (each rank published its workers' memory), then for one
        # more (each sees the node's full sum). all_reduce: every rank runs the same epochs.
        n = lints.evaluations.get("dataloader_workers_rss", 0)
        if mem_base is None:
            mem_base = [n, None]
        got = torch.tensor([n - (mem_base[1] if mem_base[1] is not None else mem_base[0])])
        dist.all_reduce(got, op=dist.ReduceOp.MIN)
        if got.item() >= 1:
            if mem_base[1] is not None:
                break
            mem_base[1] = n
        if time.monotonic() > t_end:
            break
        time.sleep(0.2)

    # the cross-rank comparisons and the last checkpoint round finish on the lints thread
    deadline = time.monotonic() + 15.0
    while not lints.idle() and time.monotonic() < deadline:
        time.sleep(0.05)
    dist.barrier()  # rank 0 hosts the store: keep it up until every rank is done with it
    states = {k: lints.state(k) for k in lints.evaluations}
    stats = w.stats()
    ranksight.unwatch()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "states": states, "herr": stats["herr"], "steps": step,
                                  "idle": lints.idle()}), flush=True)
    return 0


def save(args, model, opt, sched, sampler, epoch, step) -> None:
    d = args.ckpt_dir
    inner = model.module if hasattr(model, "module") else model
    if args.ckpt == "model-only":
        torch.save(inner.state_dict(), os.path.join(d, "model.pt"))
    elif args.ckpt == "timer-model-only":
        sd = {"model": inner.state_dict(), "step": step}
        with checkpoint_timer(os.path.join(d, "ckpt.pt"), obj=sd):
            torch.save(sd, os.path.join(d, "ckpt.pt"))
    elif args.ckpt == "full":
        state = {"model": inner.state_dict(), "optimizer": opt.state_dict(),
                 "rng": {"cpu": torch.get_rng_state(), "python": random.getstate()},
                 "sampler_epoch": epoch, "global_step": step}
        if sched is not None:
            state["lr_scheduler"] = sched.state_dict()
        atomic_save(state, os.path.join(d, "ckpt.pt"))
        torch.save(inner.state_dict(), os.path.join(d, "export_weights.pt"))  # an export in the same round
    elif args.ckpt == "split":  # one file per part, like some trainers: complete as a round
        torch.save(inner.state_dict(), os.path.join(d, "model.pt"))
        torch.save(opt.state_dict(), os.path.join(d, "optimizer.pt"))
        if sched is not None:
            torch.save(sched.state_dict(), os.path.join(d, "scheduler.pt"))
        torch.save({"cpu": torch.get_rng_state(), "epoch": epoch, "step": step}, os.path.join(d, "trainer_state.pt"))


if __name__ == "__main__":
    sys.exit(main())
