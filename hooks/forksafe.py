"""Forking while watched (DataLoader workers, ``multiprocessing`` with the fork start method).

A forked child inherits a copy of the active watch but none of its threads. Two rules keep that
copy harmless:

* in the child the copy is switched off at once (``os.register_at_fork(after_in_child=...)``):
  its hooks and patched functions pass straight through and it sends nothing; it is no longer
  ``ranksight.hooks.current()``. A ``watch()`` in the child starts its own.
* a fork waits, at most ``FORK_WAIT`` seconds, while the background thread is inside one of its
  ticks or its start (NVML self-check, CUDA allocator stats, sockets: C libraries with their own
  locks), so that the child never inherits a lock that thread held at the fork. A tick takes
  well under a millisecond; forks are rare (worker start), so the wait costs nothing in practice.
  A fork from the background thread itself does not wait (the lock is re-entrant).
* the child never garbage-collects what it inherited: ``gc.freeze()`` right before the fork
  (undone in the parent right after it, as the gc module's documentation describes for fork
  without exec). A watch that ended leaves objects in reference cycles until the parent's
  collector runs; collected in a child, a CUDA event or tensor among them is destroyed in a
  process whose CUDA context is the parent's, and CUDA aborts the child (seen on an H200: a
  DataLoader worker killed by SIGABRT inside "Garbage-collecting"). Frozen, the inherited
  objects simply stay in the child's copy of memory, shared with the parent.
"""
from __future__ import annotations

import gc
import os
import threading
from typing import Any, Callable, List

FORK_WAIT = 1.0  # seconds a fork waits for the background thread's current tick at most

_lock = threading.RLock()
_held: List[bool] = [False]
_child_callbacks: List[Callable[[], None]] = []


def working() -> Any:
    """Held by the background thread while it works (``with forksafe.working():``)."""
    return _lock


def on_child(fn: Callable[[], None]) -> None:
    """``fn()`` runs in a forked child, right after the fork (registered once per function)."""
    if fn not in _child_callbacks:
        _child_callbacks.append(fn)


def _before() -> None:
    _held[0] = _lock.acquire(timeout=FORK_WAIT)
    gc.freeze()


def _after_in_parent() -> None:
    gc.unfreeze()
    if _held[0]:
        _held[0] = False
        _lock.release()


def _after_in_child() -> None:
    global _lock
    _lock = threading.RLock()  # the parent's may be held by a thread that does not exist here
    _held[0] = False
    for fn in list(_child_callbacks):
        try:
            fn()
        except Exception:  # never let our bookkeeping break a child process
            pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before, after_in_parent=_after_in_parent, after_in_child=_after_in_child)
