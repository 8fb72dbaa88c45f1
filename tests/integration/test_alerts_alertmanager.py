"""The triage order in a real Alertmanager: a cause mutes its symptoms on the same job
(or node), and only there.

Debian's prometheus-alertmanager is started on a free loopback port with the generated
config (clustering off, its own storage). Every inhibit rule of the triage table gets a
case: the cause and its symptom are POSTed with the labels Prometheus really gives them
(rank alerts carry the training job; node alerts carry job="ranksight-agent", as the
scrape config's honor_labels leaves them), then GET /api/v2/alerts must report the
symptom inhibitedBy the cause's fingerprint, and a symptom whose job / node / rank
differs must not be. The triage order's main pairs are also asserted by name, with
expectations written here, independent of the table.
"""
from __future__ import annotations

import datetime as dt
import socket
import time
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Iterator, List, Tuple

import pytest

from ranksight import config, triage
from ranksight.alerts import generate
from ranksight.common import servers
from ranksight.common.plumbing import AlertmanagerAPI

from conftest import require_binary

Labels = Dict[str, str]

# The triage order's main pairs (cause, symptom, the label they share), written out by hand.
MAIN_PAIRS: List[Tuple[str, str, str]] = [
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


def alert_labels(e: triage.Entry, job: str, node: str, rank: int, gpu: str = _EXTRA["gpu"]) -> Labels:
    """The label set Prometheus sends for this alert (see the module docstring)."""
    if e.rank_level:
        labels = {"job": job, "node": node, "rank": str(rank), "local_rank": str(rank), "instance": f"{node}:9945"}
        if e.alert in ("RanksightRankStalled", "RanksightRankBlocked"):
            labels["reason"] = "no_progress" if e.alert == "RanksightRankStalled" else "waiting_in_collective"
        if e.kind == "lint":
            labels["lint"] = "numa_binding"
        if "gpu" in e.joined:  # the rank's GPU, from ranksight_rank_gpu_info
            labels["gpu"] = gpu
        if "comm" in e.joined:  # the straggler's, and a waiting rank's comm share
            labels["comm"] = "waiting"
    elif e.alert == "RanksightTcpRetransmits":  # aggregated by node, joined with the job of its ranks
        labels = {"node": node, "job": job}
    elif e.alert == "RanksightCollectiveDesync":  # aggregated by the training job and process group
        labels = {"job": job, "pg": "default_pg"}
    elif e.alert in _AGGREGATED:
        labels = {k: (node if k == "node" else gpu if k == "gpu" else _EXTRA[k]) for k in _AGGREGATED[e.alert]}
    else:
        labels = {"job": triage.SCRAPE_JOB, "instance": f"{node}:9945"}
        labels.update({k: (node if k == "node" else gpu if k == "gpu" else _EXTRA[k])
                       for k in e.scope if k != "instance"})
    return {"alertname": e.alert, "severity": e.severity, **labels}


@dataclass
class Case:
    name: str
    source: Labels
    muted: List[Labels] = field(default_factory=list)  # must be inhibited by source
    free: List[Labels] = field(default_factory=list)  # must not be inhibited


def _variant(t: triage.Entry, job: str, node: str, rank: int, differ: FrozenSet[str]) -> Labels:
    labels = alert_labels(t, job + "x" if "job" in differ else job, node + "x" if "node" in differ else node,
                          5 if "rank" in differ else rank, "7" if "gpu" in differ else _EXTRA["gpu"])
    return {**labels, "comm": "own"} if "comm" in differ else labels


def build_cases(cfg: config.Config, tag: str) -> List[Case]:
    """One case per (cause, symptom) of the table, with its own job and node names so cases
    cannot touch. The symptom is posted as it is (same job, node: muted), and once more with
    each label of the rules' `equal` changed alone, and with all of them changed: it must be
    muted exactly when every label of some rule for the pair still matches the cause."""
    by = triage.by_alert(cfg)
    groups: Dict[Tuple[str, str], List[Tuple[str, ...]]] = {}
    for source, target, equal in triage.inhibit_pairs(cfg):
        groups.setdefault((source, target), []).append(equal)
    cases = []
    for k, ((source, target), rules) in enumerate(groups.items()):
        job, node = f"{tag}job{k}", f"{tag}n{k}"
        s, t = by[source], by[target]
        union = sorted({label for eq in rules for label in eq})
        assert set(union) <= {"job", "node", "rank", "gpu", "comm"}, f"no variant for {union}"
        rank = 0 if "rank" in union else 1  # "the other ranks of its job", unless a rule is per rank
        case = Case(f"{source} -> {target} on {rules}", alert_labels(s, job, node, 0))
        for differ in [frozenset()] + [frozenset([label]) for label in union] + [frozenset(union)]:
            muted = any(not (set(eq) & differ) for eq in rules)
            (case.muted if muted else case.free).append(_variant(t, job, node, rank, differ))
        cases.append(case)
    return cases


# ------------------------------------------------------------------ a real Alertmanager
def _post(am: AlertmanagerAPI, alerts: List[Labels]) -> None:
    now = dt.datetime.now(dt.timezone.utc)
    fmt = "%Y-%m-%dT%H:%M:%S.000Z"
    am.post_alerts([{"labels": a, "annotations": {"summary": "test"}, "startsAt": now.strftime(fmt),
                     "endsAt": (now + dt.timedelta(hours=1)).strftime(fmt)} for a in alerts])


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory) -> Iterator[AlertmanagerAPI]:
    binary = require_binary("alertmanager")
    tmp = tmp_path_factory.mktemp("am")
    # The webhook points at a port we hold bound but not listening: notifications (if any) are refused
    # here and never reach another test's receiver.
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    cfg = config.load(None, "default", env={
        "RANKSIGHT__alerting__webhook_url": f"http://127.0.0.1:{sink.getsockname()[1]}/alerts"})
    (tmp / "alertmanager.yml").write_text(generate.render(cfg)["alertmanager.yml"])
    server = None
    try:
        for attempt in range(3):  # another process may take the free port between bind and start
            server = servers.alertmanager(tmp / "alertmanager.yml", tmp / "data", tmp / "alertmanager.log",
                                          binary=binary, flags=["--log.level=warn"])
            try:
                server.launch(15.0)
                break
            except servers.ServerError:
                if attempt == 2:
                    raise
        yield server.api
    finally:
        if server is not None:
            server.stop()
        sink.close()


