"""One task of a 2-rank gloo DDP job launched by `srun -N1 -n2` (tests/integration/test_slurm.py).

The rendezvous is the job's own: RANK and WORLD_SIZE from Slurm's SLURM_PROCID and SLURM_NTASKS,
MASTER_ADDR and MASTER_PORT from the submitting environment. ranksight's two lines are marked; its
identity (job = slurm_worker-<SLURM_JOB_ID>, local rank = SLURM_LOCALID) is found on its own. After --steps
optimizer steps the task prints "READY <job id> <rank>" and idles (its heartbeats go on) until
the job is cancelled.
"""
from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import ranksight  # ranksight line 1 of 2


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["SLURM_PROCID"]),
                            world_size=int(os.environ["SLURM_NTASKS"]))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(16, 32), torch.randn(16, 4)) for _ in range(args.steps)]
    loader = ranksight.watch(model, opt, data)  # ranksight line 2 of 2
    for x, y in loader:
        ((model(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    print(f"READY {os.environ['SLURM_JOB_ID']} {dist.get_rank()}", flush=True)
    while True:  # until scancel
        time.sleep(1)


if __name__ == "__main__":
    raise SystemExit(main())
