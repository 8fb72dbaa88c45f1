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
import bisect
import json
import random
import socket
import time
from typing import Callable, Dict, List, Optional, Tuple

from ranksight import catalog as C
from ranksight import protocol as P

BATCH_EVERY = 0.25  # the hooks' background tick (hooks/sender.py TICK_SECONDS)


def _records(ranks: int, n: int) -> List[bytes]:
    out = []
    base = dict(v=1, job="bench", ws=ranks, node=socket.gethostname(), pid=4242, ts=time.time())
    for i in range(n):
        r = i % ranks
        d = 0.01 * (1 + (i % 17) / 100)
        out.append(P.encode(dict(base, t="step", rank=r, lr=r, seq=i // ranks + 1, dur=d, data=d * 0.05, fwd=d * 0.3,
                                 bwd=d * 0.4, opt=d * 0.1, b2o=d * 0.8, comm=d * 0.2, xcomm=d * 0.02, ckpt=0.0, micro=1,
                                 retries=0, ooms=0, mres=1 << 34, malloc=1 << 33, herr=0, hdrop=0, wrss=0, restart=0)))
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


HIST_OF = {"step": C.STEP_DURATION, "data": C.DATALOADER_WAIT_HIST, "b2o": C.BACKWARD_TO_OPTIMIZER}
# each phase of a played step as a share of its duration (the step records' lists and the totals)
PHASE_SHARE = (("dur", 1.0), ("data", 0.05), ("fwd", 0.3), ("bwd", 0.4), ("opt", 0.1), ("b2o", 0.8),
               ("comm", 0.2), ("xcomm", 0.02))


def _hists(counts: Dict[str, List[int]], dur: float, n: int) -> Dict[str, List[int]]:
    """Add ``n`` steps of duration ``dur`` to each histogram's non-cumulative bucket counts (as the
    hooks keep them: one count per bucket of the catalog, the +Inf bucket last); the data wait and
    backward-to-optimizer values are their PHASE_SHARE of the step."""
    share = dict(PHASE_SHARE, step=1.0)
    for key, fam in HIST_OF.items():
        c = counts.setdefault(key, [0] * (len(fam.buckets) + 1))
        c[bisect.bisect_left(fam.buckets, share[key] * dur)] += n
    return counts


