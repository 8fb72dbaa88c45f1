"""Communication timing: DDP comm hook, wrapped ``torch.distributed`` collectives, ``Work.wait``,
and the NCCL Flight Recorder (read in ``flight_recorder.py``).

Definitions (per optimizer step):

comm   collective time: the union of [launch, completion] of every collective the hooks
       see (DDP buckets through our comm hook, wrapped collectives, async work until
       its future completes, time blocked in ``Work.wait()``), clipped to the step. On the
       host (gloo, CPU) from ``perf_counter``; on CUDA from events on the current stream:
       the start recorded when an async call (DDP bucket, ``async_op=True``) returned, i.e.
       after the enqueue (a host-bound step's enqueue time is not communication), or before
       a synchronous call; the end in the future's ``then`` callback (the stream that waits
       on the work). Or from the NCCL Flight Recorder's ``duration_ms`` when
       ``TORCH_NCCL_ENABLE_TIMING=1``: a sum of each collective's own duration, so collectives
       that run at the same time on different streams (an async one on NCCL's stream beside a
       synchronous one, which torch >= 2.7 runs on the current stream) count each, where the
       events' union counts their overlap once. gloo DDP: DDP's reducer timer (``DDPStats``).

xcomm  exposed (non-overlapped) communication: time the training thread could not
       compute because it waited for communication. It is the union of
         * the backward tail: from the end of gradient computation to the moment
           ``backward()`` returns. Gradient computation ends when the last collective
           of the backward is launched (DDP launches a bucket's all-reduce as soon as its
           last gradient is computed, FSDP its reduce-scatter); the remaining time is
           DDP's / FSDP's final callback waiting for the outstanding reductions (on the
           host it ends when the last of them completes, so DDP's copy of the reduced
           gradients back into ``.grad`` stays compute). A backward that launches no
           collective (no_sync, single process) has no tail;
         * time inside synchronous wrapped collectives (``async_op=False``);
         * time blocked in ``Work.wait()``;
       counted only on the training thread (the main thread, or an autograd thread while a
       backward runs), each span clipped to its step and overlaps counted once. On CUDA the
       same spans are CUDA events on the compute stream (so they show how long the compute
       stream stood waiting for communication), united on the GPU time axis.
       A rank that waits for a slow peer therefore shows the wait as xcomm, and its
       busy time (step - data - xcomm - ckpt) stays low; the slow rank's stays high.
"""
from __future__ import annotations

import itertools
import logging
import statistics
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .patch import Patcher, like
from .timing import COMM, XCOMM, CudaTimeline, drain, union_seconds

log = logging.getLogger("ranksight.hooks")

# torch.distributed functions that are wrapped (each only if this torch has it).
COLLECTIVES = (
    "broadcast", "all_reduce", "all_reduce_coalesced", "reduce", "all_gather", "all_gather_single",
    "all_gather_into_tensor", "all_gather_coalesced", "gather", "scatter", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all_single", "all_to_all", "barrier",
    "monitored_barrier", "all_gather_object", "gather_object", "broadcast_object_list",
    "scatter_object_list", "send_object_list", "recv_object_list", "send", "recv", "isend", "irecv",
    "batch_isend_irecv", "_broadcast_coalesced",
)


# wrapped functions that are always asynchronous (return Work objects without async_op)
ALWAYS_ASYNC = frozenset(("isend", "irecv", "batch_isend_irecv"))


