"""Per-rank state of the node agent: counters, histograms, a sliding-window
step-time quantile, heartbeats, stalls and lints. Plain objects; the
:class:`~ranksight.exporter.collectors.ranks.RanksCollector` turns them into metric families at scrape time.

Threads: the ingest thread calls :meth:`RankTable.apply`, the agent's checker
thread calls :meth:`RankTable.check` (heartbeat misses, stalls, TTL) and the
scrape thread calls :meth:`RanksCollector.collect`. One lock guards the table;
each holder keeps it for microseconds (one datagram, one rank snapshot).

Counters. A watch session (one ``watch()`` in one process: pid and ``sess``) keeps cumulative
totals of everything it sent and puts them on every heartbeat and on its "bye" (protocol v2).
The rank's totals are the truth: a counter is ``carried + totals`` (``carried``: what earlier
sessions of the same job and rank added, so a restarted rank continues its counters), plus the
per-step deltas of the step records that arrived after the last heartbeat (so counters move
between heartbeats). A lost datagram or an agent restart therefore costs no count: the next
heartbeat restores the exact value. A counter never goes down: totals that are behind what
the deltas already added (a reordered datagram) are ignored. Version 1 senders have no totals:
their per-step deltas are summed, as they always were. Fields the hooks send as cumulative
per-process values (allocator retries, OOMs, hook errors, dropped events) are turned into
deltas per session, so they stay monotone too.

Finish. A v2 "bye" applies the final totals and marks the rank finished: its series stay for
``rank_linger_seconds`` (so a job shorter than a scrape interval still lands in Prometheus with
its final counts), ``rank_up`` stays 1, no heartbeat miss or stall is counted, and
``ranksight_rank_finished`` is 1. Then the rank is forgotten. A new session of the same job and
rank during the linger continues it.

Lints: ``ranksight_lint_active{lint}`` is exposed (value 1) only while the lint
is active on the rank; a lint the hooks report fine, or that clears, has no
series (Prometheus marks it stale, which ends the ``== 1`` alert). One series
per lint per rank at 0 would be 72 of a node's series for nothing.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Set, Tuple

from ranksight import catalog as C
from ranksight import config, protocol, record
from ranksight import triage

from . import goodput
from .stats import Hist, WindowQuantile

log = logging.getLogger("ranksight.exporter.ranks")

OK, REJECTED, OVERFLOW = C.INGEST_OK, C.INGEST_REJECTED, C.INGEST_OVERFLOW

NO_PROGRESS, WAITING = C.STALL_NO_PROGRESS, C.STALL_WAITING
BATCH_LR_LINT = C.LINT_GLOBAL_BATCH_LR  # raised by the agent from the job's history, not by the sender
STALL_REASONS = C.STALL_REASONS
RANKS_API = "/api/v1/ranks"  # the agent's JSON view of its ranks and their last stacks

# A heartbeat is late by up to this share of its interval before a miss counts
# (sender jitter and the checker's own period).
MISS_GRACE = 0.5
# The receiver stamps a batch of datagrams when it drains the socket, at most this long after the
# first of them arrived (ingest.IDLE_SLEEP_MAX): a heartbeat's stamp may be that late, so a gap
# counts as missed heartbeats only beyond it.
RECEIVE_DELAY_MAX = 0.5
MAX_WATCHED_DIRS = 64
P99_REFRESH_SECONDS = 5.0


_AGENT = config.defaults()["agent"]  # the defaults below are the config's (ranksight/config.py)


VERSION_KEYS = ("torch", "cuda", "nccl")  # the hello info's members exposed as rank_versions_info
_VERSION_OK = re.compile(r"[0-9A-Za-z.+_-]{0,64}")


def versions(info: Dict[str, Any]) -> Tuple[str, str, str]:
    """The torch, CUDA and NCCL versions of a hello's info: a value that is not a short version
    string (a sender's bug, or an odd build) reads as "other" rather than a label of any text."""
    out = []
    for k in VERSION_KEYS:
        v = info.get(k, "")
        out.append(v if isinstance(v, str) and _VERSION_OK.fullmatch(v) else "other")
    return out[0], out[1], out[2]


def parallel(info: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """The strategy and ZeRO stage of a hello's info (None when it names no strategy); a value
    outside the catalog's reads as "other"."""
    s = info.get("strategy")
    if s is None:
        return None
    z = info.get("zero_stage", "")
    return (s if s in C.PARALLEL_STRATEGIES else "other", z if z in C.ZERO_STAGES else "other")


@dataclass(frozen=True)
class RankSettings:
    max_ranks: int = _AGENT["max_ranks"]
    max_jobs: int = _AGENT["max_jobs"]
    quantile_window_seconds: float = _AGENT["quantile_window_seconds"]
    rank_ttl_seconds: float = _AGENT["rank_ttl_seconds"]
    rank_linger_seconds: float = _AGENT["rank_linger_seconds"]
    down_after_misses: int = _AGENT["down_after_misses"]
    stall_min_seconds: float = _AGENT["stall_min_seconds"]
    stall_p99_factor: float = _AGENT["stall_p99_factor"]

    @classmethod
    def from_config(cls, agent: Dict[str, object]) -> "RankSettings":
        return cls(**{k: agent[k] for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


class Rank:
    """State of one (job, rank)."""

    __slots__ = (
        "job", "rank", "node", "lr", "ws", "labels", "pid", "lpid", "first_seen", "last_seen",
        # the step record's fields by key (ranksight/record.py): sums of the per-step fields (and
        # "steps", "ckpt_bytes", "ckpt_fail"), histograms by "hist" key, cumulative fields turned
        # into counters (key -> [total, last]) and the current readings
        "kept", "sums", "hists", "cum", "cur", "win",
        "last_step_ts", "last_progress", "seq", "sess", "carried", "carried_h", "recv", "lost", "lost_carried", "finished", "pstart", "gpu_uuid",
        "gpu_every", "versions", "parallel",
        # checkpoints
        "ckpt_rec", "last_ckpt_ts", "last_ckpt_dur", "ckpt_since",
        # heartbeats
        "last_hb", "every", "missed_gap", "misses", "up", "phase", "coll", "probe", "hb_step",
        "stalled", "p99", "p99_at",
        "lints", "dirs", "expo", "gp", "stack",
    )

    def __init__(self, job: str, rank: int, window: float, now: float, kept: Optional["Kept"] = None):
        self.kept = kept = kept or KEPT
        self.job = job
        self.rank = rank
        self.node = ""
        self.lr = -1
        self.ws = 0
        self.labels: List[str] = []
        # its pid as it says, and the pid the kernel gave the agent for it (a unix-socket sender's
        # credentials; -1 over UDP, where the pid is only what the datagram claims)
        self.pid = self.lpid = -1
        self.first_seen = now
        self.last_seen = now
        self.sums: Dict[str, float] = dict(kept.sums)
        self.hists: Dict[str, Hist] = {k: Hist(m.buckets) for k, m, _ in kept.hists}
        self.win = WindowQuantile(window)
        self.last_step_ts: Optional[float] = None
        self.last_progress = now
        self.seq = 0
        self.sess = -1
        self.recv = 0  # step records received in this session
        self.lost = 0  # step records lost (all sessions): the totals' steps minus the records received
        self.lost_carried = 0
        self.carried: Dict[str, float] = dict(kept.sums)
        self.carried_h: Dict[str, Tuple[List[int], float]] = {}
        self.finished: Optional[float] = None  # agent clock at a clean exit ("bye"); the linger runs from here
        self.pstart = 0.0
        self.gpu_uuid, self.gpu_every = "", 0  # the hello's GPU and steps per CUDA-timed step (0: none)
        self.versions: Optional[Tuple[str, str, str]] = None  # torch, CUDA, NCCL from the hello's info
        self.parallel: Optional[Tuple[str, str]] = None  # strategy, ZeRO stage from the hello's info
        self.cum: Dict[str, List[int]] = {k: [0, 0] for k in kept.cumulative}
        self.cur: Dict[str, int] = dict.fromkeys(kept.current, 0)
        # sums["ckpt"] from the checkpoint records' seconds, not the steps' "ckpt": a sender that does
        # not report the steps' checkpoint time (v1, and v2 hooks whose totals have no "ckpt")
        self.ckpt_rec = False
        self.last_ckpt_ts: Optional[float] = None
        self.last_ckpt_dur: Optional[float] = None
        self.ckpt_since: Optional[float] = None
        self.last_hb: Optional[float] = None
        self.every = 1.0
        self.missed_gap = 0
        self.misses = 0
        self.up = True
        self.phase = "other"
        self.coll = -1.0
        self.probe = 0.0
        self.hb_step = 0
        self.stalled: Optional[str] = None
        self.p99 = 0.0
        self.p99_at = -1e18
        self.lints: Set[str] = set()  # the lints active now; a lint that clears is removed
        self.dirs: Dict[str, str] = {}
        self.expo: Optional[object] = None  # the ranks collector's label sets for this rank, rebuilt when labels change
        self.gp = goodput.Ledger(now)  # lifecycle accounting (exporter/goodput.py)
        self.stack: Optional[Stack] = None  # the main thread's stack while it made no progress ("stack" records)

    # -- identity
    def identify(self, rec: dict, now: float) -> None:
        node, lr = rec["node"], rec["lr"]
        if node != self.node or lr != self.lr:
            self.node, self.lr = node, lr
            self.labels = [self.job, node, str(self.rank), str(lr)]
            self.expo = None
        self.ws = rec["ws"]
        pid = rec["pid"]
        self.lpid = rec.get("lpid", -1)
        sess = rec.get("sess", 0)
        if pid != self.pid or sess != self.sess:
            if self.pid != -1:
                if pid != self.pid:
                    log.info("job %s rank %d: new process (pid %d -> %d); counters continue", self.job, self.rank,
                             self.pid, pid)
                else:
                    log.info("job %s rank %d: new watch session in pid %d; counters continue", self.job, self.rank, pid)
            goodput.new_session(self, now, first=self.pid == -1)
            self.ckpt_rec = rec["v"] < 2  # v2: learnt from its totals
            self.pid = pid
            self.sess = sess
            self._carry()
            self.finished = None
            for c in self.cum.values():
                c[1] = 0  # the new process counts from 0
            self.seq = 0
            self.hb_step = 0
            self.last_hb = None
            self.missed_gap = 0
            self.up = True
            self.last_progress = now
            self.ckpt_since = None
        self.last_seen = now

    def _carry(self) -> None:
        """A new session starts: what the rank counted so far is carried under its totals."""
        self.recv = 0
        self.lost_carried = self.lost
        self.carried.update(self.sums)
        for k, h in self.hists.items():
            self.carried_h[k] = (list(h.counts), h.sum)

    def totals(self, rec: dict) -> None:
        """Apply a v2 heartbeat's or bye's cumulative totals: counter = carried + total, never down."""
        tot = rec["tot"]
        carried = self.carried
        lost = self.lost_carried + tot["steps"] - self.recv
        if lost > self.lost:
            self.lost = lost
        self.ckpt_rec = rec_ckpt = "ckpt" not in tot
        sums = self.sums
        for k, a in self.kept.tot_records if rec_ckpt else self.kept.tot:
            v = carried[a] + tot.get(k, 0)
            if v > sums[a]:
                sums[a] = v
        hist = rec["hist"]
        for k, _, sk in self.kept.hists:
            h = self.hists[k]
            base, base_sum = self.carried_h.get(k) or ([0] * len(h.counts), 0.0)
            counts = hist.get(k)
            if counts is not None:
                hc = h.counts
                for i, n in enumerate(counts):
                    v = base[i] + n
                    if v > hc[i]:
                        hc[i] = v
            v = base_sum + tot.get(sk, 0)
            if v > h.sum:
                h.sum = v
        lck = tot.get("lck")
        # the totals carry the checkpoint's time rounded to the microsecond, its record the full
        # float: the same checkpoint reads up to 0.5 us later here, and must not read as a newer one
        # (goodput would move the safe point to now and lose the progress since the save)
        if lck is not None and (self.last_ckpt_ts is None or lck > self.last_ckpt_ts + LCK_SAME):
            self.last_ckpt_ts = lck
            if "lckd" in tot:
                self.last_ckpt_dur = tot["lckd"]

    def finish(self, rec: dict, now: float) -> None:
        """A clean exit: final totals, then the linger (see the module docstring)."""
        if "tot" in rec:
            self.totals(rec)
        self.finished = now
        self.up = True
        self.stalled = None
        self.phase = "idle"
        self.coll = -1.0
        self.ckpt_since = None

    def _cum(self, k: str, v: int) -> None:
        c = self.cum[k]
        if v > c[1]:
            c[0] += v - c[1]
            c[1] = v

    # -- records
    def step(self, rec: dict, now: float) -> None:
        """A v1 "step" record: its per-step fields are added to the sums and histograms."""
        self.recv += 1
        sums = self.sums
        sums["steps"] += 1
        ckpt = sums["ckpt"]
        for k in self.kept.step_sums:
            sums[k] += rec[k]
        if self.ckpt_rec:  # checkpoint time comes from the checkpoint records
            sums["ckpt"] = ckpt
        hists = self.hists
        for hk, k in self.kept.step_hists:  # Hist.observe, inlined
            h = hists[hk]
            x = rec[k]
            h.counts[bisect_left(h.bounds, x)] += 1
            h.sum += x
        self.win.observe(rec["dur"], now)
        self._stepped(rec, rec["seq"], now)

    def _stepped(self, rec: dict, last: int, now: float) -> None:
        """What a step or steps record says at its last step: progress and the per-process values."""
        self.last_step_ts = rec["ts"]
        self.last_progress = now
        if last > self.seq:
            self.seq = last
        for k, c in self.cum.items():  # cumulative on the sender
            v = rec[k]
            if v > c[1]:
                c[0] += v - c[1]
                c[1] = v
        cur = self.cur
        for k in cur:
            cur[k] = rec[k]

    def batch(self, rec: dict, now: float) -> None:
        """A v2 "steps" record: the window quantile sees every duration; the counters and
        histograms are the totals it carries (exact, so nothing is summed here)."""
        n = rec["n"]
        self.recv += n
        self.win.observe_many(rec["dur"], now)
        self._stepped(rec, rec["seq"] + n - 1, now)
        self.totals(rec)

    def heartbeat(self, rec: dict, now: float) -> None:
        self.last_hb = now
        self.every = rec["every"]
        self.missed_gap = 0
        self.up = True
        phase = rec["phase"]
        if phase == "checkpoint":
            pdur = rec.get("pdur", 0.0)  # seconds in the current phase (hooks >= 0.1); else count from here
            if pdur > 0:
                self.ckpt_since = now - pdur
            elif self.ckpt_since is None:
                self.ckpt_since = now
        else:
            self.ckpt_since = None
        self.phase = phase
        self.coll = rec["coll"]
        self.probe = rec["probe"]
        if rec["step"] > self.hb_step:
            if rec["step"] > self.seq:  # a step the agent did not see (lost datagram) is still progress
                self.last_progress = now
            self.hb_step = rec["step"]
        self._cum("herr", rec["herr"])
        if "tot" in rec:
            self.totals(rec)

    def checkpoint(self, rec: dict) -> None:
        """A checkpoint record: the write's duration goes to the write histogram; the time it
        blocked the steps (ckpt_s, checkpoint_seconds_total) comes with the steps' own "ckpt"
        (from a sender that does not report that: the record's duration, as those senders meant it)."""
        dur = rec["dur"]
        if self.ckpt_rec:
            self.sums["ckpt"] += dur
        self.hists[CKPT_HIST].observe(dur)
        self.last_ckpt_dur = dur
        if rec["ok"]:
            self.sums["ckpt_bytes"] += rec["bytes"]
            self.last_ckpt_ts = rec["ts"]
        else:
            self.sums["ckpt_fail"] += 1

    def set_stack(self, rec: dict, now: float) -> None:
        """A "stack" record: keep the last one (an empty one clears it); log it once per change."""
        frames = tuple(rec["frames"])
        if not frames:
            if self.stack is not None:
                log.info("job %s rank %d made progress again (was at %s)", self.job, self.rank, self.stack.where)
            self.stack = None
            return
        if self.stack is None or self.stack.frames != frames:
            log.warning("job %s rank %d no progress for %.0f s (phase %s) at %s; stack, innermost first: %s",
                        self.job, self.rank, rec["idle"], rec["phase"], rec["where"], " | ".join(frames))
        self.stack = Stack(frames, rec["where"], rec["idle"], rec["phase"], now, rec["ts"], rec.get("cw"))

    def describe(self, now: float) -> Dict[str, object]:
        """The rank as /api/v1/ranks shows it."""
        st = self.stack
        return {"job": self.job, "rank": self.rank, "node": self.node, "local_rank": self.lr, "pid": self.pid,
                "local_pid": self.lpid if self.lpid > 0 else None, "pstart": self.pstart,
                "up": self.up, "stalled": self.stalled, "phase": self.phase, "step": max(self.seq, self.hb_step),
                "in_collective_s": self.coll if self.coll >= 0 else None,
                "finished": self.finished is not None,
                "stack": None if st is None else {"where": st.where, "frames": list(st.frames), "phase": st.phase,
                                                  "idle_s": st.idle, "age_s": round(now - st.at, 3), "ts": st.ts,
                                                  "collective": None if st.cw is None else
                                                  dict(st.cw, wait=round(st.cw["wait"] + now - st.at, 3))}}

    # -- checker
    def check(self, now: float, s: RankSettings) -> None:
        if self.finished is not None:  # exited cleanly: lingering, neither missed nor down nor stalled
            return
        if self.last_hb is not None:
            n = int((now - self.last_hb - RECEIVE_DELAY_MAX) / self.every - MISS_GRACE)
            if n > self.missed_gap:
                self.misses += n - self.missed_gap
                self.missed_gap = n
            self.up = self.missed_gap < s.down_after_misses
        # stall: alive (heartbeats arrive), no progress for longer than the limit, not checkpointing
        stalled = None
        if self.last_hb is not None and self.up and self.phase != "checkpoint":
            if now - self.p99_at >= P99_REFRESH_SECONDS:
                q = self.win.quantiles((0.99,), now)
                self.p99 = q[0] if q else 0.0
                self.p99_at = now
            limit = max(s.stall_min_seconds, s.stall_p99_factor * self.p99)
            # Before its first step a rank is judged by its main-thread probe alone: loading data or
            # compiling for minutes is not a hang, a main thread stuck in one C call is.
            stepped = self.seq > 0 or self.hb_step > 0
            if (stepped and now - self.last_progress > limit) or self.probe > limit:
                stalled = WAITING if self.coll >= 0 else NO_PROGRESS
        if stalled != self.stalled:
            if stalled:
                log.warning("job %s rank %d stalled (%s)", self.job, self.rank, stalled)
            self.stalled = stalled


@dataclass(frozen=True)
class Stack:
    frames: Tuple[str, ...]  # innermost first
    where: str
    idle: float  # seconds without progress when the rank read it
    phase: str
    at: float  # agent clock when it arrived
    ts: float  # sender's wall clock
    cw: Optional[Dict[str, object]] = None  # the collective it waits in: op, pg, seq, wait (protocol "cw")


class Kept:
    """What the agent keeps of the step record, derived from its declaration (ranksight/record.py;
    ``record.ALL``, or a test's copy): the rank's sums ("steps", each per-step field, the checkpoint
    records' bytes and failures; v2 totals carry each under the same key), its histograms
    (("hist" key, metric, the "tot" key of its sum)), its cumulative fields and current readings.
    Checkpoint time is the steps' "ckpt", or the checkpoint records' "ckpt_s" from a sender without it."""

    def __init__(self, layout: record.Layout = record.ALL):
        self.layout = layout
        self.step_sums = layout.per_step
        self.sums: Dict[str, float] = dict({"steps": 0}, **{k: 0.0 if k in layout.seconds else 0
                                                             for k in layout.per_step}, ckpt_bytes=0, ckpt_fail=0)
        self.tot = tuple((k, k) for k in self.sums)  # ("tot" key, sums key)
        self.tot_records = tuple(("ckpt_s", k) if k == "ckpt" else (k, k) for k in self.sums)  # totals without "ckpt"
        self.hists = tuple(layout.hists) + (protocol.CKPT_HIST,)
        self.step_hists = tuple((hk, k) for hk, _, k in layout.hists)  # the per-step fields observed in them
        self.cumulative = layout.cumulative
        self.current = layout.current


KEPT = Kept()
CKPT_HIST = protocol.CKPT_HIST[0]


class RankTable:
    """All tracked ranks, capped by max_ranks and max_jobs."""

    def __init__(self, settings: RankSettings, kept: Optional[Kept] = None):
        self.s = settings
        self.kept = kept or KEPT  # the step record's fields each rank keeps
        self.lock = threading.Lock()
        self.ranks: Dict[Tuple[str, int], Rank] = {}
        self.jobs: Dict[str, int] = {}
        # job -> (global batch, base LR, monotonic time seen): outlives the job's ranks (a restart
        # after a clean exit still compares with the last run), capped at max_jobs, oldest dropped.
        self.job_batch: Dict[str, Tuple[int, float, float]] = {}

    def apply(self, rec: dict, now: float) -> str:
        """Apply one decoded datagram; returns the ingest result label."""
        key = (rec["job"], rec["rank"])
        t = rec["t"]
        with self.lock:
            r = self.ranks.get(key)
            if r is None:
                if t == "bye" and rec["v"] < 2:
                    return OK
                job = rec["job"]
                if len(self.ranks) >= self.s.max_ranks or (job not in self.jobs and len(self.jobs) >= self.s.max_jobs):
                    return OVERFLOW
                r = Rank(job, rec["rank"], self.s.quantile_window_seconds, now, self.kept)
                self.ranks[key] = r
                self.jobs[job] = self.jobs.get(job, 0) + 1
            r.identify(rec, now)
            if t == "steps":
                r.batch(rec, now)
            elif t == "step":
                r.step(rec, now)
            elif t == "hb":
                r.heartbeat(rec, now)
            elif t == "ckpt":
                r.checkpoint(rec)
            elif t == "bye":
                if rec["v"] < 2:
                    self._remove(key)
                elif self.s.rank_linger_seconds <= 0:
                    r.finish(rec, now)
                    self._remove(key)
                else:
                    if r.finished is None:
                        log.info("job %s rank %d finished: final series kept %.0f s", r.job, r.rank,
                                 self.s.rank_linger_seconds)
                    r.finish(rec, now)
            elif t == "lint":
                lint = rec["lint"]
                if lint not in triage.LINTS:
                    return REJECTED
                if lint == BATCH_LR_LINT and "gbatch" in rec:
                    active = self._batch_lr_changed(rec["job"], rec["gbatch"], rec["lrate"], now)
                else:
                    active = rec["active"]
                if active:
                    r.lints.add(lint)
                else:
                    r.lints.discard(lint)
            elif t == "stack":
                r.set_stack(rec, now)
            elif t == "hello":
                r.dirs = {k: os.path.normpath(v) for k, v in rec["dirs"].items() if v and os.path.isabs(v)}
                r.pstart = rec.get("pstart", 0.0)
                r.gpu_uuid = normalize_uuid(rec.get("gpu", ""))
                r.gpu_every = rec.get("gpu_every", 0)
                r.versions = versions(rec["info"])
                r.parallel = parallel(rec["info"])
            goodput.after(self.ranks.values(), r, rec, now)
        return OK

    def _batch_lr_changed(self, job: str, gbatch: int, lrate: float, now: float) -> bool:
        """True when the job ran before with another global batch but the same base LR."""
        prev = self.job_batch.pop(job, None)
        while len(self.job_batch) >= self.s.max_jobs:
            self.job_batch.pop(min(self.job_batch, key=lambda j: self.job_batch[j][2]))
        self.job_batch[job] = (gbatch, lrate, now)
        if prev is None or prev[0] == gbatch:
            return False
        same_lr = abs(prev[1] - lrate) <= 1e-9 * max(abs(prev[1]), abs(lrate), 1e-30)
        if same_lr:
            log.warning("job %s: global batch changed %d -> %d but the LR stayed %g", job, prev[0], gbatch, lrate)
        return same_lr

    def _remove(self, key: Tuple[str, int]) -> None:
        r = self.ranks.pop(key, None)
        if r is not None:
            left = self.jobs[r.job] - 1
            if left:
                self.jobs[r.job] = left
            else:
                del self.jobs[r.job]

    def check(self, now: float) -> None:
        """Heartbeat misses, rank_up, stalls and the TTL; called a few times per heartbeat interval."""
        ttl = self.s.rank_ttl_seconds
        linger = self.s.rank_linger_seconds
        with self.lock:
            expired = [k for k, r in self.ranks.items() if now - r.last_seen > ttl]
            for k in expired:
                log.info("job %s rank %d silent for %.0f s: forgotten", k[0], k[1], ttl)
                self._remove(k)
            done = [k for k, r in self.ranks.items() if r.finished is not None and now - r.finished > linger]
            for k in done:
                self._remove(k)
            for r in self.ranks.values():
                r.check(now, self.s)
                goodput.check(r, now)

    def describe(self, now: float) -> List[Dict[str, object]]:
        """Every tracked rank (job, rank order) with its last stack: the agent's /api/v1/ranks."""
        with self.lock:
            return [self.ranks[k].describe(now) for k in sorted(self.ranks)]

    def min_interval(self) -> float:
        with self.lock:
            return min((r.every for r in self.ranks.values() if r.last_hb is not None), default=1.0)

    def __len__(self) -> int:
        return len(self.ranks)

    def watched_dirs(self) -> Set[str]:
        """Absolute tmp/log/checkpoint dirs the ranks reported in their hello (capped)."""
        out: Set[str] = set()
        with self.lock:
            for r in self.ranks.values():
                out.update(r.dirs.values())
                if len(out) >= MAX_WATCHED_DIRS:
                    break
        return set(sorted(out)[:MAX_WATCHED_DIRS])


def normalize_uuid(u: str) -> str:
    """A GPU UUID as NVML prints it ("GPU-xxxxxxxx-..."), lower-case; "" when unknown."""
    u = (u or "").strip().lower()
    if not u:
        return ""
    return u if u.startswith("gpu-") or u.startswith("mig-") else "gpu-" + u


LCK_SAME = 1e-6  # seconds: a totals' last-checkpoint time within this of the known one is the same checkpoint
