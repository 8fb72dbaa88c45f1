"""Sampled GPU timing (hooks.gpu_timing_every, hooks/timing.py and StepPath._sampled): one step in
N on average timed with CUDA events (drawn gaps), every step's GPU phases the shares of the GPU
span over the latest timed steps (their sums over their spans) times its own host duration. On
the stand-in GPU of tests/integration/test_hooks.py (CUDA events cannot exist here; the real
events are tests/gpu/test_gpu_sampled.py): which steps record events, the shares each step gets
and the sums they add up to, also when one phase stalls every N steps, the hello's
``gpu_every`` and the agent's gauge."""
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
from ranksight.hooks import timing
from ranksight.hooks.timing import FWD, OPT, SPAN, CudaTimeline, SpanShares

from hooks_workloads.harness import Receiver
from test_exporter_helpers import parse, series
from test_hooks import FAST, _LagGPU


def _timed_steps(tl: CudaTimeline, steps: int, step_s: float = 1.0):
    """The steps (1-based) whose marks record events, each step ``step_s`` seconds of host time."""
    timed = []
    for step in range(1, steps + 1):
        a, b = tl.mark(True), tl.mark(True)
        assert (a is None) == (b is None)
        if a is not None:
            timed.append(step)
            tl.push(FWD, a, b)
        tl.step_end(step * step_s)
    return timed


def test_the_timed_steps_are_one_in_every_on_average_with_drawn_gaps_and_never_the_first():
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 1 << 20, every=4, every_s=1e9, seed=7)
    timed = _timed_steps(tl, 8000)
    assert timed[0] == 2  # the first step has no start event (and holds the warm-up)
    gaps = [b - a for a, b in zip(timed, timed[1:])]
    assert set(gaps) == set(range(1, 8))  # uniform over 1 .. 2 x every - 1
    assert abs(len(gaps) / sum(gaps) - 1 / 4) < 0.01  # one step in 4
    assert tl.dropped == 0  # a step that is not timed drops nothing
    got = {FWD: 0.0, SPAN: 0.0}
    assert tl.resolve(got) == 2  # the first timed step's interval and its span: it stops there
    assert got[SPAN] > 0 and tl.pending == 2 * (len(timed) - 1)
    again = CudaTimeline(_LagGPU(0.0), "stand-in", 1 << 20, every=4, every_s=1e9, seed=7)
    assert _timed_steps(again, 8000) == timed  # the seed gives the draws


def test_the_timed_steps_do_not_keep_step_with_work_done_every_n_steps():
    """A loop that logs (and synchronizes) every 32 steps: a fixed stride of 16 from the second
    step would never time a logging step; drawn gaps time each residue of 32 about as often."""
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 1 << 20, every=16, every_s=1e9, seed=3)
    timed = _timed_steps(tl, 32 * 3000)
    by_residue = [0] * 32
    for step in timed:
        by_residue[step % 32] += 1
    assert min(by_residue) > 0.7 * len(timed) / 32 and max(by_residue) < 1.3 * len(timed) / 32, by_residue


def test_a_time_floor_times_slow_steps_and_every_1_times_all_of_them():
    # 0.3 s steps, a drawn gap of up to 1,999: the step after the first one to end 0.5 s after a
    # timed one is timed, so every third step
    tl = CudaTimeline(_LagGPU(0.0), "stand-in", 1024, every=1000, every_s=0.5, seed=1)
    assert _timed_steps(tl, 40, step_s=0.3) == list(range(2, 41, 3))
    exact = CudaTimeline(_LagGPU(0.0), "stand-in", 64)
    for step in range(1, 6):
        assert exact.every == 1 and exact.mark(True) is not None
        exact.step_end(float(step))


class _CostlyGPU(_LagGPU):
    """The stand-in GPU (idle: an event is reached when recorded) whose event record costs the
    host ``cost`` seconds, as a CUDA event record costs the step path on a GPU. The cost is on a
    clock of its own (``perf``, which the test puts in place of the timeline's): a busy wait on the
    real clock would also count the time the test process is preempted on a loaded machine."""

    def __init__(self, cost: float):
        super().__init__(0.0)
        self.cost, self.records, self.now = cost, 0, 0.0

    def perf(self) -> float:
        return self.now

    def Event(self, enable_timing=True):  # noqa: N802 (torch.cuda.Event)
        ev = super().Event(enable_timing)
        record, gpu = ev.record, self

        def costly(stream=None):
            gpu.records += 1
            gpu.now += gpu.cost
            record(stream)

        ev.record = costly
        return ev


