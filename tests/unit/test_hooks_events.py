"""The step path's CUDA events are reused (timing.CudaTimeline's own events): in the steady
state no event is created per step, and a reused event still times its phase. A stand-in for
CUDA events (tests/integration/test_hooks.py's _LagGPU); the real events are in tests/gpu."""
from __future__ import annotations

import time

import torch
import torch.nn as nn

import ranksight
from ranksight.hooks.timing import BWD, COMM, FWD, CudaTimeline

from hooks_workloads.harness import Receiver
from test_hooks import FAST, _LagEvent, _LagGPU, _on_stand_in_gpu


def test_own_events_are_reused_only_once_every_interval_holding_them_resolved():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    a, b, c = tl.mark(True), tl.mark(True), tl.mark()
    tl.push(FWD, a, b)
    tl.push(BWD, b, c)  # b ends one interval and starts the next
    got = []
    assert tl.resolve(lambda k, s: got.append(k), limit=1) == 1
    first = tl.mark(True)
    assert first is a and first is not b  # a is free; b is still held by the BWD interval
    assert tl.resolve(lambda k, s: got.append(k)) == 1
    again = tl.mark(True)
    assert again is b
    assert tl.mark() is not c and tl.mark(True) is not c  # not own: never reused
    tl.push(COMM, c, tl.mark())
    assert tl.created == 6  # a, b, c; two fresh ones; and the one just now (free list empty)


def test_the_step_path_creates_no_events_in_the_steady_state_and_times_phases_right():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 16), torch.randn(8, 2)) for _ in range(40)]
    fwd_sleep = 0.002
    model.register_forward_pre_hook(lambda m, a: time.sleep(fwd_sleep))  # after ours: inside the fwd span
    rx = Receiver()
    try:
        loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
        w = ranksight.hooks.current()
        tl = _on_stand_in_gpu(w, lag=0.0)
        marks = [0]
        mark = tl.mark

        def counting(own=False):
            marks[0] += 1
            return mark(own)

        tl.mark = counting
        created = []
        for i, (x, y) in enumerate(loader):
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            if i == 9:
                created.append(tl.created)
        created.append(tl.created)
        ranksight.unwatch()
        assert marks[0] == 6 * 40
        assert created[1] == created[0], created  # steps 11-40 created none
        assert rx.wait_for(lambda: rx.of("bye"))
        steps = rx.of("step")
        assert [s["seq"] for s in steps] == list(range(1, 41))
        assert all(fwd_sleep <= s["fwd"] <= s["dur"] for s in steps[1:]), [s["fwd"] for s in steps]
        assert all(s["bwd"] > 0 and s["opt"] > 0 for s in steps[1:])
        assert w.herr == 0
    finally:
        ranksight.unwatch()
        rx.close()


class _CountingGPU(_LagGPU):
    """The stand-in GPU, counting each event's ``query()`` calls."""

    def Event(self, enable_timing=True):  # noqa: N802 (torch.cuda.Event)
        ev = _LagEvent(self)
        ev.queries = 0
        real = ev.query

        def query():
            ev.queries += 1
            return real()

        ev.query = query
        return ev


def test_the_anchor_is_queried_until_it_is_reached_and_never_after():
    gpu = _CountingGPU(0.0)
    gpu.busy = True
    tl = CudaTimeline(gpu, "stand-in", 64)
    a, b = tl.mark(True), tl.mark(True)
    tl.push(FWD, a, b)
    assert tl.resolve(lambda k, s: None) == 0 and tl._anchor.queries == 0  # the interval's end first
    gpu.busy = False
    assert tl.resolve(lambda k, s: None) == 1 and tl._anchor.queries == 1
    for _ in range(3):
        tl.push(BWD, tl.mark(True), tl.mark(True))
        assert tl.resolve(lambda k, s: None) == 1
    assert tl._anchor.queries == 1
    tl.push(COMM, tl.mark(), tl.mark())  # a union kind: its seconds are offsets from the anchor
    got = {FWD: 0.0, BWD: 0.0, COMM: 0.0}
    assert tl.resolve(got) == 1 and got[COMM] > 0 and tl._anchor.queries == 1


def test_resolve_adds_to_a_dict_what_it_gives_a_function():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    for kind in (FWD, BWD, FWD, COMM, COMM):
        s = tl.mark(True)
        time.sleep(0.001)
        tl.push(kind, s, tl.mark(True))
    pending = list(tl._pending)
    calls = []
    assert tl.resolve(lambda k, s: calls.append((k, s))) == 5
    for it in pending:  # the same intervals once more, into a dict
        tl._pending.append(it)
    acc = {FWD: 0.0, BWD: 0.0, COMM: 0.0}
    tl2 = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    tl2._anchor, tl2._pending = tl._anchor, tl._pending
    assert tl2.resolve(acc) == 5
    want = {FWD: 0.0, BWD: 0.0, COMM: 0.0}
    for k, s in calls:
        want[k] += s
    assert acc[FWD] == want[FWD] and acc[BWD] == want[BWD] and want[FWD] > 0.0015
    assert acc[COMM] > 0 and want[COMM] > 0  # (a union kind: each timeline keeps its own union)


def test_pooled_events_keep_their_entry_and_come_back_after_the_entries_are_forgotten():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    for _ in range(3):  # the step path's pattern: fwd, bwd, opt, each two own events, resolved at the step end
        for kind in (FWD, BWD, FWD):
            tl.push(kind, tl.mark(True), tl.mark(True))
        assert tl.resolve(lambda k, s: None) == 3
    entries = dict(tl._own)
    assert len(entries) == 6 and tl.created == 6 and len(tl._free) == 6
    for kind in (FWD, BWD, FWD):
        tl.push(kind, tl.mark(True), tl.mark(True))
    assert tl.resolve(lambda k, s: None) == 3
    assert all(tl._own[k] is v for k, v in entries.items()) and tl.created == 6  # no new entry, no new event
    tl._own.clear()  # what mark() does once too many events were marked and never pushed
    a, b = tl.mark(True), tl.mark(True)
    tl.push(FWD, a, b)
    assert tl.resolve(lambda k, s: None) == 1
    assert tl.mark(True) in (a, b) and tl.created == 6  # they came back to the pool
    orphan = tl.mark(True)  # marked, never pushed: never free again
    for _ in range(8):
        tl.push(BWD, tl.mark(True), tl.mark(True))
        tl.resolve(lambda k, s: None)
    assert orphan not in [e[0] for e in tl._free]
