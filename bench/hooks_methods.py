"""The host time of each hook method per step, for ``ranksight bench hooks`` (``bench_hooks.py``
says what the table is) and ``bench/hooks_ab.py``: counting timers around the step path's methods
during one watched run of the trivial step, on CPU, on a stand-in CUDA timeline, or on the GPU."""
from __future__ import annotations

import statistics
import time
from typing import Any, Dict, List, Optional

# ------------------------------------------------------------------ host time in each hook method
# (module of ranksight.hooks, class or None for a module function, attribute): each is wrapped with a
# counting timer for one watched run. Nested calls (mark inside _fwd_pre, _step_end inside _opt_post)
# are subtracted from their caller: a row's "self" time is its own lines, and the rows' self times add
# up to the hooks' host time per step. The torch.autograd.backward wrapper is timed as "backward
# wrapper" with the real backward subtracted.
METHODS = (("steppath", "_TimedIter", "__next__"), ("steppath", None, "batch_work"),
           ("watcher", "Watcher", "_fwd_pre"), ("watcher", "Watcher", "_fwd_post"),
           ("watcher", "Watcher", "_bwd_done"), ("watcher", "Watcher", "_opt_pre"),
           ("watcher", "Watcher", "_opt_post"), ("watcher", "Watcher", "_step_boundary"),
           ("watcher", "Watcher", "_close_pending"), ("watcher", "Watcher", "_step_end"),
           ("watcher", "Watcher", "_reset_step"), ("watcher", "Watcher", "_sampled"),
           ("timing", "CudaTimeline", "step_end"), ("timing", "CudaTimeline", "mark"),
           ("timing", "CudaTimeline", "push"), ("timing", "CudaTimeline", "resolve"),
           ("comm", "CommTracker", "take"), ("comm", "DDPStats", "poll"), ("loss", "LossReader", "take"))
REAL_BACKWARD = "(torch.autograd.backward itself)"


class _MethodTimer:
    """Counting timers with a stack: each call's time (perf_counter_ns) goes to its row, and the
    whole span of a timed call, its timer included, is subtracted from the row of the timed call it
    is nested in. ``floor_ns``: what a timer reads around a call that does nothing (subtracted from
    every call); ``outer_ns``: the part of a timer its span does not see (entering and leaving the
    wrapper), subtracted from the caller once per nested call. Both from ``calibrate()``."""

    def __init__(self) -> None:
        self.rows: Dict[str, List[Any]] = {}  # name -> [calls, incl ns, self ns, per-call self ns, spans ns]
        self._stack: List[List[int]] = []  # per open call: [nested spans ns, nested calls]
        self.floor_ns = self.outer_ns = 0.0
        self.on = False

    def wrap(self, name: str, f: Any) -> Any:
        row = self.rows.setdefault(name, [0, 0, 0, [], []])
        stack, pc, me = self._stack, time.perf_counter_ns, self

        def timed(*a: Any, **k: Any) -> Any:
            t_in = pc()
            if not me.on:
                return f(*a, **k)
            stack.append([0, 0])
            t0 = pc()
            try:
                return f(*a, **k)
            finally:
                d = pc() - t0
                inner, n = stack.pop()
                own = d - inner - me.floor_ns - n * me.outer_ns
                row[0] += 1
                row[1] += d - me.floor_ns
                row[2] += own
                row[3].append(own)
                span = pc() - t_in
                row[4].append(span)
                if stack:
                    stack[-1][0] += span
                    stack[-1][1] += 1

        return timed

    def calibrate(self, n: int = 20000) -> None:
        """floor_ns and outer_ns from a method that does nothing, called wrapped and bare, each call
        timed from outside too: medians over the calls (a preempted call moves them little)."""
        class Nop:
            def f(self) -> None:
                return None

        bare = Nop().f
        probe = self.wrap("(calibration)", Nop.f)
        obj = Nop()
        pc = time.perf_counter_ns
        seen_bare, seen_wrapped = [], []
        self.on = True
        for _ in range(n):
            a = pc()
            bare()
            b = pc()
            probe(obj)
            c = pc()
            seen_bare.append(b - a)
            seen_wrapped.append(c - b)
        self.on = False
        row = self.rows.pop("(calibration)")
        med = statistics.median
        self.floor_ns = med(row[3])  # what the timer reads around a call that does nothing
        # what the caller sees of a timed call beyond the bare call, less the span the timer reports
        self.outer_ns = max(0.0, med(seen_wrapped) - med(seen_bare) - med(row[4]))