class CommTracker:
    """Collective and exposed-wait intervals, fed from any thread, drained once per step."""

    def __init__(self, on_error: Callable[[str, BaseException], None], main_tid: int,
                 timeline: Optional[CudaTimeline] = None, comm_events: bool = True):
        import torch

        self._on_error = on_error
        self._main_tid = main_tid
        self.timeline = timeline
        self.comm_events = comm_events and timeline is not None  # False: comm from the Flight Recorder
        self.active = True
        self._intervals: Deque[Tuple[float, float]] = deque()  # host [launch, completion]
        self._exposed: Deque[Tuple[float, float]] = deque()  # host spans the training thread waited
        self._extra: Deque[float] = deque()  # comm durations without a time axis (Flight Recorder)
        # something was added to those three since take() (set after each append, from any thread;
        # the step's end reads this one attribute, not three queues, and skips take() while False)
        self.fresh = False
        self._inflight: Dict[int, float] = {}
        self._pos: Dict[int, Tuple[str, str, int]] = {}  # in-flight token -> (op, group, sequence in the group)
        self._seqs: Dict[str, int] = {}  # group -> collectives launched through the wrappers
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._tls = threading.local()
        self._graph_task_id = getattr(torch._C, "_current_graph_task_id", None)
        # (host time, CUDA event or None) of the latest collective launch: the watcher takes the
        # last launch inside a backward as the end of gradient computation
        self.last_launch: Tuple[float, Any] = (-1.0, None)
        self.last_complete = -1.0  # host time the latest collective completed
        self.ddp_hooked = False
        self.works_without_future = 0
        # gloo DDP timed by its reducer timer: collectives a user comm hook launches inside the
        # backward are already in those figures, so the wrappers skip them (no double count)
        self.ddp_stats_backward = False
        self.in_backward = False  # set by the watcher's backward wrapper while a backward runs

    # ---------------------------------------------------------------- bookkeeping
    def _counting_thread(self) -> bool:
        if threading.get_ident() == self._main_tid:
            return True
        f = self._graph_task_id
        return f is not None and f() != -1

    def launch(self, event: bool = True, op: str = "", group: Any = None) -> Tuple[int, float, Any]:
        """A collective is about to be called: host launch time, in-flight token and (``event``, on
        CUDA) a start event. An async collective passes ``event=False`` and calls ``launched()``
        once the call returned: its start event then follows the enqueue, so a host-bound step
        does not count the host's enqueue time (the GPU idling meanwhile) as communication."""
        t0 = time.perf_counter()
        ev = None
        if event and self.timeline is not None:
            ev = self.timeline.mark()  # before the in-flight entry: a raising mark() leaves none behind
        tok = next(self._ids)
        with self._lock:
            self._inflight[tok] = t0
            if op:
                pg = group_name(group)
                n = self._seqs[pg] = self._seqs.get(pg, 0) + 1
                self._pos[tok] = (op, pg, n)
        self.last_launch = (t0, ev)  # CPU async calls too: the backward wrapper reads the host time
        return tok, t0, ev

    def launched(self, t0: float) -> Any:
        """The async collective launched at host time ``t0`` is enqueued: its start event (CUDA) or
        None. Never raises (a failed event record, e.g. during graph capture, gives no event)."""
        ev = None
        if self.timeline is not None:
            try:
                ev = self.timeline.mark()
            except Exception as e:
                self._on_error("collective start event", e)
        self.last_launch = (t0, ev)
        return ev

    def complete(self, tok: int, t0: float, ev0: Any, end_ev: Any = None) -> Any:
        """The collective finished (any thread). Returns the end event (GPU) for reuse."""
        t1 = time.perf_counter()
        with self._lock:
            self._inflight.pop(tok, None)
            self._pos.pop(tok, None)
        self._intervals.append((t0, t1))
        self.fresh = True
        if t1 > self.last_complete:
            self.last_complete = t1
        if ev0 is not None and self.comm_events:
            if end_ev is None:
                end_ev = self.timeline.mark()
            self.timeline.push(COMM, ev0, end_ev)
        return end_ev

    def add_exposed(self, t0: float, t1: float) -> None:
        self._exposed.append((t0, t1))
        self.fresh = True

    def add_flight_recorder(self, seconds: List[float]) -> None:
        self._extra.extend(seconds)
        self.fresh = True

    def oldest_inflight(self, now: float) -> float:
        """Seconds since the oldest in-flight collective was launched, or -1."""
        with self._lock:
            if not self._inflight:
                return -1.0
            oldest = min(self._inflight.values())
        return max(0.0, now - oldest)

    def waiting(self, now: float) -> Optional[Dict[str, Any]]:
        """The oldest in-flight collective launched through the wrappers, as FlightRecorder.waiting()
        gives it (its sequence number counts the wrapped collectives of its group), or None."""
        with self._lock:
            if not self._pos:
                return None
            tok = min(self._pos, key=lambda k: self._inflight.get(k, now))
            op, pg, n = self._pos[tok]
            t0 = self._inflight.get(tok, now)
        return {"op": op, "pg": pg, "seq": n, "wait": round(max(0.0, now - t0), 3)}

    def take(self, lo: float, hi: float) -> Tuple[float, float, float]:
        """(host comm, comm seconds without a time axis, host exposed comm) for the step [lo, hi]:
        unions of the spans clipped to the step, plus durations (the Flight Recorder).
        Resets them."""
        self.fresh = False  # (before the drains: what another thread adds meanwhile sets it again)
        comm = union_seconds(drain(self._intervals), lo, hi) if self._intervals else 0.0
        x = union_seconds(drain(self._exposed), lo, hi) if self._exposed else 0.0
        extra = sum(drain(self._extra)) if self._extra else 0.0
        return comm, extra, x

    # ---------------------------------------------------------------- wrappers
    def wrap_collective(self, name: str, orig: Callable) -> Callable:
        tracker = self
        is_compiling = _is_compiling_fn()
        always_async = name in ALWAYS_ASYNC

        def collective(*args: Any, **kwargs: Any) -> Any:
            if (not tracker.active or getattr(tracker._tls, "depth", 0) or is_compiling()
                    or (tracker.ddp_stats_backward and tracker.in_backward)):
                return orig(*args, **kwargs)
            try:
                # async calls get their start event after the call returned (see launch())
                pre = not (always_async or kwargs.get("async_op"))
                tok, t0, ev0 = tracker.launch(event=pre, op=name, group=kwargs.get("group"))
                tracker._tls.depth = 1
            except Exception as e:  # our bookkeeping only; the collective still runs
                tracker._on_error(f"collective {name}", e)
                return orig(*args, **kwargs)
            try:
                ret = orig(*args, **kwargs)
            except BaseException:
                tracker._tls.depth = 0
                try:
                    tracker.complete(tok, t0, ev0)
                except Exception as e:
                    tracker._on_error(f"collective {name}", e)
                raise
            tracker._tls.depth = 0
            try:
                tracker._after_call(ret, tok, t0, ev0, pre)
            except Exception as e:
                tracker._on_error(f"collective {name}", e)
            return ret

        collective.__ranksight__ = True  # type: ignore[attr-defined]
        return like(collective, orig, name)

    def _after_call(self, ret: Any, tok: int, t0: float, ev0: Any, pre: bool = True) -> None:
        works = _works(ret)
        if not works:  # synchronous: the call itself was the wait
            if not pre:  # async_op=True that returned no work
                ev0 = self.launched(t0)
            end = self.complete(tok, t0, ev0)
            if self._counting_thread():
                if self.timeline is not None:
                    self.timeline.push(XCOMM, ev0, end if end is not None else self.timeline.mark())
                else:
                    self._exposed.append((t0, time.perf_counter()))
                    self.fresh = True
            return
        # async_op=True: in flight until the (last) work's future completes. Its start event is
        # recorded now that the call returned (a pre-call one, async_op passed positionally, is
        # replaced); the host launch time t0 stays the call's start.
        ev0 = self.launched(t0)
        work = works[-1]
        try:
            fut = work.get_future()
        except Exception:  # e.g. gloo send/recv has no future: Work.wait() time is what we see
            self.works_without_future += 1
            self.complete(tok, t0, None)
            return

        def done(_f: Any, tok: int = tok, t0: float = t0, ev0: Any = ev0) -> None:
            try:
                self.complete(tok, t0, ev0)
            except Exception as e:
                self._on_error("collective completion", e)

        fut.then(done)

    def wrap_wait(self, orig: Callable) -> Callable:
        tracker = self

        def wait(work: Any, *args: Any, **kwargs: Any) -> Any:
            if not tracker.active or getattr(tracker._tls, "depth", 0):
                return orig(work, *args, **kwargs)
            try:
                counting = tracker._counting_thread()
                x0 = tracker.timeline.mark() if (counting and tracker.timeline is not None) else None
                t0 = time.perf_counter()
                tracker._tls.depth = 1
            except Exception as e:
                tracker._on_error("Work.wait", e)
                return orig(work, *args, **kwargs)
            try:
                return orig(work, *args, **kwargs)
            finally:
                tracker._tls.depth = 0
                try:
                    t1 = time.perf_counter()
                    tracker._intervals.append((t0, t1))
                    tracker.fresh = True
                    if counting:
                        if tracker.timeline is not None:
                            tracker.timeline.push(XCOMM, x0, tracker.timeline.mark())
                        else:
                            tracker._exposed.append((t0, t1))
                            tracker.fresh = True
                except Exception as e:
                    tracker._on_error("Work.wait", e)

        return like(wait, orig, "wait")

    def install(self, patcher: Patcher) -> int:
        """Wrap the torch.distributed collectives and Work.wait. Returns how many were wrapped."""
        import torch.distributed as dist

        n = 0
        for name in COLLECTIVES:
            orig = getattr(dist, name, None)
            if orig is None or not callable(orig):
                continue
            if patcher.set(dist, name, self.wrap_collective(name, orig)):
                n += 1
        work_cls = getattr(dist, "Work", None) or getattr(torch_c10d(), "Work", None)
        if work_cls is not None and getattr(work_cls, "wait", None) is not None:
            patcher.set(work_cls, "wait", self.wrap_wait(work_cls.wait))
        if patcher.patched(dist, "isend") or patcher.patched(dist, "irecv"):
            p2p_ops_hold_originals(patcher)
        return n

    # ---------------------------------------------------------------- DDP
    def attach_ddp(self, ddp: Any, use_hook: bool, stats_every: int = 20) -> Optional["DDPStats"]:
        """Time DDP's gradient all-reduce.

        ``use_hook`` (CUDA): register our comm hook once (it cannot be removed: after unwatch it
        stays as the plain default all-reduce). Its ``then`` callbacks run inline on NCCL futures.
        Otherwise (gloo): read DDP's own C++ reducer timer (``DDPStats``, sampled): any Python comm hook
        costs about 0.4 ms of CPU per step on gloo (the future's callback and DDP's parsing of
        its result each take the GIL from another thread: +12% on a 7 ms 2-rank step here, with
        torch's own ``allreduce_hook``); reading the reducer's timer costs ~150 us per read, so it is
        read every ``stats_every``-th iteration and estimated in between (``DDPStats``).
        When the user already registered a comm hook, the wrapped collectives time that hook's
        calls (said once)."""
        if not use_hook:
            stats = DDPStats.attach(ddp, stats_every)
            if stats is None:
                log.warning("ranksight: this torch's DDP exposes no runtime stats; DDP's all-reduce is not timed")
            self.ddp_stats_backward = stats is not None
            return stats
        existing = getattr(ddp, "_ranksight_comm_hook", None)
        if existing is not None:
            existing.__ranksight_cell__[0] = self  # re-watch: point our hook at this tracker
            self.ddp_hooked = True
            return None
        if getattr(ddp, "_comm_hooks", None):
            log.warning("ranksight: this DDP model already has a comm hook; timing its collectives "
                        "through the wrapped torch.distributed calls instead")
            return None
        hook = make_ddp_hook([self])
        try:
            ddp.register_comm_hook(ddp.process_group, hook)
        except Exception as e:
            log.warning("ranksight: cannot register a DDP comm hook (%s); timing DDP's collectives "
                        "through the wrapped torch.distributed calls instead", str(e).splitlines()[0])
            return None
        try:
            ddp.__dict__["_ranksight_comm_hook"] = hook
        except Exception:
            pass
        self.ddp_hooked = True
        return None


