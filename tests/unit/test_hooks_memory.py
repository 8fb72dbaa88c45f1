"""The CUDA allocator's peaks (hooks/memory.py): read through ``torch.cuda``'s two host-side calls
and nothing else (a stand-in that raises on any other attribute, fed with the samples of
tests/fixtures/cuda_memory), a step's spike held for a whole window after the reset, 0 on CPU, and
the agent exposing them as the catalog's gauges."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight import record
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ranks import RankSettings, RankTable
from ranksight.hooks import memory
from ranksight.hooks.sender import Background, enc_fields
from ranksight.totals import Totals

from support.cuda_memory_standin import CudaMemoryStandin, load
from test_exporter_helpers import parse, series

MiB = 1 << 20


def test_the_reader_reads_the_declared_fields_from_memory_stats_only():
    cuda = CudaMemoryStandin("steady")
    r = memory.AllocatorReader(cuda, 0, 30.0, now=0.0)
    got = r.read(1.0)
    steady = load("steady")
    assert got == {"retries": 0, "ooms": 0, "mres": steady["reserved_bytes.all.current"],
                   "malloc": 1200 * MiB, "mpeak": 1400 * MiB, "mrpeak": steady["reserved_bytes.all.peak"]}
    assert cuda.calls == ["memory_stats"]  # no reset inside the window, no other call at all
    fields = {f.key: f for f in record.FIELDS}
    assert all(fields[k].kind != record.PER_STEP and fields[k].unit in ("bytes", "count") for k in got)
    assert fields["mpeak"].metric is C.CUDA_ALLOCATED_PEAK and fields["mrpeak"].metric is C.CUDA_RESERVED_PEAK
    assert fields["mpeak"].since == fields["mrpeak"].since == 5


def test_a_spike_inside_a_step_stays_in_the_peak_for_a_whole_window_after_the_reset():
    """A 512 MiB temporary freed within the step: the current reading misses it, the peak holds it
    through the reset at the window's end and the whole next window, then lets it go."""
    cuda = CudaMemoryStandin("steady")
    r = memory.AllocatorReader(cuda, 0, 30.0, now=0.0)
    r.read(1.0)
    cuda.play("spike")
    got = r.read(2.0)
    assert got["malloc"] == 1200 * MiB and got["mpeak"] == 1912 * MiB
    assert got["mrpeak"] == got["mres"] == (2 << 30) + 512 * MiB
    cuda.play("steady")
    at_reset = r.read(30.0)  # the window ends: this read resets the allocator's peaks
    assert at_reset["mpeak"] == 1912 * MiB and cuda.calls[-1] == "reset_peak_memory_stats"
    assert cuda.stats["allocated_bytes.all.peak"] == cuda.stats["allocated_bytes.all.current"]
    cuda.play("steady")
    assert r.read(45.0)["mpeak"] == 1912 * MiB  # the closed window's peak, while the next one runs
    cuda.play("steady")
    assert r.read(60.0)["mpeak"] == 1912 * MiB  # (this read closes the window that held no spike)
    cuda.play("steady")
    assert r.read(61.0)["mpeak"] == 1400 * MiB  # two windows on, only the steady steps' peak
    assert set(cuda.calls) == {"memory_stats", "reset_peak_memory_stats"}
    assert cuda.calls.count("reset_peak_memory_stats") == 2


def test_a_window_of_0_never_resets_the_processs_peak():
    cuda = CudaMemoryStandin("steady")
    r = memory.AllocatorReader(cuda, 0, 0.0, now=0.0)
    cuda.play("spike")
    for t in (1.0, 100.0, 10_000.0):
        cuda.play("steady")
        assert r.read(t)["mpeak"] == 1912 * MiB
    assert "reset_peak_memory_stats" not in cuda.calls


def test_the_background_thread_reads_through_its_cuda_api_and_counts_a_failure():
    """The background's heartbeat read: the reader is made once per device with the settings' window;
    a failing read is a counted hook error and leaves the last values."""
    errors = []
    bg = SimpleNamespace(_alloc=None, _tl=SimpleNamespace(device=0), cuda_api=CudaMemoryStandin("spike"),
                         settings=SimpleNamespace(memory_peak_seconds=30.0), _mem=dict.fromkeys(memory.FIELDS, 0),
                         _hook_error=lambda where, e: errors.append(where))
    t0 = time.perf_counter()
    Background._read_cuda_memory(bg)
    assert bg._mem["mpeak"] == 1912 * MiB and bg._mem["malloc"] == 1200 * MiB and not errors
    assert bg._alloc.window_s == 30.0 and t0 + 30.0 <= bg._alloc.next_reset <= time.perf_counter() + 30.0

    def broken(device=None):
        raise RuntimeError("allocator gone")

    bg.cuda_api.memory_stats = broken
    Background._read_cuda_memory(bg)
    assert errors == ["CUDA memory stats"] and bg._mem["mpeak"] == 1912 * MiB


def test_a_cpu_watch_reports_the_peaks_as_0(clean_watch_env):
    import torch

    import ranksight

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = ranksight.hooks.watcher.start(model, opt, None, agent="off",
                                      config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})
    try:
        assert w._tl is None
        state = w.step_state()
        assert state["mpeak"] == 0 and state["mrpeak"] == 0
        assert set(P.LAYOUTS[P.VERSION].last) <= set(state)
    finally:
        ranksight.unwatch()


@pytest.mark.parametrize("v", [4, 5])
def test_the_agent_exposes_the_peaks_as_gauges(v):
    """A v5 record's peaks reach ranksight_cuda_memory_*_peak_bytes; a v4 sender's read as 0."""
    lay = P.SENDER_LAYOUTS[v, False]
    values = dict(dur=0.5, micro=1, retries=0, ooms=0, mres=3 << 30, malloc=1 << 30, mpeak=2 << 30, mrpeak=4 << 30)
    it = lay.step_tuple(1, 10.0, values)
    tot = Totals(lay)
    tot.step(it)
    prefix = P.encode(dict(v=v, job="j", ws=1, rank=0, lr=0, node="n", pid=7, sess=1, t="steps")).decode()[:-1] + ","
    last = [values.get(k, 0) for k in lay.last]
    data = lay.encode_steps(prefix, 1.7e9, 1, lay.encode_lists([it]), last, enc_fields(tot.fields())).encode()
    table = RankTable(RankSettings())
    assert table.apply(P.decode(data), 1000.0) == "ok"
    got = parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode())
    peak, rpeak = series(got, C.CUDA_ALLOCATED_PEAK.name), series(got, C.CUDA_RESERVED_PEAK.name)
    assert list(peak.values()) == [float(2 << 30) if v == 5 else 0.0]
    assert list(rpeak.values()) == [float(4 << 30) if v == 5 else 0.0]
    assert list(series(got, C.CUDA_RESERVED.name).values()) == [float(3 << 30)]
