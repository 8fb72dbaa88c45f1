"""The agent's side of goodput: lifecycle gaps of each (job, rank), measured where they happen.

The rank's own counters give the in-step split (step time, data wait, exposed comm, checkpoint).
What only the agent sees is the rank's life around its steps, kept in one :class:`Ledger` per
rank and exposed as counters (the recording rules of ranksight/triage/goodput.py join them):

- ``rank_wall_seconds_total``: wall time since the rank's first process started (the hello's
  ``pstart``; first sight without one), across restarts; it stops at a clean exit ("bye") and
  runs again from the next session's process start.
- ``badput_seconds_total{category}``:
    startup          the rank's first process start (or the process start of a new run after a
                     clean exit) to its first step's start;
    recovery         a disruption (the process died: heartbeats stopped, or a new process of the
                     same job and rank appeared without a "bye", or after a "bye" with a higher
                     launcher restart count: a surviving rank whose collective failed exits
                     cleanly before torchrun restarts it) to the new process's first step;
    wasted_progress  at a disruption, the productive step time since the last successful
                     checkpoint, which the restarted job must redo. The checkpoint is the rank's own
                     or, when it saves none (rank-0-only saves), the latest of any rank of its job on
                     this agent; a rank on a node with no saving rank counts from its session start;
    stalled          the rank flagged stalled (alive, no progress past its limit, either reason),
                     from its last progress to the step that ended it (or its death).
- ``badput_overlap_seconds_total{category}``: stalled time that also lies in the step that ended
  the stall (by the component it fell in: data wait when the rank stalled in next(), exposed comm
  when it waited in a collective, else productive), and wasted progress (productive). The rules
  subtract it from the in-step counters so that no second counts twice.

Time: everything is kept on the agent's monotonic clock; ``pstart`` (unix seconds on the same
host) is converted with the wall/monotonic offset taken at import (``OFFSET``), and so is each
record's ``ts``: a death is dated by the process's last record, a clean exit by its "bye" and a first
step by its end, as the sender made them, not by their arrival (the receiver drains in batches, up
to ``RECEIVE_DELAY_MAX`` late); an implausible ``ts`` (a skewed clock) falls back to the arrival.
A rank that never reached its first step while a gap is open is not also counted as stalled: the
gap wins.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, Iterable, List, Optional

from ranksight import catalog as C

from .collectors import Family, Labels, add, family

log = logging.getLogger("ranksight.exporter.goodput")

OFFSET = time.time() - time.monotonic()  # unix = monotonic + OFFSET (this host)
STARTUP, WASTED, RECOVERY, STALLED = C.BADPUT_AGENT_CATEGORIES
PRODUCTIVE, DATA, XCOMM = C.OVERLAP_CATEGORIES
WAITING = C.STALL_WAITING


class Ledger:
    """Lifecycle accounting of one (job, rank); all times on the agent's monotonic clock."""

    __slots__ = ("wall", "seg", "bad", "over", "gap", "gap_since", "stall_since", "stall_kind", "alive",
                 "dead", "safe", "safe_ts", "safe_open", "own_ts", "sess_prod", "sessions", "bye_at", "bye_wasted", "rerun")

    def __init__(self, now: float):
        self.wall = 0.0  # closed wall segments
        self.seg: Optional[float] = now  # start of the open wall segment (None after a clean exit)
        self.bad: Dict[str, float] = dict.fromkeys(C.BADPUT_AGENT_CATEGORIES, 0.0)
        self.over: Dict[str, float] = dict.fromkeys(C.OVERLAP_CATEGORIES, 0.0)
        self.gap: Optional[str] = STARTUP  # the open lifecycle gap: startup | recovery | None
        self.gap_since = now
        self.stall_since: Optional[float] = None
        self.stall_kind = PRODUCTIVE
        self.alive = now  # last record from the current process
        self.dead = False  # the current process died (disruption counted, recovery open)
        self.safe: Optional[float] = None  # productive seconds at the last checkpoint known to be saved
        self.safe_ts: Optional[float] = None  # that checkpoint's unix time
        self.safe_open = False  # the rank wrote it and counts checkpoint records: its next step may hold the write
        self.own_ts: Optional[float] = None  # the rank's own last checkpoint time, as last seen here
        self.sess_prod = 0.0  # productive seconds when the current session started
        self.bye_at: Optional[float] = None  # the last clean exit ("bye")
        self.bye_wasted = 0.0  # progress since the checkpoint at that exit, wasted if it was a restart
        self.rerun: Optional[int] = None  # a session after a clean exit, before its first step: the old restart count
        self.sessions = 0

    # ------------------------------------------------------------------ values
    def values(self, now: float) -> Dict[str, float]:
        """category -> badput seconds now, open intervals included."""
        out = dict(self.bad)
        if self.gap is not None:
            out[self.gap] += max(now - self.gap_since, 0.0)
        if self.stall_since is not None:
            out[STALLED] += max(now - self.stall_since, 0.0)
        return out

    def wall_seconds(self, now: float) -> float:
        return self.wall + (max(now - self.seg, 0.0) if self.seg is not None else 0.0)

    # ------------------------------------------------------------------ transitions
    def _close_stall(self, at: float) -> float:
        s = 0.0
        if self.stall_since is not None:
            s = max(at - self.stall_since, 0.0)
            self.bad[STALLED] += s
            self.stall_since = None
        return s

    def _close_gap(self, at: float) -> None:
        if self.gap is not None:
            self.bad[self.gap] += max(at - self.gap_since, 0.0)
            self.gap = None

    def disrupt(self, r: Any, at: float, why: str) -> None:
        """The current process died at ``at``: its progress since the last checkpoint is wasted and
        the recovery runs from here."""
        self._close_stall(at)
        wasted = 0.0
        if self.gap is None:  # it had stepped: what it did since the checkpoint is lost
            prod = productive(r, self)
            base = self.safe if self.safe is not None else self.sess_prod
            wasted = max(prod - base, 0.0)
            self.bad[WASTED] += wasted
            self.over[PRODUCTIVE] += wasted
        self._close_gap(at)
        self.gap, self.gap_since = RECOVERY, at
        self.dead = True
        log.info("job %s rank %d: disruption (%s): %.1f s of progress since the last checkpoint wasted",
                 r.job, r.rank, why, wasted)


