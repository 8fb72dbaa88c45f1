"""The Watcher: PyTorch hooks that time each optimizer step, and the background thread that
sends what they measure.

Layout: this module holds the API (``watch``/``start``/``unwatch``, settings) and the watch's
set-up and extension points; ``steppath.py`` the hooks on the step path (``StepPath``),
``sender.py`` the background thread (``Background``), ``closing.py`` the end of the watch
(``Closing``: ``close()``), ``active_watch.py`` the active watch; ``Watcher`` combines them.

Step path (main thread, a few microseconds per hook):
  loader ``__next__``   data wait (time inside ``next()`` on the returned loader's iterator)
  forward pre/post      forward time; counts micro-batches (forwards with grad enabled)
  ``torch.autograd.backward`` (patched, reversibly; ``Tensor.backward`` calls it)
                        backward start and ``backward()`` return. Gradient computation ends at
                        the last collective launched inside the backward (DDP bucket on CUDA,
                        FSDP reduce-scatter) or, for gloo DDP, where DDP's reducer timer says;
                        from there to the return is exposed communication (see ``comm.py``).
                        Why a patch and not an autograd hook: any Python hook
                        that fires inside the autograd graph (a tensor/grad_fn hook on the
                        output, a final callback) measured 10-15 us per backward on this
                        machine, half of the 30 us budget; the wrapper costs about 1 us.
  optimizer pre/post    optimizer time; the post-hook closes the step (step boundary). Optimizers
                        found by ``auto.py`` (``watch()`` given none) leave it open until the next
                        iteration's first fetch: several optimizers in one iteration make one step
See ``comm.py`` for the communication definitions and ``checkpoint.py`` for checkpoints.

On CUDA the forward/backward/optimizer/exposed-comm spans are CUDA events recorded on the
current stream and resolved on later steps with ``query()`` (``timing.CudaTimeline``);
data wait, checkpoint and step duration are host times. Nothing here synchronizes the
device. ``close()`` sends the intervals of the last steps and then the "bye", every step
before it (see ``closing.py``).

The step path only appends a tuple to a deque. The background thread ("ranksight-hb")
turns tuples into datagrams, sends a heartbeat every ``hooks.heartbeat_seconds`` with the
current phase, the age of the oldest in-flight collective and the main-thread liveness
probe, prints the rank-0 console table, reads CUDA allocator stats and the Flight Recorder.
Every hook body catches its exceptions: they are counted (``herr``), logged once, and never
reach the training loop.

Patched while watched, restored by ``unwatch()``: ``torch.autograd.backward``, the
``torch.distributed`` collectives and ``Work.wait`` (``comm.py``), ``torch.save`` and the
``torch.distributed.checkpoint`` saves (``checkpoint.py``), ``torch.load`` (``resume.py``). A CUDA DDP model gets a comm hook
(the default all-reduce, timed); DDP cannot remove a comm hook, so after ``unwatch()`` it stays
as a plain pass-through all-reduce.
"""
from __future__ import annotations

import atexit
import logging
import os
import random
import sys
import threading
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, List, Optional

import torch

from ranksight import protocol
from ranksight.totals import Totals

from .active_watch import _ACTIVE, active
from .checkpoint import CheckpointTimer, Recorder, atomic_write
from .resume import Resume, ResumeWatch  # noqa: F401 (public here)
from .closing import (BYE_COPIES, CLOSE_GPU_MAX, CLOSE_GPU_WAIT, JOIN_SECONDS, SEND_LOCK_WAIT,  # noqa: F401 (public here)
                      Closing)
from .comm import CommTracker, FlightRecorder
from .copysafe import CopySafe
from .identity import Identity
from .loss import LossReader
from . import parallel
from .patch import Patcher
from .timing import BWD, COMM, FWD, OPT, PBUSY, SPAN, XCOMM, CudaTimeline, SpanShares
from .settings import Settings, load_settings  # noqa: F401 (public here)
from .sender import LAYOUT, STEPS_PER_RECORD, TICK_SECONDS, Background, enc_fields  # noqa: F401 (public here)
from .steppath import QUEUE_CAP, StepPath, WatchedLoader, _TimedIter, timed_next  # noqa: F401 (public here)

log = logging.getLogger("ranksight.hooks")

_perf = time.perf_counter


