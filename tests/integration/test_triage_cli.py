"""`ranksight triage` against a real Prometheus (test-profile rules, 1 s intervals) fed by
a real node agent, which receives real protocol-v1 datagrams from a small sender
playing the ranks of several jobs at once (one per scenario).

Scenarios (per-step durations in seconds; the agent sums them into the counters
the recording rules divide):

  tri-data       rank 1 waits 50% of its step on data; rank 0 waits for it in the all-reduce
  tri-straggler  rank 1 computes 1.5x longer; rank 0 shows the difference as collective wait; its
                 ranks' hello names a DeepSpeed ZeRO-3 model
  tri-hang       rank 1 stops making progress outside a collective; rank 0 blocks in one
  tri-ok         both ranks compute-bound, small data wait and comm share
  tri-gated      communication-bound; rank 1's busy time is 1.13x rank 0's, but only 4% of the step:
                 the straggler ratio is past its threshold while the alert's condition does not hold
  tri-ended      dataloader-bound, then both ranks say goodbye: triaged as of its last data
"""
from __future__ import annotations

import http.server
import json
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Dict, Iterator, Optional

import pytest

from e2e_harness import host_agent, start_stack, triage_cli  # noqa: E402
from ranksight.common.plumbing import free_port, wait_for  # noqa: E402
from e2e_harness import cfg_test_profile  # noqa: E402

from ranksight import catalog as C, protocol  # noqa: E402
from ranksight.triage.names import stepped_a_window  # noqa: E402

PERIOD = 0.05  # seconds between simulated steps


@dataclass
class RankPlay:
    """What one simulated rank reports per step (seconds) and in its heartbeats."""

    dur: float = 0.1
    data: float = 0.005
    comm: float = 0.02
    xcomm: float = 0.01
    stepping: bool = True  # False: no more steps (hung or blocked)
    coll: float = -1.0  # heartbeat: seconds in the in-flight collective (-1: none)
    hang_since: Optional[float] = None  # heartbeat probe grows from here (main thread stuck)
    gone: bool = False  # sent "bye"


