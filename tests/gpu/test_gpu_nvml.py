"""The agent's GPU collector on a real GPU with the real ``pynvml``.

One module-scoped run: the collector samples every 0.5 s (window 6 s) while the test puts a
steady load (back-to-back bf16 8192^3 matmuls) and then a sawtooth load (0.3 s of matmuls,
0.45 s of host sleep) on GPU 0; a snapshot of the collector's state is taken at the end of
each, while the load still runs. The tests then check what the triage needs from it.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Dict

import pytest

from gpu_fixtures import gpu_results  # noqa: F401  (fixture; puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

STEADY_S = 9.0
SAWTOOTH_S = 10.0
WINDOW_S = 6.0


def _snap(coll: Any) -> Dict[str, Any]:
    with coll.lock:
        g = coll.gpus[0]
        return {"t": time.monotonic(), "stats": g.stats, "swings": g.swings, "busy": g.busy, "hist": list(g.hist),
                "samples": sum(g.hist), "sm_active": g.sm_active, "tensor_active": g.tensor_active,
                "pcie": dict(g.pcie), "reasons": g.reasons, "temp": g.temp, "power": g.power, "sm_hz": g.sm_hz,
                "mem_used": g.mem_used, "mem_total": g.mem_total, "up": g.up, "poll_s": coll.poll_duration}


def _xid_threads():
    return [t for t in threading.enumerate() if t.name == "gpu-xid" and t.is_alive()]


@pytest.fixture(scope="module")
def nvml_run(gpu_results):
    from gpu_loads import Loads

    from ranksight.exporter.collectors.gpu import GpuCollector

    loads = Loads()
    before = len(_xid_threads())
    # device state every poll: these tests read NVML itself, not the collector's state period
    coll = GpuCollector("h200-test", poll_seconds=0.5, window_seconds=WINDOW_S, state_seconds=0.5)
    coll.start()
    assert coll.error is None, f"the GPU collector is down with the real pynvml: {coll.error}"
    out: Dict[str, Any] = {"driver": coll.driver, "name": coll.gpus[0].name, "gpus": len(coll.gpus)}
    try:
        time.sleep(1.0)
        out["xid_threads_running"] = len(_xid_threads()) - before
        out["idle"] = _snap(coll)
        loads.steady(STEADY_S, at_end=lambda: out.__setitem__("steady", _snap(coll)))
        cycles = loads.sawtooth(SAWTOOTH_S, at_end=lambda: out.__setitem__("sawtooth", _snap(coll)))
        out["sawtooth_cycles"] = cycles
        time.sleep(2.0)
        coll.poll()
        out["after"] = _snap(coll)
        polls = []
        for _ in range(10):
            coll.poll()
            polls.append(coll.poll_duration)
        out["poll_seconds"] = {"p50": W.median(polls), "max": max(polls)}
        out["families"] = sorted({f.name for f in coll.collect()})
    finally:
        t0 = time.monotonic()
        coll.stop()
        out["stop_seconds"] = time.monotonic() - t0
        out["xid_threads_after_stop"] = len(_xid_threads()) - before
    gpu_results["nvml"] = out
    return out


def test_collector_reads_the_gpu(nvml_run):
    r = nvml_run
    assert r["gpus"] >= 1 and r["name"], r
    s = r["steady"]
    assert s["up"] is True
    assert s["mem_total"] and s["mem_total"] > 1 << 30
    assert s["mem_used"] is not None and s["mem_used"] > 0
    assert s["temp"] is not None and 5 <= s["temp"] <= 110
    assert s["power"] is not None and 20 <= s["power"] <= 1500
    assert s["sm_hz"] is not None and s["sm_hz"] >= 300e6


def test_steady_and_sawtooth_are_told_apart(nvml_run):
    r = nvml_run
    steady, saw = r["steady"], r["sawtooth"]
    assert steady["stats"] is not None and saw["stats"] is not None
    s_mean, s_min, s_max = steady["stats"]
    w_mean, w_min, w_max = saw["stats"]
    # steady: high and flat; the idle->busy ramp is not a swing
    assert s_mean >= 0.9 and s_min >= 0.8, steady["stats"]
    assert steady["swings"] - r["idle"]["swings"] == 0
    # sawtooth: mean below the sawtooth threshold, full-depth swings, several per window
    assert w_mean < 0.8, saw["stats"]
    assert w_max >= 0.9 and w_min <= 0.1, saw["stats"]
    swings = saw["swings"] - steady["swings"]
    assert swings >= r["sawtooth_cycles"] // 2, (swings, r["sawtooth_cycles"])
    # gpu_busy_seconds_total advances with utilization x time
    assert saw["busy"] > steady["busy"] > r["idle"]["busy"]


def test_samples_arrive_at_nvml_rate(nvml_run):
    r = nvml_run
    n = r["sawtooth"]["samples"] - r["idle"]["samples"]
    secs = r["sawtooth"]["t"] - r["idle"]["t"]
    assert n >= 2.5 * secs, f"{n} samples in {secs:.1f} s"  # NVML gives ~5/s on H200


def test_gpm_sm_and_tensor_activity(nvml_run):
    s = nvml_run["steady"]
    assert s["sm_active"] is not None, "GPM SM activity missing on a Hopper GPU"
    assert s["tensor_active"] is not None, "GPM tensor activity missing on a Hopper GPU"
    assert s["sm_active"] >= 0.5 and s["tensor_active"] >= 0.3, (s["sm_active"], s["tensor_active"])
    a = nvml_run["after"]  # idle again
    assert a["tensor_active"] is None or a["tensor_active"] < s["tensor_active"]


def test_pcie_and_clock_event_reasons(nvml_run):
    s = nvml_run["steady"]
    p = s["pcie"]
    for k in ("gen_current", "gen_max", "width_current", "width_max"):
        assert p.get(k) is not None, f"PCIe {k} not read: {p}"
    assert 1 <= p["gen_current"] <= p["gen_max"] and 1 <= p["width_current"] <= p["width_max"]
    assert s["reasons"] is not None
    assert nvml_run["after"]["reasons"] is not None


def test_xid_thread_runs_and_stops(nvml_run):
    r = nvml_run
    assert r["xid_threads_running"] == 1, "the XID thread was not running 1 s after start"
    assert r["xid_threads_after_stop"] == 0
    assert r["stop_seconds"] < 3.0


def test_agent_scrape_with_real_gpu(tmp_path, gpu_results):
    """A real `ranksight exporter` subprocess with the gpu collector: scrape time and content."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from ranksight import catalog as C
    from ranksight.tools.stack import AgentProcess

    agent = AgentProcess(tmp_path, collectors="gpu,ranks", name="agent-gpu")
    agent.start(timeout=60)
    try:
        time.sleep(2.5)  # a few sampler passes
        times, body = [], b""
        for _ in range(50):
            t0 = time.perf_counter()
            with urllib.request.urlopen(f"{agent.url}/metrics", timeout=5) as resp:
                body = resp.read()
            times.append(time.perf_counter() - t0)
        text = body.decode()
        fams = {f.name: f for f in text_string_to_metric_families(text)}

        def val(m, **labels):
            f = fams.get(str(m).removesuffix("_total")) or fams.get(str(m))
            assert f is not None, f"{m} missing from /metrics"
            for s in f.samples:
                if all(s.labels.get(k) == v for k, v in labels.items()):
                    return s.value
            raise AssertionError(f"{m}{labels} missing")

        assert val(C.COLLECTOR_UP, collector="gpu") == 1
        assert val(C.GPU_UP, gpu="0") == 1
        gpu_poll = val(C.COLLECTOR_DURATION, collector="gpu")
        val(C.GPU_UTILIZATION, gpu="0", stat="mean")
        val(C.GPU_PCIE_GEN, gpu="0", state="max")
        gpu_results["agent_scrape"] = {
            "scrapes": len(times), "p50_s": W.median(times), "p99_s": W.quantile(times, 0.99),
            "max_s": max(times), "bytes": len(body), "gpu_poll_s": gpu_poll,
            "series": sum(len(f.samples) for f in fams.values())}
    finally:
        agent.stop()