class DDPStats:
    """DDP's reducer timer (CPU/gloo DDP), read every ``every``-th synchronized iteration; the
    iterations in between are estimated from the latest reads and this backward's own duration.

    During a sampled iteration DDP records (C++, wall-clock ns) when the first bucket's all-reduce
    launched, when the last gradient was computed and when the last all-reduce completed. DDP
    publishes them at the start of the next synchronized forward; ``poll()`` (when ``backward()``
    returns) publishes them at once (``set_runtime_stats_and_log``) and reads them: comm = last
    completion - first launch, exposed = last completion - max(last gradient, first launch).

    Why sampled: a read costs 50-120 us of the training thread (publishing the stats, copying
    DDP's logging data to Python), and at sample rate 1 DDP publishes them again in every forward:
    together about 150 us per iteration, most of the hooks' cost on a 6 ms 2-rank gloo step. DDP
    samples iterations 1-10 and every ``every``-th one after (its own default is every 100th).

    The estimate for an iteration that is not sampled: gradient computation takes about as long
    every iteration (same model, same shapes), waiting for communication does not. So
    exposed = this backward's duration - the gradient computation time of the recent samples
    (their median, host time: backward duration - exposed), clipped to [0, backward];
    comm = exposed + the recent samples' overlapped communication (comm - exposed), clipped to
    the backward. A rank that waits for a slow peer on one step shows the wait on that step.

    Which iterations DDP samples is known by counting: a sampled read returns DDP's iteration
    number, the watcher's forward pre-hook counts synchronized forwards after it (DDP's
    ``prepare_for_forward`` counts the same ones). A read that finds another iteration than the
    count predicted (forwards outside the hooks' sight) sets the rate to 1 until the next read.
    """

    DEFAULT_SAMPLE_RATE = 100  # DDP's kDDPRuntimeLoggingSampleRate, restored on close
    REF_SAMPLES = 5

    def __init__(self, ddp: Any, every: int = 20):
        self.ddp = ddp
        self.every = max(1, int(every))
        self.iteration: Optional[int] = None  # DDP's iteration of the current synchronized forward; None: unknown
        self._sync: Optional[bool] = None  # require_backward_grad_sync at the last forward (what DDP goes by)
        self._last_iter: Any = None
        self.samples = 0
        self.estimated = 0
        self.resyncs = 0
        self._compute: Deque[float] = deque(maxlen=self.REF_SAMPLES)
        self._overlap: Deque[float] = deque(maxlen=self.REF_SAMPLES)
        self._ref: Optional[Tuple[float, float]] = None  # (gradient computation, overlapped comm) seconds

    @classmethod
    def attach(cls, ddp: Any, every: int = 20) -> Optional["DDPStats"]:
        if not (hasattr(ddp, "_set_ddp_runtime_logging_sample_rate") and getattr(ddp, "logger", None) is not None):
            return None
        ddp._set_ddp_runtime_logging_sample_rate(1)  # until the first read tells the iteration number
        return cls(ddp, every)

    def on_forward(self) -> None:
        """A forward with grad enabled starts (the watcher's forward pre-hook)."""
        sync = self._sync = self.ddp.require_backward_grad_sync
        if sync and self.iteration is not None:
            self.iteration += 1

    def poll(self, bwd: float) -> Optional[Tuple[float, float]]:
        """(comm, exposed) seconds of the backward that just returned after ``bwd`` seconds, or None
        (no all-reduce in it, or nothing to go by yet)."""
        # no_sync() around the forward: no all-reduce in this backward (DDP decides in the forward)
        sync = self._sync
        if not (sync if sync is not None else self.ddp.require_backward_grad_sync):
            return None
        it = self.iteration
        if it is None or it <= 10 or it % self.every == 0:
            r = self._read(bwd)
            if r is not None:
                return r
        ref = self._ref
        if ref is None:
            return None
        self.estimated += 1
        x = bwd - ref[0]
        x = 0.0 if x < 0.0 else (bwd if x > bwd else x)
        c = x + ref[1]
        return (c if c < bwd else bwd), x

    def _read(self, bwd: float) -> Optional[Tuple[float, float]]:
        ddp = self.ddp
        ddp.logger.set_runtime_stats_and_log()
        d = ddp.logger._get_ddp_logging_data().ints_map
        it = d.get("iteration")
        if it is None or it == self._last_iter:
            if self.iteration is not None:
                self._resync()  # DDP did not sample the iteration the count predicted
            return None
        self._last_iter = it
        if self.iteration != it:
            if self.iteration is not None:
                self._resync()
                return None
            self.iteration = it  # rate 1 until now: this read tells DDP's iteration number
            if self.every > 1:
                ddp._set_ddp_runtime_logging_sample_rate(self.every)
        cs, ce, ke = d.get("backward_comm_time_start"), d.get("backward_comm_time_end"), d.get("backward_compute_time_end")
        if not cs or not ce or not ke or ce < cs:
            return None
        self.samples += 1
        comm, x = (ce - cs) / 1e9, max(0, ce - max(ke, cs)) / 1e9
        self._compute.append(max(0.0, bwd - x))
        self._overlap.append(max(0.0, comm - x))
        self._ref = (statistics.median(self._compute), statistics.median(self._overlap))
        return comm, x

    def _resync(self) -> None:
        self.resyncs += 1
        self.iteration = None
        self.ddp._set_ddp_runtime_logging_sample_rate(1)

    def close(self) -> None:
        self.ddp._set_ddp_runtime_logging_sample_rate(self.DEFAULT_SAMPLE_RATE)


