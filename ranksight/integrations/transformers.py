"""Hugging Face ``Trainer`` integration: ``Trainer(..., callbacks=[RanksightCallback()])``.

``on_train_begin`` starts ``ranksight.watch()`` with nothing given: the Trainer's optimizer (the
inner torch optimizer of Accelerate's wrapper) is found through PyTorch's global optimizer step
hooks, the model (the DDP/FSDP wrapper the Trainer calls, else the model) at the end of the first
step, and data wait on every DataLoader iterator. A step is one optimizer step, so under
``gradient_accumulation_steps=k`` each step counts k micro-batches (forwards with grad). The
Trainer's own checkpoint saves (``Trainer._save_checkpoint``: weights, optimizer, scheduler, RNG)
are timed as one checkpoint write each; the evaluation loader's fetches during training
(``Trainer.evaluate``) are not data wait. ``on_log`` records the training loss the Trainer logs
(``logs["loss"]``, every ``logging_steps``: the mean since the last log, which the Trainer has
already read to the host and averaged over the ranks, so every rank reports the same value:
a NaN is caught, a disagreement between ranks is not; call ``ranksight.loss`` in
``compute_loss`` for each rank's own). ``on_train_end`` unwatches and restores everything; each
``train()`` call is one watch. A watch the user started before ``train()`` is left as it is.

Importing this module imports transformers.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from transformers import Trainer, TrainerCallback

from ._common import Owned, pause_data_during, run_length, time_saves

__all__ = ["RanksightCallback"]


def _checkpoint_dir(trainer: Any, *args: Any, **kwargs: Any) -> Optional[str]:
    """The checkpoint folder, on the process that writes the weights and optimizer (``should_save``):
    its size is the write's bytes there. The other ranks' saves are timed with 0 bytes."""
    if not trainer.args.should_save:
        return None
    trial = kwargs.get("trial", args[1] if len(args) > 1 else None)
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    return os.path.join(trainer._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}")


class RanksightCallback(TrainerCallback):
    """``config``: a ranksight config path or dict (default ``RANKSIGHT_CONFIG``); ``agent``: the
    agent address (default ``RANKSIGHT_AGENT``)."""

    def __init__(self, config: Any = None, agent: Optional[str] = None):
        self.config = config
        self.agent = agent
        self._own = Owned()

    @property
    def watcher(self) -> Any:
        """The watch this callback started (None outside ``train()``)."""
        return self._own.w

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        w = self._own.begin(None, self.config, self.agent)
        if w is not None:
            run_length(w, getattr(state, "max_steps", 0), getattr(state, "global_step", 0))
        if w is not None and w is self._own.w:
            try:
                time_saves(w, Trainer, "_save_checkpoint", "transformers", _checkpoint_dir)
                pause_data_during(w, Trainer, "evaluate")
            except Exception as e:
                w._hook_error("transformers checkpoint setup", e)

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        w = self._own.w
        if w is None or not isinstance(logs, dict) or "loss" not in logs:
            return
        w.record_loss(logs["loss"])  # a float the Trainer already read (record_loss never raises)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._own.end()
