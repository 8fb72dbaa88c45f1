"""NCCL's (and the generic) Flight Recorder, read from the background thread: in-flight
collectives for the heartbeat, where a blocked rank waits, and NCCL collective durations when
``TORCH_NCCL_ENABLE_TIMING=1`` (see ``comm.py`` for how they are used)."""
from __future__ import annotations

import logging
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple

log = logging.getLogger("ranksight.hooks")

CONFIRM_EVERY = 1.0  # seconds between full dumps that re-confirm a collective still open


class FlightRecorder:
    """The c10d Flight Recorder (NCCL, and gloo in newer torch), read off the step path.

    ``inflight_age()`` (every heartbeat): seconds since a collective that is enqueued but not
    completed was first seen, or -1. This is what shows a rank blocked in a collective that the
    Python wrappers cannot see (DDP's C++ gloo all-reduce, NCCL kernels still running). The
    cheap status-only dump (about 6 us) names the candidates: per group, the collective after the
    last completed one, while the group has enqueued more. gloo writes that completed count from
    its worker threads, each with the sequence number it finished, so a late write can leave the
    count one behind for good (until the next collective): 3 in 100 idle moments on this CPU read
    a finished barrier as open. A candidate is therefore reported only once the full dump's entry
    confirms it (not retired, not completed). That dump costs milliseconds, so it is read only for
    a candidate still open at the next heartbeat, once per candidate found finished and at most
    every ``CONFIRM_EVERY`` seconds while one stays open; its age counts from when it was first seen.
    ``poll()``: from the full dump, (durations in seconds of collectives completed since the last
    poll, seconds since the oldest still-running collective was created or -1); used for NCCL
    collective time when ``TORCH_NCCL_ENABLE_TIMING=1``. A full dump of a 2000-entry buffer
    took 40 ms on this machine's CPU (holding the GIL), so ``poll_due()`` spaces polls to keep
    that under 1% of wall time (every 1 to 30 s); collectives that fall out of the ring buffer
    between two polls are lost (``wrapped`` counts such polls).
    """

    def __init__(self, backend: str = "") -> None:
        import torch

        c10d = torch._C._distributed_c10d
        # NCCL keeps its own recorder: on torch 2.11 with NCCL, `_dump_fr_trace` (the generic
        # recorder, gloo's) returned no entries while `_dump_nccl_trace` held all 228 (H200 run)
        nccl, generic = getattr(c10d, "_dump_nccl_trace", None), getattr(c10d, "_dump_fr_trace", None)
        self._dump = (nccl or generic) if "nccl" in (backend or "") else (generic or nccl)
        self._seen: set = set()
        self.errors = 0
        self.wrapped = 0
        self._interval = 1.0
        self._next_poll = 0.0
        self._first_seen: Dict[Tuple[str, int], float] = {}
        self._open: Dict[Tuple[str, int], Tuple[bool, float]] = {}  # candidate -> (entries say open, when read)

    @staticmethod
    def wanted(backend: str) -> bool:
        return "nccl" in (backend or "") and os.environ.get("TORCH_NCCL_ENABLE_TIMING", "").lower() in ("1", "true")

    @property
    def available(self) -> bool:
        return self._dump is not None

    def inflight_age(self, now: float) -> float:
        raw = self._dump(includeCollectives=False, includeStackTraces=False, onlyActive=False)
        status = (pickle.loads(raw).get("pg_status") or {}) if raw else {}
        first = self._first_seen
        live = set()
        for pg, st in status.items():
            try:
                enq, done = int(st.get("last_enqueued_collective", -1)), int(st.get("last_completed_collective", -1))
            except (TypeError, ValueError, AttributeError):
                continue
            if enq > done:
                key = (str(pg), done + 1)
                live.add(key)
                first.setdefault(key, now)
        for key in [k for k in first if k not in live]:
            del first[key]
        for key in [k for k in self._open if k not in live]:
            del self._open[key]
        due = [k for k in live if first[k] < now and (k not in self._open or (
            self._open[k][0] and now - self._open[k][1] >= CONFIRM_EVERY))]
        if due:
            self._confirm(due, now)
        return max((now - first[k] for k in live if self._open.get(k, (False, 0.0))[0]), default=-1.0)

    def _confirm(self, keys: List[Tuple[str, int]], now: float) -> None:
        """Read the full dump: is each candidate's entry still open? A group whose entries the
        recorder does not keep (no entry of that group at all) is taken at its status's word."""
        raw = self._dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        entries = (pickle.loads(raw).get("entries") or []) if raw else []
        found: Dict[Tuple[str, int], bool] = {}
        groups = set()
        for e in entries:
            pg = str(e.get("pg_id"))
            groups.add(pg)
            if not e.get("is_p2p"):
                key = (pg, e.get("collective_seq_id"))
                found[key] = found.get(key, False) or _open(e)
        for key in keys:
            self._open[key] = (found.get(key, key[0] not in groups), now)

    def waiting(self, op: str = "") -> Optional[Dict[str, Any]]:
        """The collective this rank waits in, from the full dump: {"op": "all_reduce", "pg":
        "default_pg", "seq": its collective sequence number in that group, "wait": seconds since
        it was created}, or None. Open collectives are those the group's status has enqueued and
        not completed whose own entry is not finished either: gloo's completed count can stay
        behind (see ``inflight_age``), and the entry of a finished collective is retired. ``op``:
        the collective the Python wrappers see the rank blocked in; the newest open one of that op
        is it. Without ``op`` (a collective the wrappers do not see, such as DDP's C++ all-reduce)
        or with no open one of that op: the oldest open one. Read only while the rank makes no
        progress (hooks/stack.py's trigger), never on the step path."""
        raw = self._dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        doc = pickle.loads(raw) if raw else {}
        status = doc.get("pg_status") or {}
        oldest: Optional[Tuple[int, Dict[str, Any]]] = None
        newest_op: Optional[Tuple[int, Dict[str, Any]]] = None
        for e in doc.get("entries", []):
            st = status.get(str(e.get("pg_id"))) or {}
            try:
                done, enq = int(st.get("last_completed_collective", -1)), int(st.get("last_enqueued_collective", -1))
            except (TypeError, ValueError):
                continue
            seq = e.get("collective_seq_id")
            if e.get("is_p2p") or type(seq) is not int or not done < seq <= enq or not _open(e):
                continue
            created = e.get("time_created_ns") or 0
            if oldest is None or created < oldest[0]:
                oldest = (created, e)
            if op and _op_name(e) == op and (newest_op is None or created >= newest_op[0]):
                newest_op = (created, e)
        best = newest_op or oldest
        if best is None:
            return None
        created, e = best
        pg = e.get("process_group")
        name = (pg[1] or pg[0]) if isinstance(pg, (list, tuple)) and len(pg) == 2 else str(pg or e.get("pg_id", ""))
        wait = (time.time_ns() - created) / 1e9 if created else 0.0
        return {"op": _op_name(e), "pg": str(name)[:128],
                "seq": e["collective_seq_id"], "wait": round(min(max(wait, 0.0), 7 * 86400.0), 3)}

    def poll_due(self, now: float) -> bool:
        return now >= self._next_poll

    def poll_timed(self, now: float) -> Tuple[List[float], float]:
        t0 = time.perf_counter()
        out = self.poll()
        cost = time.perf_counter() - t0
        self._interval = min(30.0, max(1.0, 100.0 * cost))
        self._next_poll = now + self._interval
        return out

    def poll(self) -> Tuple[List[float], float]:
        raw = self._dump(includeCollectives=True, includeStackTraces=False, onlyActive=False)
        entries = pickle.loads(raw).get("entries", []) if raw else []
        out: List[float] = []
        seen = set()
        oldest_ns = None
        for e in entries:
            key = (e.get("pg_id"), e.get("record_id"))
            state = e.get("state")
            if state == "completed":
                d = e.get("duration_ms")
                if d is None:
                    # "completed" shows as soon as the end event fires, but duration_ms appears only
                    # when NCCL's watchdog retires the entry (~100 ms later, seen on an H200): count
                    # it from a later dump, or ~70% of the durations are lost.
                    continue
                seen.add(key)
                if key not in self._seen and d >= 0:
                    out.append(d / 1e3)
            elif state in ("started", "scheduled"):
                t = e.get("time_created_ns")
                if t and (oldest_ns is None or t < oldest_ns):
                    oldest_ns = t
        rids = [r for r in (e.get("record_id") for e in entries) if isinstance(r, int)]
        prev_max = getattr(self, "_max_rid", None)
        if rids and prev_max is not None and min(rids) > prev_max + 1:
            self.wrapped += 1  # the ring buffer turned over between two polls: durations were lost
        if rids:
            self._max_rid = max(rids)
        self._seen = seen
        age = -1.0
        if oldest_ns is not None:
            age = (time.time_ns() - oldest_ns) / 1e9
            if not (0 <= age <= 7 * 86400):
                age = -1.0
        return out, age


def _open(e: Dict[str, Any]) -> bool:
    """An entry not finished: NCCL marks "completed" when the end event fires and ``retired`` when
    its watchdog retires it; gloo leaves "scheduled" and sets only ``retired``."""
    return not e.get("retired") and e.get("state") != "completed"


def _op_name(e: Dict[str, Any]) -> str:
    """An entry's collective as the Python API names it: "gloo:all_reduce" -> "all_reduce"."""
    return str(e.get("profiling_name", "")).split(":")[-1][:64]
