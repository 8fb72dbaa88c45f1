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

The senders of the rank load live in bench/exporter_load.py (run as this script's ``_send`` and
``_send_overload`` children).

Run from a checkout: ``ranksight bench exporter [--json]`` or ``python3 bench/bench_exporter.py [--json]``.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ranksight import catalog as C
from ranksight.console import fail
from ranksight.common.plumbing import free_port, stop_process, wait_http

HERE = Path(__file__).resolve()
SUPPORT = HERE.parent.parent / "tests" / "support"  # the NVML stand-in, a test double, lives with the tests

NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
NE_QUERY = "/metrics?collect[]=netstat&collect[]=netdev&collect[]=netclass"
TARGETS = {"cpu_percent": 1.0, "rss_mb": 60.0, "ingest_per_s": 50_000}
AGENT_PATH_ENV = "RANKSIGHT_BENCH_AGENT_PYTHONPATH"  # PYTHONPATH of the agent process alone


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


def _load():
    """bench/exporter_load.py: the senders of the rank load (this script's children run them)."""
    if str(HERE.parent) not in sys.path:
        sys.path.insert(0, str(HERE.parent))
    import exporter_load

    return exporter_load


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
        got = _job_steps(scraper, _load().OVERLOAD_JOB)
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
        fail(f"no NVML trace at {DEFAULT_TRACE}; pass --nvml-trace FILE", 1)
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
        return _load().send(argv[1:])
    if argv and argv[0] == "_send_overload":
        return _load().send_overload(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
