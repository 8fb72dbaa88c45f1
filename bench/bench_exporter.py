"""Node agent benchmark: scrape p50/p99 (side by side with Debian's node_exporter network-only
scrape), the agent's CPU % and RSS, and the highest ingest rate with no drops.

Setup: the agent runs as its own process with all collectors on the real /proc and /sys
and 8 stand-in GPUs serving the recorded H200 traces (tests/support/nvml_standin.py);
a sender process plays 8 ranks at 100 steps/s each as the hooks send them: per rank and tick
(0.25 s) its steps in "steps" records of as many as a datagram holds, and one heartbeat a
second, both carrying the totals.

- scrape: interleaved A/B, one agent scrape then one node_exporter scrape
  (``collect[]=netstat&collect[]=netdev&collect[]=netclass``), each on its own keep-alive
  connection with ``Accept-Encoding: gzip`` as Prometheus sends; p50/p99 of each and the
  p50 ratio. Both run under the same machine load.
- CPU and RSS: the agent's process CPU time over a window with Prometheus-like scrapes
  (every ``--scrape-interval`` seconds), as a percentage of one core; RSS at the end.
- ingest: bursts of valid step datagrams (8 ranks) at rising rates for ``--burst-seconds``;
  a rate passes when the agent counted every datagram as ok. The sender paces in 10 ms slices
  and reports the rate it achieved; the kernel's UDP RcvbufErrors corroborates drops.
- overload (counts exact): ``--overload-senders`` processes offer ``--overload-rate`` datagrams/s
  of 16 ranks, one step per "steps" record with the rank's totals on it, then each rank's final
  heartbeat; it passes when every rank's ``ranksight_steps_total`` on the agent equals the steps its
  sender counted, however many datagrams the agent or the kernel dropped on the way.

Run from a checkout: ``ranksight bench exporter [--json]`` or ``python3 bench/bench_exporter.py [--json]``.
"""
from __future__ import annotations

import argparse
import bisect
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.common.plumbing import free_port, stop_process, wait_http

HERE = Path(__file__).resolve()
SUPPORT = HERE.parent.parent / "tests" / "support"  # the NVML stand-in, a test double, lives with the tests

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
NE_QUERY = "/metrics?collect[]=netstat&collect[]=netdev&collect[]=netclass"
TARGETS = {"cpu_percent": 1.0, "rss_mb": 60.0, "ingest_per_s": 50_000}
AGENT_PATH_ENV = "RANKSIGHT_BENCH_AGENT_PYTHONPATH"  # PYTHONPATH of the agent process alone
BATCH_EVERY = 0.25  # the hooks' background tick (hooks/sender.py TICK_SECONDS)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--scrapes", type=int, default=200, help="scrapes of each exporter, interleaved (default 200)")
    p.add_argument("--cpu-seconds", type=float, default=30.0, help="CPU/RSS measurement window (default 30)")
    p.add_argument("--scrape-interval", type=float, default=15.0,
                   help="scrape period during the CPU window, as Prometheus would (default 15)")
    p.add_argument("--burst-seconds", type=float, default=3.0, help="length of each ingest burst (default 3)")
    p.add_argument("--rates", default="20000,35000,50000,65000,80000,100000",
                   help="ingest rates to try, datagrams/s, ascending (default 20k..100k)")
    p.add_argument("--overload-rate", type=float, default=60000.0,
                   help="offered datagrams/s of the counts-exact overload phase (default 60k; 0: skip)")
    p.add_argument("--overload-senders", type=int, default=4, help="sender processes of that phase (default 4)")
    p.add_argument("--gpus", type=int, default=8, help="stand-in GPUs (default 8)")
    p.add_argument("--ranks", type=int, default=8, help="simulated ranks (default 8)")
    p.add_argument("--steps-per-second", type=float, default=100.0, help="per rank (default 100)")
    p.add_argument("--node-exporter", default=NODE_EXPORTER, metavar="PATH",
                   help=f"node_exporter binary for the side-by-side scrape (default {NODE_EXPORTER}; skipped if absent)")
    p.add_argument("--nvml-trace", default=None, metavar="FILE",
                   help="NVML trace for the stand-in (default tests/fixtures/nvml/h200_nvml_trace.json)")


