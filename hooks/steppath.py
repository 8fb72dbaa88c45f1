"""The step path: the loader, forward, backward and optimizer hooks of a ``Watcher`` (main
thread, a few microseconds per hook). They time the phases, mark CUDA events and close each
step into a tuple appended to the watch's queue; the background thread (``sender.py``) sends it."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Dict, Optional

import torch

from ranksight import protocol

from .patch import like
from .work import batch_work
from .timing import BWD, COMM, FWD, OPT, PBUSY, SPAN, XCOMM

log = logging.getLogger("ranksight.hooks")
_perf = time.perf_counter
_grad_enabled = torch.is_grad_enabled


QUEUE_CAP = 8192  # records waiting for the background thread; beyond this they are dropped and counted
# sampled timing: at most this many timed steps resolved into the shares at one step's end (more than
# one drains a backlog: with every step timed, one a step would keep it as long as it ever was)
SPANS_PER_STEP = 4


class _TimedIter:
    """Iterator over the user's loader that times each ``next()`` (data wait)."""

    __slots__ = ("_it", "_w")

    def __init__(self, it: Any, w: "Watcher"):
        self._it = it
        self._w = w

    def __iter__(self) -> "_TimedIter":
        return self

    def __next__(self) -> Any:
        return timed_next(self._w, next, self._it)


class _FirstBatch:
    """The first ``next()`` of an epoch whose first batch an extension wants (the lints): puts the
    loader's own iterator back in the ``_TimedIter`` (later fetches go straight to it: no call of
    this wrapper a step), then fetches the batch and hands it to ``cb`` (which counts its own
    errors). The loader's exceptions (StopIteration included) pass unchanged."""

    __slots__ = ("_it", "_cb", "_owner")

    def __init__(self, it: Any, cb: Callable[[Any], None], owner: _TimedIter):
        self._it = it
        self._cb = cb
        self._owner = owner

    def __iter__(self) -> "_FirstBatch":
        return self

    def __next__(self) -> Any:
        it = self._owner._it = self._it
        b = next(it)
        self._cb(b)
        return b


def timed_next(w: "Watcher", nxt: Callable[[Any], Any], it: Any) -> Any:
    """``nxt(it)`` timed as data wait: the watched loader's iterator, and (``auto.py``) every
    DataLoader iterator when no loader was given. A fetch starts a new iteration: it closes a
    step left open by discovered optimizers (``Watcher._step_boundary``)."""
    if not w._active or w._in_fetch or w.data_paused:
        return nxt(it)
    try:
        t0 = _perf()
        if w._pending_t is not None:
            w._close_pending(t0)
        if w._t0 is None:
            w._t0 = t0
        w._phase = "data"
        w._phase_t = t0
        w._in_fetch = w._fetched = True
    except Exception as e:
        w._hook_error("loader next()", e)
        return nxt(it)
    try:
        batch = nxt(it)
    finally:
        try:
            w._in_fetch = False
            t1 = _perf()
            w._data += t1 - t0
            w._phase = "other"
            w._phase_t = t1
        except Exception as e:
            w._hook_error("loader next()", e)
    try:  # the batch's work, from its shape on the host (hooks/work.py)
        samples, tokens = batch_work(batch, w.settings.tokens_per_sample)
        w._samples += samples
        w._tokens += tokens
        if tokens and not w._seq_len:  # the FLOPs estimate's sequence length (hooks/flops.py), once
            w._seq_len = tokens // samples
    except Exception as e:
        w._hook_error("batch size", e)
    return batch


