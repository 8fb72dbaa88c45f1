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
from test_hooks import FAST, _LagGPU, _on_stand_in_gpu


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
