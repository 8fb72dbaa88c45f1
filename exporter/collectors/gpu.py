"""gpu: NVML utilization waveform and device state, sampled off the scrape path.

A sampling thread wakes every ``poll_seconds`` and, for each GPU, drains
``nvmlDeviceGetSamples(h, NVML_GPU_UTILIZATION_SAMPLES, last_ts)`` (every
sample since the previous poll; about 5 per second on H200, which the driver
buffers, so none is lost between polls). Every ``state_seconds`` (and on the
first pass) it also reads memory, temperature, power, SM clock, clocks-event
reasons, the current PCIe link and GPM SM and tensor activity (the GPM figures
average the time between two reads); the maximum PCIe link is read until the
GPU answers it, then kept. A scrape every 15 s sees state at most
``state_seconds`` old, for a fifth of the NVML calls of reading it every
second. Scrapes only read what the thread stored; they never call NVML.

Waveform per GPU, from the raw samples:
- window mean/min/max over the last ``window_seconds`` of sample time;
- ``gpu_utilization_samples``: histogram of every sample (catalog UTIL_BUCKETS);
- ``gpu_utilization_swings_total``: high -> low crossings (a sample at or above
  ``swing_high`` arms, a later one at or below ``swing_low`` counts and disarms);
- ``gpu_busy_seconds_total``: each sample's utilization times the time since
  the previous sample (the period it describes), so rate() is the mean
  utilization over any window.

An XID thread waits on an NVML event set (500 ms timeouts, so it stops within
half a second) and counts critical XID errors by xid.

Failures: no NVML (library, driver) or no GPU -> the collector is down
(collector_up 0, one log line). A GPU that stops answering (GPU_IS_LOST or
another error on its sample read) is ``gpu_up 0`` alone; the others go on.
The NVML module is a parameter: the real ``pynvml`` by default, or a stand-in
with the same calls (tests/support/nvml_standin.py) in tests and benches.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from bisect import bisect_left
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from ranksight import catalog as C
from ranksight import config
from ranksight.triage import CLOCK_EVENT_REASONS

from ..peak import peak_flops
from . import CollectorError, Context, Family, Labels, add, add_histogram, bucket_labels, family, register

log = logging.getLogger("ranksight.exporter.gpu")

_AGENT = config.defaults()["agent"]  # the constructor's defaults are the config's
_THRESHOLDS = config.defaults()["thresholds"]
MAX_GAP_SECONDS = 2.0  # longest sample period credited to gpu_busy_seconds_total (a gap means lost samples)
MAX_XIDS_PER_GPU = 64
XID_WAIT_MS = 500


class GpuState:
    """Everything known about one GPU; written by the sampler, read by scrapes under the collector lock."""

    def __init__(self, index: int, handle: Any):
        self.index = index
        self.label = str(index)
        self.handle = handle
        self.up = True
        self.name = ""
        self.peak: Optional[float] = None  # dense FLOP/s for the collector's dtype (exporter/peak.py)
        self.uuid = ""
        self.last_ts = 0  # NVML sample timestamp (us) of the newest sample seen
        self.prev_ts: Optional[int] = None
        self.window: Deque[Tuple[float, float]] = collections.deque()
        self.stats: Optional[Tuple[float, float, float]] = None  # mean, min, max over the window
        self.hist = [0] * (len(C.UTIL_BUCKETS) + 1)
        self.hist_sum = 0.0
        self.swings = 0
        self.armed = False
        self.busy = 0.0
        self.mem_used: Optional[int] = None
        self.mem_total: Optional[int] = None
        self.temp: Optional[float] = None
        self.power: Optional[float] = None
        self.sm_hz: Optional[float] = None
        self.reasons: Optional[int] = None
        self.pcie: Dict[str, Optional[int]] = {}
        self.xids: Dict[int, int] = {}
        self.gpm: Optional[List[Any]] = None  # two GPM sample buffers [prev, cur] when supported
        self.gpm_primed = False
        self.sm_active: Optional[float] = None
        self.tensor_active: Optional[float] = None
        self.expo: Optional[Dict[str, Any]] = None  # label sets for exposition (GpuCollector._labels)
        self.state_at: Optional[float] = None  # monotonic time of the last device state read
        self.pcie_max: Dict[str, int] = {}  # gen_max, width_max once the GPU answered them

    def observe(self, ts: int, util: float, high: float, low: float) -> None:
        prev = self.prev_ts
        if prev is not None and ts > prev:
            self.busy += util * min((ts - prev) / 1e6, MAX_GAP_SECONDS)
        self.prev_ts = ts
        self.hist[bisect_left(C.UTIL_BUCKETS, util)] += 1
        self.hist_sum += util
        if util >= high:
            self.armed = True
        elif self.armed and util <= low:
            self.swings += 1
            self.armed = False
        self.window.append((ts / 1e6, util))

    def trim(self, window_seconds: float) -> None:
        w = self.window
        if not w:
            self.stats = None
            return
        edge = w[-1][0] - window_seconds
        while w and w[0][0] <= edge:
            w.popleft()
        vals = [u for _, u in w]
        self.stats = (sum(vals) / len(vals), min(vals), max(vals))


class GpuCollector:
    name = "gpu"

    def __init__(self, node: str, poll_seconds: float = _AGENT["gpu_poll_seconds"],
                 window_seconds: float = _AGENT["gpu_window_seconds"],
                 swing_high: float = _THRESHOLDS["gpu_swing_high"], swing_low: float = _THRESHOLDS["gpu_swing_low"],
                 nvml: Any = None, state_seconds: float = _AGENT["gpu_state_seconds"],
                 clock: Any = time.monotonic, peak_dtype: str = _AGENT["peak_flops_dtype"],
                 peak_tflops: float = _AGENT["peak_tflops"], peak_by_name: Optional[Dict[str, float]] = None):
        self.node = node
        self.peak_dtype = peak_dtype
        self._peak = (peak_tflops, dict(peak_by_name or {}))
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.state_seconds = state_seconds
        self.window_seconds = window_seconds
        self.high = swing_high
        self.low = swing_low
        self._nvml_given = nvml
        self.nv: Any = None
        self.error: Optional[str] = None
        self.driver = ""
        self.gpus: List[GpuState] = []
        self.lock = threading.Lock()
        self.poll_duration = 0.0
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._logged: Set[Tuple[int, str]] = set()
        self._inited = False

    # ------------------------------------------------------------------ lifecycle
    def start(self, threads: bool = True) -> None:
        """Initialize NVML and start the sampling and XID threads. Never raises:
        a failure leaves the collector down with ``self.error`` as its one log line."""
        try:
            nv = self._nvml_given
            if nv is None:
                import pynvml as nv  # nvidia-ml-py; loads libnvidia-ml only in nvmlInit
            self.nv = nv
            nv.nvmlInit()
            self._inited = True
            self.driver = _str(nv.nvmlSystemGetDriverVersion())
            count = nv.nvmlDeviceGetCount()
            if count == 0:
                raise CollectorError("NVML found no GPU")
            for i in range(count):
                g = GpuState(i, nv.nvmlDeviceGetHandleByIndex(i))
                g.name = _str(nv.nvmlDeviceGetName(g.handle))
                g.uuid = _str(nv.nvmlDeviceGetUUID(g.handle))
                g.peak = peak_flops(g.name, self.peak_dtype, *self._peak)
                self._init_gpm(g)
                self.gpus.append(g)
        except CollectorError as e:
            self.error = str(e)
        except Exception as e:  # ImportError, NVMLError (library not found, driver not loaded), OSError
            self.error = f"NVML unavailable: {_describe(e)}"
        if self.error:
            log.debug("gpu collector down: %s", self.error)  # the agent logs it once
            self._shutdown()
            return
        log.info("gpu collector: %d GPU(s), driver %s", len(self.gpus), self.driver)
        for name in sorted({g.name for g in self.gpus if g.peak is None}):
            log.warning("gpu collector: no peak %s FLOP/s known for %r: no MFU for it (set agent.peak_tflops_by_name)",
                        self.peak_dtype, name)
        self.poll()
        if threads:
            for target, name in ((self._sample_loop, "gpu-sampler"), (self._xid_loop, "gpu-xid")):
                t = threading.Thread(target=target, name=name, daemon=True)
                t.start()
                self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        self._threads = []
        self._shutdown()

    def _shutdown(self) -> None:
        nv = self.nv
        for g in self.gpus:
            if g.gpm:
                for s in g.gpm:
                    try:
                        nv.nvmlGpmSampleFree(s)
                    except Exception:
                        pass
                g.gpm = None
        if self._inited:
            self._inited = False
            try:
                nv.nvmlShutdown()
            except Exception as e:
                log.debug("nvmlShutdown: %s", e)

    # ------------------------------------------------------------------ sampling
    def _sample_loop(self) -> None:
        logged = False
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except Exception:  # keep sampling; a bug here must not silence the GPUs for good
                if not logged:
                    logged = True
                    log.exception("gpu sampling pass failed (logged once)")

    def poll(self) -> None:
        """One sampling pass over every GPU (the sampler thread calls this; tests may too)."""
        t0 = time.perf_counter()
        for g in self.gpus:
            self._poll_gpu(g)
        self.poll_duration = time.perf_counter() - t0

    def _poll_gpu(self, g: GpuState) -> None:
        nv = self.nv
        try:
            try:
                vtype, samples = nv.nvmlDeviceGetSamples(g.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, g.last_ts)
            except nv.NVMLError as e:
                if e.value != nv.NVML_ERROR_NOT_FOUND:  # NOT_FOUND: no sample since last_ts
                    raise
                vtype, samples = None, []
            now = self.clock()
            state = None
            # due: a read within half a poll of the period counts as on time (the thread's wake-ups jitter)
            if g.state_at is None or now - g.state_at >= self.state_seconds - self.poll_seconds / 2:
                state = self._device_state(g)
                g.state_at = now
        except nv.NVMLError as e:
            with self.lock:
                if g.up:
                    log.warning("gpu %d stopped answering NVML (%s): gpu_up 0", g.index, _describe(e))
                g.up = False
            return
        with self.lock:
            if not g.up:
                log.info("gpu %d answers NVML again", g.index)
                g.up = True
            for s in samples:
                ts = s.timeStamp
                if ts <= g.last_ts:
                    continue
                g.observe(ts, _sample_value(nv, vtype, s.sampleValue) / 100.0, self.high, self.low)
                g.last_ts = ts
            g.trim(self.window_seconds)
            if state is not None:
                (g.mem_used, g.mem_total, g.temp, g.power, g.sm_hz, g.reasons, g.pcie,
                 g.sm_active, g.tensor_active) = state

    def _field(self, g: GpuState, what: str, fn, *args):
        """One NVML read; None when the device does not support it (logged once per GPU and field).
        GPU_IS_LOST propagates: the whole GPU is down."""
        nv = self.nv
        try:
            return fn(g.handle, *args)
        except nv.NVMLError as e:
            if e.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise
            if (g.index, what) not in self._logged:
                self._logged.add((g.index, what))
                log.info("gpu %d: %s unavailable (%s)", g.index, what, _describe(e))
            return None

    def _device_state(self, g: GpuState):
        nv = self.nv
        mem = self._field(g, "memory", nv.nvmlDeviceGetMemoryInfo)
        temp = self._field(g, "temperature", nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU)
        mw = self._field(g, "power", nv.nvmlDeviceGetPowerUsage)
        mhz = self._field(g, "sm clock", nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM)
        reasons_fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        reasons = self._field(g, "clocks-event reasons", reasons_fn)
        pmax = g.pcie_max
        for k, fn in (("gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration), ("width_max", nv.nvmlDeviceGetMaxPcieLinkWidth)):
            if k not in pmax:  # the link's maximum does not change: read until answered, then kept
                v = self._field(g, "pcie", fn)
                if v is not None:
                    pmax[k] = v
        pcie = {
            "gen_current": self._field(g, "pcie", nv.nvmlDeviceGetCurrPcieLinkGeneration),
            "gen_max": pmax.get("gen_max"),
            "width_current": self._field(g, "pcie", nv.nvmlDeviceGetCurrPcieLinkWidth),
            "width_max": pmax.get("width_max"),
        }
        sm, tensor = self._gpm(g)
        return (
            mem.used if mem is not None else None,
            mem.total if mem is not None else None,
            float(temp) if temp is not None else None,
            mw / 1000.0 if mw is not None else None,
            mhz * 1e6 if mhz is not None else None,
            reasons,
            pcie,
            sm,
            tensor,
        )

    # ------------------------------------------------------------------ GPM (Hopper and newer)
    def _init_gpm(self, g: GpuState) -> None:
        nv = self.nv
        try:
            if not nv.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice:
                return
            g.gpm = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        except Exception as e:  # NVMLError, or an old library without the GPM calls
            log.info("gpu %d: GPM unavailable (%s)", g.index, _describe(e))
            g.gpm = None

    def _gpm(self, g: GpuState) -> Tuple[Optional[float], Optional[float]]:
        if not g.gpm:
            return None, None
        nv = self.nv
        prev, cur = g.gpm
        try:
            nv.nvmlGpmSampleGet(g.handle, cur)
            if not g.gpm_primed:
                g.gpm_primed = True
                g.gpm = [cur, prev]
                return None, None
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1 = prev
            mg.sample2 = cur
            mg.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            mg.metrics[1].metricId = nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as e:
            if e.value == nv.NVML_ERROR_GPU_IS_LOST:
                raise
            if (g.index, "gpm") not in self._logged:
                self._logged.add((g.index, "gpm"))
                log.info("gpu %d: GPM read failed (%s)", g.index, _describe(e))
            return None, None
        g.gpm = [cur, prev]
        out = []
        for i in range(2):
            m = mg.metrics[i]
            out.append(m.value / 100.0 if m.nvmlReturn == nv.NVML_SUCCESS else None)
        return out[0], out[1]

    # ------------------------------------------------------------------ XID events
    def _xid_loop(self) -> None:
        nv = self.nv
        try:
            es = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.info("gpu: no XID events (%s)", _describe(e))
            return
        by_handle: Dict[int, GpuState] = {}
        try:
            for g in self.gpus:
                try:
                    nv.nvmlDeviceRegisterEvents(g.handle, nv.nvmlEventTypeXidCriticalError, es)
                    by_handle[g.index] = g
                except nv.NVMLError as e:
                    log.info("gpu %d: XID events unavailable (%s)", g.index, _describe(e))
            while by_handle and not self._stop.is_set():
                try:
                    data = nv.nvmlEventSetWait(es, XID_WAIT_MS)
                except nv.NVMLError as e:
                    if e.value != nv.NVML_ERROR_TIMEOUT:
                        log.debug("nvmlEventSetWait: %s", _describe(e))
                        self._stop.wait(1.0)
                    continue
                if not data.eventType & nv.nvmlEventTypeXidCriticalError:
                    continue
                try:
                    idx = nv.nvmlDeviceGetIndex(data.device)
                except nv.NVMLError:
                    continue
                g = by_handle.get(idx)
                if g is None:
                    continue
                xid = int(data.eventData)
                log.warning("gpu %d: XID %d", idx, xid)
                with self.lock:
                    if xid in g.xids or len(g.xids) < MAX_XIDS_PER_GPU:
                        g.xids[xid] = g.xids.get(xid, 0) + 1
        finally:
            try:
                nv.nvmlEventSetFree(es)
            except Exception as e:
                log.debug("nvmlEventSetFree: %s", e)

    # ------------------------------------------------------------------ exposition
    def uuid_labels(self) -> Dict[str, str]:
        """GPU UUID (lower-case, as NVML prints it) -> the ``gpu`` label of this collector's series."""
        with self.lock:
            return {g.uuid.strip().lower(): g.label for g in self.gpus if g.uuid}

    def _labels(self, g: GpuState) -> Dict[str, Any]:
        L = g.expo
        if L is None:
            base = Labels(node=self.node, gpu=g.label)
            L = g.expo = {
                "base": base,
                "info": Labels(base, name=g.name, uuid=g.uuid, driver=self.driver),
                "peak": base.plus("dtype", self.peak_dtype),
                "buckets": bucket_labels(base, C.UTIL_BUCKETS),
                "stat": [base.plus("stat", st) for st in ("mean", "min", "max")],
                "reason": [(bit, base.plus("reason", reason)) for bit, reason in CLOCK_EVENT_REASONS.items()],
                "state": {st: base.plus("state", st) for st in ("current", "max")},
                "xid": {},
            }
        return L

    def collect(self) -> List[Family]:
        if self.error:
            raise CollectorError(self.error)
        F = {m.short: family(m) for m in (
            C.GPU_UP, C.GPU_INFO, C.GPU_PEAK_FLOPS, C.GPU_UTILIZATION, C.GPU_UTILIZATION_SAMPLES, C.GPU_SWINGS, C.GPU_BUSY_SECONDS,
            C.GPU_MEMORY_USED, C.GPU_MEMORY_TOTAL, C.GPU_TEMPERATURE, C.GPU_POWER, C.GPU_SM_CLOCK,
            C.GPU_CLOCKS_EVENT, C.GPU_PCIE_GEN, C.GPU_PCIE_WIDTH, C.GPU_XID_ERRORS, C.GPU_SM_ACTIVE,
            C.GPU_TENSOR_ACTIVE)}
        gauges = [(F[m.short], a) for m, a in (
            (C.GPU_MEMORY_USED, "mem_used"), (C.GPU_MEMORY_TOTAL, "mem_total"), (C.GPU_TEMPERATURE, "temp"),
            (C.GPU_POWER, "power"), (C.GPU_SM_CLOCK, "sm_hz"), (C.GPU_SM_ACTIVE, "sm_active"),
            (C.GPU_TENSOR_ACTIVE, "tensor_active"))]
        f_util, f_reason = F[C.GPU_UTILIZATION.short], F[C.GPU_CLOCKS_EVENT.short]
        f_xid = F[C.GPU_XID_ERRORS.short]
        with self.lock:
            for g in self.gpus:
                L = self._labels(g)
                base = L["base"]
                add(F[C.GPU_UP.short], base, 1.0 if g.up else 0.0)
                add(F[C.GPU_INFO.short], L["info"], 1.0)
                if g.peak is not None:
                    add(F[C.GPU_PEAK_FLOPS.short], L["peak"], g.peak)
                # counters stay exposed while a GPU is lost (they are still true); gauges go away
                add_histogram(F[C.GPU_UTILIZATION_SAMPLES.short], base, L["buckets"], g.hist, g.hist_sum)
                add(F[C.GPU_SWINGS.short], base, g.swings)
                add(F[C.GPU_BUSY_SECONDS.short], base, g.busy)
                for xid, n in sorted(g.xids.items()):
                    lab = L["xid"].get(xid)
                    if lab is None:
                        lab = L["xid"][xid] = base.plus("xid", str(xid))
                    add(f_xid, lab, n)
                if not g.up:
                    continue
                if g.stats is not None:
                    for lab, v in zip(L["stat"], g.stats):
                        add(f_util, lab, v)
                for f, a in gauges:
                    v = getattr(g, a)
                    if v is not None:
                        add(f, base, v)
                if g.reasons is not None:
                    for bit, lab in L["reason"]:
                        add(f_reason, lab, 1.0 if g.reasons & bit else 0.0)
                for m, kind in ((C.GPU_PCIE_GEN, "gen"), (C.GPU_PCIE_WIDTH, "width")):
                    for state, lab in L["state"].items():
                        v = g.pcie.get(f"{kind}_{state}")
                        if v is not None:
                            add(F[m.short], lab, v)
        return list(F.values())


def _str(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _describe(e: BaseException) -> str:
    s = str(e)
    return s if s else type(e).__name__


def _sample_value(nv: Any, vtype: Any, v: Any) -> float:
    if vtype == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vtype == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.ulVal)
    if vtype == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return float(v.ullVal)
    if vtype == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if vtype == nv.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    return float(v.uiVal)  # utilization samples are unsigned int percent


@register("gpu")
def _build(ctx: Context) -> GpuCollector:
    s = ctx.settings
    g = GpuCollector(s.node, s.gpu_poll_seconds, s.gpu_window_seconds, s.gpu_swing_high, s.gpu_swing_low,
                     nvml=ctx.nvml, state_seconds=s.gpu_state_seconds, peak_dtype=s.peak_flops_dtype,
                     peak_tflops=s.peak_tflops, peak_by_name=s.peak_tflops_by_name)
    g.start()
    return g
