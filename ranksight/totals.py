"""The watch session's cumulative totals (protocol v2 and v3 "tot" and "hist"): what the hooks
sent, added up by the thread that sends it. The agent exposes these as the rank's counters, so a
lost datagram or an agent restart costs no count (see ranksight.protocol). Torch-free: the hooks
keep them (hooks/sender.py), and the benchmarks that play ranks keep them the same way."""
from __future__ import annotations

from bisect import bisect_left
from types import MethodType
from typing import Any, Dict, Optional

from ranksight import catalog as C
from ranksight import protocol, record


class Totals:
    """The watch session's cumulative totals of what it sent (the "tot" and "hist" of protocol v2 and v3).

    Updated by whichever thread sends (the background thread, or close() after it stopped), as
    each step or checkpoint record goes out, so the totals on a heartbeat or the bye cover
    exactly the records sent before it. The step fields and their histograms are those of the
    step record's declaration (ranksight/record.py), added by straight-line code compiled from it."""

    __slots__ = ("v", "ckpt", "hists", "h_ckpt", "lck", "lckd", "step")

    def __init__(self, layout: Optional[record.Layout] = None) -> None:
        lay = layout or protocol.LAYOUTS[protocol.VERSION]
        self.v: Dict[str, Any] = {"steps": 0}
        self.v.update({k: (0.0 if k in lay.seconds else 0) for k in lay.per_step})
        self.ckpt = {"ckpt_s": 0.0, "ckpt_bytes": 0, "ckpt_n": 0, "ckpt_fail": 0}
        self.hists = {hk: (m.buckets, [0] * (len(m.buckets) + 1)) for hk, m, _ in lay.hists}
        self.h_ckpt = [0] * (len(C.CHECKPOINT_WRITE.buckets) + 1)
        self.lck: Optional[float] = None
        self.lckd = 0.0
        # step(it, sign=1): add one sent step tuple (``sign=-1`` takes back one that had to be split
        # before it was sent). Its "ckpt" (what saves blocked the step) is summed as "ckpt"; the
        # checkpoint records' own durations are "ckpt_s".
        self.step = MethodType(lay.compile_totals(), self)

    def checkpoint(self, ts: float, dur: float, nbytes: int, ok: bool) -> None:
        c = self.ckpt
        c["ckpt_s"] += dur
        c["ckpt_n"] += 1
        self.h_ckpt[bisect_left(C.CHECKPOINT_WRITE.buckets, dur)] += 1
        if ok:
            c["ckpt_bytes"] += nbytes
            self.lck, self.lckd = ts, dur
        else:
            c["ckpt_fail"] += 1

    def fields(self) -> Dict[str, Any]:
        """The "tot" and "hist" fields of a heartbeat or bye."""
        tot: Dict[str, Any] = {k: (round(x, 9) if type(x) is float else x) for k, x in self.v.items()}
        tot.update(self.ckpt)
        tot["ckpt_s"] = round(tot["ckpt_s"], 9)
        if self.lck is not None:
            tot["lck"] = round(self.lck, 6)
            tot["lckd"] = round(self.lckd, 9)
        hist = {hk: list(c) for hk, (_, c) in self.hists.items()}
        hist[protocol.CKPT_HIST[0]] = list(self.h_ckpt)
        return {"tot": tot, "hist": hist}