def _auto_steps(tl: CudaTimeline, steps: int, step_s: float, t0: float = 0.0):
    """Steps of ``step_s`` host seconds as the step path drives them (two phase marks, the
    resolve at each step's end); returns the timed steps and the host time at the end."""
    got = {FWD: 0.0, SPAN: 0.0}
    timed = []
    t = t0
    for step in range(1, steps + 1):
        a = tl.mark(True)
        b = tl.mark(True)
        if a is not None:
            timed.append(step)
            tl.push(FWD, a, b)
        t += step_s
        tl.resolve(got)
        tl.step_end(t)
    return timed, t


def test_automatic_sampling_keeps_the_events_cost_within_the_budget_and_times_every_long_step(monkeypatch):
    """hooks.gpu_timing_every 0: the mean gap follows the measured cost of a timed step (its 4 event
    records, 100 us each here) over the budget's share of the step time. 1 ms steps with a 1%
    budget (10 us a step): the records cost about the budget, not more, and not much less (one
    step in ~40 timed). Then the steps grow to 200 ms: within a few timed steps every step is
    timed again (the records are 0.2% of a step)."""
    gpu = _CostlyGPU(100e-6)
    monkeypatch.setattr(timing, "_perf", gpu.perf)
    tl = CudaTimeline(gpu, "stand-in", 1 << 16, every=0, every_s=1e9, seed=5, budget=0.01)
    assert tl.auto and tl.sampled and not tl.on
    steps, step_s = 20000, 1e-3
    timed, t = _auto_steps(tl, steps, step_s)
    spent = gpu.records * gpu.cost
    assert 0.25 * tl.budget < spent / (steps * step_s) < 1.5 * tl.budget, (spent, gpu.records, tl.every)
    assert 20 <= tl.every <= 80, tl.every
    gaps = [b - a for a, b in zip(timed[len(timed) // 2:], timed[len(timed) // 2 + 1:])]
    assert 0.5 * tl.every < sum(gaps) / len(gaps) < 2 * tl.every  # the drawn gaps have that mean
    timed, _ = _auto_steps(tl, 200, 0.2, t)
    assert tl.every == 1
    assert timed[-20:] == list(range(181, 201))  # every step timed
    assert tl.dropped == 0


def test_a_backlog_of_timed_steps_drains_when_every_step_is_timed():
    """Automatic sampling at a gap of 1 (each step's events cost far under the budget): the GPU
    reaches nothing for 50 steps (a long kernel, an evaluation), then catches up. Each step's end
    takes up to SPANS_PER_STEP resolved timed steps into the shares, so the backlog drains within
    a few dozen steps; taking one a step would hold it at its length, the shares that old."""
    gpu = _LagGPU(0.0)
    rx = Receiver()
    try:
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = ranksight.watch(model, opt, [torch.randn(2, 4)] * 200, agent=rx.url,
                                 config=dict(FAST, hooks=dict(FAST["hooks"], gpu_timing_every=0)))
        w = ranksight.hooks.current()
        tl = w._tl = w.comm.timeline = CudaTimeline(gpu, "stand-in", 1024, 0, 1e9, seed=1, budget=1.0)
        w._read_cuda_memory = lambda: None
        held = []
        for i, x in enumerate(loader):
            gpu.busy = 20 <= i < 70
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            held.append(tl.pending)
        assert tl.every == 1 and tl.dropped == 0
        assert max(held) > 150, max(held)  # the backlog: 50 steps' intervals
        assert max(held[110:]) <= 12, held[100:]  # drained: a step or two in flight
        assert w.herr == 0
    finally:
        ranksight.unwatch()
        rx.close()


def test_automatic_sampling_is_offered_by_the_config_and_its_gap_reaches_the_hello():
    from ranksight.hooks.settings import load_settings

    s = load_settings({"hooks": {"gpu_timing_every": 0, "gpu_timing_budget": 0.002}})
    assert s.gpu_timing_every == 0 and s.gpu_timing_budget == 0.002
    assert load_settings({}).gpu_timing_budget == 0.005 and load_settings({}).gpu_timing_every == 0  # the default
    rx = Receiver()
    try:
        model = nn.Linear(4, 4)
        ranksight.watch(model, torch.optim.SGD(model.parameters(), lr=0.1), [torch.randn(2, 4)], agent=rx.url,
                        config=dict(FAST, hooks=dict(FAST["hooks"], gpu_timing_every=0)))
        w = ranksight.hooks.current()
        assert rx.wait_for(lambda: rx.of("hello"))  # the watch's own (a CPU rank's: 0)
        w._tl = CudaTimeline(_LagGPU(0.0), "stand-in", 64, 0)
        w._send_hello()
        w._tl.every = 12  # the mean gap moved: the background thread sends the hello again, once
        time.sleep(0.6)  # ... but not within HELLO_EVERY_MIN_S of the last hello
        assert 12 not in [h["gpu_every"] for h in rx.of("hello")]
        w._hello_due = 0.0
        assert rx.wait_for(lambda: any(h["gpu_every"] == 12 for h in rx.of("hello")))
        time.sleep(0.6)
        ranksight.unwatch()
        assert rx.wait_for(lambda: rx.of("bye"))
        every = [h["gpu_every"] for h in rx.of("hello")]
        assert every == [0, 1, 12], every
    finally:
        ranksight.unwatch()
        rx.close()


def test_the_shares_are_the_sums_over_the_spans_of_the_timed_steps_of_the_last_seconds():
    shares = SpanShares((FWD, OPT), window_s=30.0, rows=1024)
    got = {FWD: 0.0, OPT: 0.0}
    # three timed steps of 10 ms, then one with a 40 ms host stall inside its optimizer phase
    for t, (fwd, opt, span) in enumerate([(0.004, 0.002, 0.010)] * 3 + [(0.004, 0.042, 0.050)]):
        shares.add({FWD: fwd, OPT: opt, SPAN: span}, got, float(t))
    assert got[FWD] == pytest.approx(0.016 / 0.080) and got[OPT] == pytest.approx(0.048 / 0.080)
    # (the mean of the four steps' own shares would read 0.32 and 0.36)
    for t in range(4, 34):  # still in the window at 33 s ...
        shares.add({FWD: 0.004, OPT: 0.002, SPAN: 0.010}, got, float(t))
    assert got[OPT] > 0.2 + 1e-6
    shares.add({FWD: 0.004, OPT: 0.002, SPAN: 0.010}, got, 34.0)  # ... out of it 30 s after it ended
    assert got[FWD] == pytest.approx(0.4) and got[OPT] == pytest.approx(0.2)
    few = SpanShares((FWD, OPT), window_s=1e9, rows=2)  # at most this many timed steps
    for fwd in (0.001, 0.002, 0.003):
        few.add({FWD: fwd, OPT: 0.0, SPAN: 0.010}, got, 0.0)
    assert got[FWD] == pytest.approx(0.25)
    win = {FWD: 0.004, OPT: 0.002, SPAN: 0.010}
    SpanShares((FWD, OPT)).add(win, {FWD: 0.0, OPT: 0.0}, 0.0)
    assert win == {FWD: 0.0, OPT: 0.0, SPAN: 0.0}  # the timed step's seconds are taken
    late = SpanShares((FWD, OPT), window_s=30.0)  # a pause longer than the window: the latest step alone
    late.add({FWD: 0.001, OPT: 0.009, SPAN: 0.010}, got, 0.0)
    late.add({FWD: 0.003, OPT: 0.001, SPAN: 0.010}, got, 100.0)
    assert got[FWD] == pytest.approx(0.3) and got[OPT] == pytest.approx(0.1)


def test_sampled_shares_add_up_to_the_every_step_sums_when_a_phase_stalls_every_32_steps():
    """Each step 10 ms (4 forward, 2 optimizer), every 32nd step 40 ms more in its optimizer (a
    synchronizing log line): the optimizer's share of all step time is 104/360 = 0.289. The latest
    timed step's shares alone, at a fixed stride of 16, read 0.2: the stalled steps are never
    timed. The sum that the rules read, each step's duration times the shares it got, with drawn
    gaps and the shares of the last 30 s: within 0.05 of it for each of 10 seeds and 0.02 on
    average (40 seeds: -0.040 to +0.026, mean -0.005)."""
    steps = 32 * 400

    def error(tl, shares):
        sh, est, opt_s, total, t = None, 0.0, 0.0, 0.0, 0.0
        for step in range(1, steps + 1):
            fwd, opt = 0.004, 0.002 + (0.040 if step % 32 == 0 else 0.0)
            dur = 0.008 + opt
            t += dur
            if sh is not None:
                est += sh[OPT] * dur
                opt_s += opt
                total += dur
            if tl.mark(True) is not None:
                sh = sh or {FWD: 0.0, OPT: 0.0}
                shares.add({FWD: fwd, OPT: opt, SPAN: dur}, sh, t)
            tl.step_end(t)
        assert opt_s / total == pytest.approx(104 / 360, abs=1e-3)
        return (est - opt_s) / total

    fixed = CudaTimeline(_LagGPU(0.0), "stand-in", 1 << 20, every=16, every_s=1e9, seed=0)
    fixed._draw = lambda lo, hi: 16  # a fixed stride
    assert error(fixed, SpanShares((FWD, OPT), rows=1)) == pytest.approx(0.2 - 104 / 360, abs=2e-3)
    errors = []
    for seed in range(10):
        tl = CudaTimeline(_LagGPU(0.0), "stand-in", 1 << 20, every=16, every_s=1e9, seed=seed)
        errors.append(error(tl, SpanShares((FWD, OPT))))
    assert max(abs(e) for e in errors) < 0.05 and abs(sum(errors) / len(errors)) < 0.02, errors


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
        tl = CudaTimeline(gpu, "stand-in", 256, w.settings.gpu_timing_every, w.settings.gpu_timing_seconds,
                          seed=0)
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
        timed = [0]
        step_end = tl.step_end

        def counting_steps(t):
            timed[0] += tl.on
            step_end(t)

        tl.step_end = counting_steps
        for x, y in loader:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            tick(GPU_STEP - sum(PHASES.values()))
        w._send_hello()  # (the background thread's first one may predate the stand-in: a CPU watch's)
        ranksight.unwatch()
        assert rx.wait_for(lambda: rx.of("bye"))
        assert w.herr == 0
        return rx.steps(), marked[0], rx.of("hello"), timed[0]
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
    exact, m_exact, _, _ = _run(1, steps, lag)
    assert m_exact == 6 * steps and exact[-1]["fwd"] > 0
    sampled, m_sampled, hello, timed = _run(3, steps, lag)
    assert [s["seq"] for s in sampled] == list(range(1, steps + 1))
    assert steps / 6 < timed < steps / 1.5  # one in 3 on average
    # 6 phase marks and 2 span marks per timed step (and a span start after the last step if its
    # end drew the next one)
    assert m_sampled - 8 * timed in (0, 1)
    assert hello[-1]["gpu_every"] == 3
    known = next(i for i, s in enumerate(sampled) if s["fwd"] > 0)
    assert 2 <= known <= 30, known  # (step 2 is timed; it resolves a step or more later)
    assert all(s[k] == 0 for s in sampled[:known] for k in PHASES)
    for k, v in PHASES.items():
        got = [s[k] / s["dur"] for s in sampled[known:]]
        assert all(abs(x - v / GPU_STEP) < 1e-5 for x in got), (k, got)  # (a record carries 6 digits)


def test_automatic_sampling_gives_every_step_the_timed_steps_shares():
    """hooks.gpu_timing_every 0 on the clocked stand-in: whatever gap the cost gives, every step
    once the first timed step resolved carries the timed steps' shares of its own duration."""
    steps = 60
    got, marked, hello, timed = _run(0, steps, 0.0)
    assert [s["seq"] for s in got] == list(range(1, steps + 1))
    assert 0 < timed < steps and marked >= 8 * timed
    assert hello[-1]["gpu_every"] >= 1
    known = next(i for i, s in enumerate(got) if s["fwd"] > 0)
    for k, v in PHASES.items():
        assert all(abs(s[k] / s["dur"] - v / GPU_STEP) < 1e-5 for s in got[known:]), k


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
