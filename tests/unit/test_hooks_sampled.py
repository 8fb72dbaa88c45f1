"""Sampled GPU timing (hooks.gpu_timing_every, hooks/timing.py and StepPath._sampled): one step in
N timed with CUDA events, the others' GPU phases the timed step's shares of its GPU span times
their own host duration. On the stand-in GPU of tests/integration/test_hooks.py (CUDA events
cannot exist here; the real events are tests/gpu/test_gpu_sampled.py): which steps record events, the
shares each step gets and the sums they add up to, the hello's ``gpu_every`` and the agent's
gauge."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn as nn

import ranksight
from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ranks import RankSettings, RankTable
from ranksight.hooks.timing import FWD, SPAN, CudaTimeline

from hooks_workloads.harness import Receiver
from test_exporter_helpers import parse, series
from test_hooks import FAST, _LagGPU


def test_only_the_timed_steps_record_events_one_in_every_and_never_the_first():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64, every=4, every_s=1e9)
    timed = []
    for step in range(1, 13):
        a, b = tl.mark(True), tl.mark(True)
        assert (a is None) == (b is None)
        if a is not None:
            timed.append(step)
            tl.push(FWD, a, b)
        tl.step_end(float(step))
    assert timed == [2, 6, 10]
    got = {FWD: 0.0, SPAN: 0.0}
    assert tl.resolve(got) == 2  # the first timed step's interval and its span: it stops there
    assert got[SPAN] > 0 and tl.pending == 4
    assert tl.dropped == 0  # a step that is not timed drops nothing


def test_a_time_floor_times_slow_steps_and_every_1_times_all_of_them():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64, every=1000, every_s=0.5)
    timed = []
    for step in range(1, 8):  # 0.3 s steps: the second, then the first step each 0.5 s after a timed one
        if tl.mark(True) is not None:
            timed.append(step)
        tl.step_end(step * 0.3)
    assert timed == [2, 5]
    exact = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    assert exact.every == 1 and all(exact.mark(True) is not None for _ in range(5))


class _ClockGPU:
    """A stand-in for ``torch.cuda`` with its own clock: an event records the clock's reading (the
    test advances it inside each phase, so each phase's GPU seconds are exact whatever the host's
    load) and is reached ``lag`` seconds of host time after it was recorded (a GPU running behind)."""

    def __init__(self, lag: float):
        self.lag, self.now, self.cuda = lag, 0.0, self

    def current_stream(self, device=None):
        return None

    def Event(self, enable_timing=True):  # noqa: N802 (torch.cuda.Event)
        return _ClockEvent(self)


class _ClockEvent:
    def __init__(self, gpu: _ClockGPU):
        self.gpu, self.t, self.reach = gpu, None, None

    def record(self, stream=None):
        self.t, self.reach = self.gpu.now, time.perf_counter() + self.gpu.lag

    def query(self):
        return self.reach is not None and time.perf_counter() >= self.reach

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


# each step's GPU time: 4 ms forward, 2 ms backward, 2 ms optimizer, 2 ms between steps
PHASES = {"fwd": 0.004, "bwd": 0.002, "opt": 0.002}
GPU_STEP = 0.010


def _run(every: int, steps: int, lag: float):
    """One watched loop on the clocked stand-in GPU: the step records, the events marked, the hellos."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(8, 16), torch.randn(8, 2)) for _ in range(steps)]
    gpu = _ClockGPU(lag)

    def tick(secs):
        gpu.now += secs

    model.register_forward_pre_hook(lambda m, a: tick(PHASES["fwd"]))  # after ours: inside the fwd span
    model.register_full_backward_pre_hook(lambda m, go: tick(PHASES["bwd"]))
    rx = Receiver()
    cfg = dict(FAST, hooks=dict(FAST["hooks"], gpu_timing_every=every, gpu_timing_seconds=1e6))
    try:
        loader = ranksight.watch(model, opt, data, agent=rx.url, config=cfg)
        w = ranksight.hooks.current()
        tl = CudaTimeline(gpu, "stand-in", 256, w.settings.gpu_timing_every, w.settings.gpu_timing_seconds)
        w._tl = w.comm.timeline = tl
        w._read_cuda_memory = lambda: None
        opt.register_step_pre_hook(lambda o, a, k: tick(PHASES["opt"]))  # after ours: in the opt span
        marked = [0]
        mark = tl.mark

        def counting(own=False):
            ev = mark(own)
            marked[0] += ev is not None
            return ev

        tl.mark = counting
        for x, y in loader:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            tick(GPU_STEP - sum(PHASES.values()))
        w._send_hello()  # (the background thread's first one may predate the stand-in: a CPU watch's)
        ranksight.unwatch()
        assert rx.wait_for(lambda: rx.of("bye"))
        assert w.herr == 0
        return rx.steps(), marked[0], rx.of("hello")
    finally:
        ranksight.unwatch()
        rx.close()


@pytest.mark.parametrize("lag", [0.0, 0.003])  # an idle GPU; one that runs a few steps behind the host
def test_a_step_that_is_not_timed_gets_the_timed_steps_shares_of_its_own_duration(lag):
    """The timed steps' shares (here exact: 0.4, 0.2, 0.2 of a 10 ms GPU step) times each step's
    host duration, on every step once the first timed step resolved, and none before (the
    warm-up is not guessed); the host durations are the steps' own (p50/p99 exact); 8 events
    per timed step instead of 6 per step."""
    steps = 60
    exact, m_exact, _ = _run(1, steps, lag)
    assert m_exact == 6 * steps and exact[-1]["fwd"] > 0
    sampled, m_sampled, hello = _run(3, steps, lag)
    assert [s["seq"] for s in sampled] == list(range(1, steps + 1))
    assert m_sampled == 8 * len(range(2, steps + 1, 3))  # 6 phase marks and 2 span marks per timed step
    assert hello[-1]["gpu_every"] == 3
    known = next(i for i, s in enumerate(sampled) if s["fwd"] > 0)
    assert 2 <= known <= 30, known  # (step 2 is timed; it resolves a step or more later)
    assert all(s[k] == 0 for s in sampled[:known] for k in PHASES)
    for k, v in PHASES.items():
        got = [s[k] / s["dur"] for s in sampled[known:]]
        assert all(abs(x - v / GPU_STEP) < 1e-5 for x in got), (k, got)  # (a record carries 6 digits)


def _hello(extra):
    rec = dict(v=5, job="j", ws=1, rank=0, lr=0, node="n", pid=7, sess=1, t="hello", ts=1.7e9, info={}, dirs={},
               pstart=1.7e9, gpu="", **extra)
    return json.dumps(rec).encode()


def test_the_agent_exposes_the_sampling_from_the_hello_and_rejects_a_bad_value():
    table = RankTable(RankSettings())
    assert table.apply(P.decode(_hello({"gpu_every": 16})), 1000.0) == "ok"
    got = parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode())
    assert list(series(got, C.GPU_TIMING_EVERY.name).values()) == [16.0]
    for bad in ("16", -1, 1.5, True):
        with pytest.raises(P.ProtocolError):
            P.decode(_hello({"gpu_every": bad}))
    for every_step in ({}, {"gpu_every": 0}, {"gpu_every": 1}):  # an older sender, a CPU rank, every step timed
        table = RankTable(RankSettings())
        assert table.apply(P.decode(_hello(every_step)), 1000.0) == "ok"
        got = parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode())
        assert not series(got, C.GPU_TIMING_EVERY.name), every_step
