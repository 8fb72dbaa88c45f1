"""Reversible attribute patches: every patch the hooks make goes through one Patcher."""
from __future__ import annotations

import logging
from typing import Any, Callable, List, Tuple

log = logging.getLogger("ranksight.hooks")


def like(wrapper: Callable, orig: Callable, name: str) -> Callable:
    """``wrapper`` made to look like ``orig`` (name, qualname, doc, module; ``__wrapped__`` = orig)
    for introspection and for tools that unwrap; ``name`` when ``orig`` has none."""
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", None) or name
    wrapper.__qualname__ = getattr(orig, "__qualname__", None) or name
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper.__module__ = getattr(orig, "__module__", None) or wrapper.__module__
    return wrapper


class Patcher:
    """``set(obj, name, new)`` remembers the old value; ``restore()`` puts every one back.

    A patch is restored only if the attribute still holds our function; if someone
    patched over it meanwhile, theirs is left in place (our wrapper then passes
    straight through, because the watcher is closed) and that is logged.
    """

    def __init__(self) -> None:
        self._patches: List[Tuple[Any, str, Any, Any, bool]] = []

    def set(self, obj: Any, name: str, new: Any) -> bool:
        had = name in getattr(obj, "__dict__", {})
        try:
            # a class keeps its raw descriptor (e.g. pybind's instancemethod), which is what must go back
            old = obj.__dict__[name] if (had and isinstance(obj, type)) else getattr(obj, name)
            setattr(obj, name, new)
        except (AttributeError, TypeError) as e:
            log.debug("ranksight: cannot patch %r.%s: %s", obj, name, e)
            return False
        self._patches.append((obj, name, old, new, had))
        return True

    def patched(self, obj: Any, name: str) -> bool:
        return any(o is obj and n == name for o, n, _, _, _ in self._patches)

    def restore(self) -> None:
        while self._patches:
            obj, name, old, new, had = self._patches.pop()
            try:
                if getattr(obj, name, None) is not new:
                    log.info("ranksight: %s.%s was patched again after ranksight; leaving it in place",
                             getattr(obj, "__name__", type(obj).__name__), name)
                    continue
                if had or not isinstance(obj, type):
                    setattr(obj, name, old)
                else:  # an inherited attribute: remove our override
                    delattr(obj, name)
            except (AttributeError, TypeError) as e:
                log.warning("ranksight: cannot restore %r.%s: %s", obj, name, e)
