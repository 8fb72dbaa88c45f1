"""The words and the layout of `ranksight triage` (ranksight/tools/triage_text.py) on reports built
from the real triage table: a value past its threshold never reads "ok", names wrap or shorten by
rule and are never cut mid-word, one line per cause, the runbook as URL and local file. The walk's
queries run against a real Prometheus in tests/integration/test_triage_cli.py; here Walk.check gets
a stand-in that answers its two queries (the indicator and the condition) by expression."""
from __future__ import annotations

import http.server
import threading
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from ranksight import config, triage
from ranksight.tools import triage_text as T
from ranksight.common.plumbing import ApiError, PrometheusAPI, Sample
from ranksight.tools.triage_cli import Check, Finding, Report, Walk, not_prometheus, render_json, render_text

CFG = config.load(None, "test")
E = {e.alert: e for e in triage.table(CFG)}
LONG = "llama-70b-pretrain-europe-west4-run-0042"


class Answers:
    """samples(expr): ``cond`` rows for the entry's condition, ``ind`` rows for its indicator."""

    def __init__(self, e, ind: List[Sample], cond: List[Sample]):
        self.e, self.ind, self.cond = e, ind, cond

    def samples(self, expr: str, at: Optional[float] = None) -> List[Sample]:
        if self.e.expr in expr:
            return list(self.cond)
        assert self.e.indicator in expr, expr
        return list(self.ind)


def _check(alert: str, value: float, labels: Dict[str, str], abnormal: bool = False) -> Check:
    e = E[alert]
    row = Sample(dict(labels), value)
    return Walk(Answers(e, [row], [row] if abnormal else []), CFG, job=None, since=None).check(e, {})


def _report(checks: List[Check], job: Optional[str] = None) -> Report:
    causes = [f for c in checks for f in c.findings if not f.explained_by]
    return Report("http://prom:9090", job, None, 1.7e9, checks, causes[0] if causes else None, causes, [])


def _ok(alert: str) -> Check:
    return _check(alert, 0.0 if E[alert].op == ">" else 1.0, dict(job="j", node="n", rank="0"))


def _verdict_of(text: str, title: str) -> str:
    line = next(ln for ln in text.splitlines() if ln[4:].startswith(title))
    return line


RANK = dict(job="j", node="n", rank="1")


@pytest.mark.parametrize("alert, value, side", [("RanksightStraggler", 1.23, "over"), ("RanksightGoodputLow", 0.008, "under")])
def test_a_value_past_its_threshold_never_reads_ok(alert, value, side):
    """The alert needs more than its headline threshold (the straggler's extra time as a share of the
    step; goodput once the job is old enough): the check is no finding, yet not "ok"."""
    c = _check(alert, value, RANK if alert != "RanksightGoodputLow" else dict(job="j"))
    assert c.verdict == "ok" and c.crossed and not c.findings
    words = T.status(c)
    assert words.startswith(f"watch: {side}, not alerting: "), words
    r = _report([_ok("RanksightDataloaderBound"), c])
    text = render_text(r)
    row = _verdict_of(text, E[alert].title)
    assert row.rstrip().endswith(words) and not row.rstrip().endswith(" ok"), row
    assert "verdict: healthy: no alert condition holds; 1 check is past the threshold but not alerting" in text
    doc = next(x for x in render_json(r)["checks"] if x["alert"] == alert)
    assert doc["verdict"] == "ok" and doc["threshold_crossed"] is True and doc["status"] == words
    assert doc["not_alerting"] and doc["not_alerting"] in words


def test_the_straggler_gate_names_its_step_share_and_the_goodput_gate_its_wall_time():
    share = CFG["thresholds"]["straggler_min_step_share"]
    assert f"over {share:.0%} of the step" in _check("RanksightStraggler", 1.23, RANK).not_alerting
    assert f"has {CFG['windows']['goodput_min_wall']} of history" in _check("RanksightGoodputLow", 0.1,
                                                                            dict(job="j")).not_alerting


def test_a_value_within_its_threshold_reads_ok():
    c = _check("RanksightStraggler", 1.01, RANK)
    assert c.verdict == "ok" and not c.crossed and c.not_alerting is None and T.status(c) == "ok"
    r = _report([_ok("RanksightDataloaderBound"), c])
    assert "verdict: healthy: every check is within its threshold" in render_text(r)


def test_an_abnormal_check_says_its_alert_is_pending():
    e = E["RanksightCommBound"]
    row = Sample(dict(RANK), 0.45)
    c = Walk(Answers(e, [row], [row]), CFG, job=None, since=None).check(
        e, {}, {e.alert: [dict(alertname=e.alert, alertstate="pending", **RANK)]})
    assert T.status(c) == f"ABNORMAL  [alert pending (for: {e.for_})]"
    assert render_json(_report([c]))["checks"][0]["pending"][0]["alertstate"] == "pending"