class Sender(threading.Thread):
    """Plays ranks of several jobs: a step datagram every PERIOD, a heartbeat every second."""

    def __init__(self, addr: str, node: str) -> None:
        super().__init__(daemon=True)
        host, port = addr.rsplit("//", 1)[1].rsplit(":", 1)
        self.dst = (host, int(port))
        self.node = node
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.plays: Dict[tuple, RankPlay] = {}
        self.seq: Dict[tuple, int] = {}
        self.lock = threading.Lock()
        self.halt = threading.Event()

    def set(self, job: str, rank: int, play: RankPlay) -> None:
        with self.lock:
            self.plays[(job, rank)] = play

    def hello(self, job: str, rank: int, info: dict) -> None:
        with self.lock:
            self._send(job, rank, {"t": "hello", "info": info, "dirs": {}})

    def bye(self, job: str) -> None:
        with self.lock:
            for (j, r), p in self.plays.items():
                if j == job:
                    p.gone = True
                    self._send(j, r, {"t": "bye"})

    def _send(self, job: str, rank: int, rec: dict) -> None:
        # version 1: per-step deltas and a "bye" that ends the rank's series at once (the ended-job case)
        base = {"v": 1, "job": job, "rank": rank, "lr": rank, "ws": 2, "node": self.node,
                "pid": 40000 + rank + 10 * (hash(job) % 1000), "ts": time.time()}
        base.update(rec)
        data = protocol.encode(base)
        protocol.decode(data)  # the sender only sends what the agent must accept
        self.sock.sendto(data, self.dst)

    def run(self) -> None:
        last_hb = 0.0
        hb_seq = 0
        while not self.halt.is_set():
            now = time.time()
            with self.lock:
                for (job, rank), p in self.plays.items():
                    if p.gone or not p.stepping:
                        continue
                    n = self.seq[(job, rank)] = self.seq.get((job, rank), 0) + 1
                    self._send(job, rank, {"t": "step", "seq": n, "dur": p.dur, "data": p.data, "comm": p.comm,
                                           "xcomm": p.xcomm, "fwd": p.dur / 4, "bwd": p.dur / 2, "opt": 0.001,
                                           "b2o": p.dur / 2})
                if now - last_hb >= 1.0:
                    hb_seq += 1
                    last_hb = now
                    for (job, rank), p in self.plays.items():
                        if p.gone:
                            continue
                        probe = now - p.hang_since if p.hang_since is not None else 0.01
                        self._send(job, rank, {"t": "hb", "seq": hb_seq, "every": 1.0,
                                               "step": self.seq.get((job, rank), 0),
                                               "phase": "forward" if p.stepping or p.coll < 0 else "backward",
                                               "coll": p.coll, "probe": probe})
            self.halt.wait(PERIOD)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.sock.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[dict]:
    """Stack + agent + sender; every scenario runs at once (distinct job names), then the tests read it."""
    d = tmp_path_factory.mktemp("triage")
    stack = start_stack(d / "stack", cfg_test_profile())
    agent = sender = None
    try:
        agent = host_agent(d, "tri", env={"RANKSIGHT__agent__stall_min_seconds": "3"})
        stack.set_targets([agent.target])
        sender = Sender(agent.ingest, node="tri-node")
        t0 = time.time()
        sender.set("tri-data", 0, RankPlay(dur=0.1, data=0.005, comm=0.055, xcomm=0.05))
        sender.set("tri-data", 1, RankPlay(dur=0.1, data=0.05, comm=0.006, xcomm=0.002))
        sender.set("tri-straggler", 0, RankPlay(dur=0.1, data=0.002, comm=0.045, xcomm=0.04))
        sender.set("tri-straggler", 1, RankPlay(dur=0.1, data=0.002, comm=0.006, xcomm=0.001))
        for r in (0, 1):  # its ranks' hello: a DeepSpeed ZeRO-3 model (ranksight_rank_parallel_info)
            sender.hello("tri-straggler", r, {"torch": "2.13.0", "strategy": "deepspeed", "zero_stage": "3"})
        sender.set("tri-ok", 0, RankPlay())
        sender.set("tri-ok", 1, RankPlay())
        sender.set("tri-hang", 0, RankPlay())
        sender.set("tri-hang", 1, RankPlay())
        sender.set("tri-gated", 0, RankPlay(dur=0.1, data=0.002, comm=0.07, xcomm=0.068))
        sender.set("tri-gated", 1, RankPlay(dur=0.1, data=0.002, comm=0.066, xcomm=0.064))
        sender.set("tri-ended", 0, RankPlay(dur=0.1, data=0.004, comm=0.055, xcomm=0.05))
        sender.set("tri-ended", 1, RankPlay(dur=0.1, data=0.05, comm=0.006, xcomm=0.002))
        sender.start()
        # a few scrapes of steady state, then the hang: rank 1 stuck outside any collective, rank 0 blocked in one
        wait_for(lambda: len(stack.prom.query(
            'count by (job) (rank:ranksight_comm_share:ratio_rate{job=~"tri-.*"})')) == 6, 30, "rates of every job")
        # the verdicts that compare ranks (straggler, a waiting comm share) judge a rank once it has
        # stepped for a whole rate window
        settled = stepped_a_window(f'{C.STEPS}{{job=~"tri-.*"}}', cfg_test_profile()["windows"]["rate"])
        wait_for(lambda: len(stack.prom.query(f"count by (job, rank) ({settled})")) == 12, 60,
                 "a whole rate window of steps on every rank")
        now = time.time()
        sender.set("tri-hang", 1, RankPlay(stepping=False, hang_since=now))
        sender.set("tri-hang", 0, RankPlay(stepping=False, coll=0.0))

        def blocked_clock() -> None:  # rank 0's in-flight collective ages with wall time
            while not sender.halt.is_set():
                sender.plays[("tri-hang", 0)].coll = time.time() - now
                time.sleep(0.2)
        threading.Thread(target=blocked_clock, daemon=True).start()
        wait_for(lambda: stack.prom.query(
            'ranksight_rank_stalled{job="tri-hang",reason="no_progress"} == 1')
            and stack.prom.query('ranksight_rank_stalled{job="tri-hang",reason="waiting_in_collective"} == 1'),
            30, "the hang to show in the agent")
        sender.bye("tri-ended")
        wait_for(lambda: not stack.prom.query('ranksight_rank_up{job="tri-ended"}'), 15, "tri-ended to leave the agent")
        yield {"stack": stack, "agent": agent, "t0": t0}
    finally:
        if sender is not None:
            sender.stop()
        if agent is not None:
            agent.stop()
        stack.stop()


def run_json(world: dict, *args: str) -> tuple:
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--json", *args)
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def check(doc: dict, alert: str) -> dict:
    return next(c for c in doc["checks"] if c["alert"] == alert)


