"""The console step-time table printed on rank 0 (works with no agent at all).

Every ``table_every_steps`` steps or ``table_every_seconds`` seconds (0 turns a trigger
off; both 0 silences the table) it prints mean/p50/p99 step time and the shares of
step time spent in: data (dataloader wait), compute (busy = step - data - exposed
comm - checkpoint, the same "busy" the straggler rule uses), comm (all collective
time, overlapped or not, so it can exceed 100% - compute), exposed comm and checkpoint.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional


def quantile(sorted_vals: List[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted list."""
    if not sorted_vals:
        return 0.0
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q * len(sorted_vals)) - 1))
    return sorted_vals[k]


@dataclass
class StepTable:
    every_steps: int
    every_seconds: float
    started: float
    durs: List[float] = field(default_factory=list)
    data: float = 0.0
    comm: float = 0.0
    xcomm: float = 0.0
    ckpt: float = 0.0
    first_seq: int = 0
    last_seq: int = 0

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

    def due(self, now: float) -> bool:
        if not self.durs:
            return False
        if self.every_steps > 0 and len(self.durs) >= self.every_steps:
            return True
        return self.every_seconds > 0 and now - self.started >= self.every_seconds

    def render(self, job: str, now: float) -> str:
        n = len(self.durs)
        total = sum(self.durs)
        s = sorted(self.durs)
        share = (lambda x: 100.0 * x / total) if total > 0 else (lambda x: 0.0)
        busy = max(0.0, total - self.data - self.xcomm - self.ckpt)
        head = (f"{'steps':>13} {'n':>5} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} "
                f"{'data':>6} {'compute':>8} {'comm':>6} {'x-comm':>7} {'ckpt':>6}")
        row = (f"{self.first_seq:>6}-{self.last_seq:<6} {n:>5} {1e3 * total / n:>9.2f} {1e3 * quantile(s, 0.5):>9.2f} "
               f"{1e3 * quantile(s, 0.99):>9.2f} {share(self.data):>5.1f}% {share(busy):>7.1f}% "
               f"{share(self.comm):>5.1f}% {share(self.xcomm):>6.1f}% {share(self.ckpt):>5.1f}%")
        return f"ranksight step time, job {job}, rank 0, last {now - self.started:.1f} s\n{head}\n{row}\n"

    def reset(self, now: float) -> None:
        self.durs = []
        self.data = self.comm = self.xcomm = self.ckpt = 0.0
        self.started = now


def make_table(every_steps: int, every_seconds: float, now: float) -> Optional[StepTable]:
    t = StepTable(int(every_steps), float(every_seconds), now)
    return t if t.enabled else None
