"""A hand-written Accelerate loop with the zero-argument ``ranksight.watch()`` (through
``ranksight.integrations.accelerate.watch``), ``accelerator.accumulate``, a prepared DataLoader
whose dataset sleeps per item, ``accelerator.save_state`` every ``--save-every`` steps. Run
under ``accelerate launch`` (2 CPU processes, gloo). Prints RESULT per rank."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, hooks_state, result  # noqa: E402

import torch  # noqa: E402
from accelerate import Accelerator  # noqa: E402

import ranksight  # noqa: E402
from ranksight.integrations import accelerate as rs_accelerate  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--save-every", type=int, default=3)
    a = ap.parse_args()
    before = hooks_state()
    acc = Accelerator(gradient_accumulation_steps=a.accum, cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = a.steps * a.accum * a.batch * acc.num_processes
    loader = torch.utils.data.DataLoader(SleepyTokens(n, sleep=a.sleep, dict_items=False), batch_size=a.batch)
    model, opt, loader = acc.prepare(model, opt, loader)
    w = rs_accelerate.watch()
    real_steps = 0
    for i, ids in enumerate(loader):
        with acc.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            acc.backward(loss)
            opt.step()  # a no-op on the micro-batches that only accumulate
            opt.zero_grad()
        if acc.sync_gradients:
            real_steps += 1
            if real_steps % a.save_every == 0:
                acc.save_state(os.path.join(a.out, f"step-{real_steps}"))
    found = type(w.model).__name__ if w is not None else None
    ranksight.unwatch()
    result(rank=acc.process_index, steps=real_steps, accum=a.accum, model=found, before=before, after=hooks_state())


if __name__ == "__main__":
    main()