class WatchedLoader:
    """What ``watch()`` returns: iterate it instead of the loader (``len()`` and every
    attribute pass through to the wrapped loader), or use it as a context manager
    (``with ranksight.watch(...) as loader:``); leaving the block calls ``unwatch()``."""

    def __init__(self, loader: Any, watcher: Optional["Watcher"]):
        self.__dict__["_loader"] = loader
        self.__dict__["watcher"] = watcher
        self.__dict__["_cur"] = None

    def __iter__(self) -> Any:
        loader = self._loader
        if loader is None:
            raise TypeError("ranksight.watch() was given no loader to iterate")
        it = iter(loader)
        w = self.watcher
        if w is None or not w._active:
            return it
        w._epoch_start(loader)
        timed = _TimedIter(it, w)
        lint_iter = getattr(w, "lint_iter", None)  # ranksight.hooks.lints: first batch, worker pids
        if lint_iter is not None:
            try:
                first = lint_iter(it)
                if first is not None:
                    timed._it = _FirstBatch(it, first, timed)
            except Exception as e:
                w._hook_error("lints iterator", e)
        return timed

    def __next__(self) -> Any:  # the user passed an iterator (e.g. a generator) and calls next() on us
        cur = self._cur
        if cur is None:
            cur = self.__dict__["_cur"] = self.__iter__()
        return next(cur)

    def __len__(self) -> int:
        return len(self._loader)

    def __getattr__(self, name: str) -> Any:
        loader = self.__dict__["_loader"]
        if loader is None:
            raise AttributeError(name)
        return getattr(loader, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._loader, name, value)

    def __enter__(self) -> "WatchedLoader":
        return self

    def __exit__(self, *exc: Any) -> bool:
        w = self.watcher
        if w is not None:
            w.close()
        return False

    def __repr__(self) -> str:
        return f"WatchedLoader({self._loader!r})"



