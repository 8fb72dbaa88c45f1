"""The agent's lifecycle accounting (exporter/goodput.py) on a scripted timeline: startup from the
process start, a death (heartbeats stop) 9 steps after a checkpoint, the restart's recovery, a
stall in next() that a long step ends, and a clean exit. Every second of each rank's wall time lands
in exactly one category of the recording rules' split (computed here from the scrape, the way the
rules do)."""
from __future__ import annotations

from typing import Callable, Dict, List, Tuple

import pytest

from ranksight import catalog as C
from ranksight.exporter import goodput

from test_exporter_helpers import hb, one
from test_exporter_ranks import RECEIVE_DELAY_MAX
from test_exporter_totals import Sender, World

DATA, XCOMM, CKPT = 0.25, 0.005, 0.5


def _split(got, rank: str) -> Dict[str, float]:
    """The rules' per-rank split (ranksight/triage/goodput.py, before the job aggregation)."""
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
        self.ckpt_next: Dict[int, float] = {}  # rank -> the checkpoint share of its next step (a blocking save)

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
                    rec = s.step(dur, data=data, micro=1, ckpt=self.ckpt_next.pop(r, 0.0))
                    assert self.w.send(s.ident, rec) == "ok"
            if abs(self.w.now - round(self.w.now)) < 1e-9:
                self.hb_n += 1
                for r, s in self.senders.items():
                    if self.beating[r]:
                        self.w.send(s.ident, dict(s.hb(seq=self.hb_n), phase=self.phase[r]))
            self.w.table.check(self.w.now)

    def ckpt(self, rank: int, unix: float) -> None:
        """A blocking save of CKPT seconds: its record goes out now, the step that holds it next."""
        s = self.senders[rank]
        self.ckpt_next[rank] = CKPT
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
    wasted = 9 * productive_step - CKPT  # steps 1016..1024 after the checkpoint at 1015 (the first held the write)
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
    wasted = 9 * productive_step  # its steps 1016..1024, none holding a write
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
    assert r["wasted_progress"] == pytest.approx(4 * (1.0 - DATA - 0.005) - CKPT)  # steps 1011..1014 (1011 held the write)
    assert r["recovery"] == pytest.approx(1019.0 - 1014.0)  # the bye to the first step's start
    assert r["startup"] == pytest.approx(1002.0 - 998.0)
    assert r["wall"] == pytest.approx(1020.0 - 998.0)


def test_a_death_and_a_clean_exit_are_dated_by_the_records_not_by_their_late_arrival():
    """The receiver drains in batches, so records arrive up to RECEIVE_DELAY_MAX late. The ledger
    dates the death by the process's last record, the restart by its first step and the clean
    exit by its "bye", each by the sender's ts: its wall and recovery are the job's own."""
    late = RECEIVE_DELAY_MAX * 0.8
    w = World(stall_min_seconds=30.0, stall_p99_factor=1.0)

    def send(s: Sender, body: dict, made: float) -> None:
        w.now = made + late
        assert w.send(dict(s.ident, ts=goodput.OFFSET + made), body) == "ok"
        w.table.check(w.now)

    s = Sender(sess=1, pid=1000)
    send(s, dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + 998.0), 1000.0)
    for n in range(10):  # ten 1 s steps from 1001 to 1011, heartbeats between them
        send(s, s.step(1.0, data=DATA, micro=1), 1002.0 + n)
        send(s, s.hb(seq=n + 1), 1002.5 + n)
    w.tick(5.0)  # the process died after its heartbeat at 1011.5; the agent finds it down later
    s = Sender(sess=2, pid=1001)
    send(s, dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + 1014.0), 1016.0)
    for n in range(3):  # the restart's steps: 1018 to 1021
        send(s, s.step(1.0, data=DATA, micro=1), 1019.0 + n)
    send(s, s.bye(), 1021.5)
    w.tick(3.0)
    r = _split(w.scrape(), "0")
    assert r["recovery"] == pytest.approx(1018.0 - 1011.5)
    assert r["wall"] == pytest.approx(1021.5 - 998.0)
    assert r["startup"] == pytest.approx(1001.0 - 998.0)
    assert r["other"] == pytest.approx(0.5 + 0.5)  # the last step to the last heartbeat, and to the bye


class OneRank:
    """One rank on one agent (no stall within 30 s); each record arrives at the agent time it was
    made, dated by it (the sender's ts)."""

    def __init__(self) -> None:
        self.w = World(stall_min_seconds=30.0, stall_p99_factor=1.0)
        self.s = Sender(sess=1, pid=1000)

    @classmethod
    def start(cls) -> Tuple[World, Sender, Callable[[dict, float], None]]:
        o = cls()
        return o.w, o.s, o.send

    def send(self, body: dict, made: float) -> None:
        self.w.now = made
        assert self.w.send(dict(self.s.ident, ts=goodput.OFFSET + made), body) == "ok"
        self.w.table.check(self.w.now)