def test_long_titles_wrap_at_a_word_boundary_and_are_never_cut():
    checks = [_ok("RanksightDataloaderBound"), _ok("RanksightStepTimeRegression"), _ok("RanksightNicSpeedLow")]
    text = render_text(_report(checks))
    lines = text.splitlines()
    for e in (E["RanksightStepTimeRegression"], E["RanksightNicSpeedLow"]):
        assert len(e.title) > T.TITLE_WIDTH
        i = next(i for i, ln in enumerate(lines) if ln[4:].startswith(e.title.split()[0] + " "))
        first, cont = lines[i][4:4 + T.TITLE_WIDTH].rstrip(), lines[i + 1][4:].strip()
        assert f"{first} {cont}" == e.title, (first, cont)
    assert "job's b\n" not in text and not any(ln.rstrip().endswith("job's b") for ln in lines)


def test_long_job_names_are_shortened_in_the_middle_with_the_full_name_once_in_the_header():
    twin = LONG[:-1] + "3"
    checks = [_check("RanksightDataloaderBound", 0.5, dict(job=LONG, node="n", rank="1"), abnormal=True),
              _check("RanksightCommBound", 0.5, dict(job=twin, node="n", rank="0"), abnormal=True)]
    text = render_text(_report(checks))
    head, body = text.split("\n\n", 1)
    assert LONG not in body and twin not in body, body
    assert text.count(LONG) == 1 and text.count(twin) == 1
    names = T.Names([("job", LONG), ("job", twin)])
    short = {names(v) for v in (LONG, twin)}
    assert len(short) == 2 and all(len(s) <= T.NAME_MAX + 4 and T.ELLIPSIS in s for s in short)
    assert {s[-4:] for s in short} == {"0042", "0043"}  # the distinguishing tail is kept
    legend = head.splitlines()[1:]
    assert legend[0] == "names shortened below:" and sorted(legend[1:]) == sorted(
        f"  {names(v)} = {v}" for v in (LONG, twin)), head
    row = _verdict_of(text, "Dataloader wait per step")
    assert "rank=1" in row and f"job={T.shorten(LONG)}" in row


def test_with_one_job_its_full_name_is_the_header_and_not_repeated_in_a_legend():
    checks = [_check("RanksightDataloaderBound", 0.5, dict(job=LONG, node="n", rank="1"), abnormal=True)]
    text = render_text(_report(checks, job=LONG))
    assert text.splitlines()[0].split()[3] == f"job={LONG}" and text.count(LONG) == 1
    assert "names shortened below" not in text


def test_one_line_per_cause_with_the_other_ranks_and_jobs_summarised():
    e = E["RanksightCommBound"]
    places = [dict(job="a", node="n", rank=str(r)) for r in range(4)] + [dict(job="b", node="m", rank="0")]
    rows = [Sample(p, 0.4 + i / 100) for i, p in enumerate(places)]
    comm = Walk(Answers(e, rows, rows), CFG, job=None, since=None).check(e, {})
    strag = _check("RanksightStraggler", 1.5, dict(job="c", node="n", rank="1"), abnormal=True)
    r = _report([_ok("RanksightDataloaderBound"), comm, strag])
    assert len(r.causes) == 6  # JSON keeps every place
    text = render_text(r)
    cause = next(ln for ln in text.splitlines() if ln.startswith("cause: "))
    assert cause.startswith("cause: RanksightCommBound: ") and "(and 4 more ranks, 1 more job)" in cause, cause
    tail = text[text.index("also abnormal and unexplained:"):].splitlines()
    assert tail[1] == "  RanksightStraggler on job=c node=n rank=1" and not tail[2:], tail
    assert sum("RanksightCommBound" in ln for ln in text.splitlines()) == 1
    assert [c["alert"] for c in render_json(r)["causes"]].count("RanksightCommBound") == 5


def test_the_runbook_is_its_url_and_its_local_file():
    c = _check("RanksightDataloaderBound", 0.5, RANK, abnormal=True)
    r = _report([c])
    e = E["RanksightDataloaderBound"]
    local = T.runbook_path(e)
    assert local is not None and local.is_file() and local.parts[-2:] == ("runbooks", "dataloader-bound.md")
    lines = render_text(r).splitlines()
    i = lines.index(f"  runbook:  {e.runbook}")
    assert e.runbook.startswith("https://") and lines[i + 1].strip() == f"{local} (local copy)"
    cause = render_json(r)["cause"]
    assert cause["runbook"] == e.runbook and cause["runbook_path"] == str(local)


