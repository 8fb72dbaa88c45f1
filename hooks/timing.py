"""Timing primitives: interval unions on the host, CUDA events resolved late on the GPU.

Rules for the GPU path (checked on an H200 under ``torch.cuda.set_sync_debug_mode("error")``):
the hooks only ``record()`` events on the current stream and later ``query()`` them;
``elapsed_time()`` is called only on events whose ``query()`` returned True. Nothing
synchronizes the device, nothing calls ``.item()``. The pending queue is bounded:
when it is full, a new interval is dropped and counted (``dropped``, sent as ``hdrop``).
"""
from __future__ import annotations

import math
import random
import time
from collections import deque
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Tuple


def union_seconds(intervals: Iterable[Tuple[float, float]], lo: float, hi: float) -> float:
    """Length of the union of [a, b] intervals, clipped to [lo, hi]."""
    spans: List[Tuple[float, float]] = []
    for a, b in intervals:
        a = lo if a < lo else a
        b = hi if b > hi else b
        if b > a:
            spans.append((a, b))
    if not spans:
        return 0.0
    spans.sort()
    total = 0.0
    cur_a, cur_b = spans[0]
    for a, b in spans[1:]:
        if a > cur_b:
            total += cur_b - cur_a
            cur_a, cur_b = a, b
        elif b > cur_b:
            cur_b = b
    return total + (cur_b - cur_a)


def drain(q: Deque[Any]) -> List[Any]:
    """Pop everything currently in a deque that other threads append to (append/popleft are atomic)."""
    out = []
    pop = q.popleft
    try:
        while True:
            out.append(pop())
    except IndexError:
        return out


class IntervalSet:
    """Covered spans on one time axis. ``add(a, b)`` returns the part of [a, b] not covered yet,
    in any arrival order; spans older than ``horizon`` seconds before the newest end are forgotten."""

    def __init__(self, horizon: float = 300.0):
        self._spans: List[List[float]] = []  # sorted, disjoint [a, b]
        self.horizon = horizon

    def add(self, a: float, b: float) -> float:
        if not b > a:
            return 0.0
        new = b - a
        keep: List[List[float]] = []
        lo, hi = a, b
        for s in self._spans:
            if s[1] < a or s[0] > b:
                keep.append(s)
                continue
            new -= min(b, s[1]) - max(a, s[0])  # existing spans are disjoint: subtract each overlap
            lo, hi = min(lo, s[0]), max(hi, s[1])
        keep.append([lo, hi])
        keep.sort()
        cut = keep[-1][1] - self.horizon
        self._spans = [s for s in keep if s[1] >= cut]
        return new if new > 0 else 0.0


def driver_recorder(torch_mod: Any, device: Any) -> Optional[Callable[[Any], bool]]:
    """A function that records an existing CUDA event again on the device's current stream with
    the driver's ``cuEventRecord``, called through ``ctypes.PyDLL`` so the GIL stays held, and
    returns True; False when it could not (then the caller uses ``Event.record``).

    ``Event.record`` releases the GIL around the driver call and takes it back after: inside a
    training loop whose other threads (a DataLoader's pin-memory thread, the hooks' background
    thread) wait for the GIL, taking it back waits for them, so one record costs several times
    its tight-loop cost. The driver call itself is short and never blocks, so holding the GIL
    through it is cheaper. The event must have been recorded once by torch (which creates it and
    marks it recorded for ``query()`` and ``elapsed_time()``); the stream is torch's current raw
    stream for the device, the one ``Event.record`` would use. Any error from the driver (a
    context that is not the event's, no driver library) returns False, and torch's own record
    raises or succeeds as it always did. None when the driver API cannot be reached."""
    try:
        import ctypes

        fn = ctypes.PyDLL("libcuda.so.1").cuEventRecord
        fn.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        fn.restype = ctypes.c_int
        raw_stream = torch_mod._C._cuda_getCurrentRawStream
        index = device.index if getattr(device, "index", None) is not None else torch_mod.cuda.current_device()
        raw_stream(index)
    except Exception:  # no libcuda, a torch without the call, no CUDA device: torch's record only
        return None

    def rerecord(ev: Any) -> bool:
        h = ev.cuda_event
        return bool(h) and fn(h, raw_stream(index)) == 0

    return rerecord


