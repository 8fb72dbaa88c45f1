"""A Hugging Face Trainer job instrumented with ranksight: the whole integration is the callback.

    from ranksight.integrations.transformers import RanksightCallback
    Trainer(..., callbacks=[RanksightCallback()])

A 2-layer GPT-2 built from a config (nothing is downloaded) on random tokens, on CPU with gloo::

    ranksight exporter &      # the node agent (optional: without it rank 0 prints its step table)
    torchrun --standalone --nproc-per-node 2 examples/train_hf.py --steps 50

Steps are the Trainer's optimizer steps; with ``--accum K`` each one counts K micro-batches.
``--data-sleep`` makes every item cost that long to load (a slow input pipeline shows as
dataloader wait). Checkpoints every ``--save-steps`` are timed as checkpoint writes.
"""
from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402
from tokens import Tokens  # examples/tokens.py: random token ids  # noqa: E402

from ranksight.integrations.transformers import RanksightCallback  # ranksight line 1 of 2  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--accum", type=int, default=2, help="gradient_accumulation_steps")
    ap.add_argument("--batch", type=int, default=8, help="per-device batch size")
    ap.add_argument("--data-sleep", type=float, default=0.0, help="seconds each item takes to load")
    ap.add_argument("--save-steps", type=int, default=20)
    ap.add_argument("--out", default=None, help="output directory (default: a temporary one)")
    a = ap.parse_args()
    cfg = GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    data = Tokens(a.steps * a.accum * a.batch * world, a.data_sleep, vocab=cfg.vocab_size, as_dict=True)
    out = a.out or tempfile.mkdtemp(prefix="ranksight-hf-")
    args = TrainingArguments(output_dir=out, max_steps=a.steps, per_device_train_batch_size=a.batch,
                             gradient_accumulation_steps=a.accum, save_strategy="steps", save_steps=a.save_steps,
                             logging_steps=10, report_to="none", use_cpu=not torch.cuda.is_available(),
                             ddp_backend=("nccl" if torch.cuda.is_available() else "gloo") if world > 1 else None,
                             ddp_find_unused_parameters=False, dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=GPT2LMHeadModel(cfg), args=args, train_dataset=data,
                      callbacks=[RanksightCallback()])  # ranksight line 2 of 2
    trainer.train()


if __name__ == "__main__":
    main()