class StepPath:
    """The step-path hooks of ``Watcher`` (a mixin: the state is set up in ``Watcher.__init__``).
    Every hook body catches its exceptions (``_hook_error``): nothing reaches the training loop."""

    # A step is one optimizer step. An optimizer given to watch() closes the step in its post-hook.
    # Optimizers found by ``auto.Discovery`` (several may step in one iteration: a GAN, a multi-
    # optimizer Lightning module) leave the step open; the next iteration's first data fetch (or,
    # in a loop without a DataLoader, its first forward) closes it, so the last optimizer to step
    # in an iteration closes that iteration's step. ``close()`` closes a step still open.
    def _step_boundary(self, t: float) -> None:
        if self._defer_steps and (self._fetched or self._fwd_seen):
            if self._pending_t is None:
                self._ckpt_pending = self._ckpt
            self._pending_t = t
        else:
            self._step_end(t)

    def _close_pending(self, t: float) -> None:
        self._pending_t = None
        try:
            self._step_end(t)
        except Exception as e:
            self._hook_error("step end", e)
            self._reset_step(t)  # start the next step clean (as the optimizer post-hook does)

    def _close_pending_at_exit(self) -> None:
        """The step the last optimizer step left open: it ends at that step, plus the checkpoint
        time written after it (so a step's ckpt never exceeds its duration)."""
        pt = self._pending_t
        if pt is None:
            return
        try:
            self._close_pending(min(_perf(), pt + max(0.0, self._ckpt - self._ckpt_pending)))
        except Exception as e:
            self._hook_error("close: open step", e)

    def _closure_backward_done(self, t0: float, t1: float) -> None:
        """A backward that ran inside an optimizer step (``optimizer.step(closure)``, as Lightning
        does): the optimizer's own time starts at the backward's end."""
        self._t_opt = t1
        self._b2o = t1 - t0
        tl = self._tl
        if tl is not None:
            self._ev_opt = tl.mark(True) if tl.on else None

    def _epoch_start(self, loader: Any) -> None:
        for fn in self._epoch_observers:
            try:
                fn(loader)
            except Exception as e:
                self._hook_error(f"epoch observer {getattr(fn, '__name__', fn)}", e)

    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not self._active or not _grad_enabled():
            return None
        try:
            t = _perf()
            if self._pending_t is not None and not self._fetched:
                self._close_pending(t)
            self._fwd_seen = True
            if self._t0 is None:
                self._t0 = t
            self._micro += 1
            self._t_fwd = t
            self._phase = "forward"
            self._phase_t = t
            if self._ddp_stats is not None:
                self._ddp_stats.on_forward()
            tl = self._tl
            if tl is not None:  # (tl.on False: a step sampled timing does not time, no call made)
                self._ev_fwd = tl.mark(True) if tl.on else None
        except Exception as e:
            self._hook_error("forward pre-hook", e)
        return None

    def _fwd_post(self, module: Any, args: Any, output: Any) -> None:
        if self._t_fwd is None:
            return None
        try:
            t = _perf()
            self._fwd += t - self._t_fwd
            self._t_fwd = None
            self._phase = "other"
            self._phase_t = t
            tl = self._tl
            if tl is not None and tl.on:
                tl.push(FWD, self._ev_fwd, tl.mark(True))
        except Exception as e:
            self._hook_error("forward hook", e)
        return None

    def _wrap_backward(self, orig: Callable) -> Callable:
        w = self
        comm = self.comm  # (made before the hooks are installed, never replaced)

        # comm.in_backward: a backward of the step path is running (the collective wrappers read it too)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if not w._active or comm.in_backward:  # nested backward (e.g. inside a hook): the outer one counts
                return orig(*args, **kwargs)
            try:
                comm.in_backward = True
                t0 = _perf()
                w._t_bwd = t0
                w._phase = "backward"
                w._phase_t = t0
                tl = w._tl
                ev0 = tl.mark(True) if tl is not None and tl.on else None
            except Exception as e:
                comm.in_backward = False
                w._hook_error("backward start", e)
                return orig(*args, **kwargs)
            try:
                ret = orig(*args, **kwargs)
            except BaseException:
                w._bwd_raised(t0, ev0)
                raise
            comm.in_backward = False
            try:
                w._bwd_done(t0, ev0)
            except Exception as e:
                w._hook_error("backward end", e)
            return ret

        return like(backward, orig, "backward")

    def _bwd_raised(self, t0: float, ev0: Any) -> None:
        """The backward raised: it ends here all the same (its time and events are counted)."""
        self.comm.in_backward = False
        try:
            self._bwd_done(t0, ev0)
        except Exception as e:
            self._hook_error("backward end", e)

    def _bwd_done(self, t0: float, ev0: Any) -> None:
        t1 = _perf()
        lt, lev = self.comm.last_launch
        if t0 <= lt <= t1 or self._ddp_stats is not None:
            lev = self._bwd_comm(t0, t1, lt, lev)
        else:  # no collective in this backward: all of it is gradient computation
            self._bwd += t1 - t0
            lev = None
        self._phase = "other"
        self._phase_t = t1
        tl = self._tl
        if tl is not None and (tl.on or ev0 is not None):  # (a backward the step ended inside keeps its
            e1 = tl.mark(True)                                 # start event and its last collective's)
            tl.push(BWD, ev0, lev if lev is not None else e1)
            if lev is not None:
                tl.push(XCOMM, lev, e1)
        if self._t_opt is not None:
            self._closure_backward_done(t0, t1)

    def _bwd_comm(self, t0: float, t1: float, lt: float, lev: Any) -> Any:
        """``_bwd_done`` for a backward with communication in it (a collective launched inside it,
        or gloo DDP's all-reduce): the gradient computation's part of [t0, t1] and the exposed
        communication after it. Returns the last collective's event that ends the gradient
        computation on the GPU, or None. (Apart from ``_bwd_done``: its code stays off the
        common path.)"""
        if t0 <= lt <= t1:  # gradients were done when the backward's last collective launched
            self._bwd += lt - t0
            if self._tl is None:
                lc = self.comm.last_complete
                self.comm.add_exposed(lt, lc if lt <= lc <= t1 else t1)
            return lev
        tail = 0.0
        ds = self._ddp_stats
        if ds is not None:  # gloo DDP: this backward's all-reduce, from DDP's own timer
            r = ds.poll(t1 - t0)
            if r is not None:
                comm, tail = r
                self._dcomm += comm
                self._dx += tail
        d = t1 - t0 - tail
        if d > 0:  # (max(0.0, d))
            self._bwd += d
        return None

    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._active:
            return None
        try:
            t = _perf()
            if self._t0 is None:
                self._t0 = t
            self._t_opt = t
            if self._t_bwd is not None:
                self._b2o = t - self._t_bwd
            self._phase = "optimizer"
            self._phase_t = t
            tl = self._tl
            if tl is not None:
                self._ev_opt = tl.mark(True) if tl.on else None
        except Exception as e:
            self._hook_error("optimizer pre-hook", e)
        return None

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self._active:
            return None
        try:
            t = _perf()
            t_opt = self._t_opt
            if t_opt is not None:
                self._opt += t - t_opt
                self._t_opt = None
                tl = self._tl
                if tl is not None and tl.on:
                    tl.push(OPT, self._ev_opt, tl.mark(True))
            if self._defer_steps:
                self._step_boundary(t)
            else:  # (what _step_boundary does for an optimizer given to watch())
                self._step_end(t)
        except Exception as e:
            self._opt_post_failed(e)
        return None

    def _opt_post_failed(self, e: Exception) -> None:
        self._hook_error("optimizer post-hook", e)
        try:  # start the next step clean; the error above is already counted and logged
            self._reset_step(time.perf_counter())
        except Exception:
            pass

    def _step_end(self, t: float) -> None:
        t0 = self._t0
        if t0 is None:
            t0 = self._t_start
        dur = t - t0
        c = self.comm
        if c.fresh:  # communication recorded since the last step's end (c.take() clears it)
            comm, extra, hx = c.take(t0, t)
        else:  # none this step (single process, gloo DDP alone): skip the call
            comm = extra = hx = 0.0
        if self._dcomm:  # gloo DDP's all-reduce (DDPStats): durations without a time axis
            extra += self._dcomm
            hx += self._dx
        if self.pipeline is not None:
            self.pipeline.step_end()
        tl = self._tl
        if tl is None:
            fwd, bwd, opt, xcomm, pbusy = self._fwd, self._bwd, self._opt, hx, self._pbusy
        elif tl.sampled:
            fwd, bwd, opt, comm, xcomm, pbusy = self._sampled(tl, dur, t)
            tl.step_end(t)
        else:
            fwd, bwd, opt, comm, xcomm, pbusy = self._exact(tl, dur, extra)
            extra = 0.0
        comm += extra
        if self.losses._pending:  # CUDA losses of earlier steps whose copy is done
            self.losses.take(self._seq + 1)
        seq = self._seq = self._seq + 1
        # the step tuple: ("step", seq, t) and the per-step fields in their declared order
        # (ranksight/record.py, LAYOUT.index); each is accumulated in self._<key> or a local <key>
        rec = ("step", seq, t, dur, self._data, fwd, bwd, opt, self._b2o, comm if comm < dur else dur,
               xcomm if xcomm < dur else dur, self._ckpt, self._micro or 1, self._samples, self._tokens,
               self._loss, self._lossn, pbusy, self._pstep, self._pwprev, self._pwnext)
        q = self._queue
        if len(q) < QUEUE_CAP:
            q.append(rec)
        else:
            self.qdrop += 1
        self._reset_step(t)

    def _exact(self, tl: Any, dur: float, extra: float) -> tuple:
        """Every step timed: this step's GPU phases, resolved from earlier steps' events, so they may
        belong to an earlier step. A value above this step's duration ``dur`` (several steps
        resolved at once) carries its excess to the next record, so per-step values stay <= dur
        and the sums stay right. ``extra``: communication seconds without a time axis, added to
        the GPU communication (the host union is meaningless for NCCL: launch returns at once)."""
        g = self._gacc
        tl.resolve(g)  # adds each resolved interval's seconds to g[kind]
        g[COMM] += extra
        # (the six phases unrolled, as in _sampled_carry: no loop or tuple building on the step path)
        v = g[FWD]
        fwd = dur if dur < v else v  # min(v, dur)
        g[FWD] = v - fwd
        v = g[BWD]
        bwd = dur if dur < v else v
        g[BWD] = v - bwd
        v = g[OPT]
        opt = dur if dur < v else v
        g[OPT] = v - opt
        v = g[XCOMM]
        xcomm = dur if dur < v else v
        g[XCOMM] = v - xcomm
        v = g[COMM]
        comm = dur if dur < v else v
        g[COMM] = v - comm
        v = g[PBUSY]
        pbusy = dur if dur < v else v
        g[PBUSY] = v - pbusy
        return fwd, bwd, opt, comm, xcomm, pbusy

    def _sampled(self, tl: Any, dur: float, t: float) -> tuple:
        """Sampled timing: this step's GPU phases are the shares of the GPU span over the timed
        steps resolved in the last SHARE_WINDOW_S seconds, at most SHARE_ROWS of them
        (``SpanShares``: their sums over the sum of their spans), times this step's host duration,
        which ends at ``t``; a value above ``dur`` carries its excess to the next step, as the
        exact path's do. The steps that end before the first timed step (the second) has
        resolved, a step or more later, carry none: the warm-up's time is not guessed from later
        steps' shares. ``resolve()`` stops after each timed step's span: up to SPANS_PER_STEP timed
        steps join the window at one step's end, so a backlog (a GPU that fell behind while every
        step was timed) drains instead of holding its length."""
        if tl.pending:  # (resolve() has nothing to do otherwise: the call is skipped)
            win = self._gwin
            tl.resolve(win)
            if win[SPAN] > 0:  # a timed step resolved: it joins the shares' window
                self._add_spans(tl, win, t)
        fast = self._gfast
        if fast is not None and dur >= 0.0:
            # no carry and every share <= 1: each phase is its share of dur (what the carry path
            # below gives then, exactly: min(share x dur + 0, dur) is share x dur, the carry stays 0)
            f, b, o, c, x, p = fast
            return f * dur, b * dur, o * dur, c * dur, x * dur, p * dur
        if not self._gknown:
            return 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        return self._sampled_carry(dur)

    def _add_spans(self, tl: Any, win: Dict[str, float], t: float) -> None:
        """The timed step resolved in ``win`` and up to SPANS_PER_STEP - 1 more join the shares'
        window (``_sampled``); the shares are ready for the steps."""
        add = self._gshares.add
        sh = self._gshare
        add(win, sh, t)  # (zeroes win)
        for _ in range(SPANS_PER_STEP - 1):
            tl.resolve(win)
            if win[SPAN] <= 0:
                break
            add(win, sh, t)
        self._gknown = True
        self._gfast = self._shares_if_no_carry()

    def _shares_if_no_carry(self) -> Optional[tuple]:
        """The shares in ``_sampled``'s order when nothing carries to the next step (every carry 0,
        every share at most 1: no phase can exceed the step), else None."""
        sh = self._gshare
        shares = (sh[FWD], sh[BWD], sh[OPT], sh[COMM], sh[XCOMM], sh[PBUSY])
        if max(shares) <= 1.0 and not any(self._gacc.values()):
            return shares
        return None

    def _sampled_carry(self, d: float) -> tuple:
        """``_sampled``'s phases with the carries: each share of ``d`` plus what the earlier steps
        carried, at most ``d``, the excess carried on."""
        sh = self._gshare
        g = self._gacc
        v = sh[FWD] * d + g[FWD]
        fwd = d if d < v else v  # min(v, dur)
        g[FWD] = v - fwd
        v = sh[BWD] * d + g[BWD]
        bwd = d if d < v else v
        g[BWD] = v - bwd
        v = sh[OPT] * d + g[OPT]
        opt = d if d < v else v
        g[OPT] = v - opt
        v = sh[COMM] * d + g[COMM]
        comm = d if d < v else v
        g[COMM] = v - comm
        v = sh[XCOMM] * d + g[XCOMM]
        xcomm = d if d < v else v
        g[XCOMM] = v - xcomm
        v = sh[PBUSY] * d + g[PBUSY]
        pbusy = d if d < v else v
        g[PBUSY] = v - pbusy
        self._gfast = self._shares_if_no_carry()
        return fwd, bwd, opt, comm, xcomm, pbusy

    def _reset_step(self, t: float) -> None:
        """A new step starts at ``t`` (``_step_end``, once the step is recorded; after a hook
        error, with no step recorded)."""
        self._data = self._fwd = self._bwd = self._opt = self._ckpt = self._b2o = self._dcomm = self._dx = 0.0
        self._pbusy = self._pstep = self._pwprev = self._pwnext = 0.0
        self._micro = self._samples = self._tokens = self._lossn = 0
        self._loss = 0.0
        self._t0 = t
        self._t_bwd = None
        self._phase = "other"
        self._phase_t = t

    def _add_loss(self, v: float) -> None:
        self._loss += v
        self._lossn += 1

    def record_loss(self, value: Any) -> None:
        """``ranksight.loss(value)``: one training loss of the step in progress (hooks/loss.py)."""
        if not self._active:
            return
        try:
            self.losses.record(value, self._seq + 1)
        except Exception as e:
            self._hook_error("loss", e)

    def _gpu_add(self, kind: str, secs: float) -> None:
        self._gacc[kind] += secs

    def _add_ckpt(self, secs: float) -> None:
        self._ckpt += secs

    def _emit_ckpt(self, dur: float, nbytes: int, ok: bool, src: str) -> None:
        self._enqueue(("ckpt", time.time(), {"t": "ckpt", "dur": min(dur, protocol.MAX_SECONDS),
                                             "bytes": min(nbytes, protocol.MAX_BYTES), "ok": ok, "src": src}))

    def _enqueue(self, item: tuple) -> None:
        if len(self._queue) < QUEUE_CAP:
            self._queue.append(item)
        else:
            self.qdrop += 1
