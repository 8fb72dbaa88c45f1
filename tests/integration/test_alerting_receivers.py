"""On-call receivers end to end: real alerts from a real Prometheus reach a real Alertmanager
(Debian 0.25) whose config `ranksight rules` rendered from an `alerting` config with a Slack
receiver (warning) and an email receiver (critical).

- The Slack API endpoint is a real HTTP server on loopback; the receiver's ``api_url_file``
  holds its URL (the secret file, as in production).
- The mail goes to a real SMTP server (aiosmtpd) on loopback; criticals also go to a PagerDuty
  receiver whose Events API v2 ``url`` is the same HTTP server (routing key in ``routing_key_file``).
- A real node agent receives protocol-v1 datagrams from the ranks that tests/integration/test_triage_cli.py's
  sender plays: job ``oc-straggler`` (rank 1 computes 1.5x longer, rank 0 waits for it in the
  all-reduce: RanksightStraggler, warning, muting RanksightCommBound) and job ``oc-hang``
  (rank 1 stops outside any collective, rank 0 blocks in one: RanksightRankStalled, critical,
  muting RanksightRankBlocked, a warning).

Asserted: the Slack message and the mail name the cause, the rank, the runbook, what the cause
mutes and the dashboard of the job; warnings reached Slack only and criticals the mail only;
the symptoms fired in Prometheus, Alertmanager held them inhibited, and no message carried them.
"""
from __future__ import annotations

import email
import email.policy
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List

import pytest
from aiosmtpd.controller import Controller

from ranksight import config, triage
from ranksight.common.plumbing import AlertmanagerAPI, free_port, wait_until
from test_triage_cli import RankPlay, Sender  # the ranks' datagram player (real protocol-v1 records)

pytestmark = pytest.mark.slow

ALERT_LINE = re.compile(r"^(Ranksight[A-Za-z]+): ", re.M)  # one per alert spelled out in a message


SLACK_PATH = "/services/T000/B000/test"
PD_PATH = "/v2/enqueue"
PD_KEY = "0123456789abcdef0123456789abcdef"


