"""Checkpoint writes: duration, bytes and success, from three sources.

* ``torch.save`` and ``torch.distributed.checkpoint`` ``save``/``async_save`` are patched
  once while a watch is active (``hooks.patch_torch_save``) and restored by ``unwatch()``.
  A ``torch.save`` into an in-memory buffer (``io.BytesIO``) is not a checkpoint write
  and is not timed (DCP itself serializes small items that way), nor is one that DCP's file
  writer or stager makes (each item of a DCP save goes through ``torch.save``, on a background
  thread for ``async_save``): a DCP save is recorded once, as "dcp".
* ``checkpoint_timer(path)``: a context manager around any checkpoint code.
* ``atomic_save(obj, path)``: ``torch.save`` to a temporary file in the same directory,
  flush, fsync, ``os.replace``, fsync the directory.

An exception from the save reaches the caller unchanged; the write is recorded with
``ok=False``. Saves on the main thread count towards the step's ``ckpt`` time and set
the heartbeat phase to "checkpoint" while they run; ``async_save`` counts only its
blocking part (staging) there, while its "ckpt" record spans launch to completion.

Extension point (lints): ``Watcher.add_checkpoint_observer(fn)``; ``fn(src, obj, path)``
sees every object passed to a watched save before it is written.
"""
from __future__ import annotations

import io
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Optional

from .patch import Patcher, like

log = logging.getLogger("ranksight.hooks")

FINISH_WAIT_SECONDS = 2.0  # unwatch() waits this long for an async save's record already being made


def path_of(f: Any) -> Optional[str]:
    if isinstance(f, (str, bytes, os.PathLike)):
        p = os.fsdecode(f)
        return p
    name = getattr(f, "name", None)
    return name if isinstance(name, str) else None


def size_of(path: Optional[str], prefix: Optional[str] = None) -> int:
    """Bytes of a file, or of the files under a directory (optionally only names with a prefix)."""
    if not path:
        return 0
    try:
        st = os.stat(path)
    except OSError:
        return 0
    if not os.path.isdir(path):
        return int(st.st_size)
    total = 0
    for root, _, files in os.walk(path):
        for n in files:
            if prefix is not None and not n.startswith(prefix):
                continue
            try:
                total += os.stat(os.path.join(root, n)).st_size
            except OSError:
                pass
    return total


# the DCP modules whose torch.save calls write the items of a DCP save (recorded once, as "dcp");
# DCP's other torch.save callers (dcp_to_torch_save, the experimental checkpointer) write whole
# checkpoints of their own and are recorded as "torch.save"
DCP_ITEM_WRITERS = frozenset(("torch.distributed.checkpoint.filesystem", "torch.distributed.checkpoint.staging"))


def _from_dcp() -> bool:
    """The caller of the torch.save wrapper (two frames up) is one of DCP_ITEM_WRITERS."""
    try:
        return sys._getframe(2).f_globals.get("__name__") in DCP_ITEM_WRITERS
    except Exception:  # no Python caller (an atexit callback, C code): not DCP
        return False