# Interval kinds the GPU timeline resolves. COMM and XCOMM are unions (overlaps counted once).
FWD, BWD, OPT, XCOMM, COMM = "fwd", "bwd", "opt", "xcomm", "comm"
PBUSY = "pbusy"  # a pipeline stage's compute chunk (hooks/pipeline.py)
UNION_KINDS = (COMM, XCOMM)
# Sampled timing: a timed step's GPU span, from an event at its start to one at its end (the GPU
# time the step took, idle gaps included); its phases' seconds over it are the step's shares
SPAN = "span"
_perf = time.perf_counter
# Sampled timing: the shares are the sums of the phases of the timed steps that ended in the last
# this many seconds over the sum of their spans (SpanShares), of at most SHARE_ROWS timed steps: a
# sixth of the default 5 m rate window the rules read the phases over
SHARE_WINDOW_S = 30.0
SHARE_ROWS = 1024
# Automatic sampled timing (every 0): the mean gap between timed steps is kept at most this
AUTO_MAX_EVERY = 256
# ... and follows the cost of a timed step and the step time through moving averages of this weight
AUTO_WEIGHT = 0.25


class SpanShares:
    """Sampled timing's shares: each phase's seconds over the GPU span, summed over the timed steps
    of the last ``window_s`` seconds of host time (at least the latest one, at most ``rows``). A ratio of sums
    weighs a long step by its length, as the rates the rules and dashboards read do (a phase's
    seconds over the step seconds): a timed step with a host stall inside one phase moves the
    shares by its weight among many, where its shares alone would stand for every step until the
    next timed one, and the mean of such per-step shares would under-weigh the long steps. The
    steps that are not timed still get the shares, so a stall in one of them is spread over the
    phases in their usual proportions; the timed ones make up for it on average, within a bias
    that falls with the number of timed steps in the window."""

    def __init__(self, kinds: Iterable[str], window_s: float = SHARE_WINDOW_S, rows: int = SHARE_ROWS):
        self.kinds = tuple(kinds)
        self.window_s = float(window_s)
        self.rows = max(1, int(rows))
        self._rows: Deque[Tuple[float, ...]] = deque()
        self._sums = [0.0] * (len(self.kinds) + 1)  # each kind's, then the spans'

    def add(self, win: Dict[str, float], out: Dict[str, float], t: float) -> None:
        """A timed step resolved at host time ``t``: its seconds by kind and its ``SPAN`` in
        ``win`` (zeroed here); the window's shares written to ``out``. Once per timed step."""
        kinds, rows, sums = self.kinds, self._rows, self._sums
        if len(rows) == self.rows:
            self._drop()
        row = tuple(win[k] for k in kinds) + (win[SPAN], t)
        rows.append(row)
        for i in range(len(sums)):
            sums[i] += row[i]
        for k in win:
            win[k] = 0.0
        cut = t - self.window_s
        while len(rows) > 1 and rows[0][-1] < cut:
            self._drop()
        if len(rows) == 1:  # (the running sums start again from the one row: no drift carried on)
            sums[:] = row[:-1]
        total = sums[-1]
        for i, k in enumerate(kinds):
            v = sums[i] / total if total > 0 else 0.0
            out[k] = v if v > 0 else 0.0

    def _drop(self) -> None:
        old = self._rows.popleft()
        sums = self._sums
        for i in range(len(sums)):
            sums[i] -= old[i]