def test_dataloader_bound_rank_is_the_cause_and_explains_its_peer(world):
    rc, doc = run_json(world, "--job", "tri-data")
    assert rc == 1 and not doc["healthy"]
    cause = doc["cause"]
    assert cause["alert"] == "RanksightDataloaderBound"
    assert cause["labels"]["rank"] == "1" and cause["labels"]["job"] == "tri-data"
    assert cause["value"] == pytest.approx(0.5, abs=0.05)
    assert cause["runbook"].endswith("/dataloader-bound.md") and cause["next_check"]
    comm = check(doc, "RanksightCommBound")
    assert comm["verdict"] == "explained"
    assert [f["labels"]["rank"] for f in comm["findings"]] == ["0"]
    assert comm["findings"][0]["explained_by"][0]["alert"] == "RanksightDataloaderBound"
    assert comm["findings"][0]["value"] == pytest.approx(0.55, abs=0.05)
    # the walk order: the six signals first, in order
    orders = [c["order"] for c in doc["checks"] if c["kind"] == "signal"]
    assert orders == sorted(orders) and orders[0] == 1 and orders[-1] == 6
    assert len(doc["causes"]) == 1  # nothing else unexplained


def test_straggler_is_named_not_the_waiting_rank(world):
    rc, doc = run_json(world, "--job", "tri-straggler")
    assert rc == 1
    assert doc["cause"]["alert"] == "RanksightStraggler"
    assert doc["cause"]["labels"]["rank"] == "1"
    # busy per step: rank 1 0.1 - 0.002 - 0.001 = 0.097, rank 0 0.1 - 0.002 - 0.04 = 0.058; the value is the
    # recorded straggler ratio, whatever the job median's definition
    recorded = world["stack"].prom.query('rank:ranksight_straggler:ratio{job="tri-straggler",rank="1"}')
    assert doc["cause"]["value"] == pytest.approx(float(recorded[0]["value"][1]), rel=0.02)
    assert doc["cause"]["value"] > 1.2
    assert doc["parallel"] == [{"job": "tri-straggler", "rank": str(r), "strategy": "deepspeed", "zero_stage": "3"}
                               for r in (0, 1)]
    text = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-straggler").stdout
    assert "cause: RanksightStraggler: Straggler rank on job=tri-straggler node=tri-node rank=1 (deepspeed ZeRO-3): " in text, text
    comm = check(doc, "RanksightCommBound")
    assert comm["verdict"] == "explained"
    assert comm["findings"][0]["labels"]["rank"] == "0"
    assert comm["findings"][0]["explained_by"] == [{"alert": "RanksightStraggler",
                                                    "labels": {"job": "tri-straggler", "node": "tri-node", "rank": "1"}}]


def test_hang_names_the_stalled_rank_and_not_the_blocked_one(world):
    rc, doc = run_json(world, "--job", "tri-hang")
    assert rc == 1
    assert doc["cause"]["alert"] == "RanksightRankStalled"
    assert doc["cause"]["labels"]["rank"] == "1"
    blocked = check(doc, "RanksightRankBlocked")
    assert blocked["verdict"] == "explained"
    assert [f["labels"]["rank"] for f in blocked["findings"]] == ["0"]
    assert blocked["findings"][0]["explained_by"][0]["alert"] == "RanksightRankStalled"
    assert all(c["cause"]["alert"] != "RanksightRankBlocked" for c in [doc] if c["cause"])


def test_healthy_job_exits_0_with_every_check_ok(world):
    rc, doc = run_json(world, "--job", "tri-ok")
    assert rc == 0 and doc["healthy"] and doc["cause"] is None
    verdicts = {c["alert"]: c["verdict"] for c in doc["checks"]}
    assert verdicts["RanksightDataloaderBound"] == "ok"
    assert verdicts["RanksightCommBound"] == "ok"
    assert verdicts["RanksightRankDown"] == "ok"
    assert verdicts["RanksightGpuSawtooth"] == "no data"  # no GPU here
    worst = check(doc, "RanksightCommBound")["worst"]
    assert worst["value"] == pytest.approx(0.2, abs=0.03) and worst["labels"]["job"] == "tri-ok"


