"""The triage order in a real Alertmanager: a cause mutes its symptoms on the same job
(or node), and only there.

Debian's prometheus-alertmanager is started on a free loopback port with the generated
config (clustering off, its own storage). Every inhibit rule of the triage table gets a
case: the cause and its symptom are POSTed with the labels Prometheus really gives them
(rank alerts carry the training job; node alerts carry job="ranksight-agent", as the
scrape config's honor_labels leaves them), then GET /api/v2/alerts must report the
symptom inhibitedBy the cause's fingerprint, and a symptom whose job / node / rank
differs must not be. The pairs the issue names are also asserted by name, with
expectations written here, independent of the table.
"""
from __future__ import annotations

import datetime as dt
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

import pytest

from ranksight import config, triage
from ranksight.alerts import generate

Labels = Dict[str, str]

# The pairs the issue lists (cause, symptom, the label they share), written out by hand.
ISSUE_PAIRS: List[Tuple[str, str, str]] = [
    ("RanksightDataloaderBound", "RanksightGpuSawtooth", "node"),
    ("RanksightDataloaderBound", "RanksightCommBound", "job"),  # the other ranks of its job
    ("RanksightStraggler", "RanksightCommBound", "job"),
    *[(down, symptom, "node" if symptom == "RanksightGpuSawtooth" else "job")
      for down in ("RanksightRankDown", "RanksightHeartbeatMissed", "RanksightRankStalled")
      for symptom in ("RanksightCommBound", "RanksightStraggler", "RanksightGpuSawtooth")],
    ("RanksightTcpRetransmits", "RanksightCommBound", "node"),
    ("RanksightNicSpeedLow", "RanksightCommBound", "node"),
    ("RanksightCheckpointSlow", "RanksightRankStalled", "job"),  # the stall during the write
    ("RanksightCheckpointSlow", "RanksightRankBlocked", "job"),
]

# Alerts whose expression aggregates the agent's labels away (max/sum by node, gpu).
_AGGREGATED = {"RanksightGpuThrottling": ("node", "gpu"), "RanksightIngestDropping": ("node",)}
_EXTRA = {"gpu": "0", "device": "eth0", "path": "/ckpt", "collector": "gpu", "xid": "79"}


def alert_labels(e: triage.Entry, job: str, node: str, rank: int) -> Labels:
    """The label set Prometheus sends for this alert (see the module docstring)."""
    if e.rank_level:
        labels = {"job": job, "node": node, "rank": str(rank), "local_rank": str(rank), "instance": f"{node}:9945"}
        if e.alert in ("RanksightRankStalled", "RanksightRankBlocked"):
            labels["reason"] = "no_progress" if e.alert == "RanksightRankStalled" else "waiting_in_collective"
        if e.kind == "lint":
            labels["lint"] = "numa_binding"
    elif e.alert in _AGGREGATED:
        labels = {k: (node if k == "node" else _EXTRA[k]) for k in _AGGREGATED[e.alert]}
    else:
        labels = {"job": triage.SCRAPE_JOB, "instance": f"{node}:9945"}
        labels.update({k: (node if k == "node" else _EXTRA[k]) for k in e.scope if k != "instance"})
    return {"alertname": e.alert, "severity": e.severity, **labels}


@dataclass
class Case:
    name: str
    source: Labels
    muted: List[Labels] = field(default_factory=list)  # must be inhibited by source
    free: List[Labels] = field(default_factory=list)  # must not be inhibited


def build_cases(cfg: config.Config, pairs: List[Tuple[str, str, Tuple[str, ...]]], tag: str) -> List[Case]:
    """One case per pair; each case has its own job and node names so cases cannot touch."""
    by = triage.by_alert(cfg)
    cases = []
    for k, (source, target, equal) in enumerate(pairs):
        job, node = f"{tag}job{k}", f"{tag}n{k}"
        s, t = by[source], by[target]
        case = Case(f"{source} -> {target} on {equal}", alert_labels(s, job, node, 0))
        same_rank = 0 if "rank" in equal else 1  # "the other ranks of its job", unless the rule is per rank
        case.muted.append(alert_labels(t, job, node, same_rank))
        for label in equal:
            if label == "job":
                case.free.append(alert_labels(t, job + "x", node, same_rank))
            elif label == "node":
                case.free.append(alert_labels(t, job, node + "x", same_rank))
            elif label == "rank":
                case.free.append(alert_labels(t, job, node, 5))
            else:
                raise AssertionError(f"no variant for equal label {label}")
        cases.append(case)
    return cases


