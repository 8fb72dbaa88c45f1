"""The rank load of the agent benchmark (bench/bench_exporter.py runs these as its children:
``bench_exporter.py _send ...`` and ``_send_overload ...``).

- ``send``: steps of ``--ranks`` ranks at ``--rate`` steps/s for ``--seconds``, one step per datagram,
  or (``--batched``) as the hooks send them: per rank and tick (BATCH_EVERY) its steps in "steps"
  records of as many as a datagram holds, with a heartbeat a second, both carrying the totals.
  Prints {"sent": n, "seconds": s}.
- ``send_overload``: one sender of the counts-exact overload phase: one step per "steps" record with
  the rank's totals on it, then each rank's final heartbeat.
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import time
from typing import Callable, Dict, List, Optional, Tuple

from ranksight import protocol as P
from ranksight import record
from ranksight.totals import Totals

BATCH_EVERY = 0.25  # the hooks' background tick (hooks/sender.py TICK_SECONDS)


# each phase of a played step as a share of its duration
PHASE_SHARE = (("dur", 1.0), ("data", 0.05), ("fwd", 0.3), ("bwd", 0.4), ("opt", 0.1), ("b2o", 0.8),
               ("comm", 0.2), ("xcomm", 0.02))
# the values a "steps" record carries once, at its last step (record.py's cumulative and current fields)
LAST = dict(retries=0, ooms=0, mres=1 << 34, malloc=1 << 33, mpeak=3 << 32, mrpeak=1 << 34, herr=0, hdrop=0, wrss=0,
            restart=0, fpt=42_000_000_000, lnan=0, lnanstep=0, pstage=0, pstages=0, pmb=0, resumed=0, rstep=0,
            total=100_000)
# a step's work and loss: 8 samples of 4,096 tokens, one loss reading of about 2
STEP_WORK = dict(micro=1, samples=8, tokens=32768, lossn=1, loss=2.0)
LAYOUT = P.SENDER_LAYOUTS[P.VERSION, False]  # the hooks' "steps" encoder, with their default settings


def _records(ranks: int, n: int) -> List[bytes]:
    """``n`` version 1 "step" records of ``ranks`` ranks (one step a datagram), their fields from
    the declaration (ranksight/record.py)."""
    lay = P.LAYOUTS[1]
    out = []
    base = dict(v=1, job="bench", ws=ranks, node=socket.gethostname(), pid=4242, ts=time.time())
    for i in range(n):
        r = i % ranks
        d = 0.01 * (1 + (i % 17) / 100)
        vals = dict(LAST, **STEP_WORK, **{k: f * d for k, f in PHASE_SHARE})
        out.append(P.encode(dict(base, t="step", rank=r, lr=r, seq=i // ranks + 1,
                                 **{k: vals.get(k, 0.0) for k in lay.seconds + lay.counts + lay.last})))
    return out


def _paced(rate: float, seconds: float, send_one: Callable[[], bool], slice_s: float, cap: int,
           each_slice: Optional[Callable[[float], None]] = None) -> Tuple[int, float]:
    """Call ``send_one`` ``rate`` times a second for ``seconds``, in slices of ``slice_s`` (at most
    ``cap`` calls a slice); ``send_one`` returns False when the socket is full, and the rest of that
    slice waits. ``each_slice(now)`` runs at the start of every slice. Returns (sent, seconds)."""
    t0 = time.perf_counter()
    end = t0 + seconds
    sent = 0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if each_slice is not None:
            each_slice(now)
        for _ in range(min(int((now - t0) * rate) - sent, cap)):
            if not send_one():
                break
            sent += 1
        time.sleep(max(0.0, slice_s - (time.perf_counter() - now)))
    return sent, time.perf_counter() - t0


def send(argv: List[str]) -> int:
    """Sender child: ``--rate R --seconds S`` (paced in 10 ms slices); prints JSON {sent, seconds}."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--seconds", type=float)
    p.add_argument("--ranks", type=int)
    p.add_argument("--heartbeats", action="store_true")
    p.add_argument("--batched", action="store_true",
                   help="as the hooks send: per rank one 'steps' record per tick, totals on it and the heartbeat")
    a = p.parse_args(argv)
    if a.batched:
        return _send_batched(a)
    recs = _records(a.ranks, 4096)
    hbs = [P.encode(dict(v=1, t="hb", job="bench", rank=r, lr=r, ws=a.ranks, node=socket.gethostname(), pid=4242,
                         ts=time.time(), seq=1, every=1.0, step=1, phase="forward", coll=-1.0, probe=0.001))
           for r in range(a.ranks)]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    dest = ("127.0.0.1", a.port)
    sendto = s.sendto
    at = {"i": 0, "hb": 0.0}

    def one() -> bool:
        try:
            sendto(recs[at["i"]], dest)
        except BlockingIOError:
            return False
        at["i"] = (at["i"] + 1) % len(recs)
        return True

    def heartbeats(now: float) -> None:  # once a second, not counted in the rate
        if now >= at["hb"]:
            for h in hbs:
                sendto(h, dest)
            at["hb"] = (at["hb"] or now) + 1.0

    sent, seconds = _paced(a.rate, a.seconds, one, 0.01, 20000, heartbeats if a.heartbeats else None)
    print(json.dumps({"sent": sent, "seconds": seconds}))
    return 0


