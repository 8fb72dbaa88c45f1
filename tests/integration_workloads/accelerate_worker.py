"""A hand-written Accelerate loop with the zero-argument ``ranksight.watch()`` (through
``ranksight.integrations.accelerate.watch``), ``accelerator.accumulate``, a prepared DataLoader
whose dataset sleeps per item, ``accelerator.save_state`` every ``--save-every`` steps. Run
under ``accelerate launch`` (2 CPU processes, gloo). Prints RESULT per rank.

``--deepspeed STAGE``: Accelerate's DeepSpeed path (a ``DeepSpeedPlugin`` of that ZeRO stage) on CPU,
run under torchrun: Accelerate takes DeepSpeed only with ``cpu=False``, so the process group is
started first as gloo (``PartialState(backend="gloo")``) and DeepSpeed runs on its CPU accelerator
(``DS_ACCELERATOR=cpu``). ``acc.backward`` then calls ``engine.backward`` and, at the accumulation
boundary, ``engine.step``."""
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
    ap.add_argument("--deepspeed", type=int, default=None, metavar="STAGE", help="Accelerate's DeepSpeed path, ZeRO STAGE")
    a = ap.parse_args()
    before = hooks_state()
    if a.deepspeed is None:
        acc = Accelerator(gradient_accumulation_steps=a.accum, cpu=True)
    else:
        acc = deepspeed_accelerator(a.deepspeed, a.accum)
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
    engine = getattr(model, "global_steps", None) is not None
    ranksight.unwatch()
    result(rank=acc.process_index, steps=real_steps, accum=a.accum, model=found, before=before, after=hooks_state(),
           engine_steps=model.global_steps if engine else None, micro_steps=model.micro_steps if engine else None,
           distributed=str(acc.distributed_type))


def deepspeed_accelerator(stage: int, accum: int) -> Accelerator:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed.ops
    from accelerate import PartialState
    from accelerate.utils import DeepSpeedPlugin

    # DeepSpeed's CPU backend builds its shared-memory all-reduce (inference only) with a compiler
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    PartialState(backend="gloo")
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=stage, gradient_accumulation_steps=accum))


if __name__ == "__main__":
    main()
