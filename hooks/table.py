"""The console step-time table printed on rank 0 (works with no agent at all).

Cadence (the ``hooks.table_*`` config keys): a table is due once ``table_every_steps``
steps or ``table_every_seconds`` seconds have passed since the last one (0 turns a
trigger off; both 0 silences the table), but never sooner than ``table_min_seconds``
after it. A share that moves by ``table_share_move`` (a fraction of step time) against
the last printed table makes one due early, once the window holds at least
``MOVE_MIN_STEPS`` steps and ``MOVE_MIN_SECONDS`` seconds, so a change in the job shows
without a table every few seconds while nothing changes.

A table gives mean/p50/p99 step time and the shares of step time spent in: data
(dataloader wait), compute (busy = step - data - exposed comm - checkpoint, the same
"busy" the straggler rule uses), comm (all collective time, overlapped or not),
x-comm (exposed comm: collective time compute waited for) and checkpoint. data +
compute + x-comm + ckpt is 100%; comm overlaps compute, so it is counted apart. The
first table carries a one-line legend that says so.

``emit(text)`` writes console text as whole lines, in one write under one lock, so
the hooks' threads never split each other's lines or a line of their own, and flushes
a block-buffered stdout first, so the table lands after the script's earlier lines.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from ranksight.stats import nearest_rank

SHARES = ("data", "compute", "comm", "x-comm", "ckpt")
MOVE_MIN_STEPS = 20  # a share-move table needs a window of at least this many steps ...
MOVE_MIN_SECONDS = 10.0  # ... and this many seconds, so one noisy step moves nothing
LEGEND = ("legend: % of step time. data = dataloader wait, compute = step - data - x-comm - ckpt, "
          "comm = all collective time, x-comm = exposed comm (the part compute waited for). "
          "comm overlaps compute, so the shares need not sum to 100%")

_lock = threading.Lock()


def emit(text: str) -> None:
    """Write text (whole lines) to stderr in one write, under the hooks' console lock. A
    block-buffered stdout (a pipe or a file) is flushed first, so the script's lines printed
    before the table come before it where both streams meet (a tty's stdout is line-buffered
    and already in order; an unbuffered one has nothing to flush)."""
    if not text.endswith("\n"):
        text += "\n"
    with _lock:
        out = sys.stdout
        if out is not None and out is not sys.stderr and not getattr(out, "line_buffering", True):
            try:
                out.flush()
            except (OSError, ValueError):  # closed or broken stdout: the table still goes out
                pass
        sys.stderr.write(text)
        sys.stderr.flush()


@dataclass
class StepTable:
    every_steps: int
    every_seconds: float
    started: float
    min_seconds: float = 0.0
    share_move: float = 0.0
    durs: List[float] = field(default_factory=list)
    data: float = 0.0
    comm: float = 0.0
    xcomm: float = 0.0
    ckpt: float = 0.0
    first_seq: int = 0
    last_seq: int = 0
    printed: int = 0  # tables rendered so far
    last_shares: Optional[Tuple[float, ...]] = None  # the shares of the last rendered table
    moved: str = ""  # why the pending table is early ("x-comm 8% -> 31%"), set by due()

    @property
    def enabled(self) -> bool:
        return self.every_steps > 0 or self.every_seconds > 0

    def add(self, seq: int, dur: float, data: float, comm: float, xcomm: float, ckpt: float) -> None:
        if not self.durs:
            self.first_seq = seq
        self.last_seq = seq
        self.durs.append(dur)
        self.data += data
        self.comm += comm
        self.xcomm += xcomm
        self.ckpt += ckpt

    def shares(self) -> Tuple[float, ...]:
        """(data, compute, comm, x-comm, ckpt) as fractions of the window's step time."""
        total = sum(self.durs)
        if total <= 0:
            return (0.0,) * len(SHARES)
        busy = max(0.0, total - self.data - self.xcomm - self.ckpt)
        return tuple(x / total for x in (self.data, busy, self.comm, self.xcomm, self.ckpt))

    def _move(self) -> str:
        if self.share_move <= 0 or self.last_shares is None:
            return ""
        now_shares, last = self.shares(), self.last_shares
        # compute is the rest of the step: it moves whenever data, x-comm or ckpt do, so it is named
        # only when no other share moved enough on its own
        for ks in ((0, 2, 3, 4), (1,)):
            i = max(ks, key=lambda k: abs(now_shares[k] - last[k]))
            if abs(now_shares[i] - last[i]) >= self.share_move:
                return f"{SHARES[i]} {100 * last[i]:.0f}% -> {100 * now_shares[i]:.0f}%"
        return ""

    def due(self, now: float) -> bool:
        if not self.durs:
            return False
        elapsed = now - self.started
        regular = (self.every_steps > 0 and len(self.durs) >= self.every_steps) or \
            (self.every_seconds > 0 and elapsed >= self.every_seconds)
        if regular and elapsed >= self.min_seconds:
            self.moved = ""
            return True
        if len(self.durs) >= MOVE_MIN_STEPS and elapsed >= MOVE_MIN_SECONDS:
            self.moved = self._move()
            return bool(self.moved)
        return False

    def render(self, job: str, now: float) -> str:
        n = len(self.durs)
        total = sum(self.durs)
        s = sorted(self.durs)
        data, busy, comm, xcomm, ckpt = (100.0 * x for x in self.shares())
        head = (f"{'steps':>13} {'n':>5} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} "
                f"{'data':>6} {'compute':>8} {'comm':>6} {'x-comm':>7} {'ckpt':>6}")
        row = (f"{self.first_seq:>6}-{self.last_seq:<6} {n:>5} {1e3 * total / n:>9.2f} {1e3 * nearest_rank(s, 0.5):>9.2f} "
               f"{1e3 * nearest_rank(s, 0.99):>9.2f} {data:>5.1f}% {busy:>7.1f}% "
               f"{comm:>5.1f}% {xcomm:>6.1f}% {ckpt:>5.1f}%")
        why = f" ({self.moved})" if self.moved else ""
        text = f"ranksight step time, job {job}, rank 0, last {now - self.started:.1f} s{why}\n{head}\n{row}\n"
        if self.printed == 0:
            text += LEGEND + "\n"
        self.printed += 1
        self.last_shares = self.shares()
        return text

    def reset(self, now: float) -> None:
        self.durs = []
        self.data = self.comm = self.xcomm = self.ckpt = 0.0
        self.started = now
        self.moved = ""


def make_table(every_steps: int, every_seconds: float, now: float, min_seconds: float = 0.0,
               share_move: float = 0.0) -> Optional[StepTable]:
    t = StepTable(int(every_steps), float(every_seconds), now, float(min_seconds), float(share_move))
    return t if t.enabled else None
