"""Reading a torch.profiler (Kineto) Chrome trace: GPU spans of host ranges, and HTA's overlap.

Torch-free, so the CPU test suite checks it (on a trace recorded on an H200) and the GPU
tests and the multi-GPU scripts use the same code.

Definitions
-----------
GPU activity: trace events of category ``kernel``, ``gpu_memcpy`` or ``gpu_memset``
(``ts``/``dur`` in microseconds on the host clock, as Kineto writes them).

Launch: the host call (category ``cuda_runtime`` or ``cuda_driver``) with the same
``args.correlation`` as the GPU activity. A GPU activity *belongs to* a host range
(a ``record_function`` span, category ``user_annotation``) when its launch started inside
the range, on any thread (backward kernels are launched by autograd's device thread while
the main thread sits in ``backward()``).

Span of a range: last end minus first start of the GPU activities that belong to it
(what a pair of CUDA events around the range measures when the device is busy).

Communication (HTA, ``hta/analyzers/communication_analysis.py`` and ``hta/utils/utils.py``):
a kernel is communication when its name starts with ``nccl``, memory when it is a
Memcpy/Memset, computation otherwise. Both kernel sets are merged into unions of intervals;
the overlap is the length of (comm union) intersected with (comp union); HTA's overlap
ratio is overlap / |comm union|. The *exposed* communication is |comm union| - overlap:
the time the GPU only communicated.
"""
from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
RANGE_CAT = "user_annotation"

Interval = Tuple[float, float]


@dataclass(frozen=True)
class GpuOp:
    name: str
    cat: str
    start: float  # us
    end: float  # us
    stream: int
    launch: Optional[float]  # us, host time of the launch call (None: no correlated launch)

    @property
    def kind(self) -> str:
        """HTA's kernel type: COMMUNICATION, MEMORY or COMPUTATION."""
        return kernel_type(self.name, self.cat)


def kernel_type(name: str, cat: str = "kernel") -> str:
    if name.startswith("nccl"):
        return "COMMUNICATION"
    if cat in ("gpu_memcpy", "gpu_memset") or "Memcpy" in name or "Memset" in name:
        return "MEMORY"
    return "COMPUTATION"


@dataclass(frozen=True)
class HostRange:
    name: str
    start: float
    end: float
    tid: Any


