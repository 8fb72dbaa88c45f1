"""A Lightning job with ``RanksightCallback``, started as Lightning users start it (``python
lightning_worker.py``: Lightning's own launcher starts the other rank with strategy="ddp" on CPU,
gloo; ``--accelerator gpu --strategy ddp|fsdp`` on one GPU). ``accumulate_grad_batches``, a
dataset that sleeps per item, ``ModelCheckpoint`` every ``--save-every`` steps; ``--two-optimizers``: manual optimization stepping two optimizers per
batch (one step per batch). Prints RESULT per rank."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, hooks_state, result  # noqa: E402

import torch  # noqa: E402
import lightning as L  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

from ranksight.integrations.lightning import RanksightCallback  # noqa: E402


class Tiny(L.LightningModule):
    def __init__(self, two_optimizers: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(64, 16)
        self.head = torch.nn.Linear(16, 64)
        self.two = two_optimizers
        self.automatic_optimization = not two_optimizers

    def loss(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.head(self.emb(ids)).flatten(0, 1), ids.flatten())

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if not self.two:
            return self.loss(batch)
        for opt in self.optimizers():  # e.g. a GAN: each optimizer steps once per batch
            opt.zero_grad()
            loss = self.loss(batch)
            self.manual_backward(loss)
            opt.step()
        return loss

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.validated = getattr(self, "validated", 0) + 1
        return self.loss(batch)

    def configure_optimizers(self):
        if self.two:
            return [torch.optim.SGD(self.emb.parameters(), lr=0.1), torch.optim.SGD(self.head.parameters(), lr=0.1)]
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--save-every", type=int, default=3)
    ap.add_argument("--two-optimizers", action="store_true")
    ap.add_argument("--strategy", choices=("ddp", "fsdp", "auto"), default=None,
                    help="default: ddp with --devices > 1, else auto; fsdp (FSDPStrategy()) needs --accelerator gpu")
    ap.add_argument("--accelerator", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--val-every", type=int, default=0, help="validate every N training batches (2 sleepy batches)")
    a = ap.parse_args()
    accum = 1 if a.two_optimizers else a.accum  # (Lightning's global_step counts each optimizer's step)
    n = a.steps * accum * a.batch * a.devices
    loader = torch.utils.data.DataLoader(SleepyTokens(n, sleep=a.sleep, dict_items=False), batch_size=a.batch,
                                         num_workers=0)
    before = hooks_state()
    cb = RanksightCallback()

    class Watched(L.Callback):
        """The model ranksight watches, read after its callback's on_train_start: the strategy's
        wrapper (DDP unwraps it again at teardown, so it cannot be read after fit())."""
        name = ""

        def on_train_start(self, trainer, pl_module):
            Watched.name = type(cb.watcher.model).__name__ if cb.watcher is not None else ""

    ckpt = ModelCheckpoint(dirpath=a.out, every_n_train_steps=a.save_every, save_top_k=-1)
    strategy: object = a.strategy or ("ddp" if a.devices > 1 else "auto")
    if strategy == "fsdp":  # GPU only: Lightning refuses FSDPStrategy on CPU, and torch's FSDP needs an accelerator
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = FSDPStrategy()
    trainer = L.Trainer(accelerator=a.accelerator, devices=a.devices, strategy=strategy,
                        max_steps=a.steps * (2 if a.two_optimizers else 1), accumulate_grad_batches=accum,
                        callbacks=[cb, Watched(), ckpt], logger=False,
                        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                        use_distributed_sampler=True, val_check_interval=a.val_every or None,
                        limit_val_batches=2 if a.val_every else 0)
    val = torch.utils.data.DataLoader(SleepyTokens(4 * a.batch * a.devices, sleep=a.sleep, dict_items=False),
                                      batch_size=a.batch) if a.val_every else None
    module = Tiny(a.two_optimizers)
    trainer.fit(module, loader, val)
    found = Watched.name
    result(rank=trainer.global_rank, global_step=trainer.global_step, accum=accum,
           batches=trainer.fit_loop.total_batch_idx + 1, validated=getattr(module, "validated", 0), before=before,
           after=hooks_state(), watcher_left=cb.watcher is not None, model=found,
           ckpts=sorted(os.listdir(a.out)) if trainer.global_rank == 0 else [])


if __name__ == "__main__":
    main()
