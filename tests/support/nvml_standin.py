"""A stand-in for the ``pynvml`` module that serves recorded real H200 traces.

CI machines have no GPU. The GPU collector takes its NVML module as a
parameter; tests and the exporter benchmark pass an :class:`NvmlStandin`,
never the default. It answers the same calls the collector makes on the real
library (nvmlInit, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
nvmlDeviceGetSamples, nvmlDeviceGetMemoryInfo, ... , the GPM and event-set
calls), with pynvml's own constants, ctypes structures (``c_nvmlSample_t``,
``c_nvmlGpmMetricsGet_t``) and ``NVMLError`` codes, so the collector code path is
the one that runs on a real GPU.

What it serves (``tests/fixtures/nvml/h200_nvml_trace.json``, recorded with
``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, lastSeen)`` on one H200):

- utilization samples: GPU i plays trace ``traces[i % len(traces)]`` ("idle",
  "steady" or "sawtooth"), looped, at the recorded timestamps (about 5 Hz),
  shifted to the stand-in's clock. A steady recording that opens with samples
  taken before the load reached it (0%, then a ramp: more than 10 points under
  the trace's median) loses that lead-in, so that the loop is the steady load. As on the real driver, a buffer holds the
  last ~14 s: draining from timestamp 0 returns the recent history, and a
  call with no new sample raises NVML_ERROR_NOT_FOUND;
- PCIe gen/width current and max, temperature, power, SM clock,
  clocks-event reasons and total memory from the trace's ``static`` record
  (a GPU playing "idle" gets the ``<key>_idle`` values where recorded);
- GPM SM and tensor activity from ``static["gpm_<trace>"]`` where recorded for
  the trace a GPU plays; elsewhere GPM says it is unsupported;
- memory used is not in the recording: ``memory_used`` bytes (default 0).

Test controls: :meth:`lose` / :meth:`restore` a GPU (its calls raise
NVML_ERROR_GPU_IS_LOST), :meth:`inject_xid` queues a critical XID event.
"""
from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pynvml as _real  # constants, ctypes structures and NVMLError only; its functions are never called here

DEFAULT_TRACE = Path(__file__).resolve().parent.parent / "fixtures" / "nvml" / "h200_nvml_trace.json"  # tests/fixtures
BUFFER_US = 14_200_000  # the driver kept ~71 samples (~14 s) in the recording


@dataclass
class _Handle:
    index: int

    def __hash__(self) -> int:
        return self.index


@dataclass
class _Memory:
    total: int
    free: int
    used: int


@dataclass
class _EventData:
    device: _Handle
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class _Support:
    def __init__(self, ok: bool):
        self.version = 1
        self.isSupportedDevice = 1 if ok else 0


