"""The step path re-records its own CUDA events with the driver's cuEventRecord, the GIL held
(``ranksight.hooks.timing.driver_recorder``). On the real GPU: an event recorded that way times
what the same event recorded by ``Event.record`` times, on the stream that is current, without a
synchronization; an event torch never recorded is left to torch."""
from __future__ import annotations

import time

import pytest

from gpu_fixtures import gpu_results  # noqa: F401  (puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

SLEEP_CYCLES = 20_000_000  # torch.cuda._sleep: about 10 ms on an H200


def _wait(ev) -> None:
    deadline = time.monotonic() + 10
    while not ev.query():  # query() only: no synchronization
        assert time.monotonic() < deadline, "event never completed"
        time.sleep(0.0005)


def _pair_ms(torch, rec_a, rec_b, a, b) -> float:
    rec_a(a)
    torch.cuda._sleep(SLEEP_CYCLES)
    rec_b(b)
    _wait(b)
    return a.elapsed_time(b)


def test_driver_rerecord_times_like_torch_record_and_never_syncs():
    import torch

    from ranksight.hooks.timing import CudaTimeline, driver_recorder

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    rr = driver_recorder(torch, dev)
    assert rr is not None, "libcuda's cuEventRecord and torch's raw stream are reachable on a CUDA machine"
    assert CudaTimeline.RECORD == "driver"
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    assert rr(a) is False, "an event torch has not created yet is left to torch"
    s = torch.cuda.current_stream(dev)
    a.record(s)
    b.record(s)
    torch.cuda.synchronize(dev)

    def by_torch(ev):
        ev.record(torch.cuda.current_stream(dev))

    def by_driver(ev):
        assert rr(ev) is True

    torch.cuda.set_sync_debug_mode("error")
    try:
        t, d = [], []
        for _ in range(6):
            t.append(_pair_ms(torch, by_torch, by_torch, a, b))
            d.append(_pair_ms(torch, by_driver, by_driver, a, b))
        # on a side stream: the driver records on the stream that is current, as torch does
        side = torch.cuda.Stream(dev)
        with torch.cuda.stream(side):
            ms_side = _pair_ms(torch, by_torch, by_driver, a, b)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    mt, md = W.median(t), W.median(d)
    assert mt > 1.0, f"the sleep kernel took {mt:.3f} ms"
    assert abs(md - mt) / mt < 0.05, f"driver-recorded pairs {d} vs torch-recorded {t} (ms)"
    assert abs(ms_side - mt) / mt < 0.10, f"side stream: {ms_side:.3f} ms vs {mt:.3f} ms"


def test_the_timeline_re_records_its_own_events_through_the_driver():
    import torch

    from ranksight.hooks.timing import FWD, CudaTimeline

    dev = torch.device("cuda", 0)
    tl = CudaTimeline(torch, dev, max_pending=64)
    assert tl._rerecord is not None
    calls = {"n": 0}
    real = tl._rerecord

    def counting(ev):
        ok = real(ev)
        calls["n"] += ok
        return ok

    tl._rerecord = counting
    got = []
    for _ in range(8):
        e0 = tl.mark(own=True)
        torch.cuda._sleep(SLEEP_CYCLES // 4)
        e1 = tl.mark(own=True)
        tl.push(FWD, e0, e1)
        _wait(e1)
        tl.resolve(lambda kind, sec: got.append((kind, sec)))
    assert len(got) == 8 and all(k == FWD and sec > 0 for k, sec in got), got
    assert tl.created <= 4, f"{tl.created} events created: the pool re-records its own"
    assert calls["n"] >= 12, f"{calls['n']} of 16 marks re-recorded through the driver"
    spread = max(s for _, s in got) / min(s for _, s in got)
    assert spread < 1.5, got