def _bucket_value(f: Any) -> Any:
    return f.value()[0]


def make_ddp_hook(cell: List[CommTracker]) -> Callable:
    """DDP comm hook = the default all-reduce (divide by world size, then sum; what
    ``default_hooks.allreduce_hook`` does), calling the process group directly (no Python
    argument checks on the step path) and timed launch -> future completion by ``cell[0]``."""
    from torch.distributed import AllreduceOptions, ReduceOp

    opts = AllreduceOptions()
    opts.reduceOp = ReduceOp.SUM
    if hasattr(opts, "asyncOp"):
        opts.asyncOp = True

    def hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket / Future
        tensor = bucket.buffer()
        tensor.div_(state.size())
        tr = cell[0]
        tok = None
        if tr.active:
            try:
                tok, t0, _ = tr.launch(event=False, op="all_reduce", group=state)
            except Exception as e:
                tr._on_error("DDP comm hook", e)
                tok = None
        fut = state.allreduce([tensor], opts).get_future()
        if tok is None:
            return fut.then(_bucket_value)
        ev0 = tr.launched(t0)  # start event after the enqueue (see CommTracker.launch); never raises

        def done(f: Any) -> Any:
            try:
                tr.complete(tok, t0, ev0)
            except Exception as e:
                tr._on_error("DDP comm hook", e)
            return _bucket_value(f)

        return fut.then(done)

    hook.__ranksight_cell__ = cell  # type: ignore[attr-defined]
    hook.__qualname__ = hook.__name__ = "ranksight_allreduce_hook"
    return hook


