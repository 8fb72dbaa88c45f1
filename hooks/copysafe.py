"""Hooks that a copy of their module or optimizer does not carry.

A hook registered on a user's object lives in that object's state, so ``copy.deepcopy`` (an EMA or
teacher copy of the model) and pickling (``torch.save`` of a whole module) copy it too. A bound
method of the watch would drag the watch along (it holds locks and threads: the copy fails), and
a copied hook would report the copy's forward passes as the watched model's. ``CopySafe`` wraps
the hook: copied or unpickled, it is a no-op."""
from __future__ import annotations

from typing import Any, Callable, Optional


class CopySafe:
    """Calls ``fn`` with the hook's arguments and returns what it returns; a deep copy or an
    unpickled copy holds no function and returns None (a hook's "change nothing")."""

    __slots__ = ("fn",)

    def __init__(self, fn: Optional[Callable[..., Any]] = None):
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        fn = self.fn
        if fn is not None:
            return fn(*args, **kwargs)
        return None

    def __deepcopy__(self, memo: Any) -> "CopySafe":
        return CopySafe()

    def __reduce__(self) -> tuple:
        return (CopySafe, ())
