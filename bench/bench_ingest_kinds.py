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

With ``--live RATES`` it also loads a real agent (``ranksight exporter``, ranks collector only) with
the overload kind at each offered rate (datagrams/s, from a sender child that builds its records
before the clock starts and then only sends them), in interleaved rounds. For each rate: what the
agent ingested while the load lasted (its ok count at the end of the send, over the send's
seconds) and in all (after it drained its socket), and what the kernel dropped. Receive livelock
shows as an ingest rate that falls as the offered rate rises past what the agent keeps up with; a
rate that levels off is the agent's cost per record.

    python3 bench/bench_ingest_kinds.py [--rounds 7] [--records 20000] [--keep 0.3] [--json]
    python3 bench/bench_ingest_kinds.py --live 2000,4000,8000,16000,32000 [--live-rounds 2] [--seconds 3]
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


def send_child(argv: List[str]) -> int:
    """The live sender: build ``n`` overload-kind records of 16 ranks of job ``job``, then send them
    to ``port`` at ``rate`` a second; prints JSON {sent, seconds}."""
    import exporter_load as L

    port, rate, seconds, job = int(argv[0]), float(argv[1]), float(argv[2]), argv[3]
    n = int(rate * seconds)
    players = {r: L.Player(dict(job=job, rank=r, lr=r % 8, ws=RANKS, node=socket.gethostname(), pid=4242, sess=1))
               for r in range(RANKS)}
    ts = time.time()
    recs = [players[i % RANKS].steps([0.01], ts + i * 1e-5) for i in range(n)]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    s.setblocking(False)
    dest = ("127.0.0.1", port)
    it = iter(recs)

    def one() -> bool:
        d = next(it, None)
        if d is None:
            return False
        try:
            s.sendto(d, dest)
        except BlockingIOError:
            pass  # a full send buffer: lost, as the kernel's drop at the agent's side
        return True

    sent, secs = L._paced(rate, seconds, one, 0.002, 5000)
    print(json.dumps({"sent": sent, "seconds": secs}))
    return 0


def _ok(url: str) -> int:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from ranksight import catalog as C

    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return int(sum(s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                   if s.name == C.INGEST_DATAGRAMS.name and s.labels.get("result") == "ok"))


def live(rates: List[float], rounds: int, seconds: float) -> Dict[str, Dict[str, float]]:
    """Each offered rate against one real agent, ``rounds`` interleaved rounds (a new job each)."""
    import subprocess

    from ranksight.common.plumbing import free_port, stop_process, wait_http

    port, uport = free_port(), free_port(udp=True)
    agent = subprocess.Popen([sys.executable, "-m", "ranksight", "exporter", "--listen", f"127.0.0.1:{port}",
                              "--ingest", f"udp://127.0.0.1:{uport}", "--collectors", "ranks"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/metrics"
    per: Dict[float, List[Dict[str, float]]] = {r: [] for r in rates}
    try:
        ok, code = wait_http(url, 30, agent)
        if not ok:
            raise SystemExit(f"bench_ingest_kinds: the agent did not serve {url} (exit {code})")
        for rnd in range(rounds):
            for r in (rates if rnd % 2 == 0 else rates[::-1]):
                time.sleep(1.0)
                before = _ok(url)
                child = subprocess.Popen([sys.executable, __file__, "_send", str(uport), str(r), str(seconds),
                                          f"live-{rnd}-{int(r)}"], stdout=subprocess.PIPE, text=True)
                # the child builds its records first; the agent's count is read as the send ends
                line = child.stdout.readline()
                during = _ok(url) - before
                child.wait(timeout=60)
                sent = json.loads(line)
                deadline, last, total = time.monotonic() + 20, -1, 0
                while time.monotonic() < deadline:  # the socket drained: the count stops moving
                    total = _ok(url) - before
                    if total == last:
                        break
                    last = total
                    time.sleep(0.3)
                per[r].append({"offered_per_s": sent["sent"] / sent["seconds"],
                               "ingested_during_per_s": during / sent["seconds"],
                               "ingested_all": total, "dropped": sent["sent"] - total})
    finally:
        stop_process(agent, 10)
    med = statistics.median
    return {f"{r:g}": {k: med([x[k] for x in v]) for k in v[0]} | {"spread_during": [min(x["ingested_during_per_s"] for x in v),
                                                                                     max(x["ingested_during_per_s"] for x in v)]}
            for r, v in per.items()}


def main(argv: List[str] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_send":
        return send_child(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--records", type=int, default=20000, help="records of each kind a round (default 20000)")
    ap.add_argument("--keep", type=float, default=0.3, help="share of steps-1 delivered in steps-1-gaps (default 0.3)")
    ap.add_argument("--live", default="", metavar="RATES", help="offered datagrams/s to load a real agent with, comma-separated")
    ap.add_argument("--live-rounds", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0, help="each live send's length (default 3)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.rounds < 1 or a.records < 100 or not 0 < a.keep <= 1:
        ap.error("--rounds >= 1, --records >= 100 and 0 < --keep <= 1")
    try:
        rates = [float(x) for x in a.live.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--live {a.live!r}: expected datagrams/s separated by commas")
    if rates and (min(rates) <= 0 or a.live_rounds < 1 or a.seconds <= 0):
        ap.error("--live rates, --live-rounds and --seconds must be positive")
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
    if rates:
        res["live"] = live(rates, a.live_rounds, a.seconds)
    if a.json:
        print(json.dumps(res, indent=2))
        return 0
    for r, v in res.get("live", {}).items():
        print(f"live {float(r):>8.0f}/s: offered {v['offered_per_s']:8.0f}/s, ingested while sent {v['ingested_during_per_s']:7.0f}/s "
              f"({v['spread_during'][0]:.0f}..{v['spread_during'][1]:.0f}), in all {v['ingested_all']:.0f}, dropped {v['dropped']:.0f}")
    print(f"{a.rounds} interleaved rounds; ingest-thread CPU per record (median, min..max over rounds)")
    for k, v in res["us_per_record"].items():
        print(f"  {k:<13} {res['bytes_per_record'][k]:>5} B  {v['median']:7.1f} us ({v['min']:.1f}..{v['max']:.1f})  "
              f"x{v['ratio']:.2f} of v1-step  ~{v['records_per_core_s'] / 1e3:.1f}k records/s a core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
