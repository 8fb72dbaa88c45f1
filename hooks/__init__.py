"""ranksight.hooks: in-process timing for distributed PyTorch training.

    import ranksight
    loader = ranksight.watch(model, optimizer, loader)   # the loop stays unchanged

``watch`` returns the loader to iterate (a ``WatchedLoader``; also a context manager
that unwatches on exit); what it is not given it finds (``auto.py``): ``watch()`` alone
times every optimizer, DataLoader iterator and the model of the first step. ``unwatch()`` removes every hook and patch. ``loss(loss)`` records the step's training loss
without waiting on the device (``loss.py``). ``checkpoint_timer``
and ``atomic_save`` record checkpoint writes. ``current()`` is the active ``Watcher``
(extension points for lints: see ``Watcher``). Importing this package imports torch.
``watch(engine, optimizer, loader)`` with a DeepSpeed engine times the engine's model steps
(``deepspeed_engine.py``); so does ``watch()`` alone, or a framework callback, once the engine's
first forward is seen. ``watch(schedule, optimizer, loader)`` with a ``torch.distributed.pipelining``
schedule (or stage) also times the stage's compute, bubble and P2P waits (``pipeline.py``).
"""
from __future__ import annotations

from typing import Any, Optional

from . import pipeline as _pipeline
from .watcher import WatchedLoader, Watcher, atomic_save, checkpoint_timer, loss, unwatch
from .watcher import active as current
from .watcher import start as _start
from .watcher import watch as _watch


def watch(model: Any = None, optimizer: Any = None, loader: Any = None, *, config: Any = None,
          agent: Optional[str] = None, discover: bool = True, total_steps: Optional[int] = None) -> WatchedLoader:
    """``watcher.watch`` (which watches a DeepSpeed engine through the engine); a pipeline schedule
    or stage through its stages (``pipeline.watch_stages``)."""
    if model is not None and _pipeline.is_pipeline(model):
        w = _pipeline.watch_stages(_start, model, optimizer, loader, config=config, agent=agent, discover=discover,
                                   total_steps=total_steps)
        return WatchedLoader(loader, w)
    return _watch(model, optimizer, loader, config=config, agent=agent, discover=discover, total_steps=total_steps)


__all__ = ["watch", "unwatch", "loss", "checkpoint_timer", "atomic_save", "current", "Watcher", "WatchedLoader"]