def test_text_report_walks_in_order_and_names_cause_runbook_and_next_check(world):
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-data")
    assert r.returncode == 1, r.stderr
    out = r.stdout
    lines = out.splitlines()
    titles = ["Dataloader wait per step", "GPU utilization waveform", "Communication share of step time",
              "Network retransmits", "Checkpoint write duration", "Heartbeat misses"]
    pos = [next(i for i, l in enumerate(lines) if t in l) for t in titles]
    assert pos == sorted(pos), out
    data_line = lines[pos[0]]
    assert "50.0%" in data_line and "rank=1" in data_line and "> 10.0%" in data_line and "ABNORMAL" in data_line
    comm_line = lines[pos[2]]
    assert "explained by RanksightDataloaderBound" in comm_line and "rank=0" in comm_line
    assert "cause: RanksightDataloaderBound" in out
    assert "runbook:  https://" in out and "dataloader-bound.md" in out
    assert "next:     GPU utilization waveform" in out
    assert "explains: RanksightCommBound" in out


def test_healthy_text_exit_0(world):
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-ok")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verdict: healthy" in r.stdout and "ABNORMAL" not in r.stdout


def test_warns_when_the_rules_come_from_another_profile(world):
    ok = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-ok")
    assert "pass the --config/--profile" not in ok.stdout
    other = triage_cli(world["stack"].prom_url, "--job", "tri-ok")  # the default profile: 10m `for:`, 5m windows
    assert other.returncode in (0, 1), other.stderr
    note = [l for l in other.stdout.splitlines() if "pass the --config/--profile" in l]
    assert len(note) == 1 and "other `for:` durations or windows" in note[0], other.stdout


def test_all_jobs_lists_every_unexplained_cause(world):
    rc, doc = run_json(world)
    assert rc == 1
    named = {(c["alert"], c["labels"]["job"]) for c in doc["causes"]}
    assert ("RanksightDataloaderBound", "tri-data") in named
    assert ("RanksightStraggler", "tri-straggler") in named
    assert ("RanksightRankStalled", "tri-hang") in named
    assert not any(job == "tri-ok" for _, job in named)
    # in walk order: the dataloader signal (1) before the extra causes
    assert doc["cause"]["alert"] == "RanksightDataloaderBound"


def test_a_job_that_has_ended_is_triaged_as_of_its_last_data(world):
    before = time.time()
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-ended")
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "(as of the job's last data)" in lines[0]
    assert re.fullmatch(r"job tri-ended ended at \S+ \S+Z \(\d+ (s|min) ago\); triaged as of its last minute; "
                        r"pass --since \d+m to judge its worst over its last run", lines[1]), lines[1]
    assert "cause: RanksightDataloaderBound" in r.stdout
    rc, doc = run_json(world, "--job", "tri-ended")
    assert rc == 1 and doc["cause"]["alert"] == "RanksightDataloaderBound" and doc["cause"]["labels"]["rank"] == "1"
    assert world["t0"] < doc["ended_at"] == doc["time"] < before and doc["notes"][0].startswith("job tri-ended ended at")
    # --since still judges the worst over a range that ends now
    rc, doc = run_json(world, "--job", "tri-ended", "--since", "2m")
    assert rc == 1 and doc["since"] == "2m" and doc["ended_at"] is None
    assert doc["cause"]["alert"] == "RanksightDataloaderBound" and doc["cause"]["labels"]["rank"] == "1"


def test_a_since_that_misses_the_ended_job_says_when_it_last_had_data(world):
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-ended", "--since", "1s")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "no ranksight series for job 'tri-ended' in the last 1s: its last data is from " in r.stderr
    assert re.search(r"pass --since \d+m to cover its last run", r.stderr), r.stderr


def test_a_job_never_seen_is_one_line_exit_2(world):
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-never")
    assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1
    assert "no ranksight series for job 'tri-never' in Prometheus in the last 7d" in r.stderr
    assert "tri-ok" in r.stderr and "tri-ended" in r.stderr