class _StandInCuda:
    """``torch.cuda`` as ``CudaTimeline`` uses it, for a machine without CUDA: an event is reached
    the moment it is recorded (an idle GPU). The step path's CUDA bookkeeping (marks, pushes,
    resolves, the GPU branch of the step end) then runs here; only the driver calls are missing
    (on the H200: create and record 6.6 us, a re-record 2.4 us, a query 0.7 us)."""

    def __init__(self, record_s: float = 0.0) -> None:
        self.cuda = self
        self.record_s = record_s  # > 0: each record busy-waits this long, as a driver call costs the host

    def current_stream(self, device: Any = None) -> None:
        return None

    def Event(self, enable_timing: bool = True) -> "_StandInEvent":  # noqa: N802 (torch.cuda.Event)
        return _CostlyStandInEvent(self.record_s) if self.record_s > 0 else _StandInEvent()


class _StandInEvent:
    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return self.t is not None

    def elapsed_time(self, end: "_StandInEvent") -> float:
        return (end.t - self.t) * 1e3


class _CostlyStandInEvent(_StandInEvent):
    """A stand-in event whose record busy-waits ``cost`` seconds first (a driver call's host time)."""
    __slots__ = ("cost",)

    def __init__(self, cost: float) -> None:
        super().__init__()
        self.cost = cost

    def record(self, stream: Any = None) -> None:
        end = time.perf_counter() + self.cost
        while time.perf_counter() < end:
            pass
        self.t = time.perf_counter()


def use_stand_in_timeline(w: Any, seed: Optional[int] = None, record_s: float = 0.0) -> Any:
    """The watch ``w`` times its steps on a ``CudaTimeline`` over the stand-in CUDA (its settings'
    sampled timing, ``seed`` for the timed steps' draws; ``record_s``: each event record's host
    cost) as it would on a GPU; returns the timeline. (bench/hooks_ab.py also runs commits whose
    timeline times every step and takes no more.)"""
    from ranksight.hooks.timing import CudaTimeline

    s = w.settings
    every = (getattr(s, "gpu_timing_every", 1), getattr(s, "gpu_timing_seconds", 0.0))
    extra = {} if seed is None else {"seed": seed}
    if every[0] == 0:
        extra["budget"] = s.gpu_timing_budget
    gpu = _StandInCuda(record_s)
    w._tl = w.comm.timeline = (CudaTimeline(gpu, "stand-in", s.max_pending_events, *every, **extra)
                               if every[0] != 1 else CudaTimeline(gpu, "stand-in", s.max_pending_events))
    w.comm.comm_events = True
    w._read_cuda_memory = lambda: None  # no torch.cuda here
    return w._tl


