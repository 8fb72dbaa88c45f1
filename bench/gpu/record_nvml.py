"""Record real NVML utilization traces on GPU 0 for the CPU stand-in's fixtures.

    python bench/gpu/record_nvml.py --out tests/fixtures/nvml/h200_nvml_trace_2026-11-29.json

Same JSON shape as ``tests/fixtures/nvml/h200_nvml_trace.json`` (so
``NvmlStandin(path=...)`` serves it): ``[timestamp_us, percent]`` lists drained with
``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, lastSeen)`` under

  idle           no work
  steady         back-to-back bf16 8192^3 matmuls, recorded after a 1.5 s lead-in, so the
                 trace has no idle ramp and loops seamlessly in the stand-in
  sawtooth       0.3 s of matmuls, 0.45 s of host sleep
  sawtooth_fast  20 ms of matmuls, 20 ms of host sleep: a period shorter than NVML's sample
                 period, which the samples average out (shows what the waveform cannot see)

and a ``static`` record (PCIe, temperature, power, SM clock, clocks-event reasons idle and
busy, memory, GPM SM/occupancy/tensor activity under the steady and the sawtooth loads).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_workload as W  # noqa: E402


class Recorder:
    def __init__(self) -> None:
        import pynvml as nv

        self.nv = nv
        nv.nvmlInit()
        self.h = nv.nvmlDeviceGetHandleByIndex(0)
        self.last = 0
        self.poll_costs: List[float] = []
        self.drain()  # history before we start

    def drain(self) -> List[List[int]]:
        nv = self.nv
        t0 = time.perf_counter()
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(self.h, nv.NVML_GPU_UTILIZATION_SAMPLES, self.last)
        except nv.NVMLError as e:
            if e.value != nv.NVML_ERROR_NOT_FOUND:
                raise
            samples = []
        self.poll_costs.append(time.perf_counter() - t0)
        out = [[int(s.timeStamp), int(s.sampleValue.uiVal)] for s in samples if s.timeStamp > self.last]
        if out:
            self.last = out[-1][0]
        return out

    def record(self, run, seconds: float) -> List[List[int]]:
        """Run ``run(duration)`` in chunks of <= 5 s, draining between (the driver keeps ~14 s)."""
        got: List[List[int]] = []
        left = seconds
        while left > 0:
            chunk = min(5.0, left)
            run(chunk)
            got.extend(self.drain())
            left -= chunk
        return got

    def gpm(self, run, seconds: float) -> Optional[Dict[str, float]]:
        nv = self.nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(self.h).isSupportedDevice:
                return None
            s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
        except Exception as e:
            return {"error": str(e)}  # type: ignore[dict-item]
        try:
            nv.nvmlGpmSampleGet(self.h, s1)
            run(seconds)
            nv.nvmlGpmSampleGet(self.h, s2)
            ids = {"sm_util": nv.NVML_GPM_METRIC_SM_UTIL, "sm_occupancy": nv.NVML_GPM_METRIC_SM_OCCUPANCY,
                   "tensor_util": nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL}
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(ids)
            mg.sample1 = s1
            mg.sample2 = s2
            for i, mid in enumerate(ids.values()):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            return {k: float(mg.metrics[i].value) for i, k in enumerate(ids) if mg.metrics[i].nvmlReturn == nv.NVML_SUCCESS}
        finally:
            nv.nvmlGpmSampleFree(s1)
            nv.nvmlGpmSampleFree(s2)

    def static(self) -> Dict[str, Any]:
        nv, h = self.nv, self.h
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        f = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        return {
            "memory_total_bytes": int(mem.total),
            "pcie_gen_current": int(nv.nvmlDeviceGetCurrPcieLinkGeneration(h)),
            "pcie_gen_max": int(nv.nvmlDeviceGetMaxPcieLinkGeneration(h)),
            "pcie_width_current": int(nv.nvmlDeviceGetCurrPcieLinkWidth(h)),
            "pcie_width_max": int(nv.nvmlDeviceGetMaxPcieLinkWidth(h)),
            "temperature_c": int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            "power_mw": int(nv.nvmlDeviceGetPowerUsage(h)),
            "clocks_event_reasons": int(f(h)),
            "sm_clock_mhz": int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
        }


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="trace JSON to write")
    p.add_argument("--seconds", type=float, default=12.0, help="length of the steady and sawtooth traces")
    a = p.parse_args(argv)
    if not W.cuda_available():
        print("bench/gpu/record_nvml.py: CUDA is not available on this machine; skipped")
        return 0
    from gpu_loads import Loads

    loads = Loads()
    rec = Recorder()
    nv = rec.nv
    drv = nv.nvmlSystemGetDriverVersion()
    name = nv.nvmlDeviceGetName(rec.h)
    out: Dict[str, Any] = {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "driver": drv.decode() if isinstance(drv, bytes) else str(drv),
        "sample_type": "NVML_GPU_UTILIZATION_SAMPLES", "value_unit": "percent",
        "timestamp_unit": "microseconds (CPU clock)",
        "how": ("nvmlDeviceGetSamples(handle, NVML_GPU_UTILIZATION_SAMPLES, lastSeenTimeStamp), drained every <= 5 s; "
                "steady = back-to-back bf16 8192^3 matmuls after a 1.5 s lead-in; sawtooth = 0.3 s of matmuls then "
                "0.45 s host sleep; sawtooth_fast = 20 ms of matmuls then 20 ms host sleep "
                "(bench/gpu/record_nvml.py)"),
    }
    time.sleep(2.0)
    rec.drain()
    idle_static = rec.static()
    out["idle"] = rec.record(Loads.idle, 8.0)

    loads.burst(1.5)  # lead-in: clocks up, samples at 100%
    rec.drain()
    out["steady"] = rec.record(lambda s: loads.steady(s), a.seconds)
    gpm_steady = rec.gpm(lambda s: loads.steady(s), 2.0)
    loads.burst(0.2)
    busy_static = rec.static()  # read right after a burst: clocks and power still up
    rec.drain()
    out["sawtooth"] = rec.record(lambda s: loads.sawtooth(s, 0.3, 0.45), a.seconds)
    gpm_saw = rec.gpm(lambda s: loads.sawtooth(s, 0.3, 0.45), 3.0)
    rec.drain()
    out["sawtooth_fast"] = rec.record(lambda s: loads.sawtooth(s, 0.02, 0.02), 10.0)

    static = dict(busy_static)
    static["clocks_event_reasons_idle"] = idle_static["clocks_event_reasons"]
    static["sm_clock_mhz_idle"] = idle_static["sm_clock_mhz"]
    static["power_mw_idle"] = idle_static["power_mw"]
    static["temperature_c_idle"] = idle_static["temperature_c"]
    static["gpm_steady"] = gpm_steady
    static["gpm_sawtooth"] = gpm_saw
    static["samples_get_cost_ms_p50"] = W.median(rec.poll_costs) * 1e3
    out["static"] = static
    out["recorded"] = W.versions()
    nv.nvmlShutdown()
    W.write_json(a.out, out)
    vals = {k: [v for _, v in out[k]] for k in ("idle", "steady", "sawtooth", "sawtooth_fast")}
    print(json.dumps({k: {"n": len(v), "mean": (sum(v) / len(v) if v else None), "min": min(v, default=None),
                          "max": max(v, default=None)} for k, v in vals.items()}))
    print(json.dumps({"static": static}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
