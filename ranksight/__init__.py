"""ranksight: triage-ordered observability for distributed PyTorch training.

    import ranksight
    loader = ranksight.watch(model, optimizer, loader)
    ranksight.loss(loss)   # each step: the training loss, read without a device sync
    trainer = Trainer(..., callbacks=[ranksight.integrations.transformers.RanksightCallback()])

The core package never imports torch. The hook API below and the subpackages a training script
uses (``ranksight.hooks``, ``ranksight.integrations``) are imported on first attribute access
(module ``__getattr__``), so ``import ranksight`` imports neither torch nor any framework.
"""
from __future__ import annotations

from importlib import import_module as _import_module

__version__ = "0.1.0"

_HOOK_API = ("watch", "unwatch", "loss", "checkpoint_timer", "atomic_save")
_LAZY_SUBPACKAGES = ("hooks", "integrations")


def __getattr__(name: str):
    if name in _HOOK_API:
        from . import hooks

        return getattr(hooks, name)
    if name in _LAZY_SUBPACKAGES:
        return _import_module(f"{__name__}.{name}")  # binds it as an attribute: asked once per name
    raise AttributeError(f"module 'ranksight' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_HOOK_API) | set(_LAZY_SUBPACKAGES))
