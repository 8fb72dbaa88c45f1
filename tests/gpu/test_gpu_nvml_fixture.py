"""Runs on CPU: the recorded H200 NVML traces, served by the stand-in, still drive the real
collector code to tell a steady load from a sawtooth one (what the GPU test checks live)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ranksight.exporter.collectors.gpu import GpuCollector
from support.nvml_standin import NvmlStandin

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nvml"
TRACES = sorted(p for p in FIXTURES.glob("*.json") if {"steady", "sawtooth", "static"} <= set(json.loads(p.read_text())))


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def test_fixture_traces_exist():
    assert TRACES, f"no NVML trace with steady/sawtooth/static in {FIXTURES}"


@pytest.mark.parametrize("path", TRACES, ids=[p.name for p in TRACES])
def test_recorded_waveforms_are_told_apart(path):
    clock = Clock()
    nv = NvmlStandin(count=2, traces=("steady", "sawtooth"), path=path, clock=clock)
    coll = GpuCollector("fixture", poll_seconds=0.5, window_seconds=6.0, nvml=nv, clock=clock)
    coll.start(threads=False)
    assert coll.error is None
    try:
        clock.t += 0.5
        coll.poll()
        s0 = [g.swings for g in coll.gpus]
        for _ in range(22):  # 11 s of trace time, less than one loop of the recordings
            clock.t += 0.5
            coll.poll()
        steady, saw = coll.gpus
        assert steady.swings - s0[0] == 0
        assert steady.stats is not None and steady.stats[0] >= 0.9 and steady.stats[1] >= 0.8, steady.stats
        assert saw.stats is not None and saw.stats[0] < 0.8 and saw.stats[2] >= 0.9, saw.stats
        assert saw.swings - s0[1] >= 5
        assert steady.tensor_active is not None and steady.tensor_active > 0.3
    finally:
        coll.stop()


FAST = [p for p in TRACES if "sawtooth_fast" in json.loads(p.read_text())]


@pytest.mark.parametrize("path", FAST, ids=[p.name for p in FAST])
def test_sub_sample_period_sawtooth_reads_flat(path):
    """20 ms bursts / 20 ms sleeps: NVML's ~0.2 s samples average them into a flat ~50%. The
    collector sees a low mean and no swing (the waveform cannot resolve it; the mean still can)."""
    clock = Clock()
    nv = NvmlStandin(count=1, traces=("sawtooth_fast",), path=path, clock=clock)
    coll = GpuCollector("fixture", poll_seconds=0.5, window_seconds=6.0, nvml=nv, clock=clock)
    coll.start(threads=False)
    try:
        clock.t += 0.5
        coll.poll()
        s0 = coll.gpus[0].swings
        for _ in range(16):
            clock.t += 0.5
            coll.poll()
        g = coll.gpus[0]
        assert g.swings - s0 == 0
        assert 0.4 <= g.stats[0] <= 0.6 and g.stats[2] < 0.8, g.stats
    finally:
        coll.stop()
