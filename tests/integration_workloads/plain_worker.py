"""A hand-written DDP loop with the zero-argument ``ranksight.watch()`` under torchrun (gloo).
``--fail-rank R``: rank R exits 1 at the end of its first attempt (torchrun elastic restarts the
job with TORCHELASTIC_RESTART_COUNT=1). Prints RESULT per rank with its identity."""
from __future__ import annotations

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, result  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ranksight  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--fail-rank", type=int, default=-1)
    a = ap.parse_args()
    ranksight.watch()  # before the process group: identity from the launcher's environment
    ident = ranksight.hooks.current().identity
    # a store prefix per attempt: the restarted ranks must not read the gloo addresses the first
    # attempt left in torchrun's store (they raced on this machine: "connectFullMesh failed")
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt-{restart}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Embedding(64, 8),
                                                                          torch.nn.Linear(8, 64)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.DataLoader(SleepyTokens(a.steps * 2 * dist.get_world_size(), sleep=0.0, dict_items=False),
                                       batch_size=2, sampler=torch.utils.data.DistributedSampler(
                                           SleepyTokens(a.steps * 2 * dist.get_world_size(), sleep=0.0)))
    for ids in data:
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
    found = type(ranksight.hooks.current().model).__name__
    ranksight.unwatch()
    result(rank=ident.rank, local_rank=ident.local_rank, world=ident.world_size, job=ident.job, restart=ident.restart,
           model=found)
    dist.destroy_process_group()
    if dist.is_available() and a.fail_rank == ident.rank and restart == 0:
        sys.exit(1)


if __name__ == "__main__":
    main()
