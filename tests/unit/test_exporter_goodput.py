"""The agent's lifecycle accounting (exporter/goodput.py) on a scripted timeline: startup from the
process start, a death (heartbeats stop) 9 steps after a checkpoint, the restart's recovery, a
stall in next() that a long step ends, and a clean exit. Every second of each rank's wall time lands
in exactly one category of the recording rules' split (computed here from the scrape, the way the
rules do)."""
from __future__ import annotations

from typing import Dict, List, Tuple

import pytest

from ranksight import catalog as C
from ranksight.exporter import goodput

from test_exporter_helpers import one
from test_exporter_totals import Sender, World

DATA, XCOMM, CKPT = 0.25, 0.005, 0.5


def _split(got, rank: str) -> Dict[str, float]:
    """The rules' per-rank split (ranksight/triage_goodput.py, before the job aggregation)."""
    lab = dict(job="job", rank=rank)
    v = {m: one(got, m.name, **lab) for m in (C.STEP_SECONDS, C.DATALOADER_WAIT, C.EXPOSED_COMM_SECONDS,
                                               C.CHECKPOINT_SECONDS, C.RANK_WALL)}
    bad = {c: one(got, C.BADPUT.name, category=c, **lab) for c in C.BADPUT_AGENT_CATEGORIES}
    over = {c: one(got, C.BADPUT_OVERLAP.name, category=c, **lab) for c in C.OVERLAP_CATEGORIES}
    step, data, xcomm, ckpt = (v[m] for m in (C.STEP_SECONDS, C.DATALOADER_WAIT, C.EXPOSED_COMM_SECONDS,
                                              C.CHECKPOINT_SECONDS))
    out = dict(productive=step - data - xcomm - ckpt - over["productive"], data_wait=data - over["data_wait"],
               exposed_comm=xcomm - over["exposed_comm"], checkpoint=ckpt, **bad)
    out["other"] = v[C.RANK_WALL] - step + sum(over.values()) - sum(bad.values())
    out["wall"] = v[C.RANK_WALL]
    return out


class Timeline:
    """Two ranks of one job on one agent; time moves in quarter seconds, heartbeats every second."""

    def __init__(self) -> None:
        self.w = World(stall_min_seconds=2.0, stall_p99_factor=1.0)
        self.senders: Dict[int, Sender] = {}
        self.beating: Dict[int, bool] = {}
        self.phase: Dict[int, str] = {}
        self.hb_n = 0

    def start(self, rank: int, pid: int, pstart: float) -> None:
        s = Sender(sess=pid, pid=pid, rank=rank)
        self.senders[rank] = s
        self.beating[rank] = True
        self.phase[rank] = "forward"
        assert self.w.send(s.ident, dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + pstart)) == "ok"

    def until(self, t: float, steps: Dict[int, List[Tuple[float, float, float]]] = None) -> None:
        """Advance to agent time ``t``; ``steps``: rank -> [(at, dur, data)] step records to send."""
        steps = {r: sorted(v) for r, v in (steps or {}).items()}
        while self.w.now < t - 1e-9:
            self.w.now = round(self.w.now + 0.25, 6)
            for r, todo in steps.items():
                while todo and todo[0][0] <= self.w.now + 1e-9:
                    _, dur, data = todo.pop(0)
                    s = self.senders[r]
                    rec = s.step(dur, data=data, micro=1)
                    assert self.w.send(s.ident, rec) == "ok"
            if abs(self.w.now - round(self.w.now)) < 1e-9:
                self.hb_n += 1
                for r, s in self.senders.items():
                    if self.beating[r]:
                        self.w.send(s.ident, dict(s.hb(seq=self.hb_n), phase=self.phase[r]))
            self.w.table.check(self.w.now)

    def ckpt(self, rank: int, unix: float) -> None:
        s = self.senders[rank]
        s.totals.checkpoint(unix, CKPT, 100, True)
        assert self.w.send(s.ident, dict(t="ckpt", dur=CKPT, bytes=100, ok=True, src="timer", ts=unix)) == "ok"

    def bye(self, rank: int) -> None:
        s = self.senders[rank]
        assert self.w.send(s.ident, s.bye()) == "ok"
        self.beating[rank] = False


def each(t0: float, t1: float, dur: float = 1.0, data: float = DATA) -> List[Tuple[float, float, float]]:
    return [(float(t), dur, data) for t in range(int(t0), int(t1) + 1)]


