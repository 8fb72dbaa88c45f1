"""The watch session's cumulative totals (protocol v2 "tot" and "hist"): what the hooks sent,
added up by the thread that sends it. The agent exposes these as the rank's counters, so a lost
datagram or an agent restart costs no count (see ranksight.protocol)."""
from __future__ import annotations

from bisect import bisect_left
from typing import Any, Dict, Optional

from ranksight import catalog as C


class Totals:
    """The watch session's cumulative totals of what it sent (protocol v2 "tot" and "hist").

    Updated by whichever thread sends (the background thread, or close() after it stopped), as
    each step or checkpoint record goes out, so the totals on a heartbeat or the bye cover
    exactly the records sent before it."""

    __slots__ = ("v", "ckpt", "h_step", "h_data", "h_b2o", "h_ckpt", "lck", "lckd")
    _STEP_KEYS = ("dur", "data", "fwd", "bwd", "opt", "b2o", "comm", "xcomm", "ckpt")

    def __init__(self) -> None:
        self.v = dict.fromkeys(("steps", "micro"), 0)
        self.v.update(dict.fromkeys(self._STEP_KEYS, 0.0))
        self.ckpt = {"ckpt_s": 0.0, "ckpt_bytes": 0, "ckpt_n": 0, "ckpt_fail": 0}
        self.h_step = [0] * (len(C.STEP_DURATION.buckets) + 1)
        self.h_data = [0] * (len(C.DATALOADER_WAIT_HIST.buckets) + 1)
        self.h_b2o = [0] * (len(C.BACKWARD_TO_OPTIMIZER.buckets) + 1)
        self.h_ckpt = [0] * (len(C.CHECKPOINT_WRITE.buckets) + 1)
        self.lck: Optional[float] = None
        self.lckd = 0.0

    def step(self, dur: float, data: float, fwd: float, bwd: float, opt: float, b2o: float, comm: float,
             xcomm: float, ckpt: float, micro: int, sign: int = 1) -> None:
        """Add one sent step (``sign=-1`` takes back one that had to be split before it was sent).
        ``ckpt``: the step's checkpoint time (what saves blocked it), summed as "ckpt"; the
        checkpoint records' own durations are "ckpt_s"."""
        v = self.v
        v["steps"] += sign
        v["micro"] += sign * micro
        v["dur"] += sign * dur
        v["data"] += sign * data
        v["fwd"] += sign * fwd
        v["bwd"] += sign * bwd
        v["opt"] += sign * opt
        v["b2o"] += sign * b2o
        v["comm"] += sign * comm
        v["xcomm"] += sign * xcomm
        v["ckpt"] += sign * ckpt
        self.h_step[bisect_left(C.STEP_DURATION.buckets, dur)] += sign
        self.h_data[bisect_left(C.DATALOADER_WAIT_HIST.buckets, data)] += sign
        self.h_b2o[bisect_left(C.BACKWARD_TO_OPTIMIZER.buckets, b2o)] += sign

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
        return {"tot": tot, "hist": {"step": list(self.h_step), "data": list(self.h_data),
                                     "b2o": list(self.h_b2o), "ckpt": list(self.h_ckpt)}}
