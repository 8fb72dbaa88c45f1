"""A plain DeepSpeed loop watched with ``ranksight.watch(engine, optimizer, loader)``: ZeRO stage
``--stage`` on CPU (``DS_ACCELERATOR=cpu``, gloo), gradient accumulation ``--accum``, a client
``torch.optim.AdamW`` or (``--ds-optimizer``) DeepSpeed's own optimizer from the config, a
DataLoader whose dataset sleeps per item, ``engine.save_checkpoint`` every ``--save-every``
optimizer steps with the wall time around it measured here. ``--entry`` picks the entry point
that watches the engine (``ranksight.watch(engine, ...)``, ``watcher.start(engine, ...)``, or
``ranksight.watch()`` alone). Each optimizer choice in
``--optimizers`` trains its own engine under its own job name, one after the other in the same
processes. Run one process per rank under torchrun. Prints RESULT per rank and engine."""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, hooks_state, result  # noqa: E402

import torch  # noqa: E402

import ranksight  # noqa: E402


def train(a: argparse.Namespace, ds_optimizer: bool, job: str) -> None:
    """One engine, watched as job ``job``, trained ``--steps`` optimizer steps; prints RESULT."""
    import deepspeed

    before = hooks_state()
    os.environ["RANKSIGHT_JOB"] = job  # the watch's job name (read when it starts)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, a.width), torch.nn.Linear(a.width, a.width), torch.nn.GELU(),
                                torch.nn.Linear(a.width, a.width), torch.nn.GELU(), torch.nn.Linear(a.width, 64))
    cfg = {"train_micro_batch_size_per_gpu": a.batch, "gradient_accumulation_steps": a.accum,
           "zero_optimization": {"stage": a.stage}, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    client = None
    if ds_optimizer:  # torch_adam: DeepSpeed's AdamW runs torch.optim.AdamW (its fused kernel needs a compiler)
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}
    else:
        client = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client, config=cfg)
    data = SleepyTokens(a.steps * a.accum * a.batch * engine.world_size, sleep=a.sleep, dict_items=False)
    sampler = torch.utils.data.DistributedSampler(data, shuffle=False)
    loader = torch.utils.data.DataLoader(data, batch_size=a.batch, sampler=sampler)
    cdb = deepspeed.comm.comm.cdb
    patched = ("step", "_take_model_step", "backward", "save_checkpoint")
    own = ([n for n in patched if n in engine.__dict__], cdb.all_gather_function, cdb.reduce_scatter_function)
    if a.entry == "watch":
        loader = ranksight.watch(engine, optimizer, loader)
    elif a.entry == "start":  # the integrations' entry point, given the engine
        from ranksight.hooks import watcher

        loader = watcher.WatchedLoader(loader, watcher.start(engine, optimizer, loader))
    else:  # "discover": watch() alone finds the engine at its first forward
        ranksight.watch()
    saves = []
    for ids in loader:
        loss = torch.nn.functional.cross_entropy(engine(ids).flatten(0, 1), ids.flatten())
        engine.backward(loss)
        engine.step()
        if engine.micro_steps % a.accum == 0 and engine.global_steps % a.save_every == 0:  # after a model step
            t0 = time.perf_counter()
            engine.save_checkpoint(os.path.join(a.out, job))
            saves.append(time.perf_counter() - t0)
    ranksight.unwatch()
    restored = own == ([n for n in patched if n in engine.__dict__], cdb.all_gather_function, cdb.reduce_scatter_function)
    result(rank=engine.global_rank, job=job, stage=a.stage, steps=engine.global_steps, micro=engine.micro_steps,
           saves=saves, optimizer=type(engine.optimizer).__name__,
           inner=type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
           before=before, after=hooks_state(), restored=restored)
    engine.destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--job", required=True, help="job name prefix: <job>-client, <job>-config")
    ap.add_argument("--stage", type=int, default=1)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.01)
    ap.add_argument("--save-every", type=int, default=4)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--entry", default="watch", choices=("watch", "start", "discover"),
                    help="watch: ranksight.watch(engine, optimizer, loader); start: watcher.start with the same; "
                         "discover: ranksight.watch() with nothing given")
    ap.add_argument("--optimizers", default="client,config",
                    help="client: a torch.optim.AdamW given to deepspeed.initialize; config: the config's AdamW")
    a = ap.parse_args()
    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU backend builds its shared-memory all-reduce (used for inference only) with a
    # C++ compiler when it starts, a minute on a 2-core machine; training on gloo does not need it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    for which in a.optimizers.split(","):
        train(a, which == "config", f"{a.job}-{which}")


if __name__ == "__main__":
    main()