def table(steps: int, url: str, config: Dict[str, Any], timeline: str = "none") -> Dict[str, Any]:
    """One watched run of the trivial step with every METHODS entry wrapped (class attributes,
    patched before watch() binds them, restored after): host microseconds per step in each.
    ``timeline``: "none" (the CPU step), "stand-in" (the watch times the CPU step on a stand-in
    CUDA timeline, ``_StandInCuda``) or "cuda" (the step on the GPU: real events). The CUDA
    timelines time every step unless ``config`` says otherwise (``hooks.gpu_timing_every``): the
    rows are then what a timed step's bookkeeping costs, the same on every run (the default's
    automatic gap would follow each machine's event cost). "cuda-default" and "stand-in-default":
    the same with the hooks' default timing (the automatic gap), what a user's run pays per step. The
    trivial step is host-bound on a GPU (its kernels are far shorter than their launches), so
    the launch queue never fills and no row holds a wait for the GPU."""
    import importlib

    import torch
    import torch.nn as nn

    import ranksight

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device("cuda" if timeline.startswith("cuda") else "cpu")
    model = nn.Linear(8, 8).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    warm = 50
    data = [torch.randn(4, 8, device=dev)] * (steps + warm)
    hooks = dict(config.get("hooks", {}))
    if not timeline.endswith("-default"):
        hooks.setdefault("gpu_timing_every", 1)
    config = dict(config, hooks=hooks)
    mt = _MethodTimer()
    mt.calibrate()
    saved = []
    for mod_name, cls_name, attr in METHODS:
        mod = importlib.import_module(f"ranksight.hooks.{mod_name}")
        owner = getattr(mod, cls_name, None) if cls_name else mod
        orig = getattr(owner, attr, None) if owner is not None else None
        if orig is None:
            continue
        saved.append((owner, attr, owner.__dict__.get(attr)))
        setattr(owner, attr, mt.wrap(f"{cls_name}.{attr}" if cls_name else attr, orig))
    try:
        loader = ranksight.watch(model, opt, data, agent=url, config=config)
        w = ranksight.hooks.current()
        every = w.settings.gpu_timing_every if w is not None else hooks.get("gpu_timing_every", 0)
        if timeline.startswith("stand-in") and w is not None:
            use_stand_in_timeline(w)
        patched = torch.autograd.backward
        if w is not None:  # the hooks' backward wrapper around a timed real backward
            real = mt.wrap(REAL_BACKWARD, getattr(patched, "__wrapped__", patched))
            torch.autograd.backward = mt.wrap("backward wrapper", w._wrap_backward(real))
        try:
            it = iter(loader)
            for _ in range(warm):
                model(next(it)).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            mt.on = True
            for x in it:
                model(x).sum().backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            mt.on = False
        finally:
            torch.autograd.backward = patched
            ranksight.unwatch()
    finally:
        for owner, attr, own in saved:
            if own is None:
                delattr(owner, attr)
            else:
                setattr(owner, attr, own)
    rows = []
    for name, (calls, incl, own, per, _) in mt.rows.items():
        if not calls or name == REAL_BACKWARD:
            continue
        p50 = max(0.0, statistics.median(per)) / 1e3
        rows.append({"method": name, "calls_per_step": round(calls / steps, 3),
                     "us_per_step": round(max(0.0, own) / steps / 1e3, 2),
                     "us_per_step_p50": round(p50 * calls / steps, 2),
                     "us_per_step_incl": round(max(0.0, incl) / steps / 1e3, 2), "us_per_call_p50": round(p50, 2)})
    rows.sort(key=lambda r: -r["us_per_step_p50"])
    tl = getattr(w, "_tl", None)  # (None on the CPU step: no CUDA, no stand-in)
    return {"steps": steps, "gpu": timeline, "gpu_timing_every": every, "rows": rows,
            "gap": getattr(tl, "every", None),  # (the timeline's mean gap at the end; None: no timeline)
            "total_us_per_step": round(sum(r["us_per_step"] for r in rows), 2),
            "total_us_per_step_p50": round(sum(r["us_per_step_p50"] for r in rows), 2),
            "timer_floor_ns": round(mt.floor_ns, 1), "timer_outer_ns": round(mt.outer_ns, 1)}


def timelines() -> List[str]:
    """The method tables: the CPU step, the stand-in CUDA timeline and, where CUDA is, the GPU step; each
    CUDA timeline with every step timed and with the default timing."""
    import torch

    return ["none", "stand-in", "stand-in-default"] + (["cuda", "cuda-default"] if torch.cuda.is_available() else [])


def print_table(m: Dict[str, Any]) -> None:
    every = m.get("gpu_timing_every", 1)
    timed = ("every step timed" if every == 1 else f"the mean gap from the events' cost, {m.get('gap')} at the end"
             if every == 0 else f"one step in {every}")
    gpu = {"stand-in": f"a stand-in CUDA timeline (no driver calls, {timed})",
           "stand-in-default": f"a stand-in CUDA timeline (no driver calls, the default timing: {timed})",
           "cuda": f"on the GPU (real CUDA events, {timed})",
           "cuda-default": f"on the GPU (real CUDA events, the default timing: {timed})"}.get(m["gpu"], "CPU timing")
    print(f"host time in each hook method, one watched run of {m['steps']} trivial steps, {gpu} (counting "
          f"timers, their own cost subtracted: {m['timer_floor_ns']:.0f} ns a call, {m['timer_outer_ns']:.0f} ns "
          f"more for its caller); self time, nested calls in their own rows:")
    print(f"  {'method':28s} {'calls/step':>10s} {'us/step p50':>11s} {'us/step mean':>12s} {'incl. mean':>10s}")
    for r in m["rows"]:
        print(f"  {r['method']:28s} {r['calls_per_step']:10.2f} {r['us_per_step_p50']:11.2f} {r['us_per_step']:12.2f} "
              f"{r['us_per_step_incl']:10.2f}")
    print(f"  {'total':28s} {'':10s} {m['total_us_per_step_p50']:11.2f} {m['total_us_per_step']:12.2f}")
    print("  (p50: the median call's time x calls per step, robust to preemption on a shared box; mean: every call)")