def test_a_blocking_save_is_checkpoint_time_not_wasted_progress():
    """A save that blocks its caller ends (its record goes out) before the step that holds it does;
    the rank's checkpoint seconds take the write with that step (its checkpoint share). At the
    death the write counts once, as checkpoint time, and only the productive time after it is
    wasted."""
    w, s, send = OneRank.start()

    send(dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + 998.0), 999.0)
    for n in range(5):  # 1 s steps from 1000 to 1005
        send(s.step(1.0, data=DATA, micro=1), 1001.0 + n)
    s.totals.checkpoint(goodput.OFFSET + 1005.75, 0.5, 100, True)  # the step from 1005 saves 1005.25-1005.75
    send(dict(t="ckpt", dur=0.5, bytes=100, ok=True, src="timer"), 1005.75)
    send(s.step(1.5, data=DATA, micro=1, ckpt=0.5), 1006.5)
    for n in range(3):  # three more steps, then the process dies (no bye)
        send(s.step(1.0, data=DATA, micro=1), 1007.5 + n)
    send(s.hb(seq=1), 1009.5)
    w.tick(6.0)
    r = _split(w.scrape(), "0")
    productive_step = 1.0 - DATA - 0.005
    assert r["wasted_progress"] == pytest.approx((1.5 - DATA - 0.005 - 0.5) + 3 * productive_step)
    assert r["checkpoint"] == pytest.approx(0.5)
    assert r["productive"] == pytest.approx(5 * productive_step)


@pytest.mark.parametrize("lck_later", [0.0, 4e-7, 1e-3])
def test_the_totals_last_checkpoint_rounded_up_is_the_same_checkpoint(lck_later):
    """The totals carry the last checkpoint's time rounded to the microsecond, its record the full
    float, so the totals can read up to 0.5 us later. That is the same checkpoint: the safe point
    stays at the save and the steps after it are wasted at the death. A time 1 ms later is a newer
    checkpoint, and the safe point moves to it."""
    w, s, send = OneRank.start()

    send(dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + 998.0), 999.0)
    send(s.step(1.0, data=DATA, micro=1), 1001.0)
    saved = goodput.OFFSET + 1001.25
    send(dict(t="ckpt", dur=0.25, bytes=100, ok=True, src="timer", ts=saved), 1001.25)
    s.totals.checkpoint(saved, 0.25, 100, True)
    for n in range(4):
        send(s.step(1.0 if n else 1.25, data=DATA, micro=1, ckpt=0.0 if n else 0.25), 1002.25 + n)
    fields = s.totals.fields()
    fields["tot"]["lck"] = saved + lck_later
    send(dict(s.hb(seq=1), **fields), 1005.5)
    w.tick(6.0)
    r = _split(w.scrape(), "0")
    productive_step = 1.0 - DATA - XCOMM
    assert r["wasted_progress"] == pytest.approx(0.0 if lck_later > 1e-6 else 4 * productive_step)


@pytest.mark.parametrize("old_hooks", [False, True], ids=["hooks", "hooks-without-tot-ckpt"])
@pytest.mark.parametrize("async_save", [False, True], ids=["blocking", "async"])
def test_wasted_progress_after_a_save_from_either_hooks(old_hooks, async_save):
    """A blocking save (0.5 s inside a step, its record before that step) or an async one (0.2 s of
    staging in a step, its 3 s write completing two steps later), then four steps and a death. The
    progress after the save is wasted, with hooks that report the steps' checkpoint time and with
    hooks before them (totals without "ckpt": checkpoint seconds are the records' seconds)."""
    w, s, send = OneRank.start()
    hbs = iter(range(1, 100))

    def heartbeat(made: float) -> None:
        fields = s.totals.fields()
        if old_hooks:
            del fields["tot"]["ckpt"]
        send(dict(hb(seq=next(hbs), step_=s.seq), **fields), made)

    send(dict(t="hello", info={}, dirs={}, pstart=goodput.OFFSET + 998.0), 999.0)
    t = 1000.0
    for _ in range(5):
        t += 1.0
        send(s.step(1.0, data=DATA, micro=1), t)
    heartbeat(t + 0.1)
    if async_save:
        t += 1.2
        send(s.step(1.2, data=DATA, micro=1, ckpt=0.2), t)  # the staging; the write runs on
        for _ in range(2):
            t += 1.0
            send(s.step(1.0, data=DATA, micro=1), t)
        s.totals.checkpoint(goodput.OFFSET + t + 0.1, 3.0, 100, True)
        send(dict(t="ckpt", dur=3.0, bytes=100, ok=True, src="dcp", ts=goodput.OFFSET + t + 0.1), t + 0.1)
    else:
        s.totals.checkpoint(goodput.OFFSET + t + 0.75, 0.5, 100, True)
        send(dict(t="ckpt", dur=0.5, bytes=100, ok=True, src="timer", ts=goodput.OFFSET + t + 0.75), t + 0.75)
        t += 1.5
        send(s.step(1.5, data=DATA, micro=1, ckpt=0.5), t)  # the step that held the save
    heartbeat(t + 0.2)
    for _ in range(4):
        t += 1.0
        send(s.step(1.0, data=DATA, micro=1), t)
    heartbeat(t + 0.1)
    w.tick(6.0)
    r = _split(w.scrape(), "0")
    productive_step = 1.0 - DATA - XCOMM
    # the four steps after the save, and with a blocking save the rest of the step that held it
    assert r["wasted_progress"] == pytest.approx((4 if async_save else 5) * productive_step)
    assert r["checkpoint"] == pytest.approx((3.0 if old_hooks else 0.2) if async_save else 0.5)