def _check(am: AlertmanagerAPI, cases: List[Case], timeout: float = 10.0) -> None:
    """POST every case's alerts, then poll until each expectation holds (the inhibitor
    receives alerts asynchronously), failing with the cases that never did. The cause must
    stay active next to its symptom: a symptom never mutes its cause."""
    _post(am, [a for c in cases for a in [c.source, *c.muted, *c.free]])
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
    cases = build_cases(cfg, "t")
    assert cases, "the triage table has no inhibitions"
    _check(alertmanager, cases)


def test_the_main_pairs_by_name(alertmanager):
    """Written by hand: the symptom on the cause's job and node is muted; on another job
    and another node it is not."""
    cfg = config.load(None, "default", env={})
    table = {(s, t) for s, t, _ in triage.inhibit_pairs(cfg)}
    by = triage.by_alert(cfg)
    cases = []
    for k, (source, target, shared) in enumerate(MAIN_PAIRS):
        assert (source, target) in table, f"the table lacks {source} -> {target}"
        job, node = f"ijob{k}", f"in{k}"
        cases.append(Case(f"{source} -> {target} (same {shared})", alert_labels(by[source], job, node, 0),
                          muted=[alert_labels(by[target], job, node, 1)],
                          free=[alert_labels(by[target], job + "x", node + "x", 1)]))
    _check(alertmanager, cases)


def test_a_straggler_mutes_only_the_comm_share_that_waits_for_it(alertmanager):
    """A straggler mutes its job's comm share where the ranks wait for it (comm="waiting"); a job
    communication-bound by itself (comm="own") keeps that page beside the straggler's."""
    by = triage.by_alert(config.load(None, "default", env={}))
    strag, comm = by["RanksightStraggler"], by["RanksightCommBound"]
    own = {**alert_labels(comm, "wide", "hostA", 0), "comm": "own"}
    _check(alertmanager, [Case("straggler on a comm-heavy job", alert_labels(strag, "wide", "hostA", 1),
                               muted=[alert_labels(comm, "wide", "hostA", 0)], free=[own])])


def test_retransmits_on_one_host_mute_comm_share_on_every_host_of_the_job(alertmanager):
    """The e2e packet-loss case: each rank on its own host, loss on host A's link. The collective
    is slow for both ranks; the retransmit alert of host A carries the training job of its ranks,
    so the comm share of the rank on host B is muted too, and another job's is not."""
    by = triage.by_alert(config.load(None, "default", env={}))
    tcp, comm = by["RanksightTcpRetransmits"], by["RanksightCommBound"]
    _check(alertmanager, [Case("retransmits on hostA", alert_labels(tcp, "lossy", "hostA", 0),
                               muted=[alert_labels(comm, "lossy", "hostA", 0), alert_labels(comm, "lossy", "hostB", 1)],
                               free=[alert_labels(comm, "bystander", "hostC", 0)])])