def productive(r: Any, g: Ledger) -> float:
    """The rank's productive step seconds so far (the rules' split, from the agent's counters)."""
    s = r.sums
    return s["dur"] - s["data"] - s["xcomm"] - s["ckpt"] - g.over[PRODUCTIVE]


# ---------------------------------------------------------------------- calls from exporter/ranks.py
def new_session(r: Any, now: float, first: bool) -> None:
    """A new watch session of the rank starts (new pid or sess). ``first``: the rank's very first."""
    g: Ledger = r.gp
    g.sessions += 1
    if first:
        return
    if r.finished is not None:  # the previous session exited cleanly: a new run of the job ...
        g._close_gap(now)
        g._close_stall(now)
        g.gap, g.gap_since = STARTUP, now
        if g.seg is None:
            g.seg = now
        g.rerun = r.cur["restart"]  # ... unless its first step says the launcher restarted it (see step())
    elif not g.dead:  # a process replaced without a "bye": it died after its last record
        g.disrupt(r, g.alive, "new process")
    g.dead = False
    g.sess_prod = productive(r, g)


def hello(r: Any, pstart: float, now: float) -> None:
    """The session's process start (unix seconds): a startup gap and the wall run from there."""
    if pstart <= 0:
        return
    g: Ledger = r.gp
    start = min(pstart - OFFSET, now)
    if g.gap == STARTUP and start < g.gap_since:
        if g.seg is not None and g.seg == g.gap_since:
            g.seg = start  # the wall of this segment runs from the process start too
        g.gap_since = start


def _end(rec: dict, now: float) -> float:
    """When the record was made (for steps: when its last step ended), on the agent's clock: the
    sender's ``ts`` (same host), unless it is implausible (a skewed clock), then the arrival. The
    arrival can be up to ``RECEIVE_DELAY_MAX`` late (the receiver drains in batches), which would
    move a death, a clean exit or a restart's first step by that much."""
    t = rec["ts"] - OFFSET
    return t if now - 60.0 <= t <= now + 1.0 else now


def step(r: Any, rec: dict, now: float) -> None:
    """A "step" record, or a "steps" record of several (lists per field): the first step of a session
    ends its startup or recovery; a step ends a stall."""
    g: Ledger = r.gp
    g.dead = False  # (a rank that only froze past its down limit and came back)
    if g.rerun is None and g.gap is None and g.stall_since is None:
        return  # a step of a running rank: nothing to close (this runs for every step record)
    end = _end(rec, now)
    durs = rec["dur"] if isinstance(rec["dur"], list) else [rec["dur"]]
    start = end - sum(durs)
    if g.rerun is not None:
        if rec["restart"] > g.rerun and g.bye_at is not None and g.gap == STARTUP:
            # A launcher restart after a "bye" (a surviving rank whose collective failed exits cleanly):
            # a disruption at the bye. Its progress since the checkpoint is wasted, the time from the
            # bye to this first step is recovery, and the wall ran through.
            g.bad[WASTED] += g.bye_wasted
            g.over[PRODUCTIVE] += g.bye_wasted
            if g.seg is not None and g.seg > g.bye_at:
                g.wall += g.seg - g.bye_at
            g.gap, g.gap_since = RECOVERY, g.bye_at
            log.info("job %s rank %d: restarted by its launcher after a clean exit: %.1f s of progress wasted",
                     r.job, r.rank, g.bye_wasted)
        g.rerun = None
    if g.gap is not None:
        g._close_gap(max(start, g.gap_since))
    if g.stall_since is not None:  # the first step of the record is the one that was stalled
        first = _first(rec)
        dur = durs[0]
        s = g._close_stall(max(start + dur, g.stall_since))
        inside = min(s, dur)
        parts = {DATA: first("data"), XCOMM: first("xcomm")}
        parts[PRODUCTIVE] = max(dur - parts[DATA] - parts[XCOMM] - first("ckpt"), 0.0)
        for c in dict.fromkeys((g.stall_kind, PRODUCTIVE, DATA, XCOMM)):  # its own component first
            take = min(inside, parts[c])
            g.over[c] += take
            inside -= take


