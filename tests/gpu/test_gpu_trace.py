"""Runs on CPU: the trace arithmetic behind the profiler comparisons (bench/gpu/gpu_trace.py),
on a hand-made Kineto trace whose answers are known."""
from __future__ import annotations

import gzip
import json

import pytest

import gpu_fixtures  # noqa: F401  (puts bench/gpu on sys.path)
import gpu_trace as ktrace


def _trace():
    ev = []

    def rng(name, ts, dur, tid=1):
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur})

    def launch(corr, ts, tid=1):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts,
                   "dur": 2, "args": {"correlation": corr}})

    def kernel(corr, name, ts, dur, stream=7, cat="kernel"):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                   "args": {"correlation": corr, "stream": stream, "device": 0}})

    rng("rs_fwd", 0, 100)
    launch(1, 10), kernel(1, "gemm", 50, 100)
    launch(2, 20), kernel(2, "gemm", 160, 40)  # a gap of 10 us on the GPU
    rng("rs_bwd", 100, 300)
    launch(3, 150, tid=2), kernel(3, "gemm_bwd", 200, 200)  # launched by another thread
    launch(4, 160, tid=2), kernel(4, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 250, 100, stream=20)
    launch(5, 170, tid=2), kernel(5, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 420, 50, stream=20)
    launch(6, 180, tid=2), kernel(6, "Memcpy DtoD (Device -> Device)", 480, 10, cat="gpu_memcpy")
    rng("rs_opt", 400, 50)
    launch(7, 410), kernel(7, "adamw", 500, 30)
    kernel(99, "orphan", 900, 5)  # no launch in the trace
    return {"traceEvents": ev}


def test_spans_and_busy():
    t = ktrace.Trace(_trace())
    assert t.span_total("rs_fwd") == (pytest.approx(150e-6), 1)  # 50 .. 200
    r = t.ranges_named("rs_fwd")[0]
    assert t.busy(r) == pytest.approx(140e-6)
    assert t.span_total("rs_bwd")[0] == pytest.approx(290e-6)  # 200 .. 490, launches on another thread
    assert t.span_total("rs_opt")[0] == pytest.approx(30e-6)
    assert t.span_total("nothing") == (0.0, 0)


def test_hta_overlap():
    t = ktrace.Trace(_trace())
    ov = t.comm_overlap()
    # comm: [250,350] + [420,470] = 150 us; compute: [50,150]∪[160,200]∪[200,400]∪[500,530]
    # overlap: [250,350] fully (100 us); [420,470] none
    assert ov.comm_s == pytest.approx(150e-6)
    assert ov.overlap_s == pytest.approx(100e-6)
    assert ov.exposed_s == pytest.approx(50e-6)
    assert ov.overlap_ratio == pytest.approx(2 / 3)
    assert ov.comm_kernels == 2


def test_kernel_types_follow_hta():
    assert ktrace.kernel_type("ncclDevKernel_AllGather_RING_LL") == "COMMUNICATION"
    assert ktrace.kernel_type("ncclKernel_AllReduce") == "COMMUNICATION"
    assert ktrace.kernel_type("Memset (Device)", "gpu_memset") == "MEMORY"
    assert ktrace.kernel_type("void at::native::vectorized_elementwise_kernel") == "COMPUTATION"


def test_interval_helpers():
    assert ktrace.merge([(5, 6), (0, 2), (1, 3), (4, 4)]) == [(0, 3), (5, 6)]
    assert ktrace.intersection_length([(0, 10)], [(2, 3), (5, 20)]) == 6
    assert ktrace.rel_diff(1.05, 1.0) == pytest.approx(0.05)
    assert ktrace.rel_diff(0, 0) == 0.0


def test_load_gz(tmp_path):
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(_trace(), f)
    assert ktrace.Trace.load(p).span_total("rs_opt")[1] == 1


def test_event_span_includes_the_wait_for_the_host():
    t = ktrace.Trace(_trace())
    # rs_opt: host range starts at 400, but stream 7 is busy until 490 (the memcpy queued
    # before it); its kernel runs 500..530: an event pair sees 490..530
    assert t.event_span_total("rs_opt") == pytest.approx(40e-6)
    # rs_fwd: nothing before on stream 7, range starts at 0: 0..200
    assert t.event_span_total("rs_fwd") == pytest.approx(200e-6)


REAL = __import__("pathlib").Path(__file__).resolve().parent / "data" / "h200_ddp_ws1_2steps.trace.json.gz"


def test_real_h200_trace():
    """Two steps of the DDP world-size-1 scenario as torch.profiler wrote them on the H200 (trimmed
    to GPU activities, their launches and the rs_* ranges by bench/gpu/scenarios.py)."""
    t = ktrace.Trace.load(REAL)
    assert len(t.ops) > 1000
    assert all(o.launch is not None for o in t.ops)  # every activity joined to its launch
    for name in ("rs_fwd", "rs_bwd", "rs_opt"):
        rs = t.ranges_named(name)
        assert len(rs) == 2
        for r in rs:
            span, ev, busy = t.span(r), t.event_span(r), t.busy(r)
            assert 0 < busy <= span <= ev, (name, busy, span, ev)
    # the step is host-bound: the GPU is busy for well under half of each range's span
    fwd = t.ranges_named("rs_fwd")[1]
    assert t.busy(fwd) < 0.5 * t.span(fwd)
    assert sum(t.span(r) for r in t.ranges_named("rs_bwd")) > sum(t.span(r) for r in t.ranges_named("rs_fwd"))
    # world size 1: NCCL launches no kernel for DDP's in-place all-reduce
    assert t.comm_overlap().comm_kernels == 0
