"""Accelerate integration: ``ranksight.watch()`` with nothing given works in an Accelerate loop
as it is (the inner torch optimizer of ``AcceleratedOptimizer`` steps only when gradients are
synchronized, so under ``accelerator.accumulate(model)`` a step is one real optimizer step and
the skipped ``optimizer.step()`` calls of the other micro-batches are not steps; the prepared
DataLoader's iterator is timed; the model found is the DDP/FSDP wrapper ``prepare`` made).

``ranksight.integrations.accelerate.watch()`` is that ``watch()`` plus ``Accelerator.save_state``
timed as one checkpoint write, and the loss each ``Accelerator.backward(loss)`` is given recorded
as ``ranksight.loss`` would (no device wait). Importing this module imports accelerate.
"""
from __future__ import annotations

from typing import Any, Optional

from accelerate import Accelerator

from ._common import record_losses, time_saves

__all__ = ["watch"]


def _state_dir(acc: Any, output_dir: Any = None, *args: Any, **kwargs: Any) -> Any:
    """The state folder on the main process, which writes the weights and optimizer (its size is the
    write's bytes there); the other ranks' saves are timed with 0 bytes."""
    if not acc.is_main_process:
        return None
    out = kwargs.get("output_dir", output_dir)
    if out is None:
        try:
            import os

            pc = acc.project_configuration
            if pc.automatic_checkpoint_naming:
                return os.path.join(acc.project_dir, "checkpoints", f"checkpoint_{pc.iteration}")
        except Exception:
            return None
    return out


def watch(*, config: Any = None, agent: Optional[str] = None) -> Any:
    """Start ``ranksight.watch()`` (nothing given) and time ``Accelerator.save_state``; returns the
    Watcher (None when the hooks could not start). ``ranksight.unwatch()`` restores everything."""
    from ranksight.hooks import watcher

    w = watcher.start(None, None, None, config=config, agent=agent, discover=True)
    if w is not None:
        try:
            time_saves(w, Accelerator, "save_state", "accelerate", _state_dir)
            record_losses(w, Accelerator, "backward")
        except Exception as e:
            w._hook_error("accelerate checkpoint setup", e)
    return w