def _first(rec: dict) -> Any:
    """The first step's field getter of a "step" or "steps" record."""
    if not isinstance(rec["dur"], list):
        return rec.__getitem__
    if "first" in rec:  # the agent's decode cut the phase lists out and kept the first step's values
        return rec["first"].__getitem__
    return lambda k: rec[k][0]


def checkpoint_seen(ranks: Iterable[Any], writer: Any) -> None:
    """``writer`` has a newer successful checkpoint: progress so far is safe on it and on every rank
    of its job tracked here that has no newer checkpoint of its own.

    The rank's checkpoint seconds are its steps' checkpoint shares, so a save that blocked its
    caller enters them with the step that holds it, which ends after the checkpoint record (the
    hooks send records in order): that step's share is checkpoint time, and the rest of the step,
    done after the save, is progress the checkpoint does not hold. An async save's completion
    record comes after the steps that held its staging.

    A sender that does not report the steps' checkpoint time (``r.ckpt_rec``) has the record's
    seconds in its checkpoint seconds already, before the step that holds a blocking save: that
    step's share is added to the safe point when it arrives (``safe_open``), so that the write is
    not counted again as wasted progress."""
    ts = writer.last_ckpt_ts
    for r in ranks:
        if r.job != writer.job:
            continue
        g: Ledger = r.gp
        if r is writer or (r.last_ckpt_ts is None or r.last_ckpt_ts <= ts):
            if g.safe_ts is None or ts > g.safe_ts:
                g.safe_ts = ts
                g.safe = productive(r, g)
                g.safe_open = r is writer and r.ckpt_rec


def after(ranks: Iterable[Any], r: Any, rec: dict, now: float) -> None:
    """After the table applied ``rec`` to ``r``."""
    g: Ledger = r.gp
    at = min(_end(rec, now), now)  # when the record was made: a death is dated by the last one, a clean exit by its bye
    g.alive = max(at, g.alive)
    t = rec["t"]
    if t == "step" or t == "steps":
        if g.safe_open:
            g.safe_open = False
            dur0 = rec["dur"][0] if isinstance(rec["dur"], list) else rec["dur"]
            g.safe += min(max(_first(rec)("ckpt"), 0.0), dur0)
        step(r, rec, now)
    elif t == "hello":
        hello(r, rec.get("pstart", 0.0), now)
    elif t == "bye" and r.finished is not None:
        finish(r, at)
    if r.last_ckpt_ts is not None and r.last_ckpt_ts != g.own_ts:
        g.own_ts = r.last_ckpt_ts
        checkpoint_seen(ranks, r)


def finish(r: Any, now: float) -> None:
    """A clean exit: the wall stops; an open gap or stall ends here."""
    g: Ledger = r.gp
    g._close_stall(now)
    g._close_gap(now)
    g.bye_at = now
    g.bye_wasted = max(productive(r, g) - (g.safe if g.safe is not None else g.sess_prod), 0.0)
    if g.seg is not None:
        g.wall += max(now - g.seg, 0.0)
        g.seg = None


def check(r: Any, now: float) -> None:
    """After the rank's own check: a death (rank down) is a disruption; a stall opens or closes."""
    g: Ledger = r.gp
    if r.finished is not None:
        return
    if not r.up and not g.dead:
        g.disrupt(r, g.alive, "rank down")
        return
    if r.stalled and g.stall_since is None and g.gap is None and not g.dead:
        g.stall_since = min(r.last_progress, now)
        g.stall_kind = XCOMM if r.stalled == WAITING else DATA if r.phase == "data" else PRODUCTIVE
    elif not r.stalled and g.stall_since is not None and r.up:
        # ended without a step record (a checkpoint phase, a step the agent only saw in a heartbeat)
        s = g._close_stall(now)
        if r.phase != "checkpoint":
            g.over[g.stall_kind] += s


# ---------------------------------------------------------------------- exposition
class Families:
    """The goodput families of one scrape."""

    def __init__(self) -> None:
        self.wall = family(C.RANK_WALL)
        self.bad = family(C.BADPUT)
        self.over = family(C.BADPUT_OVERLAP)

    def add(self, base: Labels, snap: "Snapshot") -> None:
        add(self.wall, base, snap.wall)
        for c, v in snap.bad.items():
            add(self.bad, base.plus("category", c), v)
        for c, v in snap.over.items():
            add(self.over, base.plus("category", c), v)

    def all(self) -> List[Family]:
        return [self.wall, self.bad, self.over]


class Snapshot:
    """One rank's goodput values, taken under the table lock."""

    __slots__ = ("wall", "bad", "over")

    def __init__(self, g: Ledger, now: float):
        self.wall = g.wall_seconds(now)
        self.bad = g.values(now)
        self.over = dict(g.over)
