"""Lightning integration: ``L.Trainer(callbacks=[RanksightCallback()])``.

``on_train_start`` (after the sanity validation) starts a watch on the strategy's model (the DDP/FSDP wrapper, else the
LightningModule). Lightning calls ``training_step`` itself, so the callback's batch hooks time
the forward: ``on_train_batch_start`` starts it and counts one micro-batch, ``on_before_backward``
ends it. Optimizers (Lightning's ``LightningOptimizer`` steps the torch optimizer) are found
through PyTorch's global optimizer step hooks: a step is one optimizer step, under
``accumulate_grad_batches=k`` it counts k micro-batches, and several optimizers stepping in one
batch (manual optimization, a GAN) make one step. Lightning runs forward and backward inside
``optimizer.step(closure)``: the optimizer's time starts at the backward's end. Data wait is time
in ``next()`` on every DataLoader iterator (Lightning's prefetching shifts a fetch by one batch,
not the sum), which Lightning itself does not measure; validation inside ``fit`` pauses it (its
time stays in the step it interrupts). ``Trainer.save_checkpoint`` (what
``ModelCheckpoint`` calls) is timed as one checkpoint write. ``on_train_batch_end`` records the
batch's training loss (``outputs["loss"]``, or the tensor ``training_step`` returned; times
``accumulate_grad_batches`` under automatic optimization, which divided it) as
``ranksight.loss`` would: read a step or more later on CUDA, without a synchronization. ``on_train_end``, ``on_exception``
and the fit's teardown unwatch and restore everything. A watch the user started before is left as it is.

Importing this module imports ``lightning`` (or ``pytorch_lightning`` when only that is installed).
"""
from __future__ import annotations

from typing import Any, Optional

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl  # type: ignore[no-redef]

from ._common import Owned, run_length, time_saves

__all__ = ["RanksightCallback"]


def _checkpoint_path(trainer: Any, filepath: Any = None, *args: Any, **kwargs: Any) -> Any:
    """The checkpoint file on global rank 0, which writes it (its size is the write's bytes there);
    the other ranks' saves are timed with 0 bytes."""
    return kwargs.get("filepath", filepath) if trainer.is_global_zero else None


def _total_steps(trainer: Any) -> Any:
    """The run's optimizer steps: ``max_steps`` when set (-1: unset), else
    ``estimated_stepping_batches`` (epochs x batches / accumulation; inf for an unbounded run)."""
    n = getattr(trainer, "max_steps", -1)
    if isinstance(n, int) and n > 0:
        return n
    try:
        return trainer.estimated_stepping_batches
    except Exception:  # no loader length yet: unknown
        return 0


class RanksightCallback(pl.Callback):
    """``config``: a ranksight config path or dict (default ``RANKSIGHT_CONFIG``); ``agent``: the
    agent address (default ``RANKSIGHT_AGENT``)."""

    def __init__(self, config: Any = None, agent: Optional[str] = None):
        super().__init__()
        self.config = config
        self.agent = agent
        self._own = Owned()

    @property
    def watcher(self) -> Any:
        """The watch this callback started (None outside ``fit()``)."""
        return self._own.w

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        model = getattr(trainer.strategy, "model", None) or pl_module
        w = self._own.begin(model, self.config, self.agent, forward_hooks=False)
        if w is not None:
            run_length(w, _total_steps(trainer), getattr(trainer, "global_step", 0))
        if w is not None and w is self._own.w:
            try:
                time_saves(w, type(trainer), "save_checkpoint", "lightning", _checkpoint_path)
            except Exception as e:
                w._hook_error("lightning checkpoint setup", e)

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        w = self._own.w
        if w is not None:
            w._fwd_pre(pl_module, ())

    def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
        w = self._own.w
        if w is not None:
            w._fwd_post(pl_module, (), loss)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        w = self._own.w
        if w is None:
            return
        try:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if loss is None:
                return
            k = getattr(trainer, "accumulate_grad_batches", 1)
            if k > 1 and getattr(pl_module, "automatic_optimization", True):
                loss = loss * k  # Lightning divided the micro-batch's loss by k (a device op: no wait)
            w.record_loss(loss)
        except Exception as e:
            w._hook_error("lightning loss", e)

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        w = self._own.w
        if w is not None:
            w.data_paused = True  # the validation loader's fetches are no training data wait

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        w = self._own.w
        if w is not None:
            w.data_paused = False

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self._own.end()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self._own.end()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            self._own.end()