class Recorder:
    """Times checkpoint writes for a watcher. ``emit(dur, nbytes, ok, src)`` sends the record;
    ``on_main(seconds)`` adds main-thread time to the step; ``set_phase(p)`` returns the old phase."""

    def __init__(self, emit: Callable[[float, int, bool, str], None], on_main: Callable[[float], None],
                 set_phase: Callable[[str], str], on_error: Callable[[str, BaseException], None], main_tid: int):
        self.active = True
        self._emit = emit
        self._on_main = on_main
        self._set_phase = set_phase
        self._on_error = on_error
        self._main_tid = main_tid
        self._tls = threading.local()
        self.observers: list = []
        # async saves still to be recorded: id(token) -> (token, future, path); the future's
        # callback or, for a future already done, flush_async() records each exactly once.
        # _finishing counts the records taken from _async and not yet emitted (their size is read
        # from disk first), so that flush_async() can wait for them.
        self._async: dict = {}
        self._async_cv = threading.Condition()  # guards _async and _finishing
        self._finishing = 0

    # -------------------------------------------------------------- begin / end
    def begin(self, src: str, obj: Any = None, path: Optional[str] = None) -> Optional[tuple]:
        """None when not recording (inactive, or nested inside another recorded save on this thread)."""
        if not self.active or getattr(self._tls, "depth", 0):
            return None
        try:
            self._tls.depth = 1
            for fn in list(self.observers):
                try:
                    fn(src, obj, path)
                except Exception as e:
                    self._on_error(f"checkpoint observer {getattr(fn, '__name__', fn)}", e)
            main = threading.get_ident() == self._main_tid
            old = self._set_phase("checkpoint") if main else None
            return (src, time.perf_counter(), main, old)
        except Exception as e:
            self._tls.depth = 0
            self._on_error("checkpoint begin", e)
            return None

    def blocking_done(self, tok: Optional[tuple], t1: Optional[float] = None) -> None:
        """The caller's thread is free again (end of the blocking part, at ``t1`` if given)."""
        if tok is None:
            return
        self._tls.depth = 0
        src, t0, main, old = tok
        if main:
            try:
                self._on_main((time.perf_counter() if t1 is None else t1) - t0)
                self._set_phase(old)
            except Exception as e:
                self._on_error("checkpoint end", e)

    def finish(self, tok: Optional[tuple], ok: bool, nbytes: int, t1: Optional[float] = None) -> None:
        """The write is complete (any thread; at ``t1`` if given)."""
        if tok is None:
            return
        try:
            self._emit((time.perf_counter() if t1 is None else t1) - tok[1], max(0, int(nbytes)), bool(ok), tok[0])
        except Exception as e:
            self._on_error("checkpoint record", e)

    def finish_async(self, key: int) -> None:
        """Record the async save ``key`` if no one has yet (its future is done)."""
        with self._async_cv:
            item = self._async.pop(key, None)
            if item is None:
                return
            self._finishing += 1
        try:
            tok, fut, path = item
            try:
                ok = not fut.cancelled() and fut.exception() is None
            except Exception:
                ok = False
            self.finish(tok, ok, self._dcp_bytes(path) if ok else 0)
        finally:
            with self._async_cv:
                self._finishing -= 1
                self._async_cv.notify_all()

    def flush_async(self, wait: float = FINISH_WAIT_SECONDS) -> None:
        """At the watch's end: record the async saves whose write is complete but whose future's
        callbacks have not run yet (``Future.result()`` returns before they do), and wait up to
        ``wait`` seconds for a record another thread has begun (the future's callback, which reads
        the checkpoint's size before it emits), so that a ``result()`` followed by ``unwatch()``
        never loses the record."""
        with self._async_cv:
            done = [k for k, (_, fut, _) in self._async.items() if fut.done()]
        for k in done:
            self.finish_async(k)
        with self._async_cv:
            self._async_cv.wait_for(lambda: self._finishing == 0, timeout=wait)

    def end(self, tok: Optional[tuple], ok: bool, nbytes: int) -> None:
        """A save that blocked its caller to the end: one end time for the step's checkpoint
        share and the record's duration, so the two agree."""
        t1 = time.perf_counter()
        self.blocking_done(tok, t1)
        self.finish(tok, ok, nbytes, t1)

    # -------------------------------------------------------------- patches
    def install(self, patcher: Patcher) -> None:
        import torch

        orig = torch.save
        if getattr(orig, "__ranksight__", False):
            orig = orig.__wrapped__  # type: ignore[attr-defined]
        wrapped = self.wrap_torch_save(orig)
        patcher.set(torch, "save", wrapped)
        ser = getattr(torch, "serialization", None)
        if ser is not None and getattr(ser, "save", None) is orig:
            patcher.set(ser, "save", wrapped)
        self.install_dcp(patcher)

    def install_dcp(self, patcher: Patcher) -> bool:
        """Patch torch.distributed.checkpoint if it is imported (importing it costs ~1.5 s, so
        the hooks never import it themselves; the background thread retries)."""
        import sys

        dcp = sys.modules.get("torch.distributed.checkpoint")
        if dcp is None or patcher.patched(dcp, "save") or getattr(dcp, "save", None) is None:
            return False
        patcher.set(dcp, "save", self.wrap_dcp_save(dcp.save, "save"))
        if getattr(dcp, "async_save", None) is not None:
            patcher.set(dcp, "async_save", self.wrap_dcp_async_save(dcp.async_save))
        if getattr(dcp, "save_state_dict", None) is not None:
            patcher.set(dcp, "save_state_dict", self.wrap_dcp_save(dcp.save_state_dict, "save_state_dict"))
        return True

    def wrap_torch_save(self, orig: Callable) -> Callable:
        rec = self

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            if not rec.active or isinstance(f, io.BytesIO) or _from_dcp():
                return orig(obj, f, *args, **kwargs)
            path = path_of(f)
            tok = rec.begin("torch.save", obj, path)
            if tok is None:
                return orig(obj, f, *args, **kwargs)
            try:
                pos = None if isinstance(f, (str, bytes, os.PathLike)) else f.tell()
            except Exception:
                pos = None
            try:
                ret = orig(obj, f, *args, **kwargs)
            except BaseException:
                rec.end(tok, False, 0)
                raise
            n = 0
            try:
                if isinstance(f, (str, bytes, os.PathLike)):
                    n = size_of(path)
                elif pos is not None:
                    n = f.tell() - pos
            except Exception:
                n = 0
            rec.end(tok, True, n)
            return ret

        save.__ranksight__ = True  # type: ignore[attr-defined]
        return like(save, orig, "save")

    def _dcp_target(self, args: tuple, kwargs: dict) -> Optional[str]:
        cid = kwargs.get("checkpoint_id")
        if cid is None:
            sw = kwargs.get("storage_writer") or (args[1] if len(args) > 1 else None)
            cid = getattr(sw, "path", None) or getattr(sw, "checkpoint_id", None)
        try:
            return os.fsdecode(cid) if cid is not None else None
        except TypeError:
            return None

    @staticmethod
    def _dcp_bytes(path: Optional[str]) -> int:
        try:
            import torch.distributed as dist

            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        except Exception:
            rank = 0
        n = size_of(path, prefix=f"__{rank}_")
        if rank == 0 and path:
            n += size_of(os.path.join(path, ".metadata"))
        return n

    def _wrap_dcp(self, orig: Callable, name: str, after: Callable[[Any, Optional[str], Any], None]) -> Callable:
        """The dcp save wrapper: begin, call, a raise is a failed write (re-raised unchanged), then
        ``after(token, path, result)`` ends the record (sync) or hands it to the future (async)."""
        rec = self

        def save(*args: Any, **kwargs: Any) -> Any:
            if not rec.active:
                return orig(*args, **kwargs)
            path = rec._dcp_target(args, kwargs)
            tok = rec.begin("dcp", args[0] if args else kwargs.get("state_dict"), path)
            try:
                ret = orig(*args, **kwargs)
            except BaseException:
                rec.end(tok, False, 0)
                raise
            after(tok, path, ret)
            return ret

        return like(save, orig, name)

    def wrap_dcp_save(self, orig: Callable, name: str) -> Callable:
        def after(tok: Any, path: Optional[str], ret: Any) -> None:
            if tok is not None:
                self.end(tok, True, self._dcp_bytes(path))

        return self._wrap_dcp(orig, name, after)

    def wrap_dcp_async_save(self, orig: Callable) -> Callable:
        rec = self

        def after(tok: Any, path: Optional[str], ret: Any) -> None:
            rec.blocking_done(tok)
            if tok is None:
                return
            try:
                fut = getattr(ret, "upload_completion", ret)  # AsyncSaveResponse (newer torch) or Future
                key = id(tok)
                with rec._async_cv:
                    rec._async[key] = (tok, fut, path)
                fut.add_done_callback(lambda f: rec.finish_async(key))
            except Exception as e:
                rec._on_error("dcp.async_save completion", e)

        return self._wrap_dcp(orig, "async_save", after)


