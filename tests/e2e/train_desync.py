"""A 2-rank gloo DDP job that desynchronizes: after --fault-after seconds both ranks agree (by
an all-reduce of rank 0's clock) on a step at which rank 0 calls all_reduce and rank 1 calls
broadcast. Both collectives carry the same sequence number in the default group, so each rank
blocks waiting for a peer that never joins its collective: the hang the Flight Recorder's
analyzer calls a desync. Takes the arguments the e2e harness passes to examples/train_ddp.py."""
from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import ranksight


def main() -> int:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--duration", type=float, default=150.0)
    p.add_argument("--fault-after", type=float, default=3.0)
    p.add_argument("--fault", default="desync")  # what the harness passes; this job only desynchronizes
    args, _ = p.parse_known_args()  # --checkpoint-dir, --log-every: not used here
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ranksight.watch(model, opt)
    start, step, fault_step = time.monotonic(), 0, -1
    while time.monotonic() - start < args.duration:
        x, y = torch.randn(512, 64), torch.randint(0, 8, (512,))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % 10 == 0 and fault_step < 0:  # agree on the step: rank 0's clock decides for both
            flag = torch.tensor([float(time.monotonic() - start > args.fault_after)])
            dist.broadcast(flag, src=0)
            if flag.item() > 0:
                fault_step = step + 5
        if step == fault_step:
            t = torch.ones(16)
            print(f"train_desync: rank {rank} desynchronizes at step {step}", flush=True)
            if rank == 0:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
