"""The active watch: at most one ``Watcher`` per process, the one ``watch()`` started last.
``close()`` forgets it; a forked child switches off its inherited copy (see ``forksafe.py``)."""
from __future__ import annotations

from typing import List, Optional

from . import forksafe

_ACTIVE: List["Watcher"] = []  # at most one; a list so that nothing rebinds a module global


def active() -> Optional["Watcher"]:
    return _ACTIVE[0] if _ACTIVE else None


def _forget(w: "Watcher") -> None:
    if _ACTIVE and _ACTIVE[0] is w:
        _ACTIVE.clear()


def _forked_child() -> None:
    """In a forked child: the inherited copy of the watch is switched off (see ``forksafe.py``)."""
    for w in _ACTIVE:
        w._active = False
        w.comm.active = False
        w.ckpt.active = False
        w.resumes.active = False
        w._closed = True  # its threads are not here; close() in the child must not touch the parent's agent
    _ACTIVE.clear()


forksafe.on_child(_forked_child)
