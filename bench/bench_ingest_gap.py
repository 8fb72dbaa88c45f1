#!/usr/bin/env python3
"""CPU per datagram of the agent's ingest path, handled back to back or after a pause.

Records the exporter benchmark's steady load (bench/bench_exporter.py: 8 ranks at 100 steps/s as
the hooks send them) from a real sender for 3 s, then hands its "steps" records to a real
``Ingest`` (the agent's decode and rank table) in rounds: with no pause between records, and
with a sleep of each ``--gaps`` value before each one (an agent that wakes for every datagram
sees them so). Each record's cost is the ingest thread's CPU time (``time.thread_time_ns``)
around ``handle``. Rounds of the gaps are interleaved; prints the median of each round's mean
microseconds per record, its spread over rounds, and the ratio to no pause.

    python3 bench/bench_ingest_gap.py [--rounds 5] [--gaps 0,0.001,0.01,0.05] [--json]
"""
from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent


def capture(seconds: float = 3.0) -> List[bytes]:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
    s.bind(("127.0.0.1", 0))
    s.settimeout(1.0)
    p = subprocess.Popen([sys.executable, str(HERE / "bench_exporter.py"), "_send", "--port", str(s.getsockname()[1]),
                          "--rate", "800", "--seconds", str(seconds), "--ranks", "8", "--heartbeats", "--batched"],
                         stdout=subprocess.DEVNULL)
    out: List[bytes] = []
    try:
        while True:
            out.append(s.recv(65536))
    except socket.timeout:
        pass
    p.wait()
    s.close()
    return out


def main(argv: List[str] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gaps", default="0,0.001,0.01,0.05", help="seconds of sleep before each record")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        gaps = [float(g) for g in a.gaps.split(",") if g.strip()]
    except ValueError:
        ap.error(f"--gaps {a.gaps!r}: expected seconds separated by commas")
    if a.rounds < 1 or not gaps or min(gaps) < 0:
        ap.error("--rounds must be >= 1 and --gaps non-negative")
    from ranksight.console import fail
    from ranksight.exporter.ingest import Ingest
    from ranksight.exporter.ranks import RankSettings, RankTable

    data = capture()
    steps = [d for d in data if b'"t":"steps"' in d]
    if not steps:
        fail("bench_ingest_gap: the sender sent no steps records", 1)
    ing = Ingest(RankTable(RankSettings()))
    now = time.monotonic()
    for d in data:  # every rank known, windows filled
        ing.handle(d, now)
    per: Dict[float, List[float]] = {g: [] for g in gaps}
    for rnd in range(a.rounds):
        for g in (gaps if rnd % 2 == 0 else gaps[::-1]):
            tt = 0
            for d in steps:
                if g:
                    time.sleep(g)
                t0 = time.thread_time_ns()
                ing.handle(d, time.monotonic())
                tt += time.thread_time_ns() - t0
            per[g].append(tt / len(steps) / 1e3)
    if set(ing.counts) - {"ok"} and any(v for k, v in ing.counts.items() if k != "ok"):
        fail(f"bench_ingest_gap: records were not accepted: {ing.counts}", 1)
    base = statistics.median(per[gaps[0]])
    res = {"records": len(steps), "bytes_per_record": sum(map(len, steps)) // len(steps), "rounds": a.rounds,
           "us_per_record": {str(g): {"median": statistics.median(v), "min": min(v), "max": max(v),
                                      "ratio": statistics.median(v) / base} for g, v in per.items()}}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"{res['records']} steps records of {res['bytes_per_record']} bytes, {a.rounds} interleaved rounds")
        for g, v in res["us_per_record"].items():
            print(f"  pause {float(g) * 1e3:6.1f} ms before each: {v['median']:7.1f} us per record "
                  f"({v['min']:.1f}..{v['max']:.1f}), x{v['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
