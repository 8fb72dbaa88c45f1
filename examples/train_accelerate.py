"""A hand-written Accelerate loop instrumented with ranksight: one call, nothing given.

    from ranksight.integrations import accelerate as rs_accelerate
    rs_accelerate.watch()     # = ranksight.watch() + Accelerator.save_state timed as a checkpoint

A small token model on random tokens, under ``accelerate launch`` (2 CPU processes, gloo)::

    ranksight exporter &      # the node agent (optional: without it rank 0 prints its step table)
    accelerate launch --multi_gpu --num_processes 2 examples/train_accelerate.py --steps 50

``accelerator.accumulate`` over ``--accum`` micro-batches: a step is one real optimizer step (the
prepared optimizer skips the others), each counting that many micro-batches. ``--data-sleep``
makes every item cost that long to load. ``save_state`` every ``--save-every`` steps.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch
from accelerate import Accelerator
from tokens import Tokens  # examples/tokens.py: random token ids

import ranksight
from ranksight.integrations import accelerate as rs_accelerate  # ranksight line 1 of 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--data-sleep", type=float, default=0.0, help="seconds each item takes to load")
    ap.add_argument("--save-every", type=int, default=20)
    a = ap.parse_args()
    acc = Accelerator(gradient_accumulation_steps=a.accum, cpu=not torch.cuda.is_available())
    model = torch.nn.Sequential(torch.nn.Embedding(512, 128), torch.nn.Linear(128, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 512))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Tokens(a.steps * a.accum * a.batch * acc.num_processes, a.data_sleep),
                                         batch_size=a.batch, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    rs_accelerate.watch()  # ranksight line 2 of 2
    out, steps = tempfile.mkdtemp(prefix="ranksight-accelerate-"), 0
    for ids in loader:
        with acc.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        if acc.sync_gradients:
            steps += 1
            if steps % a.save_every == 0:
                acc.save_state(os.path.join(out, f"step-{steps}"))
    ranksight.unwatch()


if __name__ == "__main__":
    main()