# ------------------------------------------------------------------ child processes
def _standin():
    """tests/support/nvml_standin.py of this checkout."""
    if str(SUPPORT) not in sys.path:
        sys.path.insert(0, str(SUPPORT))
    import nvml_standin

    return nvml_standin


def _serve_standin(argv: List[str]) -> int:
    """The agent with stand-in GPUs (a benchmark child; never the default)."""
    import logging

    from ranksight.exporter.agent import AgentSettings
    from ranksight.exporter.main import serve

    NvmlStandin = _standin().NvmlStandin

    p = argparse.ArgumentParser()
    p.add_argument("--listen")
    p.add_argument("--ingest")
    p.add_argument("--gpus", type=int)
    p.add_argument("--trace")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    nv = NvmlStandin(count=a.gpus, path=Path(a.trace) if a.trace else None)
    return serve(AgentSettings(node=socket.gethostname(), listen=a.listen, ingest=a.ingest), nvml=nv)


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


def _send(argv: List[str]) -> int:
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


def _send_overload(argv: List[str]) -> int:
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


def _job_steps(scraper: "Scraper", job: str) -> Dict[str, int]:
    from prometheus_client.parser import text_string_to_metric_families

    out: Dict[str, int] = {}
    for fam in text_string_to_metric_families(scraper.text()):
        for smp in fam.samples:
            if smp.name == C.STEPS.name and smp.labels.get("job") == job:
                out[smp.labels["rank"]] = int(smp.value)
    return out


