"""A Hugging Face Trainer job with ``RanksightCallback``: tiny GPT-2 from a config, gradient
accumulation, a dataset that sleeps per item, checkpoints every ``--save-steps``. Run under
torchrun (gloo); prints RESULT with what the Trainer ran and what the watch left behind.

``--deepspeed STAGE``: the Trainer's ``deepspeed=`` (a ZeRO config of that stage, its batch sizes
"auto") on CPU: ``use_cpu=False`` (the Trainer drops DeepSpeed on ``use_cpu``), the process group
started as gloo first in a DeepSpeed state the Trainer takes (``PartialState(backend="gloo")`` with
``ACCELERATE_USE_DEEPSPEED=true``, ``accelerator_config={"use_configured_state": True}``) and
DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``)."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, hooks_state, result, tiny_gpt2  # noqa: E402

from transformers import Trainer, TrainingArguments  # noqa: E402

from ranksight.integrations.transformers import RanksightCallback  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--save-steps", type=int, default=3)
    ap.add_argument("--train-calls", type=int, default=1)
    ap.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps (a sleepy eval set)")
    ap.add_argument("--deepspeed", type=int, default=None, metavar="STAGE", help="deepspeed= a ZeRO STAGE config")
    a = ap.parse_args()
    ds = None
    if a.deepspeed is not None:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed.ops

        # DeepSpeed's CPU backend builds its shared-memory all-reduce (inference only) with a compiler
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        # the process group as gloo first, in a state made for DeepSpeed that the Trainer then uses
        # (use_configured_state): the Trainer's own, given no backend on a machine without an
        # accelerator Accelerate knows, makes every rank process 0 of 1 (each saves as the main one)
        from accelerate import PartialState

        os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
        PartialState(backend="gloo")
        ds = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
              "zero_optimization": {"stage": a.deepspeed}, "steps_per_print": 10 ** 9}
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = a.steps * a.accum * a.batch * world  # exactly the items the steps read: no extra prefetch wait
    args = TrainingArguments(output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=a.batch,
                             gradient_accumulation_steps=a.accum, save_strategy="steps", save_steps=a.save_steps,
                             logging_strategy="no", report_to="none", use_cpu=ds is None,
                             ddp_backend="gloo" if world > 1 else None, deepspeed=ds,
                             accelerator_config={"use_configured_state": True} if ds else None,
                             ddp_find_unused_parameters=False,
                             dataloader_num_workers=0, dataloader_pin_memory=False, disable_tqdm=True,
                             learning_rate=1e-3, seed=0, eval_strategy="steps" if a.eval_steps else "no",
                             eval_steps=a.eval_steps or None, per_device_eval_batch_size=a.batch)
    before = hooks_state()
    cb = RanksightCallback()
    evals = SleepyTokens(2 * a.batch * world, sleep=a.sleep) if a.eval_steps else None
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=SleepyTokens(n, sleep=a.sleep), eval_dataset=evals,
                      callbacks=[cb])
    steps = []
    for i in range(a.train_calls):
        if i:
            trainer.args.max_steps = trainer.state.global_step + a.steps  # another train() call, same callback
        trainer.train()
        steps.append(trainer.state.global_step)
    after = hooks_state()
    evaluated = [h for h in trainer.state.log_history if "eval_loss" in h]
    engine = trainer.model_wrapped if ds is not None else None
    result(evaluations=len(evaluated), global_steps=steps, accum=a.accum, before=before, after=after,
           watcher_left=cb.watcher is not None, engine=type(engine).__name__ if engine is not None else None,
           engine_steps=getattr(engine, "global_steps", None), rank=int(os.environ.get("RANK", "0")))


if __name__ == "__main__":
    main()