class _Trace:
    """One recorded sample list, looped on a period of its own length plus one sample interval."""

    def __init__(self, samples: List[List[int]], trim_lead_in: bool = False):
        if trim_lead_in:
            median = sorted(v for _, v in samples)[len(samples) // 2]
            skip = 0
            while skip < len(samples) - 1 and samples[skip][1] < median - 10:
                skip += 1
            samples = samples[skip:]
        t0 = samples[0][0]
        self.offsets = [int(ts - t0) for ts, _ in samples]
        self.values = [int(v) for _, v in samples]
        step = (self.offsets[-1] - self.offsets[0]) // max(1, len(self.offsets) - 1)
        self.period = self.offsets[-1] + step

    def between(self, lo: int, hi: int) -> List[Tuple[int, int]]:
        """(virtual time us, value) of the samples with lo < t <= hi (t may be negative: history)."""
        out = []
        c = lo // self.period
        while c * self.period <= hi:
            base = c * self.period
            for o, v in zip(self.offsets, self.values):
                t = base + o
                if lo < t <= hi:
                    out.append((t, v))
            c += 1
        return out


class NvmlStandin:
    """Module-like object: ``GpuCollector(nvml=NvmlStandin(8))``."""

    def __init__(self, count: int = 8, traces: Sequence[str] = ("steady", "sawtooth", "idle"),
                 path: Optional[Path] = None, clock: Callable[[], float] = time.time,
                 memory_used: int = 0):
        data = json.loads(Path(path or DEFAULT_TRACE).read_text())
        self.static: Dict[str, Any] = data["static"]
        self.driver: str = data["driver"]
        self.gpu_name: str = data["gpu"]
        self.count = count
        self.trace_names = [traces[i % len(traces)] for i in range(count)]
        self._traces = {name: _Trace(data[name], name == "steady") for name in set(self.trace_names)}
        self.clock = clock
        self.memory_used = memory_used
        self._start_us: Optional[int] = None
        self._lost: set = set()
        self._events: "queue.Queue[_EventData]" = queue.Queue()
        self._registered: Dict[int, int] = {}
        self._lock = threading.Lock()
        self.calls: Dict[str, int] = {}
        self._gpm_last: Dict[str, float] = {}

    # pynvml's constants, structures and error class
    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") and not name.startswith("nvmlEventType"):
            raise AttributeError(f"NVML stand-in does not implement {name}")
        return getattr(_real, name)

    # ------------------------------------------------------------------ helpers
    def _count(self, name: str) -> None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def _check(self, handle: Optional[_Handle] = None) -> None:
        if self._start_us is None:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        if handle is not None and handle.index in self._lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)

    def _static(self, key: str, handle: _Handle) -> Any:
        if self.trace_names[handle.index] == "idle" and f"{key}_idle" in self.static:
            return self.static[f"{key}_idle"]
        return self.static[key]

    def _now_us(self) -> int:
        return int(self.clock() * 1e6)

    # ------------------------------------------------------------------ test controls
    def lose(self, index: int) -> None:
        self._lost.add(index)

    def restore(self, index: int) -> None:
        self._lost.discard(index)

    def inject_xid(self, index: int, xid: int) -> None:
        self._events.put(_EventData(_Handle(index), _real.nvmlEventTypeXidCriticalError, xid))

    def trace_for(self, index: int) -> str:
        return self.trace_names[index]

    # ------------------------------------------------------------------ the NVML calls
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        self._start_us = self._now_us()

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        self._check()
        self._start_us = None

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check()
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._check()
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._check()
        if not 0 <= index < self.count:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        h = _Handle(index)
        self._check(h)
        return h

    def nvmlDeviceGetIndex(self, handle: _Handle) -> int:
        self._check()
        return handle.index

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check(handle)
        return self.gpu_name

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        self._check(handle)
        return f"GPU-standin-{handle.index:08d}-0000-0000-0000-000000000000"

    def nvmlDeviceGetSamples(self, handle: _Handle, sampling_type: int, timeStamp: int):
        self._count("nvmlDeviceGetSamples")
        self._check(handle)
        if sampling_type != _real.NVML_GPU_UTILIZATION_SAMPLES:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        assert self._start_us is not None
        start = self._start_us
        now = self._now_us() - start
        lo = max(int(timeStamp) - start, now - BUFFER_US)
        got = self._traces[self.trace_names[handle.index]].between(lo, now)
        if not got:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        out = []
        for t, v in got:
            s = _real.c_nvmlSample_t()
            s.timeStamp = start + t
            s.sampleValue.uiVal = v
            out.append(s)
        return _real.NVML_VALUE_TYPE_UNSIGNED_INT, out

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: Any = None) -> _Memory:
        self._check(handle)
        total = int(self.static["memory_total_bytes"])
        return _Memory(total=total, free=total - self.memory_used, used=self.memory_used)

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:
        self._check(handle)
        return int(self._static("temperature_c", handle))

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self._static("power_mw", handle))

    def nvmlDeviceGetClockInfo(self, handle: _Handle, clock_type: int) -> int:
        self._check(handle)
        if clock_type != _real.NVML_CLOCK_SM:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return int(self._static("sm_clock_mhz", handle))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self._static("clocks_event_reasons", handle))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self.static["pcie_gen_current"])

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self.static["pcie_gen_max"])

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self.static["pcie_width_current"])

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: _Handle) -> int:
        self._check(handle)
        return int(self.static["pcie_width_max"])

    # GPM
    def nvmlGpmQueryDeviceSupport(self, handle: _Handle) -> _Support:
        self._check(handle)
        return _Support(f"gpm_{self.trace_names[handle.index]}" in self.static)

    def nvmlGpmSampleAlloc(self):
        self._check()
        return _real.c_nvmlGpmSample_t()

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._check()

    def nvmlGpmSampleGet(self, handle: _Handle, sample: Any) -> Any:
        self._check(handle)
        gpm = self.static.get(f"gpm_{self.trace_names[handle.index]}")
        if gpm is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_last = gpm  # the metrics read next describe this GPU's trace
        return sample

    def nvmlGpmMetricsGet(self, mg: Any) -> Any:
        self._check()
        g = self._gpm_last
        recorded = {_real.NVML_GPM_METRIC_SM_UTIL: g["sm_util"], _real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: g["tensor_util"]}
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            if m.metricId in recorded:
                m.value = recorded[m.metricId]
                m.nvmlReturn = _real.NVML_SUCCESS
            else:
                m.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return mg

    # events (XID)
    def nvmlEventSetCreate(self) -> object:
        self._check()
        return object()

    def nvmlDeviceRegisterEvents(self, handle: _Handle, event_types: int, event_set: object) -> None:
        self._check(handle)
        self._registered[handle.index] = event_types

    def nvmlEventSetWait(self, event_set: object, timeoutms: int) -> _EventData:
        self._count("nvmlEventSetWait")
        self._check()
        try:
            ev = self._events.get(timeout=timeoutms / 1000.0)
        except queue.Empty:
            raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT) from None
        if not self._registered.get(ev.device.index, 0) & ev.eventType:
            raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)
        return ev

    def nvmlEventSetFree(self, event_set: object) -> None:
        self._count("nvmlEventSetFree")
