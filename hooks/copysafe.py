"""Hooks that a copy of their module does not carry.

A hook registered on a module lives in the module's state, so ``copy.deepcopy`` (an EMA or teacher
copy of the model) and pickling (``torch.save`` of a whole module) copy it too (an optimizer's
``__getstate__`` leaves its step hooks out: its copies carry none). A bound
method of the watch would drag the watch along (it holds locks and threads: the copy fails), and
a copied hook would report the copy's forward passes as the watched model's. ``CopySafe`` wraps
the hook: copied or unpickled, it is a no-op."""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional


def _nothing(*args: Any, **kwargs: Any) -> None:
    """A copied hook: changes nothing."""
    return None


class CopySafe(functools.partial):
    """Calls ``fn`` with the hook's arguments and returns what it returns; a deep copy or an
    unpickled copy holds no function (``fn`` None) and returns None (a hook's "change nothing").

    A ``functools.partial`` with no bound arguments: the call goes from the module straight to
    ``fn`` in C, with no Python frame of its own (the forward hooks run twice a step)."""

    __slots__ = ()

    def __new__(cls, fn: Optional[Callable[..., Any]] = None) -> "CopySafe":
        return super().__new__(cls, _nothing if fn is None else fn)

    @property
    def fn(self) -> Optional[Callable[..., Any]]:
        f = self.func
        return None if f is _nothing else f

    def __deepcopy__(self, memo: Any) -> "CopySafe":
        return CopySafe()

    def __reduce__(self) -> tuple:
        return (CopySafe, ())
