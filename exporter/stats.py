"""Per-rank statistics the agent keeps: a Prometheus-style histogram and a sliding-window
quantile of step times."""
from __future__ import annotations

import math
from bisect import bisect_left
from typing import Dict, List, Optional, Sequence, Tuple

from ranksight.stats import rank_of


class Hist:
    """Prometheus-style histogram: non-cumulative bucket counts, +Inf last."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v


class WindowQuantile:
    """Quantiles of the values observed in the last ``window`` seconds.

    Values go into log-spaced buckets (ratio GAMMA, so any reported quantile is
    within (GAMMA-1)/(GAMMA+1) = 0.5% of a real observation's value) kept per
    time slot; slots older than the window are dropped. Observing is O(1) and
    touches only the current slot (it runs for every step of every rank); a
    quantile sums the window's slots and walks their few distinct buckets, not
    the samples (a rank at 100 steps/s holds 30,000 samples in 5 minutes).
    """

    GAMMA = 1.01
    _INV_LN = 1.0 / math.log(GAMMA)
    ZERO_KEY = -(1 << 30)  # durations below 1 ns

    __slots__ = ("slot_len", "nslots", "slots", "cur_id", "cur")

    def __init__(self, window: float, nslots: int = 30):
        self.slot_len = window / nslots
        self.nslots = nslots
        self.slots: List[Tuple[int, Dict[int, int]]] = []
        self.cur_id = -1
        self.cur: Dict[int, int] = {}

    def observe(self, v: float, now: float) -> None:
        self.observe_many((v,), now)

    def observe_many(self, vs: Sequence[float], now: float, _log=math.log, _floor=math.floor) -> None:
        """Count each of ``vs`` in the current slot (one slot lookup for the lot)."""
        sid = int(now / self.slot_len)
        if sid != self.cur_id:
            self._advance(sid)
        inv, zero = self._INV_LN, self.ZERO_KEY
        cur = self.cur
        get = cur.get
        for v in vs:
            k = _floor(_log(v) * inv) if v > 1e-9 else zero
            cur[k] = get(k, 0) + 1

    def _advance(self, sid: int) -> None:
        self.cur = {}
        self.cur_id = sid
        self.slots.append((sid, self.cur))
        self._expire(sid)

    def _expire(self, sid: int) -> None:
        oldest = sid - self.nslots + 1
        slots = self.slots
        while slots and slots[0][0] < oldest:
            slots.pop(0)

    def quantiles(self, qs: Tuple[float, ...], now: float) -> Optional[List[float]]:
        self._expire(int(now / self.slot_len))
        total: Dict[int, int] = {}
        for _, d in self.slots:
            for k, c in d.items():
                total[k] = total.get(k, 0) + c
        n = sum(total.values())
        if n <= 0:
            return None
        keys = sorted(total)
        out: List[float] = []
        for q in qs:
            target = rank_of(n, q)
            acc = 0
            for k in keys:
                acc += total[k]
                if acc >= target:
                    out.append(self._value(k))
                    break
        return out

    def _value(self, k: int) -> float:
        if k == self.ZERO_KEY:
            return 0.0
        g = self.GAMMA
        return 2.0 * g ** (k + 1) / (g + 1.0)  # bucket [g^k, g^(k+1)): minimal relative error
