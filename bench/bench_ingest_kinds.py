#!/usr/bin/env python3
"""CPU per datagram of the agent's ingest path, by the kind of datagram the agent benchmark sends.

``bench/bench_exporter.py`` finds the highest rate the agent ingests without a drop with version 1
"step" records (one step each, no totals), and loads it past that in its overload phase with the
hooks' own "steps" records, one step each with the session totals, from 16 ranks, most of them
dropped by the kernel. The overload phase's ingested rate is lower than the no-drop rate. This
benchmark hands each kind to a real ``Ingest`` (the agent's decode and rank table) in-process and
times the ingest thread's CPU (``time.thread_time_ns``) around ``handle``:

- ``v1-step``: the burst phase's records (bench/exporter_load.py ``_records``);
- ``steps-1``: the overload phase's records, every one delivered;
- ``steps-1-gaps``: the same records with ``--keep`` of them delivered (seeded, in order per rank), so
  the agent sees the sequence gaps a full socket leaves (the totals carry the lost steps);
- ``steps-full``: the hooks' steady load, a tick's steps per record (as full as a datagram holds).

Rounds of the kinds are interleaved, each on a fresh agent state. Prints the median microseconds
per record, the spread over rounds, the ratio to ``v1-step`` and the records a second that one core
ingests at that cost (1e6 / us): if the overload kind costs about twice the burst kind per record, a
rate half the no-drop rate is that cost, not a livelock (an ingest rate that falls as the offered
rate rises).

    python3 bench/bench_ingest_kinds.py [--rounds 7] [--records 20000] [--keep 0.3] [--json]
"""
from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RANKS = 16  # the overload phase's ranks


def kinds(n: int, keep: float, seed: int = 0) -> Dict[str, List[bytes]]:
    import exporter_load as L

    v1 = L._records(8, n)
    players = {r: L.Player(dict(job=L.OVERLOAD_JOB, rank=r, lr=r % 8, ws=RANKS, node=socket.gethostname(), pid=4242,
                                sess=1)) for r in range(RANKS)}
    ts = time.time()
    one = [players[i % RANKS].steps([0.01], ts + i * 1e-5) for i in range(n)]
    rng = random.Random(seed)
    gaps = [d for d in one if rng.random() < keep]
    full_players = {r: L.Player(dict(job="bench-full", rank=r, lr=r, ws=8, node=socket.gethostname(), pid=4343,
                                     sess=1)) for r in range(8)}
    full = []
    for i in range(max(1, n // 8)):
        p = full_players[i % 8]
        full.append(p.steps([0.01] * 25, ts + i * 0.25))
    return {"v1-step": v1, "steps-1": one, "steps-1-gaps": gaps, "steps-full": full}


def cost(records: List[bytes]) -> float:
    """Mean ingest-thread CPU microseconds per record, on a fresh agent state."""
    from ranksight.exporter.ingest import Ingest
    from ranksight.exporter.ranks import RankSettings, RankTable

    ing = Ingest(RankTable(RankSettings()))
    now = time.monotonic()
    warm = min(200, len(records) // 10)
    for d in records[:warm]:  # the ranks known
        ing.handle(d, now)
    tt = 0
    for d in records[warm:]:
        t0 = time.thread_time_ns()
        ing.handle(d, time.monotonic())
        tt += time.thread_time_ns() - t0
    bad = {k: v for k, v in ing.counts.items() if k != "ok" and v}
    if bad:
        raise SystemExit(f"bench_ingest_kinds: records were not accepted: {bad}")
    return tt / (len(records) - warm) / 1e3


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--records", type=int, default=20000, help="records of each kind a round (default 20000)")
    ap.add_argument("--keep", type=float, default=0.3, help="share of steps-1 delivered in steps-1-gaps (default 0.3)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.records < 100 or not 0 < a.keep <= 1:
        ap.error("--rounds >= 1, --records >= 100 and 0 < --keep <= 1")
    data = kinds(a.records, a.keep)
    names = list(data)
    per: Dict[str, List[float]] = {k: [] for k in names}
    for rnd in range(a.rounds):
        for k in (names if rnd % 2 == 0 else names[::-1]):
            per[k].append(cost(data[k]))
    base = statistics.median(per["v1-step"])
    res = {"rounds": a.rounds, "records": {k: len(v) for k, v in data.items()},
           "bytes_per_record": {k: sum(map(len, v)) // len(v) for k, v in data.items()},
           "us_per_record": {k: {"median": statistics.median(v), "min": min(v), "max": max(v),
                                 "ratio": statistics.median(v) / base,
                                 "records_per_core_s": 1e6 / statistics.median(v)} for k, v in per.items()}}
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    print(f"{a.rounds} interleaved rounds; ingest-thread CPU per record (median, min..max over rounds)")
    for k, v in res["us_per_record"].items():
        print(f"  {k:<13} {res['bytes_per_record'][k]:>5} B  {v['median']:7.1f} us ({v['min']:.1f}..{v['max']:.1f})  "
              f"x{v['ratio']:.2f} of v1-step  ~{v['records_per_core_s'] / 1e3:.1f}k records/s a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