def _first_param_device(model: Any) -> Optional[torch.device]:
    try:
        for p in model.parameters():
            return p.device
    except Exception:
        pass
    return None


def _unwrap(model: Any) -> Any:
    return getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule


# ------------------------------------------------------------------------------ watcher
class Watcher(StepPath, Background, Closing):
    """One active watch. Public for extensions (lints) and tests:

    ``model``, ``optimizer``, ``loader`` (the user's objects), ``process_group`` (the default
    group or None), ``identity``, ``settings``, ``parallel`` and ``set_parallel(strategy,
    zero_stage)`` (how the model is parallelized, sent in the hello), ``stats()``, ``send_lint(id, active, msg)``,
    ``add_checkpoint_observer(fn)`` (``fn(src, obj, path)``), ``add_resume_observer(fn)``
    (``fn(resume)``, a checkpoint restore, ``hooks/resume.py``), ``add_epoch_observer(fn)``
    (``fn(loader)`` when an iteration over the loader starts), ``add_periodic(fn, seconds)``
    (runs on the background thread), ``add_close_callback(fn)`` (runs once in ``close()``),
    ``close()``. ``watch()`` calls ``ranksight.hooks.lints.attach(watcher)`` when that module exists.
    """

    def __init__(self, model: Any, optimizer: Any, loader: Any, settings: Settings, *, discover: bool = False,
                 forward_hooks: bool = True):
        self.model = model
        self.optimizer = optimizer
        self.loader = loader
        self.settings = settings
        # discovery of what was not given (``auto.py``), the step boundary of discovered optimizers
        self._forward_hooks = forward_hooks
        self._in_fetch = self._fetched = self._fwd_seen = False
        self.data_paused = False  # set by an integration while the framework evaluates: its fetches are no data wait
        self._pending_t: Optional[float] = None
        self._ckpt_pending = 0.0
        self._defer_steps = discover and optimizer is None
        self.discovery: Any = None
        if discover and (model is None or optimizer is None or loader is None):
            from .auto import Discovery

            self.discovery = Discovery(self, model is None, optimizer is None, loader is None)
        self.parallel: Dict[str, str] = {}  # the hello's "strategy" and "zero_stage" (parallel.py)
        self._hello_parallel: Dict[str, str] = {}
        self.identity = Identity.detect()
        self._main_tid = threading.main_thread().ident or threading.get_ident()
        self._active = True
        self._closed = False
        self._lock = threading.Lock()
        # counters
        self.herr = 0
        self.qdrop = 0
        self._err_logged: set = set()
        # step-path state (main thread)
        self._t_start = _perf()
        self._t0: Optional[float] = None
        self._data = self._fwd = self._bwd = self._opt = self._ckpt = self._b2o = 0.0
        self._dcomm = self._dx = 0.0  # gloo DDP's all-reduce this step (DDPStats), comm and exposed
        # a pipeline stage's compute, schedule time and P2P waits this step (hooks/pipeline.py), and
        # (pipeline rank, pipeline ranks, micro-batches per step x local stages); (0, 0, 0): no pipeline
        self._pbusy = self._pstep = self._pwprev = self._pwnext = 0.0
        self._pipe = (0, 0, 0)
        self.pipeline: Any = None  # hooks/pipeline.py PipelineTimer
        self._micro = self._samples = self._tokens = self._lossn = 0
        self._seq_len = 0  # T: tokens per sample of the first batch with tokens (the FLOPs estimate's)
        self._flops: Any = None  # hooks/flops.py FlopsPerToken, made when the background thread starts
        self._loss = 0.0  # the finite training losses read this step (hooks/loss.py), and their count
        self.losses = LossReader(self._add_loss)
        self._seq = 0
        self._t_fwd: Optional[float] = None
        self._t_bwd: Optional[float] = None
        self._t_opt: Optional[float] = None
        self._phase = "idle"
        self._phase_t = self._t_start
        self._ev_fwd = self._ev_opt = None
        self._gacc: Dict[str, float] = {FWD: 0.0, BWD: 0.0, OPT: 0.0, XCOMM: 0.0, COMM: 0.0, PBUSY: 0.0}
        # sampled timing (CudaTimeline.sampled): the timed step being resolved (its phases'
        # seconds and its SPAN), and the phases' shares of the span over the latest resolved ones
        self._gwin: Dict[str, float] = dict(self._gacc, **{SPAN: 0.0})
        self._gshare: Dict[str, float] = dict(self._gacc)
        self._gshares = SpanShares(self._gshare)
        self._gknown = False  # a timed step resolved: the shares hold
        self._gfast: Optional[tuple] = None  # the shares as a tuple while no phase carries seconds (_sampled)
        self._queue: Deque[tuple] = deque()
        self.sess = random.getrandbits(31)  # protocol v2 "sess": this watch, told apart from others in the process
        self.totals = Totals()
        self._held: Optional[tuple] = None  # the step record the background thread holds back (CUDA)
        self._steps_fill = protocol.STEPS_FILL_FIRST  # steps one "steps" datagram holds (measured on every record sent)
        # taking queued records and sending them is one critical section (background thread, close());
        # after close() sent the bye (_bye_sent) nothing else is sent
        self._send_lock = threading.RLock()  # (close() may run on the background thread itself)
        self._bye_sent = False
        self.gpu_unsent = 0.0  # GPU seconds close() could not send (no step record left to carry them)
        self.gpu_wait_s = 0.0  # how long close() waited for the last GPU intervals
        # extension points
        self._epoch_observers: List[Callable[[Any], None]] = []
        self._periodic: List[List[Any]] = []  # [fn, every, next_due]
        self._close_callbacks: List[Callable[[], None]] = []
        # GPU timing
        self.backend = self._backend()
        self._tl: Optional[CudaTimeline] = None
        dev = self._cuda_device(model)
        if dev is not None:
            self._tl = self._timeline(dev)
        # the Flight Recorder: in-flight collectives for the heartbeat (any backend it records),
        # and NCCL collective durations when TORCH_NCCL_ENABLE_TIMING=1 (self._fr)
        self._fr_status: Optional[FlightRecorder] = None
        self._fr: Optional[FlightRecorder] = None
        if self.backend:
            fr = FlightRecorder(self.backend)
            if fr.available:
                self._fr_status = fr
                if FlightRecorder.wanted(self.backend):
                    self._fr = fr
        self._ddp_stats: Any = None
        # patches and hooks
        self._patcher = Patcher()
        self._handles: List[Any] = []
        # CUDA events time collectives until the Flight Recorder proves it records them (entries with
        # durations: TORCH_NCCL_ENABLE_TIMING=1 and a non-zero trace buffer); then it takes over
        self._fr_on = False
        self.comm = CommTracker(self._hook_error, self._main_tid, self._tl, comm_events=True)
        self.ckpt = Recorder(self._emit_ckpt, self._add_ckpt, self._set_phase, self._hook_error, self._main_tid)
        self.resumes = ResumeWatch(self._hook_error)  # checkpoint restores (hooks/resume.py)
        self.total_steps = settings.total_steps  # the run's length (0: unknown); watch(total_steps=), a callback
        self._dcp_patched = False
        self._install()
        # background thread: wakes TICK_SECONDS (or twice per heartbeat) to send, probe and print
        self._tick_s = min(TICK_SECONDS, settings.heartbeat_seconds / 2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ranksight-hb", daemon=True)
        self._thread.start()
        atexit.register(self.close)
        try:  # forked multiprocessing children skip atexit but run these finalizers
            import multiprocessing.util as mpu

            self._finalizer = mpu.Finalize(self, Watcher._final_close, args=(self,), exitpriority=10)
        except Exception:
            self._finalizer = None

    # ------------------------------------------------------------------ setup
    @staticmethod
    def _backend() -> str:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return str(dist.get_backend())
        except Exception:
            pass
        return ""

    def _cuda_device(self, model: Any) -> Optional[torch.device]:
        try:
            if not torch.cuda.is_available():
                return None
            dev = _first_param_device(model) if model is not None else None
            if dev is not None:
                return dev if dev.type == "cuda" else None
            if torch.cuda.is_initialized() and "nccl" in self.backend:
                return torch.device("cuda", torch.cuda.current_device())
        except Exception as e:
            self._hook_error("CUDA detection", e)
        return None

    def _install(self) -> None:
        model, opt = self.model, self.optimizer
        if opt is not None:
            if not hasattr(opt, "register_step_post_hook"):
                log.warning("ranksight: the optimizer has no step hooks (torch >= 2.0 needed); no step records")
            else:
                self._handles.append(opt.register_step_pre_hook(self._opt_pre))
                self._handles.append(opt.register_step_post_hook(self._opt_post))
            self.resumes.attach_optimizer(opt, self._handles)
        elif self.discovery is None:
            log.warning("ranksight: watch() got no optimizer; a step is one optimizer step, so no step records")
        if model is not None or opt is not None or self.discovery is not None:
            self._patcher.set(torch.autograd, "backward", self._wrap_backward(torch.autograd.backward))
        try:
            import torch.distributed as dist

            if dist.is_available():
                self.comm.install(self._patcher)
        except Exception as e:
            self._hook_error("communication setup", e)
        if model is not None:
            self._attach_model(model)
        if self.discovery is not None:
            self.discovery.install(self._patcher, self._handles)
        if self.settings.patch_torch_save:
            try:
                self.ckpt.install(self._patcher)
                self.resumes.install(self._patcher)
                self._dcp_patched = self._patcher.patched(sys.modules.get("torch.distributed.checkpoint"), "save")
            except Exception as e:
                self._hook_error("checkpoint setup", e)

    def _timeline(self, dev: Any) -> CudaTimeline:
        s = self.settings
        return CudaTimeline(torch, dev, s.max_pending_events, s.gpu_timing_every, s.gpu_timing_seconds,
                            budget=s.gpu_timing_budget)

    def _attach_model(self, model: Any) -> None:
        """Time ``model``'s forward (its module hooks, unless a framework callback drives
        ``_fwd_pre``/``_fwd_post`` itself) and its DDP all-reduce. At ``watch()`` for a model that
        was given, at the end of the first step for one that ``auto.Discovery`` found."""
        self.model = model
        if self._tl is None:  # a model found after watch(): CUDA may have started since
            dev = self._cuda_device(model)
            if dev is not None:
                self._tl = self._timeline(dev)
                self.comm.timeline = self._tl
                self.comm.comm_events = not self._fr_on
        try:
            self.resumes.attach_model(model, self._handles)
        except Exception as e:
            self._hook_error("resume setup", e)
        try:
            self.parallel = parallel.describe(model)
        except Exception as e:
            self._hook_error("parallel strategy", e)
        if not hasattr(model, "register_forward_pre_hook"):
            log.warning("ranksight: the model is not an nn.Module; forward/backward are not timed")
        elif self._forward_hooks:
            self._handles.append(model.register_forward_pre_hook(CopySafe(self._fwd_pre), prepend=True))
            self._handles.append(model.register_forward_hook(CopySafe(self._fwd_post), prepend=True))
        try:
            import torch.distributed as dist

            if dist.is_available():
                from torch.nn.parallel import DistributedDataParallel as DDP

                inner = _unwrap(model)
                if isinstance(inner, DDP):
                    self._ddp_stats = self.comm.attach_ddp(inner, use_hook=self._tl is not None,
                                                           stats_every=self.settings.ddp_stats_every)
        except Exception as e:
            self._hook_error("communication setup", e)

    # ------------------------------------------------------------------ errors, phase
    def _hook_error(self, where: str, exc: BaseException) -> None:
        self.herr += 1
        if where not in self._err_logged:
            self._err_logged.add(where)
            log.warning("ranksight: %s raised %s: %s (counted as a hook error; training continues)",
                        where, type(exc).__name__, exc)
            log.debug("ranksight: %s traceback", where, exc_info=exc)

    def _set_phase(self, phase: str) -> str:
        old = self._phase
        self._phase = phase
        self._phase_t = _perf()
        return old

    # ------------------------------------------------------------------ extension points
    @property
    def process_group(self) -> Any:
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.group.WORLD
        except Exception:
            pass
        return None

    def send_lint(self, lint_id: str, active: bool, msg: str = "", **extra: Any) -> None:
        """Queue a "lint" record (sent by the background thread). ``extra``: the lint's own fields
        (``gbatch``/``lrate`` for global_batch_lr, see ranksight.protocol). Never raises."""
        try:
            rec = {"t": "lint", "lint": str(lint_id)[:64], "active": bool(active), "msg": str(msg)[: protocol.MAX_MSG]}
            rec.update(extra)
            self._enqueue(("lint", time.time(), rec))
        except Exception as e:
            self._hook_error("send_lint", e)

    def add_checkpoint_observer(self, fn: Callable[[str, Any, Optional[str]], None]) -> None:
        self.ckpt.observers.append(fn)

    def set_total_steps(self, n: Any) -> None:
        """The run's total optimizer steps (a positive whole number; anything else leaves it as it
        is, with one warning). Sent with each step record as ``"total"``. Never raises."""
        try:
            v = int(n)
            if v != n or v <= 0 or v > 10 ** 15:
                raise ValueError(f"expected a positive whole number, got {n!r}")
            self.total_steps = v
        except Exception as e:
            self._hook_error("total_steps", e)

    def add_resume_observer(self, fn: Callable[[Resume], None]) -> None:
        """``fn(resume)`` on the loading thread when the watched model is restored from a
        checkpoint (``hooks/resume.py``)."""
        self.resumes.observers.append(fn)

    def add_epoch_observer(self, fn: Callable[[Any], None]) -> None:
        self._epoch_observers.append(fn)

    def add_periodic(self, fn: Callable[[], None], every_seconds: float) -> None:
        self._periodic.append([fn, float(every_seconds), 0.0])

    def add_close_callback(self, fn: Callable[[], None]) -> None:
        """``fn()`` runs once in ``close()``, after the hooks are removed and before the final
        flush (records it queues, e.g. ``send_lint``, still go out)."""
        self._close_callbacks.append(fn)

    def set_parallel(self, strategy: str, zero_stage: str = "") -> None:
        """How the model is parallelized, when the watch cannot read it from the model's type (a
        pipeline schedule): one of ``catalog.PARALLEL_STRATEGIES`` and DeepSpeed's ZeRO stage or "".
        The hello is sent again with it."""
        self.parallel = {"strategy": str(strategy), "zero_stage": str(zero_stage)}

    def checkpoint_timer(self, path: Any = None, nbytes: Optional[int] = None, obj: Any = None) -> CheckpointTimer:
        return CheckpointTimer(self.ckpt if self._active else None, path, nbytes, obj)

    def stats(self) -> Dict[str, Any]:
        tr = getattr(self, "_transport", None)
        ds = self._ddp_stats
        return {"steps": self._seq, "herr": self.herr, "hdrop": self._tl.dropped if self._tl else 0,
                "qdrop": self.qdrop, "sent": tr.sent if tr else 0, "send_errors": tr.errors if tr else 0,
                "ddp_comm_hook": self.comm.ddp_hooked, "gpu": self._tl is not None,
                "gpu_every": self._tl.every if self._tl is not None else 0,
                "flight_recorder": self._fr_on, "ddp_stats": self._ddp_stats is not None, "phase": self._phase,
                "ddp_stats_read": ds.samples if ds else 0, "ddp_stats_estimated": ds.estimated if ds else 0,
                "ddp_stats_resyncs": ds.resyncs if ds else 0, "gpu_unsent": self.gpu_unsent,
                "loss_nonfinite": self.losses.nonfinite, "loss_in_flight": self.losses.in_flight(),
                "loss_dropped": self.losses.dropped, "loss_out_of_range": self.losses.out_of_range}


# ------------------------------------------------------------------------------ the API
def watch(model: Any = None, optimizer: Any = None, loader: Any = None, *, config: Any = None,
          agent: Optional[str] = None, discover: bool = True, total_steps: Optional[int] = None) -> WatchedLoader:
    """Start timing ``model``/``optimizer``/``loader``; returns the loader to iterate.

    What is not given is found (``discover``, see ``auto.py``): every optimizer through PyTorch's
    global optimizer step hooks, every DataLoader iterator, and the model (a DDP/FSDP wrapper or
    the module whose parameters the optimizer holds). Explicit arguments win: a given optimizer,
    loader or model is the only one timed. ``ranksight.watch()`` alone finds all three.
    ``config``: a config path (default ``RANKSIGHT_CONFIG``) or a dict with a "hooks" section.
    ``agent``: overrides ``RANKSIGHT_AGENT`` / ``hooks.agent`` (``udp://host:port``,
    ``unix:///path`` or ``off``). ``total_steps``: the optimizer steps the whole run is to take,
    across restarts (over ``hooks.total_steps``), for its ETA and cost. A second ``watch()``
    replaces the first. A DeepSpeed engine as ``model`` is watched through the engine
    (``deepspeed_engine.py``): its model steps are the steps, whatever ``optimizer`` is.
    """
    w = start(model, optimizer, loader, config=config, agent=agent, discover=discover, total_steps=total_steps)
    return WatchedLoader(loader, w)


def start(model: Any = None, optimizer: Any = None, loader: Any = None, *, config: Any = None,
          agent: Optional[str] = None, discover: bool = True, forward_hooks: bool = True,
          total_steps: Optional[int] = None) -> Optional[Watcher]:
    """``watch()`` for framework integrations: returns the Watcher (None when the hooks could not
    start). ``forward_hooks=False``: the caller drives ``_fwd_pre``/``_fwd_post`` (a framework's
    batch callbacks) instead of the model's forward hooks. A DeepSpeed engine as ``model`` is
    watched through the engine, as ``watch()`` does."""
    from . import deepspeed_engine as ds

    prev = active()
    if prev is not None:
        log.info("ranksight: watch() called again; replacing the previous watch")
        prev.close()
    engine = model if model is not None and ds.is_engine(model) else None
    try:
        settings = load_settings(config, agent)
        steps = ds.EngineSteps(engine) if engine is not None else None
        w = Watcher(model, steps if steps is not None else optimizer, loader, settings, discover=discover,
                    forward_hooks=forward_hooks)
        w.config_source = config  # the lints (ranksight.hooks.lints) read their section from the same config
        if total_steps is not None:
            w.set_total_steps(total_steps)
    except Exception as e:  # never stop training because the hooks could not start
        log.warning("ranksight: cannot start the hooks (%s: %s); training continues unwatched",
                    type(e).__name__, e)
        log.debug("ranksight: watch() traceback", exc_info=e)
        return None
    _ACTIVE.append(w)
    if steps is not None:
        ds.attach_engine(w, engine, steps)
    _attach_extensions(w)
    return w


def _attach_extensions(w: Watcher) -> None:
    """Extension point: a ``ranksight.hooks.lints`` module with ``attach(watcher)`` is called here."""
    import importlib
    import importlib.util

    name = __name__.rsplit(".", 1)[0] + ".lints"
    try:
        if importlib.util.find_spec(name) is None:
            return
        mod = importlib.import_module(name)
        attach = getattr(mod, "attach", None)
        if attach is not None:
            attach(w)
    except Exception as e:
        w._hook_error("lints attach", e)


def unwatch() -> None:
    """Remove every hook and patch of the active watch (no-op when none)."""
    w = active()
    if w is not None:
        w.close()


def loss(value: Any) -> None:
    """``ranksight.loss(loss)``: record this step's training loss (a tensor or a number; call it
    once per micro-batch or once per step). A CUDA tensor is read a step or more later, once its
    copy to the host completed: no synchronization. A NaN or infinite loss is counted and its step
    reported. Does nothing unwatched; never raises."""
    w = active()
    if w is not None:
        w.record_loss(value)


def checkpoint_timer(path: Any = None, nbytes: Optional[int] = None, obj: Any = None) -> CheckpointTimer:
    """``with ranksight.checkpoint_timer(path):`` records one checkpoint write (works unwatched too)."""
    w = active()
    return CheckpointTimer(w.ckpt if w is not None and w._active else None, path, nbytes, obj)


def atomic_save(obj: Any, path: Any, **kwargs: Any) -> int:
    """``torch.save(obj, path)`` done atomically: temporary file in the same directory, fsync,
    ``os.replace``, fsync of the directory. Recorded as a checkpoint write ("atomic_save") while
    watched. Returns the bytes written; errors reach the caller unchanged."""
    save = torch.save
    save = getattr(save, "__wrapped__", save) if getattr(save, "__ranksight__", False) else save
    w = active()
    rec = w.ckpt if w is not None and w._active else None
    tok = rec.begin("atomic_save", obj, os.fspath(path)) if rec is not None else None
    try:
        n = atomic_write(save, obj, path, **kwargs)
    except BaseException:
        if rec is not None:
            rec.end(tok, False, 0)
        raise
    if rec is not None:
        rec.end(tok, True, n)
    return n
