"""A Lightning job instrumented with ranksight: the whole integration is the callback.

    from ranksight.integrations.lightning import RanksightCallback
    L.Trainer(..., callbacks=[RanksightCallback()])

A small token model on random tokens; Lightning's own launcher starts the ranks (DDP on CPU with
gloo, or on the GPUs there are)::

    ranksight exporter &      # the node agent (optional: without it rank 0 prints its step table)
    python examples/train_lightning.py --devices 2 --steps 50

Steps are optimizer steps; ``--accum K`` (accumulate_grad_batches) counts K micro-batches per
step; ``--two-optimizers`` steps two optimizers per batch (manual optimization, like a GAN): one
step per batch. ``--data-sleep`` makes every item cost that long to load. ModelCheckpoint saves
every ``--save-every`` steps are timed as checkpoint writes.
"""
from __future__ import annotations

import argparse
import tempfile

import lightning as L
import torch
from tokens import Tokens  # examples/tokens.py: random token ids

from ranksight.integrations.lightning import RanksightCallback  # ranksight line 1 of 2


class TokenModel(L.LightningModule):
    def __init__(self, two_optimizers: bool):
        super().__init__()
        self.emb = torch.nn.Embedding(512, 128)
        self.body = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(), torch.nn.Linear(256, 512))
        self.two = two_optimizers
        self.automatic_optimization = not two_optimizers

    def _loss(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(self.body(self.emb(ids)).flatten(0, 1), ids.flatten())

    def training_step(self, ids: torch.Tensor, batch_idx: int) -> torch.Tensor:
        if not self.two:
            return self._loss(ids)
        for opt in self.optimizers():
            opt.zero_grad()
            loss = self._loss(ids)
            self.manual_backward(loss)
            opt.step()
        return loss

    def configure_optimizers(self):
        if self.two:
            return [torch.optim.AdamW(self.emb.parameters()), torch.optim.AdamW(self.body.parameters())]
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--accum", type=int, default=2, help="accumulate_grad_batches")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--data-sleep", type=float, default=0.0, help="seconds each item takes to load")
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--two-optimizers", action="store_true")
    a = ap.parse_args()
    accum = 1 if a.two_optimizers else a.accum
    loader = torch.utils.data.DataLoader(Tokens(a.steps * accum * a.batch * a.devices, a.data_sleep),
                                         batch_size=a.batch)
    ckpt = L.pytorch.callbacks.ModelCheckpoint(dirpath=tempfile.mkdtemp(prefix="ranksight-lightning-"),
                                               every_n_train_steps=a.save_every, save_top_k=-1)
    trainer = L.Trainer(devices=a.devices, strategy="ddp" if a.devices > 1 else "auto",
                        max_steps=a.steps * (2 if a.two_optimizers else 1), accumulate_grad_batches=accum,
                        callbacks=[RanksightCallback(), ckpt],  # ranksight line 2 of 2
                        logger=False, enable_progress_bar=False, num_sanity_val_steps=0)
    trainer.fit(TokenModel(a.two_optimizers), loader)


if __name__ == "__main__":
    main()
