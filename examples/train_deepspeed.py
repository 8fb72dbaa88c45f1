"""A plain DeepSpeed ZeRO loop instrumented with ranksight, on CPU (gloo), in two lines:

    import ranksight
    loader = ranksight.watch(engine, optimizer, loader)   # the engine deepspeed.initialize returned

Run it with 2 ranks (start `ranksight exporter` first to get metrics; without an agent rank 0
prints its step table)::

    DS_BUILD_OPS=0 pip install deepspeed==0.19.8          # pure Python: no op compiled
    DS_ACCELERATOR=cpu torchrun --standalone --nproc-per-node 2 examples/train_deepspeed.py --stage 2

A step is one model step (every ``--accum`` micro-batches), whatever the ZeRO stage (``--stage``
1, 2 or 3); ``engine.save_checkpoint`` at the end is one checkpoint write. DeepSpeed's AdamW from
the config with ``torch_adam`` runs ``torch.optim.AdamW`` (without it DeepSpeed compiles its CPU
Adam kernel, a C++ compiler needed); the ``deepspeed_shm_comm`` line below keeps ``init_distributed``
from compiling the shared-memory all-reduce it uses for inference only.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402
import torch  # noqa: E402

import ranksight  # noqa: E402  ranksight line 1 of 2


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", type=int, choices=(0, 1, 2, 3), default=2, help="ZeRO stage (default 2)")
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per model step (default 2)")
    ap.add_argument("--samples", type=int, default=640, help="dataset size (default 640)")
    ap.add_argument("--checkpoint-dir", default="run/ds-checkpoints", help="where save_checkpoint writes")
    a = ap.parse_args()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": a.accum,
           "zero_optimization": {"stage": a.stage}, "steps_per_print": 10 ** 9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, config=cfg)
    data = torch.utils.data.TensorDataset(torch.randn(a.samples, 32), torch.randn(a.samples, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, sampler=torch.utils.data.DistributedSampler(data))

    loader = ranksight.watch(engine, optimizer, loader)  # ranksight line 2 of 2

    for x, y in loader:
        loss = torch.nn.functional.mse_loss(engine(x), y)
        ranksight.loss(loss)  # optional: the loss, recorded without a device sync
        engine.backward(loss)
        engine.step()
    engine.save_checkpoint(a.checkpoint_dir)
    if engine.global_rank == 0:
        print(f"train_deepspeed: ZeRO-{a.stage}, {engine.global_steps} model steps of {a.accum} micro-batches, "
              f"loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