def _overload(args: argparse.Namespace, py: str, mod: str, uport: int, scraper: "Scraper") -> Dict:
    """Offer ``--overload-rate`` datagrams/s (several senders, 16 ranks) and check the counts: each
    rank's steps_total on the agent equals the steps its sender counted, whatever was dropped."""
    senders, ranks = max(1, args.overload_senders), 16
    per = max(1, ranks // senders)
    ok0 = _ok_count(scraper)
    kern0 = _udp_rcvbuf_errors()
    procs = [subprocess.Popen([py, mod, "_send_overload", "--port", str(uport), "--rate",
                               str(args.overload_rate / senders), "--seconds", str(args.burst_seconds), "--first",
                               str(k * per), "--ranks", str(per), "--ws", str(senders * per)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(senders)]
    outs = []
    for pr in procs:
        o, e = pr.communicate(timeout=args.burst_seconds + 60)
        if pr.returncode:
            raise RuntimeError(f"overload sender failed: {e.strip()[-300:]}")
        outs.append(json.loads(o))
    want = {r: v for o in outs for r, v in o["steps"].items()}
    got: Dict[str, int] = {}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        got = _job_steps(scraper, OVERLOAD_JOB)
        if got == want:
            break
        time.sleep(0.3)
    sent = sum(o["sent"] for o in outs)
    seconds = max(o["seconds"] for o in outs)
    ok = _ok_count(scraper) - ok0 - len(want) * 3  # less the final heartbeats
    kern = _udp_rcvbuf_errors() - kern0 if kern0 >= 0 else None
    return {"offered_per_s": round(sent / seconds), "seconds": round(seconds, 2), "senders": senders, "ranks": len(want),
            "sent": sent, "counted_ok": ok, "dropped": max(0, sent - ok), "ingested_per_s": round(ok / seconds),
            "kernel_rcvbuf_errors": kern, "steps_sent": sum(want.values()), "steps_on_agent": sum(got.values()),
            "counts_exact": got == want}


# ------------------------------------------------------------------ helpers
class Scraper:
    def __init__(self, port: int, path: str):
        self.port, self.path = port, path
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def get(self) -> Tuple[float, bytes]:
        t = time.perf_counter()
        self.conn.request("GET", self.path, headers={"Accept-Encoding": "gzip"})
        r = self.conn.getresponse()
        body = r.read()
        dt = time.perf_counter() - t
        if r.status != 200:
            raise RuntimeError(f"scrape of :{self.port}{self.path} answered {r.status}")
        return dt, body

    def text(self) -> str:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", self.path)
        body = c.getresponse().read()
        c.close()
        return body.decode()


def _wait_http(port: int, path: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    ok, code = wait_http(f"http://127.0.0.1:{port}{path}", timeout, proc)
    if code is not None:
        raise RuntimeError(f"process exited with {code} before serving :{port}")
    if not ok:
        raise RuntimeError(f"nothing served :{port}{path} after {timeout:.0f} s")


def _ingest_counts(scraper: Scraper) -> Dict[str, int]:
    """The agent's ingest datagrams by result."""
    from prometheus_client.parser import text_string_to_metric_families

    return {s.labels["result"]: int(s.value) for fam in text_string_to_metric_families(scraper.text())
            for s in fam.samples if s.name == C.INGEST_DATAGRAMS.name}


def _ok_count(scraper: Scraper) -> int:
    return _ingest_counts(scraper).get("ok", 0)


def _udp_rcvbuf_errors() -> int:
    try:
        lines = Path("/proc/net/snmp").read_text().splitlines()
        names = next(ln for ln in lines if ln.startswith("Udp:")).split()
        vals = [ln for ln in lines if ln.startswith("Udp:")][1].split()
        return int(vals[names.index("RcvbufErrors")])
    except (OSError, StopIteration, ValueError, IndexError):
        return -1


def _cpu_ns(pid: int) -> Optional[int]:
    """The process's CPU time in nanoseconds: the sum of its threads' /proc schedstat run times
    (psutil's times come in clock ticks, 10 ms: 0.05% of a core over a 20 s window). None without
    /proc; the threads must live through the window, as the agent's do."""
    total = 0
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    except OSError:
        return None
    return total


def _pct(xs: List[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


# ------------------------------------------------------------------ the benchmark
def _scrape_times(args: argparse.Namespace, port: int, ne_port: Optional[int], result: Dict,
                  ne: Optional[subprocess.Popen]) -> "Scraper":
    """Scrape latency and size of the agent (and of node_exporter's network collectors when it runs)
    into result["scrape_ms"]; the agent's Scraper, for the phases that follow."""
    import psutil

    a_scr = Scraper(port, "/metrics")
    n_scr = Scraper(ne_port, NE_QUERY) if ne_port is not None else None
    for _ in range(5):
        a_scr.get()
        if n_scr:
            n_scr.get()
    a_t, n_t = [], []
    a_size = n_size = 0
    for _ in range(args.scrapes):
        dt, body = a_scr.get()
        a_t.append(dt * 1e3)
        a_size = len(body)
        if n_scr:
            dt, body = n_scr.get()
            n_t.append(dt * 1e3)
            n_size = len(body)
    text = a_scr.text()
    result["scrape_ms"] = {"agent": {"p50": _pct(a_t, 0.5), "p99": _pct(a_t, 0.99), "gzip_bytes": a_size,
                                     "samples": sum(1 for ln in text.splitlines() if ln and ln[0] != "#")}}
    if n_t:
        result["scrape_ms"]["node_exporter_network"] = {"p50": _pct(n_t, 0.5), "p99": _pct(n_t, 0.99),
                                                        "gzip_bytes": n_size}
        result["scrape_ms"]["ratio_p50"] = result["scrape_ms"]["agent"]["p50"] / result["scrape_ms"]["node_exporter_network"]["p50"]
        result["scrape_ms"]["ratio_p99"] = result["scrape_ms"]["agent"]["p99"] / result["scrape_ms"]["node_exporter_network"]["p99"]
        result["node_exporter_rss_mb"] = psutil.Process(ne.pid).memory_info().rss / 2**20
    else:
        result["scrape_ms"]["node_exporter_network"] = None
    return a_scr


def _cpu_window(args: argparse.Namespace, agent: subprocess.Popen, a_scr: "Scraper", rate: float,
                result: Dict) -> None:
    """The agent's CPU and RSS under the rank load, scraped at a Prometheus-like interval."""
    import psutil

    pa = psutil.Process(agent.pid)
    i0 = _ingest_counts(a_scr)
    c0 = pa.cpu_times()
    n0 = _cpu_ns(agent.pid)
    t0 = time.monotonic()
    next_scrape = t0
    while time.monotonic() - t0 < args.cpu_seconds:
        if time.monotonic() >= next_scrape:
            a_scr.get()
            next_scrape += args.scrape_interval
        time.sleep(0.05)
    c1 = pa.cpu_times()
    n1 = _cpu_ns(agent.pid)
    wall = time.monotonic() - t0
    ticks = 100.0 * ((c1.user - c0.user) + (c1.system - c0.system)) / wall
    result["agent_cpu_percent_ticks"] = ticks
    result["agent_cpu_percent"] = 100.0 * (n1 - n0) / 1e9 / wall if n0 is not None and n1 is not None else ticks
    result["agent_rss_mb"] = pa.memory_info().rss / 2**20
    i1 = _ingest_counts(a_scr)
    got = {k: v - i0.get(k, 0) for k, v in i1.items() if v - i0.get(k, 0)}
    result["cpu_window"] = {"seconds": wall, "scrape_interval_s": args.scrape_interval,
                            "steps_per_s": rate, "datagrams_per_s": sum(got.values()) / wall,
                            # the load must be accepted: a rejected datagram costs the agent less
                            "ingest": got}


def _ingest_bursts(args: argparse.Namespace, py: str, mod: str, uport: int, a_scr: "Scraper") -> Dict:
    """The ingest phase: bursts at rising rates until one is not counted in full."""
    tried = []
    best = 0.0
    for r in [float(x) for x in args.rates.split(",") if x.strip()]:
        time.sleep(0.5)
        before = _ok_count(a_scr)
        kern0 = _udp_rcvbuf_errors()
        out = subprocess.run([py, mod, "_send", "--port", str(uport), "--rate", str(r), "--seconds",
                              str(args.burst_seconds), "--ranks", str(args.ranks)],
                             capture_output=True, text=True, timeout=args.burst_seconds + 60)
        sent = json.loads(out.stdout)
        achieved = sent["sent"] / sent["seconds"]
        deadline = time.monotonic() + 20
        got, last, still = 0, -1, 0
        while time.monotonic() < deadline:  # wait until the agent has drained its socket
            got = _ok_count(a_scr) - before
            if got >= sent["sent"]:
                break
            still = still + 1 if got == last else 0
            if still >= 5:
                break
            last = got
            time.sleep(0.2)
        kern = _udp_rcvbuf_errors() - kern0 if kern0 >= 0 else None
        ok = got == sent["sent"]
        tried.append({"target_per_s": r, "sent_per_s": round(achieved), "sent": sent["sent"], "counted_ok": got,
                      "dropped": sent["sent"] - got, "kernel_rcvbuf_errors": kern, "no_drops": ok})
        if not ok:
            break
        best = max(best, achieved)
    return {"max_rate_no_drops_per_s": round(best), "burst_seconds": args.burst_seconds, "tried": tried}


def _meets(result: Dict) -> Dict:
    """Each target met (True/False), or None where it was not measured."""
    sc = result.get("scrape_ms", {})
    return {
        "scrape_p50_vs_node_exporter": (sc.get("ratio_p50") is not None and sc["ratio_p50"] <= 1.0) if sc.get("node_exporter_network") else None,
        "cpu": (result.get("agent_cpu_percent", 1e9) <= TARGETS["cpu_percent"]
                and set(result.get("cpu_window", {}).get("ingest", {})) == {"ok"}),
        "rss": result.get("agent_rss_mb", 1e9) <= TARGETS["rss_mb"],
        "ingest": result.get("ingest", {}).get("max_rate_no_drops_per_s", 0) >= TARGETS["ingest_per_s"],
        # offered at least the target rate, dropped what it had to, and lost no count
        "overload_counts_exact": (result["overload"]["offered_per_s"] >= TARGETS["ingest_per_s"]
                                  and result["overload"]["counts_exact"]) if "overload" in result else None,
    }


def measure(args: argparse.Namespace) -> Dict:
    trace = args.nvml_trace
    DEFAULT_TRACE = _standin().DEFAULT_TRACE
    if trace is None and not DEFAULT_TRACE.exists():
        raise SystemExit(f"ranksight: error: no NVML trace at {DEFAULT_TRACE}; pass --nvml-trace FILE")
    port, uport = free_port(), free_port(udp=True)
    py = sys.executable
    mod = str(HERE)  # this script runs the agent and the sender as its children
    env = dict(os.environ)
    if os.environ.get(AGENT_PATH_ENV):  # bench/agent_ab.py: another revision's agent, this load
        env["PYTHONPATH"] = os.environ[AGENT_PATH_ENV]
    agent = subprocess.Popen([py, mod, "_serve", "--listen", f"127.0.0.1:{port}", "--ingest",
                              f"udp://127.0.0.1:{uport}", "--gpus", str(args.gpus)] + (["--trace", trace] if trace else []),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    ne: Optional[subprocess.Popen] = None
    ne_port = 0
    load: Optional[subprocess.Popen] = None
    result: Dict = {"setup": {"gpus": args.gpus, "ranks": args.ranks, "steps_per_second_per_rank": args.steps_per_second,
                              "cpus": os.cpu_count(), "python": sys.version.split()[0]}}
    try:
        _wait_http(port, "/metrics", agent)
        if os.path.exists(args.node_exporter):
            ne_port = free_port()
            ne = subprocess.Popen([args.node_exporter, f"--web.listen-address=127.0.0.1:{ne_port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_http(ne_port, NE_QUERY, ne)
        rate = args.ranks * args.steps_per_second
        load_seconds = 3600.0
        load = subprocess.Popen([py, mod, "_send", "--port", str(uport), "--rate", str(rate), "--seconds",
                                 str(load_seconds), "--ranks", str(args.ranks), "--heartbeats", "--batched"],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        time.sleep(3.0)  # warm-up: ranks known, windows filling, GPU sampler running
        a_scr = _scrape_times(args, port, ne_port if ne is not None else None, result, ne)
        _cpu_window(args, agent, a_scr, rate, result)
        if load is not None:
            stop_process(load, 10)
        load = None
        result["ingest"] = _ingest_bursts(args, py, mod, uport, a_scr)
        if args.overload_rate > 0:
            time.sleep(0.5)
            result["overload"] = _overload(args, py, mod, uport, a_scr)
    finally:
        for proc in (load, ne, agent):
            if proc is not None:
                stop_process(proc, 10)
        err = agent.stderr.read().decode(errors="replace") if agent.stderr else ""
        if "Traceback" in err:
            result["agent_stderr_tail"] = err[-2000:]
    result["targets"] = TARGETS
    result["meets"] = _meets(result)
    return result


def run(args: argparse.Namespace) -> int:
    res = measure(args)
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    sc = res["scrape_ms"]
    ne = sc.get("node_exporter_network")
    print(f"scrape agent        p50 {sc['agent']['p50']:7.2f} ms  p99 {sc['agent']['p99']:7.2f} ms  "
          f"({sc['agent']['samples']} samples)")
    if ne:
        print(f"scrape node_exporter p50 {ne['p50']:7.2f} ms  p99 {ne['p99']:7.2f} ms  (netstat, netdev, netclass)")
        print(f"ratio agent/node_exporter p50 {sc['ratio_p50']:.2f}  p99 {sc['ratio_p99']:.2f}")
    print(f"agent CPU {res['agent_cpu_percent']:.2f}% of a core, RSS {res['agent_rss_mb']:.1f} MB "
          f"({res['cpu_window']['datagrams_per_s']:.0f} datagrams/s, scrape every {res['cpu_window']['scrape_interval_s']:g} s; "
          f"ingested: {', '.join(f'{k} {v}' for k, v in sorted(res['cpu_window']['ingest'].items())) or 'none'})")
    print(f"ingest max rate with no drops: {res['ingest']['max_rate_no_drops_per_s']} datagrams/s "
          f"({res['ingest']['burst_seconds']:g} s bursts)")
    for t in res["ingest"]["tried"]:
        print(f"  {t['target_per_s']:>8.0f}/s target, {t['sent_per_s']:>7}/s sent, dropped {t['dropped']}")
    ov = res.get("overload")
    if ov:
        print(f"overload: {ov['offered_per_s']} datagrams/s offered by {ov['senders']} senders ({ov['ranks']} ranks), "
              f"{ov['ingested_per_s']}/s ingested, {ov['dropped']} dropped; steps {ov['steps_on_agent']} on the agent "
              f"of {ov['steps_sent']} sent: counts exact {ov['counts_exact']}")
    print("meets targets: " + ", ".join(f"{k}={v}" for k, v in res["meets"].items()))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_serve":
        return _serve_standin(argv[1:])
    if argv and argv[0] == "_send":
        return _send(argv[1:])
    if argv and argv[0] == "_send_overload":
        return _send_overload(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