class Player:
    """One played rank's "steps" records, made as the hooks make them (hooks/sender.py
    ``_send_steps``): the declaration's encoder (ranksight/record.py) and the session totals
    (ranksight/totals.py) after the record's last step."""

    def __init__(self, ident: Dict[str, object], layout: record.Layout = LAYOUT) -> None:
        self.layout = layout
        self.totals = Totals()
        self.seq = 0
        self.prefix = P.encode(dict(ident, v=layout.version, t="steps")).decode()[:-1] + ","
        self.last = [LAST.get(k, 0) for k in layout.last]  # a field added to the record sends 0, as a rank without it does
        self.fill = P.STEPS_FILL_FIRST  # steps a datagram holds, measured on each record sent (as the hooks do)

    def steps(self, durs: List[float], ts: float) -> bytes:
        """The next steps, of these durations, in one record."""
        batch = []
        for d in durs:
            self.seq += 1
            batch.append(record.ALL.step_tuple(self.seq, 0.0, dict({k: f * d for k, f in PHASE_SHARE}, **STEP_WORK)))
        return self.record(batch, ts)

    def record(self, batch: List[tuple], ts: float) -> bytes:
        """A record of queued step tuples, as hooks/sender.py ``_send_steps`` makes it."""
        lay = self.layout
        lists = lay.encode_lists(batch)
        for it in batch:
            self.totals.step(it)
        tail = P.encode(self.totals.fields()).decode()[1:-1]
        data = lay.encode_steps(self.prefix, ts, batch[0][1], lists, self.last, tail).encode()
        self.fill = P.steps_fill(len(data), len(data) - len(lists) + lay.lists_fixed, len(batch))
        return data

    def heartbeat(self, base: Dict[str, object], seq: int) -> bytes:
        return P.encode(dict(base, v=self.layout.version, t="hb", ts=time.time(), seq=seq, every=1.0,
                             step=self.seq, phase="forward", coll=-1.0, probe=0.001, **self.totals.fields()))


def _send_batched(a: argparse.Namespace) -> int:
    """8 ranks' traffic as the hooks send it (hooks/sender.py): each BATCH_EVERY tick every rank
    sends its steps as "steps" records (the totals after their last step) of as many steps as a
    datagram holds; a heartbeat with the totals once a second."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = ("127.0.0.1", a.port)
    per = max(1, round(a.rate / a.ranks * BATCH_EVERY))
    jitter = random.Random(1)  # measured durations: every value has all its significant digits
    base = [dict(job="bench", rank=r, lr=r, ws=a.ranks, node=socket.gethostname(), pid=4242, sess=1)
            for r in range(a.ranks)]
    players = [Player(b) for b in base]
    t0 = time.perf_counter()
    end = t0 + a.seconds
    sent = 0
    tick = 0

    while True:
        now = time.perf_counter()
        if now >= end:
            break
        hb_due = tick % round(1 / BATCH_EVERY) == 0
        for r, pl in enumerate(players):
            q = [0.01 * (1 + ((tick * per + i) % 17) / 100) * jitter.uniform(0.999, 1.001) for i in range(per)]
            while q:
                n = pl.fill
                s.sendto(pl.steps(q[:n], round(time.time(), 6)), dest)
                sent += 1
                q = q[n:]
            if hb_due:
                s.sendto(pl.heartbeat(base[r], tick + 1), dest)
                sent += 1
        tick += 1
        time.sleep(max(0.0, t0 + tick * BATCH_EVERY - time.perf_counter()))
    print(json.dumps({"sent": sent, "seconds": time.perf_counter() - t0}))
    return 0


OVERLOAD_JOB = "bench-overload"


def send_overload(argv: List[str]) -> int:
    """Sender child of the overload phase: ``--ranks`` ranks from ``--first``, one step per "steps"
    record with the rank's totals on it (as the hooks send them, one step a record: the most
    datagrams per step), together ``--rate`` datagrams/s for ``--seconds``; then, after a pause, each
    rank's final heartbeat with its totals, three times (the job's end, which the agent must get).
    Prints JSON {sent, seconds, steps: {rank: total}}."""
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int)
    p.add_argument("--rate", type=float)
    p.add_argument("--seconds", type=float)
    p.add_argument("--first", type=int)
    p.add_argument("--ranks", type=int)
    p.add_argument("--ws", type=int)
    a = p.parse_args(argv)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    dest = ("127.0.0.1", a.port)
    ranks = list(range(a.first, a.first + a.ranks))
    base = {r: dict(job=OVERLOAD_JOB, rank=r, lr=r % 8, ws=a.ws, node=socket.gethostname(), pid=4242, sess=1)
            for r in ranks}
    players = {r: Player(base[r]) for r in ranks}
    turn = [0]

    def one() -> bool:
        r = ranks[turn[0] % len(ranks)]
        turn[0] += 1
        try:
            s.sendto(players[r].steps([0.01], time.time()), dest)
        except BlockingIOError:
            pass  # a full send buffer is a lost datagram too: the totals must survive it
        return True

    sent, seconds = _paced(a.rate, a.seconds, one, 0.005, 5000)
    for _ in range(3):
        time.sleep(0.5)
        for r in ranks:
            s.sendto(players[r].heartbeat(base[r], players[r].seq + 1), dest)
    print(json.dumps({"sent": sent, "seconds": seconds, "steps": {str(r): players[r].seq for r in ranks}}))
    return 0
