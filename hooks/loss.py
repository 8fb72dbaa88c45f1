"""The training loss, read without waiting on the device: ``ranksight.loss(loss)``.

A value the user passes each step (a tensor, a Python or NumPy number) becomes the step record's
loss fields (``ranksight/record.py``): ``loss`` (the sum of the finite losses read at the step)
and ``lossn`` (how many), so that the agent's counters give the mean loss over any window; a NaN
or an infinity is never sent as a value, it is counted (``lnan``) and the step it was recorded in
is kept (``lnanstep``, the first one only).

CPU tensors and numbers are read at once (``Tensor.item()`` on the host costs no
synchronization). A CUDA tensor is copied, without blocking, into one slot of a small pinned
host buffer, and a CUDA event is recorded after the copy on the current stream; the slot is read
only once ``event.query()`` says the copy is done, at the end of a later step (``take``): never
``.item()`` on the device tensor, never a wait. Readings still in flight past ``slots`` are
dropped and counted (the watch's ``hdrop``). A finite loss outside [0, MAX_SECONDS] (a negative
log-likelihood, say) cannot be carried by the step record: it is counted in ``out_of_range`` and
not sent. Other devices (MPS, XLA) would need a read that synchronizes: their losses are ignored.

The reader is the watch's (``Watcher.losses``); it calls ``add(value)`` for each finite reading
it resolves, which adds it to the step in progress (``Watcher._loss``, ``Watcher._lossn``). A
loss belongs to the step in progress when it is recorded: one recorded after the last
``optimizer.step()`` of the run, and CUDA readings still in flight at ``close()``, are not sent.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Any, Callable, Deque, List, Optional, Tuple

from ranksight.protocol import MAX_SECONDS

SLOTS = 64  # CUDA readings in flight at most (one per step: 64 steps of GPU lag)


class CudaCopy:
    """The device side: ``start(tensor) -> (slot, event)`` copies a CUDA scalar into a free slot
    of a pinned host buffer and records an event after it; ``read(slot)`` is the slot's value
    (call it only once the event's ``query()`` is true); ``free(slot)``. A test passes an object
    with the same methods (and an event with ``query()``) to run ``LossReader`` on CPU."""

    def __init__(self, torch: Any, slots: int = SLOTS):
        self._torch = torch
        self._buf = torch.zeros(slots, dtype=torch.float32, pin_memory=True)
        self._free: List[int] = list(range(slots))

    def start(self, t: Any) -> Optional[Tuple[int, Any]]:
        if not self._free:
            return None
        src = t.detach()
        if src.numel() != 1:
            src = src.float().mean()  # an unreduced loss: its mean, computed on the device
        elif src.dtype != self._torch.float32:
            src = src.float()
        i = self._free.pop()
        self._buf[i].copy_(src.reshape(()), non_blocking=True)  # on the loss device's current stream
        ev = self._torch.cuda.Event()
        ev.record(self._torch.cuda.current_stream(src.device))  # ... and the event after it, on that stream
        return i, ev

    def read(self, slot: int) -> float:
        return float(self._buf[slot].item())  # a pinned host tensor: no device access

    def free(self, slot: int) -> None:
        self._free.append(slot)


class LossReader:
    """Loss readings of one watch. ``record(value, step)`` on the main thread (the step path);
    ``take(step)`` at each step's end resolves the CUDA readings recorded before ``step`` whose
    copy is done; ``nonfinite``, ``first_bad`` and ``dropped`` are read by the background thread."""

    def __init__(self, add: Callable[[float], None], copy: Optional[Any] = None):
        self._add = add
        self._copy = copy  # CudaCopy (or a test's stand-in); made on the first CUDA loss
        self._pending: Deque[Tuple[int, Any, int]] = deque()  # (step, event, slot), oldest first
        self.nonfinite = 0  # cumulative
        self.first_bad = 0  # step of the first non-finite loss (0: none)
        self.dropped = 0  # CUDA readings dropped: every slot in flight
        self.out_of_range = 0  # finite losses the step record cannot carry (negative, or above MAX_SECONDS)
        self.ignored = 0  # losses on a device that cannot be read without a synchronization

    def record(self, value: Any, step: int) -> None:
        """One loss of the step ``step`` (the step in progress)."""
        dev = getattr(value, "device", None)
        if dev is None:  # a Python or NumPy number
            self._value(float(value), step)
            return
        kind = dev.type
        if kind == "cpu":
            v = value.detach()
            self._value(float(v.item() if v.numel() == 1 else v.float().mean().item()), step)
        elif kind == "cuda":
            if self._copy is None:
                import torch

                self._copy = CudaCopy(torch)
            started = self._copy.start(value)
            if started is None:
                self.dropped += 1
            else:
                self._pending.append((step, started[1], started[0]))
        else:
            self.ignored += 1

    def take(self, step: int) -> None:
        """Resolve the readings of steps before ``step`` whose copy has completed, oldest first
        (stops at the first one still in flight: events on one stream complete in order)."""
        p = self._pending
        while p and p[0][0] < step and p[0][1].query():
            s, _, slot = p.popleft()
            v = self._copy.read(slot)
            self._copy.free(slot)
            self._value(v, s)

    def in_flight(self) -> int:
        return len(self._pending)

    def _value(self, v: float, step: int) -> None:
        if not math.isfinite(v):
            self.nonfinite += 1
            if not self.first_bad:
                self.first_bad = step
        elif 0.0 <= v <= MAX_SECONDS:
            self._add(v)
        else:
            self.out_of_range += 1
