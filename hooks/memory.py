"""The CUDA caching allocator's counters, read on the background thread: the current allocated and
reserved bytes, the retries and OOMs, and the peaks of allocated and reserved bytes.

Everything comes from ``torch.cuda.memory_stats(device)`` and ``torch.cuda.reset_peak_memory_stats
(device)``: host-side counters the allocator keeps under its own lock (``torch/cuda/memory.py``
calls ``torch._C._cuda_memoryStats`` and ``torch._C._cuda_resetPeakMemoryStats``, neither of which
launches work or waits on a stream), so a read never synchronizes the device. They are read here,
on the background thread, once per heartbeat (``hooks.heartbeat_seconds``), never on the step path:
``memory_stats`` builds and flattens a dict of over a hundred entries, which is not free, and a step's
own peak would be overwritten by the next record's before a scrape saw it (the agent exposes the
last reading of a current field as a gauge).

A peak is the highest value since the allocator's last peak reset. By default
(``hooks.memory_peak_seconds`` 0) the reader never resets: the gauge is the process's high-water
mark, which is what memory imbalance and near-OOM compare, and the training code's own peak
readings are left alone. With a window, the reader resets the peaks every
``hooks.memory_peak_seconds`` and reports the larger of the peak of the window just closed
and the peak of the current one: a spike inside any step (a temporary tensor freed before the step
ends, rank 0's checkpoint or evaluation buffers) stays in the gauge for at least one whole window,
so a scrape at least that frequent sees it. 0 never resets: the gauge is the process's peak, and
the training code's own ``max_memory_allocated()`` readings keep their meaning. With a window, a
peak the training code reads itself covers at most the time since the reader's last reset. A
spike that comes and goes between the reader's ``memory_stats`` and its reset (two calls, a few
microseconds apart, once a window) is not seen.

The ``cuda`` interface is a seam: ``torch.cuda`` in a training process, a stand-in fed with a
recorded ``memory_stats`` in tests."""
from __future__ import annotations

from typing import Any, Dict

# the memory_stats() key of each step-record field read as it is
COUNTERS = {"retries": "num_alloc_retries", "ooms": "num_ooms", "mres": "reserved_bytes.all.current",
            "malloc": "allocated_bytes.all.current"}
# the step-record field of each peak, and its memory_stats() key
PEAKS = {"mpeak": "allocated_bytes.all.peak", "mrpeak": "reserved_bytes.all.peak"}
FIELDS = tuple(COUNTERS) + tuple(PEAKS)


class AllocatorReader:
    """Reads the allocator's counters of one device; ``read(now)`` returns them by field key."""

    def __init__(self, cuda: Any, device: Any, window_s: float, now: float):
        self.cuda = cuda
        self.device = device
        self.window_s = float(window_s)
        self.next_reset = now + self.window_s
        self.closed = dict.fromkeys(PEAKS, 0)  # the peaks of the window that closed last
        self.values: Dict[str, int] = dict.fromkeys(FIELDS, 0)

    def read(self, now: float) -> Dict[str, int]:
        """The counters now, the peaks over the current and the previous window; at a window's
        end, the allocator's peaks are reset (to the current values)."""
        s = self.cuda.memory_stats(self.device)
        out = {k: int(s.get(name, 0)) for k, name in COUNTERS.items()}
        peaks = {k: int(s.get(name, 0)) for k, name in PEAKS.items()}
        for k, p in peaks.items():
            out[k] = max(p, self.closed[k])
        if self.window_s > 0 and now >= self.next_reset:
            self.closed = peaks
            self.next_reset = now + self.window_s
            self.cuda.reset_peak_memory_stats(self.device)
        self.values = out
        return out