def test_a_ratio_past_its_threshold_whose_alert_does_not_hold_reads_watch_not_ok(world):
    rc, doc = run_json(world, "--job", "tri-gated")
    strag = check(doc, "RanksightStraggler")
    assert strag["worst"]["labels"]["rank"] == "1" and strag["worst"]["value"] == pytest.approx(0.034 / 0.03, rel=0.03)
    assert strag["verdict"] == "ok" and not strag["findings"] and strag["threshold_crossed"] is True
    share = cfg_test_profile()["thresholds"]["straggler_min_step_share"]
    assert strag["status"].startswith(f"watch: over, not alerting: also needs the extra busy time over {share:.0%} "
                                      "of the step"), strag["status"]
    assert doc["cause"]["alert"] == "RanksightCommBound"  # the job's own comm: the cause, straggler or not
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-gated")
    line = next(ln for ln in r.stdout.splitlines() if "Straggler rank" in ln)
    assert "1.13x" in line and "> 1.10x" in line and line.rstrip().endswith(strag["status"]), line
    # a young job's goodput is not judged yet: under the floor, "watch", never "ok"
    rc, doc = run_json(world, "--job", "tri-data")
    goodput = check(doc, "RanksightGoodputLow")
    assert goodput["worst"]["value"] < 0.8 and goodput["verdict"] == "ok" and goodput["threshold_crossed"]
    assert goodput["status"].startswith("watch: under, not alerting: judged once the job's goodput has 5m of history")
    ok = check(run_json(world, "--job", "tri-ok")[1], "RanksightDataloaderBound")
    assert ok["status"] == "ok" and ok["threshold_crossed"] is False


class _EmptyMetrics(http.server.BaseHTTPRequestHandler):
    """A scrape target that answers with an empty exposition: up == 1."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):  # quiet
        pass


def blind_spots(world: dict, *args: str) -> list:
    rc, doc = run_json(world, "--job", "tri-ok", *args)
    return [n for n in doc["notes"] if n.startswith("monitoring blind spot: ")]


def test_blind_spot_only_while_an_agent_is_down_now(world):
    """An agent target that is down now is a blind spot. Its up == 0 samples inside --since are not,
    once it answers again (an agent that started after Prometheus) or is gone from the targets."""
    stack, agent = world["stack"], world["agent"]
    port = free_port()
    late = f"127.0.0.1:{port}"
    srv = None
    try:
        stack.set_targets([agent.target, late])
        wait_for(lambda: stack.prom.value(f'up{{instance="{late}"}}') == 0.0, 20, "the target scraped as down")
        wait_for(lambda: any(t["health"] == "down" for t in stack.prom.targets()), 20, "the target listed as down")
        blind = blind_spots(world)
        assert len(blind) == 1 and f"instance={late}" in blind[0], blind
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", port), _EmptyMetrics)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        wait_for(lambda: all(t["health"] == "up" for t in stack.prom.targets()), 20, "the target up again")
        assert blind_spots(world, "--since", "2m") == []
    finally:
        stack.set_targets([agent.target])
        if srv is not None:
            srv.shutdown()
            srv.server_close()
    assert blind_spots(world, "--since", "2m") == []
    r = triage_cli(world["stack"].prom_url, "--profile", "test", "--job", "tri-ok", "--since", "2m")
    assert "blind spot" not in r.stdout and "verdict: healthy" in r.stdout, r.stdout


def test_unreachable_prometheus_is_one_line_exit_2(world):
    port = world["stack"].prometheus_port
    r = triage_cli("http://127.0.0.1:1", "--job", "x")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == ["ranksight: error: cannot reach Prometheus at http://127.0.0.1:1: "
                                             "[Errno 111] Connection refused"]
    # something that is not Prometheus: the agent's own HTTP port
    agent = f"http://{world['agent'].target}"
    r = triage_cli(agent)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == (f"ranksight: error: {agent} answers but is not a Prometheus API: it looks like a "
                                f"ranksight agent (it serves ranksight series on /metrics); point --prometheus at "
                                f"Prometheus (it listens on :9090 by default: http://localhost:9090)"), r.stderr
    assert port


@pytest.mark.parametrize("args, msg", [
    (["--prometheus", "localhost:9090"], "expected an http(s) URL"),
    (["--prometheus", "http://127.0.0.1:9", "--since", "15 minutes"], "--since: expected a Prometheus duration"),
    (["--prometheus", "http://127.0.0.1:9", "--timeout", "0"], "--timeout"),
    (["--prometheus", "http://127.0.0.1:9", "--job", ""], "--job: empty"),
    (["--prometheus", "http://127.0.0.1:9", "--bogus"], "unrecognized arguments"),
    ([], "required: --prometheus"),
])
def test_usage_errors_exit_2_one_line(args, msg):
    import subprocess

    r = subprocess.run([sys.executable, "-m", "ranksight", "triage", *args], capture_output=True, text=True, timeout=30)
    assert r.returncode == 2, r.stdout + r.stderr
    assert msg in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
