"""The end of a watch: ``Closing.close()`` removes every hook and patch, sends what is left and the
"bye", and stops the background thread (a mixin of ``Watcher``: the state is set up in
``Watcher.__init__``).

On CUDA, ``close()`` waits (polling ``query()``, while the GPU keeps reaching events: at most
``CLOSE_GPU_WAIT`` without progress and ``CLOSE_GPU_MAX`` in all) for the intervals of the last
steps and sends them on the step records not sent yet (the background thread holds the newest
one back while intervals are pending, at most ``HOLD_SECONDS``). It never synchronizes the device.

Nothing lost at the end: the background thread takes queued records and sends them under one
lock (``_send_lock``); ``close()`` takes the same lock for its final flush and the "bye", so every
step is sent before the bye whatever the thread was doing, and nothing is sent after it.
"""
from __future__ import annotations

import atexit
import threading
import time
from typing import List

from ranksight import protocol

from .active_watch import _forget
from .sender import LAYOUT

BYE_COPIES = 3  # the bye carries the final totals; the agent applies copies idempotently
CLOSE_GPU_WAIT = 0.5  # close() stops waiting for the last GPU intervals after this long without one resolving
CLOSE_GPU_MAX = 5.0  # ... and after this long in all (polling query(), never a sync)
JOIN_SECONDS = 2.0  # close() waits this long for the background thread to stop (its sends are under _send_lock)
SEND_LOCK_WAIT = 5.0  # close() waits this long for a send in progress on the background thread
# the fields resolved from CUDA events (timing kind == field key) and where they sit in a queued step tuple
_STEP_GPU_FIELDS = tuple((k, LAYOUT.index[k]) for k in LAYOUT.gpu)
_perf = time.perf_counter


class Closing:
    """``close()`` and what it runs (a mixin of ``Watcher``). Idempotent; safe on the background
    thread itself (``_send_lock`` is re-entrant)."""

    def _last_gpu(self, items: List[tuple]) -> None:
        """The GPU intervals of the last steps: wait for them (polling ``query()``, never
        synchronizing; while they keep resolving, at most CLOSE_GPU_WAIT without progress and
        CLOSE_GPU_MAX in all), then add what is resolved and not sent yet to the
        unsent step records ``items``, newest first, each field up to its step's duration (the
        carry-over rule of ``_step_end``); the rest on the newest one. Without any step record
        left (the background thread sent them: the watch ended more than HOLD_SECONDS after the
        last step) the seconds are counted in ``gpu_unsent``; intervals the GPU has not reached
        when the wait ends are dropped (counted in ``self._tl.dropped``) when close() releases them."""
        tl = self._tl
        start = _perf()
        cap = start + CLOSE_GPU_MAX
        deadline = start + CLOSE_GPU_WAIT
        while True:
            if tl.resolve(self._gpu_add):  # type: ignore[union-attr]  # the GPU is working through them
                deadline = min(cap, _perf() + CLOSE_GPU_WAIT)
            if not tl.pending or _perf() >= deadline:  # type: ignore[union-attr]
                break
            time.sleep(0.002)
        self.gpu_wait_s = _perf() - start
        g = self._gacc
        newest = -1
        for i in range(len(items) - 1, -1, -1):
            rec = items[i]
            if rec[0] != "step":
                continue
            if newest < 0:
                newest = i
            if not any(g[k] > 0 for k, _ in _STEP_GPU_FIELDS):
                break
            vals = list(rec)
            dur = vals[LAYOUT.index["dur"]]
            for k, j in _STEP_GPU_FIELDS:
                add = min(g[k], dur - vals[j])
                if add > 0:
                    vals[j] += add
                    g[k] -= add
            items[i] = tuple(vals)
        if newest >= 0:  # more than fits (the GPU ran many steps behind): the newest record carries
            vals = list(items[newest])  # the rest, so the sums stay right (that record may exceed its dur)
            for k, j in _STEP_GPU_FIELDS:
                if g[k] > 0:
                    vals[j] += g[k]
                    g[k] = 0.0
            items[newest] = tuple(vals)
        self.gpu_unsent = sum(max(0.0, g[k]) for k, _ in _STEP_GPU_FIELDS)

    @staticmethod
    def _final_close(w: "Watcher") -> None:
        w.close()

    def close(self) -> None:
        """Remove every hook and patch, flush, send "bye", stop the background thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._close_pending_at_exit()
        try:
            self.ckpt.flush_async()
        except Exception as e:
            self._hook_error("close: async checkpoints", e)
        self._active = False
        self.comm.active = False
        self.ckpt.active = False
        self.resumes.active = False
        for h in self._handles:
            try:
                h.remove()
            except Exception:
                pass
        self._handles.clear()
        self._patcher.restore()
        if self._ddp_stats is not None:
            try:
                self._ddp_stats.close()
            except Exception as e:
                self._hook_error("DDP stats close", e)
        for fn in self._close_callbacks:
            try:
                fn()
            except Exception as e:
                self._hook_error(f"close callback {getattr(fn, '__name__', fn)}", e)
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=JOIN_SECONDS)
        # The final flush and the bye under _send_lock: a send the thread is in the middle of (it
        # may still be running after the join timed out) ends first, and it sends nothing after.
        locked = self._send_lock.acquire(timeout=SEND_LOCK_WAIT)
        if not locked:
            self._hook_error("close: send lock", TimeoutError("background thread still sending"))
        try:
            self._final_flush()
        finally:
            self._bye_sent = True
            if locked:
                self._send_lock.release()
        try:
            atexit.unregister(self.close)
        except Exception:
            pass
        if self._finalizer is not None:
            try:
                self._finalizer.cancel()
            except Exception:
                pass
        self._release_cuda()
        _forget(self)

    def _final_flush(self) -> None:
        """close(): every record not sent yet (with the last steps' GPU intervals), then the bye."""
        tr = getattr(self, "_transport", None)
        if tr is None:
            return
        try:
            if getattr(self, "_base", None) is not None and not self._bye_sent:
                items = self._take_items()
                if self._tl is not None and not self._tl.sampled:  # (sampled: the shares stand for them)
                    try:
                        self._last_gpu(items)
                    except Exception as e:
                        self._hook_error("close: last GPU intervals", e)
                self._send_items(items)
                if self._table is not None and self._table.durs:
                    self._print_table()
                bye = protocol.encode(dict(self._base, t="bye", ts=time.time(), **self.totals.fields()))
                for _ in range(BYE_COPIES):  # the final totals: a lost bye would lose the last steps
                    tr.send(bye)
        except Exception as e:
            self._hook_error("close", e)
        tr.close()

    def _release_cuda(self) -> None:
        """Drop the CUDA events this watch still holds, so they are destroyed now, here, and never
        by a garbage collection in a forked child (see forksafe.py). Only the background thread
        could still touch them, and it has stopped (or is about to, sending nothing)."""
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            return  # still finishing: its last tick may resolve them; the fork freeze covers the rest
        try:
            if self._tl is not None:
                self._tl.release()
            self._ev_fwd = self._ev_opt = None
            self.comm.last_launch = (-1.0, None)
        except Exception as e:
            self._hook_error("close: CUDA events", e)