def group_name(group: Any) -> str:
    """A process group's name as the Flight Recorder reports it (its description, else its name);
    "default_pg" for the default group (None)."""
    if group is None:
        return "default_pg"
    return str(getattr(group, "group_desc", "") or getattr(group, "group_name", "") or "group")[:128]


def _unwrapped(op: Any) -> Any:
    return getattr(op, "__wrapped__", op) if getattr(op, "__ranksight__", False) else op


def p2p_ops_hold_originals(patcher: Patcher) -> None:
    """``dist.P2POp(dist.isend, ...)`` while ``dist.isend`` is wrapped: ``P2POp`` checks its op by
    identity against ``distributed_c10d.isend``/``irecv`` (``_check_op``, and ``batch_isend_irecv``
    picks the peer keyword with ``op is isend``), so a P2POp made with a wrapper would raise. The
    check and the constructor are wrapped to take a wrapper's original: a P2POp holds the original
    function, made during the watch or not (its waits are still timed, by ``Work.wait``)."""
    import torch.distributed.distributed_c10d as c10d

    check = getattr(c10d, "_check_op", None)
    cls = getattr(c10d, "P2POp", None)
    if check is None or cls is None:
        return

    def _check_op(op: Any) -> None:
        return check(_unwrapped(op))

    init = cls.__init__

    def __init__(self: Any, op: Any, *args: Any, **kwargs: Any) -> None:
        init(self, _unwrapped(op), *args, **kwargs)

    patcher.set(c10d, "_check_op", like(_check_op, check, "_check_op"))
    patcher.set(cls, "__init__", like(__init__, init, "__init__"))


def torch_c10d() -> Any:
    import torch

    return torch._C._distributed_c10d


def _is_compiling_fn() -> Callable[[], bool]:
    try:
        import torch

        f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
        if f is not None:
            return f
    except Exception:
        pass
    return lambda: False


def _works(ret: Any) -> List[Any]:
    """The Work objects a collective returned (none for a synchronous call)."""
    if ret is None:
        return []
    W = getattr(torch_c10d(), "Work", None)
    if W is None:
        return []
    if isinstance(ret, W):
        if type(ret).__name__ == "_IllegalWork":  # inside a coalescing manager
            return []
        return [ret]
    if isinstance(ret, (list, tuple)) and ret and all(isinstance(w, W) for w in ret):
        return [w for w in ret if type(w).__name__ != "_IllegalWork"]
    return []


from .flight_recorder import FlightRecorder  # noqa: E402,F401 (public here)
