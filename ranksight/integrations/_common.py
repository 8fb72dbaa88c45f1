"""What the integrations share: one watch per callback, and a framework's own save method timed
as one checkpoint write (its nested ``torch.save`` calls are not counted again)."""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Optional

log = logging.getLogger("ranksight.hooks")


def time_saves(w: Any, owner: type, name: str, src: str, path_of: Callable[..., Optional[str]]) -> bool:
    """Patch ``owner.name`` (a save method) through the watcher's Patcher, so ``close()`` restores
    it: each call is one checkpoint write (sent as source "timer", like ``checkpoint_timer``; ``src``
    names the framework in error messages); ``path_of(self, *args, **kwargs)`` names the file or
    directory it writes (its size is the write's bytes). False when it cannot be patched."""
    from ranksight.hooks.checkpoint import size_of
    from ranksight.hooks.patch import like

    orig = getattr(owner, name, None)
    if orig is None:
        return False

    def save(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = w.ckpt if w._active else None
        if rec is None:
            return orig(self, *args, **kwargs)
        path = None
        try:
            path = path_of(self, *args, **kwargs)
            path = os.fspath(path) if path is not None else None
        except Exception as e:
            w._hook_error(f"{src} checkpoint path", e)
        tok = rec.begin("timer", None, path)
        ok = False
        try:
            out = orig(self, *args, **kwargs)
            ok = True
            return out
        finally:
            try:
                rec.end(tok, ok, size_of(path) if ok else 0)
            except Exception as e:
                w._hook_error(f"{src} checkpoint", e)

    return w._patcher.set(owner, name, like(save, orig, name))


def record_losses(w: Any, owner: type, name: str) -> bool:
    """Patch ``owner.name`` (a method whose first argument is the loss, such as
    ``Accelerator.backward``) through the watcher's Patcher: each call records that loss with
    ``Watcher.record_loss`` (no device wait; never raises) before the method runs."""
    from ranksight.hooks.patch import like

    orig = getattr(owner, name, None)
    if orig is None:
        return False

    def method(self: Any, loss: Any, *args: Any, **kwargs: Any) -> Any:
        if w._active:
            w.record_loss(loss)
        return orig(self, loss, *args, **kwargs)

    return w._patcher.set(owner, name, like(method, orig, name))


def run_length(w: Any, total: Any, done: Any) -> None:
    """What a framework knows of the run: its total optimizer steps (``total``; a declared
    ``watch(total_steps=)`` or ``hooks.total_steps`` wins) and the step training starts from
    (``done``: past 0 when it resumed from its checkpoint, reported as a resume, ``ResumeWatch.mark``;
    a restore the hooks saw wins). Values that
    are not positive whole numbers (-1, inf: unknown) are ignored. Never raises."""
    try:
        if not w.total_steps and isinstance(total, (int, float)) and 0 < total < float("inf") and total == int(total):
            w.set_total_steps(int(total))
        if isinstance(done, int) and done > 0:
            w.resumes.mark(done)
    except Exception as e:
        w._hook_error("run length", e)


class Owned:
    """The watch a callback started. A watch the user started before stays theirs: the callback
    then neither replaces nor closes it."""

    def __init__(self) -> None:
        self.w: Any = None

    def begin(self, model: Any, config: Any, agent: Optional[str], forward_hooks: bool = True) -> Any:
        from ranksight.hooks import watcher

        cur = watcher.active()
        if cur is not None and cur is not self.w:
            log.info("ranksight: a watch is already active; the callback uses it")
            self.w = None
            return cur
        self.w = watcher.start(model, None, None, config=config, agent=agent, discover=True,
                               forward_hooks=forward_hooks)
        return self.w

    def end(self) -> None:
        w, self.w = self.w, None
        if w is not None:
            w.close()


def pause_data_during(w: Any, owner: type, name: str) -> bool:
    """Patch ``owner.name`` (a framework's evaluation entry point) through the watcher's Patcher:
    while it runs, DataLoader fetches are not data wait (``Watcher.data_paused``); the time stays in
    the step it interrupts."""
    from ranksight.hooks.patch import like

    orig = getattr(owner, name, None)
    if orig is None:
        return False

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not w._active or w.data_paused:
            return orig(self, *args, **kwargs)
        w.data_paused = True
        try:
            return orig(self, *args, **kwargs)
        finally:
            w.data_paused = False

    return w._patcher.set(owner, name, like(evaluate, orig, name))
