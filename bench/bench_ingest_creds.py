#!/usr/bin/env python3
"""Ingest cost per datagram: UDP, unix socket without credentials, unix socket with SO_PASSCRED.

The agent's own receive code on real sockets, in one process: each round sends a chunk of "steps"
records as the hooks make them (not timed), then times draining and applying them exactly as the receiver loop does
(recv + Ingest.handle, or recvmsg + Ingest.handle with the sender's SCM_CREDENTIALS).
Rounds of the three modes are interleaved; prints the median microseconds per datagram of each
and the ratios to UDP. Usage: bench/bench_ingest_creds.py [--rounds 2000] [--chunk 8] [--json]

``--probe-rate R``: instead, a real ``ranksight exporter --ingest unix://...`` and a non-blocking
sender at R datagrams/s for 3 s; prints what was sent, refused by the kernel (EAGAIN: the socket's
queue, net.unix.max_dgram_qlen, was full) and counted by the agent.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import urllib.request
import time
from typing import Callable, Dict, List

from ranksight import catalog as C
from ranksight import protocol as P

RANKS = 8


def records(n: int) -> List[bytes]:
    """``n`` datagrams of RANKS ranks as the hooks send them, one step per "steps" record with the
    rank's totals (the most datagrams per step), made by the hooks' encoder (exporter_load.Player)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from exporter_load import Player

    players = [Player(dict(job="bench", rank=r, lr=r, ws=RANKS, node=socket.gethostname(), pid=os.getpid(), sess=1))
               for r in range(RANKS)]
    return [players[i % RANKS].steps([0.01 * (1 + (i % 17) / 100)], time.time()) for i in range(n)]


def mode(kind: str, tmp: str) -> Dict[str, Callable]:
    from ranksight.exporter.ingest import CRED_SPACE, Ingest
    from ranksight.exporter.ranks import RankSettings, RankTable

    ingest = Ingest(RankTable(RankSettings()))
    if kind == "udp":
        rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rx.bind(("127.0.0.1", 0))
        dest = rx.getsockname()
        tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    else:
        dest = os.path.join(tmp, f"{kind}.sock")
        rx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if kind == "unix+cred":
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        rx.bind(dest)
        tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    rx.setblocking(False)
    bufsize = P.MAX_DATAGRAM + 1

    def send(recs: List[bytes]) -> None:
        for r in recs:
            tx.sendto(r, dest)

    def drain() -> int:
        n = 0
        now = time.monotonic()
        if kind == "unix+cred":
            recvmsg, handle = rx.recvmsg, ingest.handle
            while True:
                try:
                    data, anc, _, _ = recvmsg(bufsize, CRED_SPACE)
                except BlockingIOError:
                    return n
                handle(data, now, anc)
                n += 1
        recv, handle = rx.recv, ingest.handle
        while True:
            try:
                data = recv(bufsize)
            except BlockingIOError:
                return n
            handle(data, now)
            n += 1

    return {"send": send, "drain": drain, "ingest": ingest}


def probe(rate: float, seconds: float = 3.0) -> Dict:
    from ranksight.common.plumbing import free_port, wait_until

    with tempfile.TemporaryDirectory() as tmp:
        path, port = os.path.join(tmp, "ingest.sock"), free_port()
        agent = subprocess.Popen([sys.executable, "-m", "ranksight", "exporter", "--listen", f"127.0.0.1:{port}",
                                  "--ingest", f"unix://{path}", "--collectors", "ranks"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}/metrics"

            def metrics() -> str:
                try:
                    return urllib.request.urlopen(url, timeout=5).read().decode()
                except OSError:
                    return ""

            wait_until(metrics, 30)
            recs = records(4096)
            tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            tx.setblocking(False)
            sent = refused = 0
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for _ in range(int((time.perf_counter() - t0) * rate) - sent - refused):
                    try:
                        tx.sendto(recs[(sent + refused) % len(recs)], path)
                        sent += 1
                    except BlockingIOError:
                        refused += 1
                time.sleep(0.001)
            time.sleep(0.5)
            ok = [ln for ln in metrics().splitlines() if ln.startswith(str(C.INGEST_DATAGRAMS) + "{")
                  and 'result="ok"' in ln]
            with open("/proc/sys/net/unix/max_dgram_qlen") as f:
                qlen = int(f.read())
            return {"rate": rate, "seconds": seconds, "sent": sent, "refused_eagain": refused,
                    "counted_ok": float(ok[0].split()[-1]) if ok else None, "max_dgram_qlen": qlen}
        finally:
            agent.terminate()
            agent.wait(10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--probe-rate", type=float, default=0.0, help="run the queue probe at this rate instead")
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--chunk", type=int, default=8, help="datagrams per round (at most net.unix.max_dgram_qlen, 10 by default)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.probe_rate:
        print(json.dumps(probe(a.probe_rate)))
        return 0
    recs = records(a.chunk * 8)
    kinds = ("udp", "unix", "unix+cred")
    with tempfile.TemporaryDirectory() as tmp:
        modes = {k: mode(k, tmp) for k in kinds}
        per: Dict[str, List[float]] = {k: [] for k in kinds}
        for i in range(a.rounds):
            chunk = recs[(i % 8) * a.chunk:(i % 8 + 1) * a.chunk]
            for k in (kinds if i % 2 == 0 else kinds[::-1]):
                m = modes[k]
                m["send"](chunk)
                t0 = time.perf_counter()
                n = m["drain"]()
                dt = time.perf_counter() - t0
                if n:
                    per[k].append(dt / n * 1e6)
        counts = {k: modes[k]["ingest"].snapshot() for k in kinds}
    med = {k: statistics.median(v) for k, v in per.items()}
    out = {"us_per_datagram": {k: round(v, 2) for k, v in med.items()},
           "ratio_to_udp": {k: round(med[k] / med["udp"], 3) for k in kinds},
           "datagrams_per_second": {k: round(1e6 / v) for k, v in med.items()},
           "results": counts, "rounds": a.rounds, "chunk": a.chunk}
    if a.json:
        print(json.dumps(out))
    else:
        for k in kinds:
            print(f"{k:<10} {med[k]:7.2f} us/datagram  {1e6 / med[k]:9.0f}/s  x{med[k] / med['udp']:.3f} of udp  "
                  f"{counts[k]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
