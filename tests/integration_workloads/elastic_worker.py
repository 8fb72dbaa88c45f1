"""A 2-rank gloo DDP job for torchrun elastic (``--max-restarts``) that checkpoints and resumes.

Every ``--ckpt-every`` steps rank 0 writes one checkpoint (model, Adam state, the step count, the
sampler's epoch and its position in the epoch) with ``torch.save`` to a temporary file renamed over
``--dir/ckpt.pt``. A process that finds the checkpoint resumes from it: the same step, optimizer
state, epoch and position (the batches of the epoch already trained are skipped, so the next batch is
the one the uninterrupted run would take). With ``--hang-at N``, rank ``--hang-rank`` of the first
process stops at step N outside any collective and sleeps (a hang: its peer blocks in the next
all-reduce) until something ends it.

Each rank appends JSON lines to ``--dir/rank<R>.jsonl``, flushed at once:

  {"ev": "start", "restart": n, "t": unix}
  {"ev": "resume", "step": s, "epoch": e, "pos": p, "opt": x, "params": y, "t": unix}   from the checkpoint
  {"ev": "ckpt", "step": s, "epoch": e, "pos": p, "opt": x, "params": y, "t": unix}     rank 0, written
  {"ev": "step", "step": s, "epoch": e, "pos": p, "idx": [sample indices], "t": unix}  a completed step
  {"ev": "hang", "step": s, "t": unix}
  {"ev": "end", "t": unix}

``opt`` and ``params`` are sums over the Adam state and the parameters (float64), so a resume that
loaded them exactly logs the checkpoint's values.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import ranksight

SAMPLES, BATCH, SEED = 256, 8, 0  # 16 batches per rank per epoch


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(SAMPLES, 16, generator=g)
    return TensorDataset(x, x[:, :4] * 2.0 + 0.1, torch.arange(SAMPLES))


def sums(model: torch.nn.Module, opt: torch.optim.Optimizer) -> tuple:
    opt_sum = 0.0
    for st in opt.state.values():
        for v in st.values():
            opt_sum += float(v.double().sum()) if torch.is_tensor(v) else float(v)
    return opt_sum, sum(float(p.detach().double().sum()) for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--hang-at", type=int, default=0)
    ap.add_argument("--hang-rank", type=int, default=1)
    ap.add_argument("--step-sleep", type=float, default=0.05, help="seconds each step waits (a kernel)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    # One key prefix per launcher round: torchrun's agent store keeps the previous round's keys, where a
    # restarted rank would read its dead peer's address.
    from datetime import timedelta

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=master,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{restart}", store), rank=rank, world_size=world)
    out = open(Path(a.dir) / f"rank{rank}.jsonl", "a", buffering=1)

    def log(**ev) -> None:
        out.write(json.dumps(dict(ev, t=time.time())) + "\n")
        out.flush()

    log(ev="start", restart=restart)
    torch.manual_seed(SEED)
    model = DDP(torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    ds = dataset()
    sampler = DistributedSampler(ds, shuffle=True, seed=SEED)
    per_epoch = len(sampler) // BATCH
    step, epoch, pos = 0, 0, 0
    ckpt = Path(a.dir) / "ckpt.pt"
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        step, epoch, pos = state["step"], state["epoch"], state["pos"]
        o, p = sums(model, opt)
        log(ev="resume", step=step, epoch=epoch, pos=pos, opt=o, params=p)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler, drop_last=True)
    watched = ranksight.watch(model, opt, loader)
    while step < a.steps:
        sampler.set_epoch(epoch)
        for i, (x, y, idx) in enumerate(watched):
            if i < pos:  # trained before the checkpoint: skipped, so the position continues where it was
                continue
            if restart == 0 and a.hang_at and step == a.hang_at and rank == a.hang_rank:
                log(ev="hang", step=step)
                while True:
                    time.sleep(1)
            time.sleep(a.step_sleep)
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step, pos = step + 1, i + 1
            log(ev="step", step=step, epoch=epoch, pos=pos, idx=idx.tolist())
            if rank == 0 and step % a.ckpt_every == 0:
                e, p = (epoch + 1, 0) if pos == per_epoch else (epoch, pos)
                tmp = ckpt.with_suffix(".tmp")
                torch.save({"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step,
                            "epoch": e, "pos": p}, tmp)
                os.replace(tmp, ckpt)
                o, s = sums(model, opt)
                log(ev="ckpt", step=step, epoch=e, pos=p, opt=o, params=s)
            if step >= a.steps:
                break
        else:
            epoch, pos = epoch + 1, 0
    log(ev="end")
    ranksight.unwatch()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
