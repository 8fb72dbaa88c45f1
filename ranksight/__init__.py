"""ranksight: triage-ordered observability for distributed PyTorch training.

    import ranksight
    loader = ranksight.watch(model, optimizer, loader)

The core package never imports torch; the hook API below is loaded lazily from
``ranksight.hooks`` on first use.
"""
from __future__ import annotations

__version__ = "0.1.0"

_HOOK_API = ("watch", "unwatch", "checkpoint_timer", "atomic_save")


def __getattr__(name: str):
    if name in _HOOK_API:
        from . import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module 'ranksight' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_HOOK_API))