class CheckpointTimer:
    """``with checkpoint_timer(path) as ck: ...`` records one checkpoint write ("timer").

    ``path`` (a file or a directory) gives the bytes after the block, unless ``nbytes`` is
    given or ``ck.bytes`` is set inside the block. ``obj`` is shown to checkpoint observers.
    An exception in the block is recorded as a failed write and re-raised unchanged.
    Without an active watch it only measures (``ck.seconds``)."""

    def __init__(self, recorder: Optional[Recorder], path: Any = None, nbytes: Optional[int] = None,
                 obj: Any = None, src: str = "timer"):
        self._rec = recorder
        self.path = os.fsdecode(path) if path is not None else None
        self.bytes = nbytes
        self.obj = obj
        self.src = src
        self.seconds = 0.0
        self.ok: Optional[bool] = None
        self._tok: Optional[tuple] = None
        self._t0 = 0.0

    def __enter__(self) -> "CheckpointTimer":
        self._t0 = time.perf_counter()
        if self._rec is not None:
            self._tok = self._rec.begin(self.src, self.obj, self.path)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.seconds = time.perf_counter() - self._t0
        self.ok = exc_type is None
        n = 0
        if self.ok:
            try:
                n = int(self.bytes) if self.bytes is not None else size_of(self.path)
            except Exception:
                n = 0
        if self._rec is not None:
            self._rec.end(self._tok, self.ok, n)
        return False  # never swallow the exception


def atomic_write(save: Callable[[Any, Any], Any], obj: Any, path: Any, **kwargs: Any) -> int:
    """Write ``obj`` with ``save(obj, file)`` to a temporary file beside ``path``, fsync it,
    ``os.replace`` it over ``path`` and fsync the directory. Returns the bytes written.
    On any error the temporary file is removed and the error is re-raised unchanged."""
    path = os.fspath(path)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp.{os.getpid()}.{threading.get_ident()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            save(obj, f, **kwargs)
            f.flush()
            os.fsync(f.fileno())
            n = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some filesystems do not fsync directories; the data itself is on disk
    return n