class CudaTimeline:
    """CUDA events recorded on the current stream, resolved on later steps with ``query()``.

    ``mark()`` records one event (about 7 us of host time) and returns it, or None when the
    pending queue is full. ``mark(own=True)``: an event only the caller's intervals use (the step
    path's phase boundaries, never handed to anything else): once every pending interval that
    holds it has resolved it goes back to a free list and a later ``mark(own=True)`` re-records
    it, so the steady state creates and destroys no CUDA events (``POOL``; events handed to the
    communication tracker are never reused: a completion callback may still push them). ``push(kind, start, end)`` queues an interval; ``resolve(add)`` pops
    finished intervals in order and calls ``add(kind, seconds)`` (or adds to a dict ``add``). Communication and exposed
    communication intervals are placed on one GPU time axis (offsets from an anchor event)
    so overlapping spans are counted once (their union).

    Sampled timing (``every`` > 1, or 0: ``sampled``): only some steps are timed. ``mark()`` returns None on the
    others (not a drop: nothing is recorded, nothing is pushed), so a step that is not timed
    costs the step path one attribute read per mark. ``step_end(t)``, called at each step's end,
    closes a timed step with a ``SPAN`` interval (an event at its start, one at its end) and
    decides whether the next step is timed: one step in ``every`` on average, and at least one
    each ``every_s`` seconds. The gap after a timed step is drawn uniformly from 1 to
    2 x ``every`` - 1 steps (``seed``: the draws'), so the timed steps do not keep step with work
    the training loop does every N steps (logging that synchronizes every 32 or 500 steps, say),
    which a fixed stride would always or never time. ``resolve()`` stops after a ``SPAN``, so the
    caller reads one timed step's phases and span at a time (``SpanShares`` turns them into
    shares). The second step is the first timed one (the first has no start event; it also holds
    the warm-up).

    Automatic sampled timing (``every`` 0): the mean gap is chosen as the steps go so that the
    timing costs the step path at most ``budget`` of the host step time. Each timed step's cost is
    measured: the host time of its ``mark()`` calls (their CUDA event records, the dominant part on
    a GPU: 12 us a call in a training loop on an H100) and of the ``resolve()`` calls that find
    intervals pending. At each timed step's end the mean gap becomes that cost over ``budget``
    times the mean step time since the timed step before (moving averages of both, weight
    ``AUTO_WEIGHT``), rounded up, from 1 (every step timed: a long step, where the events cost
    little) to ``AUTO_MAX_EVERY``. ``every`` then reads the mean gap in use. The steps keep the
    sampled path (``sampled`` True) throughout, so their phases are the window's shares even
    while every step is timed.
    """

    POOL = True  # reuse own events (bench/gpu/overhead.py compares it with fresh events)
    # How an event that exists is recorded again: "driver" (cuEventRecord called with the GIL held,
    # see driver_recorder) or "torch" (Event.record). bench/gpu/overhead.py --record-ab compares them.
    RECORD = "driver"

    def __init__(self, torch_mod: Any, device: Any, max_pending: int, every: int = 1, every_s: float = 0.0,
                 seed: Optional[int] = None, budget: float = 0.005):
        self._cuda = torch_mod.cuda
        self.device = device
        self._rerecord = driver_recorder(torch_mod, device) if self.RECORD == "driver" else None
        self.max_pending = int(max_pending)
        self.dropped = 0
        self.created = 0  # CUDA events created (bench/gpu/overhead.py reports it per step)
        self._pending: Deque[Tuple[str, Any, Any]] = deque()
        self._free: List[List[Any]] = []  # entries of own events that every interval holding them has resolved
        # id(own event) -> [the event, pending intervals that hold it], while the event is pending or free;
        # the entry keeps the event alive, so its id is not reused by another object while it is here
        self._own: Dict[int, List[Any]] = {}
        self._union = {k: IntervalSet() for k in UNION_KINDS}
        self._anchor = self._cuda.Event(enable_timing=True)
        self._anchor.record(self._cuda.current_stream(device))
        self._anchor_done = False  # the anchor's query() returned True (it is never recorded again)
        self.auto = int(every) <= 0  # the mean gap follows the timing's cost (budget)
        # the mean gap between timed steps; 1 and not auto: every step timed with no spans (the step
        # path carries the exact seconds)
        self.every = max(1, int(every))
        self.sampled = self.auto or self.every > 1  # the step path takes the shares of timed steps' spans
        self.every_s = float(every_s)
        self.budget = float(budget)
        self.cost = 0.0  # auto: host seconds the timing took since the last timed step ended
        self._cost_avg = self._dur_avg = 0.0  # auto: moving averages of a timed step's cost, of a step's time
        self.on = not self.sampled  # the step in progress is timed: mark() records events
        if self.auto:  # (the step path binds these: every other path keeps the class's, uncounted)
            self.mark = self._costed_mark  # type: ignore[method-assign]
            self.resolve = self._costed_resolve  # type: ignore[method-assign]
        self._n = self.every  # steps ended since the last timed one (so the second step is timed)
        self._gap = self.every  # the steps from one timed step to the next (drawn at each timed one)
        self._draw = random.Random(seed).randint
        self._last = float("-inf")  # host time the last timed step ended
        self._span0: Optional[Any] = None  # the timed step's start event

    def step_end(self, t: float) -> None:
        """Sampled timing: the step ending at host time ``t`` is over. A timed one is closed with
        its ``SPAN`` and draws the gap to the next; the next step is timed when that many steps
        ended since the last timed one or ``every_s`` seconds passed, and then its start event is
        recorded now."""
        if self.on:
            s0 = self._span0
            if s0 is not None:
                self.push(SPAN, s0, self.mark(True))
                self._span0 = None
            if self.auto:
                self._tune(t)
            self._last = t
            self._n = 0
            self._gap = self._draw(1, 2 * self.every - 1)
        self._n += 1
        self.on = on = self._n >= self._gap or t - self._last >= self.every_s
        if on:
            self._span0 = self.mark(True)

    def _tune(self, t: float) -> None:
        """Automatic sampled timing, at a timed step's end (host time ``t``): the mean gap from
        the cost of the timing since the last timed step and the mean step time since then."""
        cost, self.cost = self.cost, 0.0
        if self._last == float("-inf"):
            return  # the first timed step: no step time to weigh its cost against yet
        dur = (t - self._last) / self._n  # (_n >= 1: the steps ended since the last timed one)
        w = AUTO_WEIGHT
        if self._dur_avg <= 0.0:
            self._cost_avg, self._dur_avg = cost, dur
        else:
            self._cost_avg += w * (cost - self._cost_avg)
            self._dur_avg += w * (dur - self._dur_avg)
        allowed = self.budget * self._dur_avg
        n = math.ceil(self._cost_avg / allowed) if allowed > 0 else AUTO_MAX_EVERY
        self.every = min(AUTO_MAX_EVERY, max(1, n))

    def _costed_mark(self, own: bool = False) -> Optional[Any]:
        """Automatic sampled timing's ``mark()``: the class's, its host time added to ``cost``."""
        if not self.on:
            return None
        t0 = _perf()
        ev = type(self).mark(self, own)
        self.cost += _perf() - t0
        return ev

    def _costed_resolve(self, add: Any, limit: int = 1 << 30) -> int:
        """Automatic sampled timing's ``resolve()``: the class's, its host time added to ``cost``
        when intervals are pending."""
        if not self._pending:
            return 0
        t0 = _perf()
        n = type(self).resolve(self, add, limit)
        self.cost += _perf() - t0
        return n

    def mark(self, own: bool = False) -> Optional[Any]:
        if not self.on:  # sampled timing, a step that is not timed
            return None
        if len(self._pending) >= self.max_pending:
            self.dropped += 1
            return None
        if own:  # the step path's marks: a free event re-recorded, the steady state
            free = self._free
            if free:
                entry = free.pop()
                ev = entry[0]
                rr = self._rerecord
                if rr is None or not rr(ev):
                    ev.record(self._cuda.current_stream(self.device))
                if self._own.get(id(ev)) is entry:  # (its entry stays while the event is in the pool)
                    return ev
            else:
                ev = self._cuda.Event(enable_timing=True)
                self.created += 1
                ev.record(self._cuda.current_stream(self.device))
            if self.POOL:
                owned = self._own
                if len(owned) >= 4 * self.max_pending:  # marked and never pushed (a hook that raised): forget
                    owned.clear()
                owned[id(ev)] = [ev, 0]
            return ev
        ev = self._cuda.Event(enable_timing=True)
        self.created += 1
        ev.record(self._cuda.current_stream(self.device))
        return ev

    def push(self, kind: str, start: Optional[Any], end: Optional[Any]) -> None:
        if start is None or end is None:
            return  # already counted as dropped by mark()
        own = self._own
        if own:  # each own event counts the pending intervals that hold it (twice when start is end)
            entry = own.get(id(start))
            if entry is not None and entry[0] is start:
                entry[1] += 1
            entry = own.get(id(end))
            if entry is not None and entry[0] is end:
                entry[1] += 1
        self._pending.append((kind, start, end))

    @property
    def pending(self) -> int:
        return len(self._pending)

    def release(self) -> None:
        """Drop every event (the watch ended): they are destroyed here, in this process, now.
        Pending intervals count as dropped, except under sampled timing (the shares of the timed
        steps before stand for them)."""
        if not self.sampled:
            self.dropped += len(self._pending)
        self.on = False
        self._span0 = None
        self._pending.clear()
        self._free.clear()
        self._own.clear()
        self._anchor = None

    def resolve(self, add: Any, limit: int = 1 << 30) -> int:
        """Resolve finished intervals from the head of the queue. Never waits. ``add``: called as
        ``add(kind, seconds)`` for each, or a dict whose ``[kind]`` each is added to. It stops
        after a ``SPAN`` interval (sampled timing: one timed step at a time)."""
        q = self._pending
        anchor = self._anchor
        if not q or anchor is None:  # nothing pending, or released
            return 0
        acc = add if type(add) is dict else None
        union = self._union
        own = self._own
        free = self._free
        anchor_done = self._anchor_done
        n = 0
        while q and n < limit:
            kind, s, e = q[0]
            if not (e.query() and s.query()):
                break
            if not anchor_done:  # the anchor is recorded once: reached once, it stays reached
                if not anchor.query():
                    break
                anchor_done = self._anchor_done = True
            q.popleft()
            n += 1
            u = union.get(kind)
            if u is not None:
                dt = u.add(anchor.elapsed_time(s) / 1e3, anchor.elapsed_time(e) / 1e3)
            else:
                dt = s.elapsed_time(e) / 1e3
            if own:  # this interval no longer holds its events: an own event no pending interval holds is free
                for ev in ((s,) if e is s else (s, e)):
                    entry = own.get(id(ev))
                    if entry is not None and entry[0] is ev:
                        entry[1] -= 1
                        if entry[1] <= 0:
                            entry[1] = 0
                            if len(free) < self.max_pending:
                                free.append(entry)  # (its entry stays: no dict churn per event and step)
                            else:
                                del own[id(ev)]
            if kind is SPAN:  # (a span of 0 still ends its step: a GPU that did nothing in it)
                dt = dt if dt > 0 else 1e-9
            if dt > 0:
                if acc is not None:
                    acc[kind] += dt
                else:
                    add(kind, dt)
            if kind is SPAN:
                break
        return n