def test_a_restart_after_a_checkpoint_and_a_stall_split_the_wall_time_exactly():
    tl = Timeline()
    tl.w.now = 1000.0
    for rank, pid in ((0, 1000), (1, 2000)):
        tl.start(rank, pid, pstart=994.0)  # the processes started 6 s before their hello
    # first steps end at 1005 (they started at 1004): startup 10 s; rank 0 checkpoints after step 1015
    tl.until(1015.0, {0: each(1005, 1015), 1: each(1005, 1015)})
    tl.ckpt(0, 1.7e9)
    tl.until(1024.0, {0: each(1016, 1024), 1: each(1016, 1024)})
    # both processes die after their step at 1024 (no bye); the agent finds them down 3 misses later
    tl.beating = {0: False, 1: False}
    tl.until(1032.0)
    got = tl.w.scrape()
    assert one(got, C.RANK_UP.name, job="job", rank="0") == 0
    # the restarted processes (new pids) start at 1031; their first steps start at 1035
    for rank, pid in ((0, 1001), (1, 2001)):
        tl.start(rank, pid, pstart=1031.0)
    tl.until(1037.0, {0: each(1036, 1040), 1: each(1036, 1037)})
    tl.phase[1] = "data"  # rank 1 hangs in next() from 1037 until a 4 s step ends at 1041 (3.5 s of it data wait)
    tl.until(1040.5, {0: each(1038, 1040)})
    tl.bye(0)
    tl.until(1041.0, {1: [(1041.0, 4.0, 3.5)]})
    tl.phase[1] = "forward"
    tl.until(1041.5)
    tl.bye(1)
    tl.until(1050.0)  # finished ranks linger; their wall time has stopped
    got = tl.w.scrape()
    r0, r1 = _split(got, "0"), _split(got, "1")

    productive_step = 1.0 - DATA - 0.005  # Sender.step: xcomm 0.005 per step
    wasted = 9 * productive_step  # steps 1016..1024 after the checkpoint at 1015
    assert r0["wall"] == pytest.approx(1040.5 - 994.0)
    assert r0["startup"] == pytest.approx(10.0)
    assert r0["recovery"] == pytest.approx(1035.0 - 1024.0)
    assert r0["wasted_progress"] == pytest.approx(wasted)
    assert r0["stalled"] == 0
    assert r0["checkpoint"] == pytest.approx(CKPT)
    # 25 steps, 9 of them redone: productive = 16 steps' worth minus the checkpoint write
    assert r0["productive"] == pytest.approx(25 * productive_step - wasted - CKPT)
    assert r0["data_wait"] == pytest.approx(25 * DATA)
    assert r0["other"] == pytest.approx(0.5)  # last step end to the bye

    # rank 1 saves nothing: the job's checkpoint on this agent (rank 0's) is its safe point too
    assert r1["wasted_progress"] == pytest.approx(wasted)
    assert r1["wall"] == pytest.approx(1041.5 - 994.0)
    assert r1["stalled"] == pytest.approx(4.0)  # last progress 1037 to the step that ended it
    assert r1["data_wait"] == pytest.approx(22 * DATA + 3.5 - 3.5)  # the stall's 3.5 s of data wait moved
    # the rest of the 4 s step (0.495 s of compute, 0.005 s of exposed comm) was stalled time too
    assert r1["productive"] == pytest.approx(22 * productive_step - wasted)
    assert r1["exposed_comm"] == pytest.approx(22 * 0.005)
    assert r1["other"] == pytest.approx(0.5)
    for r in (r0, r1):
        parts = [r[c] for c in C.GOODPUT_CATEGORIES]
        assert min(parts) >= -1e-9 and sum(parts) == pytest.approx(r["wall"])


def test_a_clean_exit_then_a_new_run_is_startup_not_recovery():
    tl = Timeline()
    tl.w.now = 1000.0
    tl.start(0, 1000, pstart=998.0)
    tl.until(1010.0, {0: each(1003, 1010)})
    tl.bye(0)
    tl.until(1020.0)  # within the linger: the rank is kept, its wall stopped at 1010
    assert _split(tl.w.scrape(), "0")["wall"] == pytest.approx(12.0)
    tl.start(0, 1001, pstart=1019.0)
    tl.until(1030.0, {0: each(1024, 1030)})
    r = _split(tl.w.scrape(), "0")
    assert r["recovery"] == 0 and r["wasted_progress"] == 0
    assert r["startup"] == pytest.approx((1002 - 998) + (1023 - 1019))
    assert r["wall"] == pytest.approx(12.0 + (1030 - 1019))


def test_a_clean_exit_then_a_launcher_restart_is_a_disruption():
    """A surviving rank whose collective fails exits through atexit (a "bye"); torchrun then restarts
    it with a higher restart count: recovery from the bye, progress since the checkpoint wasted."""
    tl = Timeline()
    tl.w.now = 1000.0
    tl.start(0, 1000, pstart=998.0)
    tl.until(1010.0, {0: each(1003, 1010)})
    tl.ckpt(0, 1.7e9)
    tl.until(1014.0, {0: each(1011, 1014)})
    tl.bye(0)
    tl.until(1016.0)
    tl.start(0, 1001, pstart=1015.0)
    s = tl.senders[0]
    s.ident = dict(s.ident)
    tl.until(1020.0)
    rec = s.step(1.0, data=DATA, micro=1)
    assert tl.w.send(s.ident, dict(rec, restart=1)) == "ok"  # launcher restart count 0 -> 1
    r = _split(tl.w.scrape(), "0")
    assert r["wasted_progress"] == pytest.approx(4 * (1.0 - DATA - 0.005))  # steps 1011..1014
    assert r["recovery"] == pytest.approx(1019.0 - 1014.0)  # the bye to the first step's start
    assert r["startup"] == pytest.approx(1002.0 - 998.0)
    assert r["wall"] == pytest.approx(1020.0 - 998.0)