# ------------------------------------------------------------------ a real Alertmanager

def _free_port() -> int:
    with closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Alertmanager:
    def __init__(self, base: str):
        self.base = base

    def _req(self, method: str, path: str, body: Optional[object] = None) -> object:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            text = r.read().decode()
        return json.loads(text) if text.strip() else None

    def post(self, alerts: List[Labels]) -> None:
        now = dt.datetime.now(dt.timezone.utc)
        fmt = "%Y-%m-%dT%H:%M:%S.000Z"
        self._req("POST", "/api/v2/alerts", [
            {"labels": a, "annotations": {"summary": "test"}, "startsAt": now.strftime(fmt),
             "endsAt": (now + dt.timedelta(hours=1)).strftime(fmt)} for a in alerts])

    def alerts(self) -> List[dict]:
        return self._req("GET", "/api/v2/alerts")  # type: ignore[return-value]


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory) -> Iterator[Alertmanager]:
    binary = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"
    assert Path(binary).exists(), "prometheus-alertmanager not found: install Debian's prometheus-alertmanager"
    tmp = tmp_path_factory.mktemp("am")
    # The webhook points at a port we hold bound but not listening: notifications (if any) are refused
    # here and never reach another test's receiver.
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    cfg = config.load(None, "default", env={
        "RANKSIGHT__alerting__webhook_url": f"http://127.0.0.1:{sink.getsockname()[1]}/alerts"})
    (tmp / "alertmanager.yml").write_text(generate.render(cfg)["alertmanager.yml"])
    proc = None
    log = open(tmp / "alertmanager.log", "w")
    try:
        for _attempt in range(3):  # another process may take the free port between bind and start
            port = _free_port()
            proc = subprocess.Popen(
                [binary, f"--config.file={tmp / 'alertmanager.yml'}", f"--storage.path={tmp / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    time.sleep(0.05)
            if proc.poll() is None:
                break
            proc.wait()
        assert proc is not None and proc.poll() is None, (tmp / "alertmanager.log").read_text()
        yield Alertmanager(f"http://127.0.0.1:{port}")
    finally:
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        sink.close()


def _check(am: Alertmanager, cases: List[Case], timeout: float = 10.0) -> None:
    """POST every case's alerts, then poll until each expectation holds (the inhibitor
    receives alerts asynchronously), failing with the cases that never did. The cause must
    stay active next to its symptom: a symptom never mutes its cause."""
    am.post([a for c in cases for a in [c.source, *c.muted, *c.free]])
    deadline = time.monotonic() + timeout
    while True:
        got = {frozenset(a["labels"].items()): a for a in am.alerts()}
        problems = []
        for c in cases:
            src = got.get(frozenset(c.source.items()))
            if src is None:
                problems.append(f"{c.name}: cause not in Alertmanager")
                continue
            if src["status"]["inhibitedBy"]:
                problems.append(f"{c.name}: the cause itself is inhibited by {src['status']['inhibitedBy']}")
            for t in c.muted:
                a = got.get(frozenset(t.items()))
                if a is None or a["status"]["inhibitedBy"] != [src["fingerprint"]] or a["status"]["state"] != "suppressed":
                    problems.append(f"{c.name}: {t} not inhibited by the cause "
                                    f"({None if a is None else a['status']})")
            for t in c.free:
                a = got.get(frozenset(t.items()))
                if a is None or a["status"]["inhibitedBy"] or a["status"]["state"] != "active":
                    problems.append(f"{c.name}: {t} inhibited though its labels differ "
                                    f"({None if a is None else a['status']})")
        if not problems:
            return
        if time.monotonic() > deadline:
            pytest.fail("\n".join(problems))
        time.sleep(0.2)


def test_every_inhibit_rule_mutes_only_its_own_job_or_node(alertmanager):
    cfg = config.load(None, "default", env={})
    pairs = triage.inhibit_pairs(cfg)
    assert pairs, "the triage table has no inhibitions"
    _check(alertmanager, build_cases(cfg, pairs, "t"))


def test_the_issue_pairs_by_name(alertmanager):
    cfg = config.load(None, "default", env={})
    table_pairs = {(s, t): eq for s, t, eq in triage.inhibit_pairs(cfg)}
    for source, target, label in ISSUE_PAIRS:
        assert (source, target) in table_pairs, f"the table lacks {source} -> {target}"
        assert table_pairs[(source, target)] == (label,), (source, target, table_pairs[(source, target)])
    _check(alertmanager, build_cases(cfg, [(s, t, (lab,)) for s, t, lab in ISSUE_PAIRS], "i"))