def test_a_missing_runbook_file_prints_the_url_alone():
    e = E["RanksightDataloaderBound"]
    from dataclasses import replace

    assert T.runbook_path(replace(e, id="no-such-runbook")) is None


class _NotPrometheus(http.server.BaseHTTPRequestHandler):
    """A web server that answers every path with 404 (not a Prometheus API, no /metrics)."""

    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_error(404)

    do_POST = do_GET

    def log_message(self, *args):  # quiet
        pass


def test_a_url_that_answers_but_is_not_prometheus_says_so():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotPrometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        prom = PrometheusAPI(f"http://127.0.0.1:{srv.server_port}", 5)
        with pytest.raises(ApiError) as e:
            prom.samples("vector(1)")
        line = not_prometheus(prom, e.value)
        assert line.startswith(f"{prom.url} answers but is not a Prometheus API (")
        assert line.endswith("point --prometheus at Prometheus (it listens on :9090 by default: http://localhost:9090)")
        assert "ranksight agent" not in line and "\n" not in line
    finally:
        srv.shutdown()
        srv.server_close()


def test_an_unreachable_url_keeps_its_one_line():
    prom = PrometheusAPI("http://127.0.0.1:1", 2)
    err = ApiError("cannot reach Prometheus at http://127.0.0.1:1: [Errno 111] Connection refused")
    assert not_prometheus(prom, err) == str(err)


def test_finding_where_and_more_for_node_scoped_causes():
    e = E["RanksightTcpRetransmits"]
    fs = [Finding(e, dict(node="h1", job="a"), 0.05), Finding(e, dict(node="h1", job="b"), 0.05),
          Finding(e, dict(node="h2", job="a"), 0.04)]
    assert T.finding_line(fs[0], fs[1:], show_job=True) == "RanksightTcpRetransmits on node=h1 (and 1 more node, 1 more job)"
    assert Path(T.__file__).name == "triage_text.py"


def test_long_host_names_lose_their_domain_unless_that_makes_two_hosts_one():
    fqdn, other = "gpu-node-017.cluster.example.internal", "gpu-node-018.cluster.example.internal"
    names = T.Names([("node", fqdn), ("node", other), ("instance", f"{fqdn}:9945")])
    assert names(fqdn) == "gpu-node-017" and names(other) == "gpu-node-018"
    assert names(f"{fqdn}:9945") == "gpu-node-017:9945"
    twins = T.Names([("node", "gpu-node-017.cluster-a.example.internal"), ("node", "gpu-node-017.cluster-b.example.internal")])
    a, b = twins("gpu-node-017.cluster-a.example.internal"), twins("gpu-node-017.cluster-b.example.internal")
    assert T.ELLIPSIS in a and a.endswith("-a.example.internal") and b.endswith("-b.example.internal")
    assert T.host_part("10.0.0.7:9945") == "10.0.0.7:9945" and T.host_part("vm") == "vm"
    checks = [_check("RanksightDataloaderBound", 0.5, dict(job=LONG, node=fqdn, rank="1"), abnormal=True)]
    text = render_text(_report(checks))
    row = _verdict_of(text, "Dataloader wait per step")
    assert f"job={T.shorten(LONG)} node=gpu-node-017 rank=1" in row, text  # one line: the rank stays in view
    assert f"  gpu-node-017 = {fqdn}" in text.splitlines()[1:4]


def test_a_named_rank_says_how_its_model_is_parallelized():
    """The hello's strategy and ZeRO stage follow each named rank (text) and are listed (JSON), so a
    slow shard group shows; a rank without them reads as before."""
    strag = _check("RanksightStraggler", 1.5, dict(job="c", node="n", rank="1"), abnormal=True)
    data = _check("RanksightDataloaderBound", 0.5, dict(job="c", node="n", rank="2"), abnormal=True)
    r = _report([strag, data])
    r.parallel = {("c", "1"): ("deepspeed", "3"), ("c", "0"): ("ddp", "")}
    text = render_text(r)
    assert "rank=1 (deepspeed ZeRO-3)" in text and "RanksightDataloaderBound on job=c node=n rank=2" in text, text
    cause = next(ln for ln in text.splitlines() if ln.startswith("cause: "))
    assert cause == "cause: RanksightStraggler: Straggler rank on job=c node=n rank=1 (deepspeed ZeRO-3): 1.50x " \
                    "(threshold > 1.10x)", cause
    assert render_json(r)["parallel"] == [{"job": "c", "rank": "0", "strategy": "ddp", "zero_stage": ""},
                                          {"job": "c", "rank": "1", "strategy": "deepspeed", "zero_stage": "3"}]