class Trace:
    """GPU activities and host ranges of one Chrome trace (one rank)."""

    def __init__(self, data: Dict[str, Any]):
        events = data.get("traceEvents", data if isinstance(data, list) else [])
        launches: Dict[Any, float] = {}
        gpu_raw: List[Dict[str, Any]] = []
        self.ranges: List[HostRange] = []
        for e in events:
            if e.get("ph") != "X":
                continue
            cat = e.get("cat")
            if cat in GPU_CATS:
                gpu_raw.append(e)
            elif cat in LAUNCH_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launches[corr] = float(e["ts"])
            elif cat == RANGE_CAT:
                ts = float(e["ts"])
                self.ranges.append(HostRange(e.get("name", ""), ts, ts + float(e.get("dur", 0.0)), e.get("tid")))
        ops = []
        for e in gpu_raw:
            args = e.get("args") or {}
            ts = float(e["ts"])
            ops.append(GpuOp(e.get("name", ""), e["cat"], ts, ts + float(e.get("dur", 0.0)),
                             _stream(args.get("stream", e.get("tid"))), launches.get(args.get("correlation"))))
        ops.sort(key=lambda o: o.start)
        self.ops: List[GpuOp] = ops
        self.ranges.sort(key=lambda r: r.start)
        launched = sorted((o.launch, i) for i, o in enumerate(ops) if o.launch is not None)
        self._launch_ts = [t for t, _ in launched]
        self._launch_idx = [i for _, i in launched]

    @classmethod
    def load(cls, path: Union[str, Path]) -> "Trace":
        p = Path(path)
        opener = gzip.open if p.suffix == ".gz" else open
        with opener(p, "rt") as f:  # type: ignore[operator]
            return cls(json.load(f))

    # ------------------------------------------------------------------ ranges
    def ranges_named(self, name: str) -> List[HostRange]:
        return [r for r in self.ranges if r.name == name]

    def ops_launched_in(self, start: float, end: float) -> List[GpuOp]:
        lo = bisect_left(self._launch_ts, start)
        hi = bisect_right(self._launch_ts, end)
        return [self.ops[i] for i in self._launch_idx[lo:hi]]

    def span(self, r: HostRange, kinds: Optional[Sequence[str]] = None) -> float:
        """GPU span (seconds) of the activities launched inside host range ``r``."""
        ops = [o for o in self.ops_launched_in(r.start, r.end) if kinds is None or o.kind in kinds]
        if not ops:
            return 0.0
        return (max(o.end for o in ops) - min(o.start for o in ops)) / 1e6

    def event_span(self, r: HostRange) -> float:
        """What a CUDA event pair around ``r`` measures (seconds): from the moment the stream of
        the range's first GPU activity had finished the work queued before it, or the range's
        host start if that is later (the device waited for the host), to the last end."""
        ops = self.ops_launched_in(r.start, r.end)
        if not ops:
            return 0.0
        first = min(ops, key=lambda o: o.start)
        prev_end = max((o.end for o in self.ops if o.stream == first.stream and o.end <= first.start), default=r.start)
        start = min(max(prev_end, r.start), first.start)
        return (max(o.end for o in ops) - start) / 1e6

    def busy(self, r: HostRange, kinds: Optional[Sequence[str]] = None) -> float:
        """Union (seconds) of the activities launched inside host range ``r``."""
        ops = [o for o in self.ops_launched_in(r.start, r.end) if kinds is None or o.kind in kinds]
        return union_length(merge((o.start, o.end) for o in ops)) / 1e6

    def span_total(self, name: str, kinds: Optional[Sequence[str]] = None) -> Tuple[float, int]:
        """(sum of the spans of every range called ``name``, how many ranges)."""
        rs = self.ranges_named(name)
        return sum(self.span(r, kinds) for r in rs), len(rs)

    def event_span_total(self, name: str) -> float:
        return sum(self.event_span(r) for r in self.ranges_named(name))

    # ------------------------------------------------------------------ HTA communication
    def comm_overlap(self, start: Optional[float] = None, end: Optional[float] = None) -> "CommOverlap":
        """HTA's communication/computation overlap over the GPU activities that start in
        [start, end] (us; default: the whole trace)."""
        ops = [o for o in self.ops if (start is None or o.start >= start) and (end is None or o.start <= end)]
        comm = merge((o.start, o.end) for o in ops if o.kind == "COMMUNICATION")
        comp = merge((o.start, o.end) for o in ops if o.kind == "COMPUTATION")
        c = union_length(comm)
        ov = intersection_length(comm, comp)
        return CommOverlap(comm_s=c / 1e6, overlap_s=ov / 1e6, exposed_s=(c - ov) / 1e6,
                           comm_kernels=sum(1 for o in ops if o.kind == "COMMUNICATION"))


@dataclass(frozen=True)
class CommOverlap:
    comm_s: float  # union of communication kernels
    overlap_s: float  # part of it overlapped by computation kernels
    exposed_s: float  # comm_s - overlap_s
    comm_kernels: int

    @property
    def overlap_ratio(self) -> float:
        return self.overlap_s / self.comm_s if self.comm_s > 0 else 0.0


# ---------------------------------------------------------------------- interval arithmetic
def merge(intervals: Iterable[Interval]) -> List[Interval]:
    """Sorted, non-overlapping union of [a, b] intervals (empty ones dropped)."""
    spans = sorted((a, b) for a, b in intervals if b > a)
    out: List[Interval] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def union_length(merged: Sequence[Interval]) -> float:
    return sum(b - a for a, b in merged)


def intersection_length(x: Sequence[Interval], y: Sequence[Interval]) -> float:
    """Length of the intersection of two merged interval lists (two-pointer sweep)."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a = max(x[i][0], y[j][0])
        b = min(x[i][1], y[j][1])
        if b > a:
            total += b - a
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _stream(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def rel_diff(a: float, b: float) -> float:
    """|a - b| / b (inf when b is 0 and a is not)."""
    if b == 0:
        return 0.0 if a == 0 else float("inf")
    return abs(a - b) / abs(b)