class ApiStandIn:
    """A real HTTP server that records what Alertmanager's Slack and PagerDuty notifiers POST."""

    def __init__(self) -> None:
        self.posts: List[dict] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.posts.append({"path": self.path, "json": json.loads(body)})
                pd = self.path == PD_PATH
                self.send_response(202 if pd else 200)
                self.send_header("Content-Type", "application/json" if pd else "text/plain")
                self.end_headers()
                self.wfile.write(b'{"status":"success","message":"Event processed"}' if pd else b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = self.base + SLACK_PATH
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def messages(self) -> List[dict]:
        """title and text of every attachment posted to the webhook path."""
        return [{"title": a.get("title", ""), "text": a.get("text", ""), "link": a.get("title_link", ""),
                 "channel": p["json"].get("channel", "")}
                for p in self.posts if p["path"] == SLACK_PATH for a in p["json"].get("attachments", [])]

    def events(self) -> List[dict]:
        """PagerDuty Events API v2 bodies."""
        return [p["json"] for p in self.posts if p["path"] == PD_PATH]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class MailSink:
    """aiosmtpd handler: keeps every message Alertmanager sends."""

    def __init__(self) -> None:
        self.mails: List[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 - aiosmtpd's name
        self.mails.append(email.message_from_bytes(envelope.content, policy=email.policy.default))
        return "250 OK"

    def messages(self) -> List[dict]:
        return [{"title": str(m["Subject"]), "text": m.get_body(("plain",)).get_content(), "to": str(m["To"])}
                for m in self.mails]


@pytest.fixture
def receivers(tmp_path: Path) -> Iterator[dict]:
    slack = ApiStandIn()
    sink = MailSink()
    smtp = Controller(sink, hostname="127.0.0.1", port=free_port())
    smtp.start()
    secret = tmp_path / "slack-api-url"
    secret.write_text(slack.url + "\n")
    pd_key = tmp_path / "pagerduty-key"
    pd_key.write_text(PD_KEY + "\n")
    cfg_file = tmp_path / "ranksight.yml"
    cfg_file.write_text(
        "alerting:\n"
        "  receivers:\n"
        f"    chat: {{type: slack, api_url_file: {secret}, channel: '#train-oncall'}}\n"
        f"    pager: {{type: email, to: oncall@example.com, from: alertmanager@example.com,"
        f" smarthost: '127.0.0.1:{smtp.port}', require_tls: false}}\n"
        f"    pd: {{type: pagerduty, routing_key_file: {pd_key}, url: '{slack.base}{PD_PATH}'}}\n"
        "  routes: {critical: [pager, pd], warning: chat, info: none, lint: chat}\n")
    try:
        yield {"slack": slack, "mail": sink, "config": str(cfg_file)}
    finally:
        smtp.stop()
        slack.close()


def _alerts_in(msgs: List[dict], job: str) -> List[str]:
    return [name for m in msgs if f"job {job}" in m["title"] for name in ALERT_LINE.findall(m["text"])]


def test_pages_carry_the_verdict_and_follow_the_severity_routes(receivers, agent, local_stack):
    cfg = config.load(receivers["config"], "test", env={})
    by = triage.by_alert(cfg)
    a = agent(env={"RANKSIGHT__agent__stall_min_seconds": "3"})
    stack = local_stack(targets=[a.target], cfg=cfg)
    sender = Sender(a.ingest, node="oc-node")
    try:
        sender.set("oc-straggler", 0, RankPlay(dur=0.1, data=0.002, comm=0.045, xcomm=0.04))
        sender.set("oc-straggler", 1, RankPlay(dur=0.1, data=0.002, comm=0.006, xcomm=0.001))
        sender.set("oc-hang", 0, RankPlay())
        sender.set("oc-hang", 1, RankPlay())
        sender.start()
        assert wait_until(lambda: len(stack.prom.query(
            'count by (job) (rank:ranksight_comm_share:ratio_rate{job=~"oc-.*"})')) == 2, 30), "no rates"
        hang = time.time()
        sender.set("oc-hang", 1, RankPlay(stepping=False, hang_since=hang))
        sender.set("oc-hang", 0, RankPlay(stepping=False, coll=0.0))

        def blocked_clock() -> None:  # rank 0's in-flight collective ages with wall time
            while not sender.halt.is_set():
                sender.plays[("oc-hang", 0)].coll = time.time() - hang
                time.sleep(0.2)
        threading.Thread(target=blocked_clock, daemon=True).start()

        slack, mail = receivers["slack"], receivers["mail"]
        got = wait_until(lambda: "RanksightStraggler" in _alerts_in(slack.messages(), "oc-straggler")
                         and "RanksightRankStalled" in _alerts_in(mail.messages(), "oc-hang")
                         and slack.events(), 100, 0.5)  # the straggler: a 30 s window of steps, 10 s for:, group_wait
        assert got, (f"slack: {slack.messages()}\nmail: {mail.messages()}\npagerduty: {slack.events()}\n"
                     f"alertmanager: {[(x['labels'], x['status']) for x in stack.am.alerts()]}")

        # the symptoms really fired, and Alertmanager holds them muted by their causes
        def muted(name: str, job: str) -> bool:
            held = [x for x in stack.am.alerts() if x["labels"]["alertname"] == name and x["labels"]["job"] == job]
            return bool(held) and all(x["status"]["state"] == "suppressed" and x["status"]["inhibitedBy"] for x in held)
        assert wait_until(lambda: muted("RanksightCommBound", "oc-straggler") and muted("RanksightRankBlocked", "oc-hang"),
                          40, 0.5), [(x["labels"], x["status"]) for x in stack.am.alerts()]
        assert stack.prom.query('ALERTS{alertname="RanksightCommBound",alertstate="firing",job="oc-straggler",rank="0"}')
        assert stack.prom.query('ALERTS{alertname="RanksightRankBlocked",alertstate="firing",job="oc-hang",rank="0"}')
        # a symptom that got through would be sent at the group's next flush: wait past it
        time.sleep(config.duration_seconds(cfg["durations"]["am_group_interval"]) + 3)
    finally:
        sender.stop()

    s_msgs, m_msgs = slack.messages(), mail.messages()
    # Slack (warning): the straggler, its rank, the runbook, what it mutes, the job's dashboard
    strag = next(m for m in s_msgs if "RanksightStraggler" in ALERT_LINE.findall(m["text"]))
    assert "warning job oc-straggler: RanksightStraggler rank 1" in strag["title"], strag
    assert "job oc-straggler, rank 1, node oc-node" in strag["text"], strag["text"]
    assert by["RanksightStraggler"].runbook in strag["text"] and by["RanksightStraggler"].runbook.endswith("/straggler.md")
    assert ("Mutes 3 symptoms while it fires: RanksightCommBound (same job, comm), RanksightGoodputLow (same job), "
            "RanksightStepTimeRegression (same job)") in strag["text"], strag["text"]
    assert "/d/ranksight-triage/?var-job=oc-straggler" in strag["text"] and strag["link"].endswith("var-job=oc-straggler")
    assert strag["channel"] == "#train-oncall"
    # mail (critical): the stalled rank
    stalled = next(m for m in m_msgs if "RanksightRankStalled" in ALERT_LINE.findall(m["text"]))
    assert "critical job oc-hang: RanksightRankStalled rank 1" in stalled["title"], stalled
    assert "job oc-hang, rank 1, node oc-node" in stalled["text"], stalled["text"]
    assert by["RanksightRankStalled"].runbook in stalled["text"]
    assert "RanksightRankBlocked (same job)" in stalled["text"] and stalled["to"] == "oncall@example.com"
    # PagerDuty (critical too): the key from its file, the verdict as summary and details, the dashboard link
    events = slack.events()
    assert events and all(ev["routing_key"] == PD_KEY for ev in events)
    ev = next(ev for ev in events if "RanksightRankStalled" in ev["payload"]["summary"])
    assert ev["event_action"] == "trigger" and ev["payload"]["severity"] == "critical"
    assert "critical job oc-hang: RanksightRankStalled rank 1" in ev["payload"]["summary"], ev
    assert by["RanksightRankStalled"].runbook in ev["payload"]["custom_details"]["verdict"], ev
    assert ev["links"][0]["href"].endswith("/d/ranksight-triage/?var-job=oc-hang"), ev
    assert all("oc-hang" in e["payload"]["summary"] for e in events), events  # criticals only
    # routes: warnings to Slack only, criticals to the mail only
    assert all(m["title"].startswith("[FIRING] warning ") or m["title"].startswith("[RESOLVED] warning ")
               for m in s_msgs), [m["title"] for m in s_msgs]
    assert all(" critical " in m["title"] for m in m_msgs), [m["title"] for m in m_msgs]
    # the muted symptoms produced no message, on any route
    for job, symptom in (("oc-straggler", "RanksightCommBound"), ("oc-hang", "RanksightRankBlocked")):
        assert symptom not in _alerts_in(s_msgs + m_msgs, job), (symptom, s_msgs, m_msgs)
    # one incident, one page: the straggler job's warnings came as one group per notification
    assert all(m["title"].count("job ") == 1 for m in s_msgs + m_msgs)


def _post(am_url: str, alerts: List[Dict[str, str]], annotations: Dict[str, Dict[str, str]]) -> None:
    now = time.time()
    fmt = "%Y-%m-%dT%H:%M:%S.000Z"
    body = [{"labels": a, "annotations": annotations[a["alertname"]],
             "startsAt": time.strftime(fmt, time.gmtime(now)), "endsAt": time.strftime(fmt, time.gmtime(now + 3600))}
            for a in alerts]
    AlertmanagerAPI(am_url).post_alerts(body)


def test_a_big_group_is_one_short_page_and_node_alerts_link_the_node(receivers, local_stack):
    """Alerts POSTed to the real Alertmanager as Prometheus labels them: seven ranks of one job
    dataloader-bound (one page, five spelled out, the rest counted, their muted comm share
    absent), and a throttled GPU on a node (the GPU named, the node dashboard linked)."""
    # a short group_wait for speed; a long repeat_interval so that only new alerts could bring a page
    cfg = config.load(receivers["config"], "test", env={"RANKSIGHT__durations__am_group_wait": "1s",
                                                        "RANKSIGHT__durations__am_repeat_interval": "1h"})
    by = triage.by_alert(cfg)
    ann = {e.alert: {"summary": e.summary, "description": f"{e.alert} test", "runbook_url": e.runbook}
           for e in by.values()}
    stack = local_stack(cfg=cfg)
    rank = {"job": "oc-big", "node": "big-node", "instance": "big-node:9945"}
    alerts = [{"alertname": "RanksightDataloaderBound", "severity": "warning", "rank": str(r), "local_rank": str(r),
               **rank} for r in range(7)]
    alerts.append({"alertname": "RanksightCommBound", "severity": "warning", "rank": "7", "local_rank": "7", **rank})
    # aggregated by (node, gpu): no job label at all
    alerts.append({"alertname": "RanksightGpuThrottling", "severity": "warning", "node": "hot-node", "gpu": "3"})
    # the agent's own health: the scrape job and instance, no node
    alerts.append({"alertname": "RanksightExporterDown", "severity": "warning", "job": triage.SCRAPE_JOB,
                   "instance": "gone-node:9945"})
    _post(stack.am_url, alerts, ann)
    slack = receivers["slack"]
    assert wait_until(lambda: len(slack.messages()) >= 3, 30, 0.3), slack.messages()
    time.sleep(config.duration_seconds(cfg["durations"]["am_group_interval"]) + 2)  # nothing more may come
    def kind(m: dict) -> str:
        return "big" if "job oc-big" in m["title"] else "agent" if f"job {triage.SCRAPE_JOB}" in m["title"] else "node"
    msgs = {kind(m): m for m in slack.messages()}
    assert len(slack.messages()) == 3 and set(msgs) == {"big", "node", "agent"}, [m["title"] for m in slack.messages()]
    big = msgs["big"]
    assert "(7 alerts)" in big["title"], big["title"]
    assert ALERT_LINE.findall(big["text"]) == ["RanksightDataloaderBound"] * 5, big["text"]
    assert "7 alerts firing in all; the first 5 are shown." in big["text"]
    assert ("Mutes 5 symptoms while it fires: RanksightGpuSawtooth (same node), RanksightCommBound (same job), "
            "RanksightStraggler (same job), RanksightGoodputLow (same job), RanksightStepTimeRegression (same job)"
            ) in big["text"]
    # looked up by name in the template: the rules carry no next-check annotation
    assert f"Next check: {by['RanksightDataloaderBound'].next_check}\n" in big["text"], big["text"]
    node = msgs["node"]
    assert node["title"].startswith("[FIRING] warning RanksightGpuThrottling on hot-node"), node["title"]
    assert "\nnode hot-node, GPU 3\n" in node["text"], node["text"]
    assert node["link"].endswith("/d/ranksight-node/?var-node=hot-node"), node["link"]
    agent = msgs["agent"]
    assert f"\njob {triage.SCRAPE_JOB}, instance gone-node:9945\n" in agent["text"], agent["text"]
    assert agent["link"].endswith("/d/ranksight-node/"), agent["link"]
    assert "\njob oc-big, rank 0, node big-node\n" in big["text"], big["text"]
    assert receivers["mail"].messages() == []  # no critical: no mail