def _send_batched(a: argparse.Namespace) -> int:
    """8 ranks' traffic as the hooks send it (hooks/sender.py): each BATCH_EVERY tick every rank
    sends its steps as "steps" records (the totals after their last step) of as many steps as a
    datagram holds; a heartbeat with the totals once a second."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dest = ("127.0.0.1", a.port)
    per = max(1, round(a.rate / a.ranks * BATCH_EVERY))
    # the totals as hooks/totals.py keeps them: every key, checkpoints included, and four histograms
    tot = [dict(steps=0, micro=0, dur=0.0, data=0.0, fwd=0.0, bwd=0.0, opt=0.0, b2o=0.0, comm=0.0, xcomm=0.0, ckpt=0.0,
                ckpt_s=0.0, ckpt_bytes=0, ckpt_n=0, ckpt_fail=0) for _ in range(a.ranks)]
    hist: List[Dict[str, List[int]]] = [{"ckpt": [0] * P.HIST_SIZES["ckpt"]} for _ in range(a.ranks)]
    fill = [P.STEPS_FILL_FIRST] * a.ranks  # steps a datagram holds, measured on each record sent (as the hooks do)
    jitter = random.Random(1)  # measured durations: every value has all its significant digits
    base = dict(v=P.VERSION, job="bench", ws=a.ranks, node=socket.gethostname(), pid=4242, sess=1)
    t0 = time.perf_counter()
    end = t0 + a.seconds
    sent = 0
    tick = 0

    def record(r: int, durs: List[float]) -> bytes:
        t = tot[r]
        seq = t["steps"] + 1
        t["steps"] += len(durs)
        t["micro"] += len(durs)
        for k, f in PHASE_SHARE:
            t[k] += f * sum(durs)
        for dd in durs:
            _hists(hist[r], dd, 1)
        # the hooks' layout: identity, ts, seq, the per-step lists in their column order, micro,
        # the last-step scalars, tot, hist
        cols = ",".join('"%s":[%s]' % (k, ",".join([P.STEP_DIGITS % (f * d) for d in durs]))
                        for k, f in PHASE_SHARE + (("ckpt", 0.0),))
        head = P.encode(dict(base, t="steps", rank=r, lr=r, ts=round(time.time(), 6), seq=seq))[:-1].decode()
        tail = P.encode(dict(micro=[1] * len(durs), retries=0, ooms=0, mres=1 << 34, malloc=1 << 33, herr=0,
                             hdrop=0, wrss=0, restart=0, tot=sent_tot(r), hist=hist[r]))[1:].decode()
        data = ("%s,%s,%s" % (head, cols, tail)).encode()
        fill[r] = P.steps_fill(len(data), len(head) + len(tail), len(durs))
        return data

    def sent_tot(r: int) -> Dict[str, object]:
        return {k: round(x, 9) if type(x) is float else x for k, x in tot[r].items()}

    while True:
        now = time.perf_counter()
        if now >= end:
            break
        hb_due = tick % round(1 / BATCH_EVERY) == 0
        for r in range(a.ranks):
            q = [0.01 * (1 + ((tick * per + i) % 17) / 100) * jitter.uniform(0.999, 1.001) for i in range(per)]
            while q:
                s.sendto(record(r, q[:fill[r]]), dest)
                sent += 1
                q = q[fill[r]:]
            if hb_due:
                s.sendto(P.encode(dict(base, t="hb", rank=r, lr=r, ts=time.time(), seq=tick + 1, every=1.0,
                                       step=tot[r]["steps"], phase="forward", coll=-1.0, probe=0.001,
                                       tot=sent_tot(r), hist=hist[r])), dest)
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
    base = dict(v=P.VERSION, job=OVERLOAD_JOB, ws=a.ws, node=socket.gethostname(), pid=4242, sess=1)
    d = 0.01
    step = {k: [round(f * d, 9)] for k, f in PHASE_SHARE + (("ckpt", 0.0),)}
    n = dict.fromkeys(ranks, 0)

    def totals(r: int) -> Tuple[dict, dict]:
        k = n[r]
        tot = dict(steps=k, micro=k, ckpt_s=0.0, **{key: k * d * f for key, f in PHASE_SHARE})
        return tot, _hists({}, d, k)

    turn = [0]

    def one() -> bool:
        r = ranks[turn[0] % len(ranks)]
        turn[0] += 1
        n[r] += 1
        tot, hist = totals(r)
        rec = dict(base, t="steps", rank=r, lr=r % 8, ts=time.time(), seq=n[r], micro=[1], retries=0, ooms=0,
                   mres=1 << 34, malloc=1 << 33, herr=0, hdrop=0, wrss=0, restart=0, tot=tot, hist=hist, **step)
        try:
            s.sendto(P.encode(rec), dest)
        except BlockingIOError:
            pass  # a full send buffer is a lost datagram too: the totals must survive it
        return True

    sent, seconds = _paced(a.rate, a.seconds, one, 0.005, 5000)
    for _ in range(3):
        time.sleep(0.5)
        for r in ranks:
            tot, hist = totals(r)
            s.sendto(P.encode(dict(base, t="hb", rank=r, lr=r % 8, ts=time.time(), seq=n[r] + 1, every=1.0, step=n[r],
                                   phase="forward", coll=-1.0, probe=0.001, tot=tot, hist=hist)), dest)
    print(json.dumps({"sent": sent, "seconds": seconds, "steps": {str(r): n[r] for r in ranks}}))
    return 0
