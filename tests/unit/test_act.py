"""`ranksight act`: every policy rule, the modes, the dry-run default, the drain rate limit and the
last-nodes rule, idempotency under Alertmanager's repeats and resolves, and authentication, through
real HTTP posts of Alertmanager's webhook JSON (version 4, as Alertmanager 0.25 sends it) to a real
`ranksight act` server on a loopback port. The agent it asks for rank pids is a real HTTP server
serving /api/v1/ranks in the agent's shape; the workers it ends are real processes."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Set, Tuple

import pytest

from ranksight import catalog as C
from ranksight import config, triage
from ranksight.cli import main
from ranksight.exporter import workers
from ranksight.common.plumbing import wait_until
from ranksight.tools.act import ActServer
from ranksight.tools.act_engines import Engine
from test_exporter_webconfig import pki  # noqa: F401  (the test CA and certificates)
from support.alertmanager_webhook import TOKEN, am_alert, am_webhook, post



class Agent:
    """/api/v1/ranks as the node agent serves it (exporter/ranks.py Rank.describe), and its POST
    /api/v1/ranks/end answered by the agent's own code (exporter/workers.py serve) over these ranks."""

    def __init__(self) -> None:
        self.ranks: List[Dict[str, Any]] = []
        self.ends: List[Dict[str, Any]] = []
        owner = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"ranks": owner.ranks})

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                owner.ends.append(json.loads(body))
                code, doc, _ = workers.serve(body, owner.ranks)
                self._send(code, doc)

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()


class Recorded(Engine):
    """An engine that records its drains; jobs and their nodes as the test sets them."""
    name = "recorded"

    def __init__(self) -> None:
        self.drained: List[Tuple[str, str]] = []
        self.jobs: Dict[str, Set[str]] = {}

    def drain_command(self, node: str, reason: str) -> str:
        return f"drain {node} '{reason}'"

    def job_nodes(self, node: str):
        done = {n for n, _ in self.drained}
        return {j: (ns, ns & done) for j, ns in self.jobs.items() if node in ns}

    def drain(self, node: str, reason: str) -> str:
        self.drained.append((node, reason))
        return f"drained {node}"


@pytest.fixture
def act(tmp_path):
    made = []
    agent = Agent()

    def make(**act_cfg: Any):
        tok = tmp_path / "token"
        tok.write_text(TOKEN + "\n")
        env = {"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__token_file": str(tok),
               "RANKSIGHT__act__agent_token_file": str(tok),
               "RANKSIGHT__act__agent_url": agent.url, "RANKSIGHT__act__kill_grace_seconds": "2"}
        env.update({f"RANKSIGHT__act__{k}": str(v) for k, v in act_cfg.items()})
        cfg = config.load(None, "test", env=env)
        eng = Recorded()
        s = ActServer(cfg, engine=eng).start()
        s.engine, s.agent, s.token_file = eng, agent, str(tok)
        made.append(s)
        return s

    yield make
    for s in made:
        s.stop()
    agent.http.shutdown()


def metrics(s) -> Dict[Tuple[str, ...], float]:
    req = urllib.request.Request(s.url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    text = urllib.request.urlopen(req, timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith(C.ACTIONS_TOTAL.name + "{"):
            lb = dict(kv.split("=") for kv in line[line.index("{") + 1:line.index("}")].replace('"', "").split(","))
            out[(lb["verdict"], lb["action"], lb["result"])] = float(line.rsplit(" ", 1)[1])
        elif line.startswith(C.ACT_REJECTED.name + "{"):
            out[("rejected", line.split('"')[1])] = float(line.rsplit(" ", 1)[1])
    return out


def states(s) -> List[str]:
    return [r.state for r in s.actor.ledger.records.values()]


def test_policy_is_the_triage_tables_action_column():
    by = triage.by_alert(config.defaults())
    acting = {n: e.action for n, e in by.items() if e.action != triage.ACT_PAGE}
    assert acting == {"RanksightRankStalled": "restart_workers", "RanksightRankDown": "record_recovery",
                      "RanksightGpuXidError": "drain_node", "RanksightNicSpeedLow": "drain_node",
                      "RanksightDiskFilling": "drain_node"}
    assert all(e.action in triage.ACTIONS for e in by.values())


def test_dry_run_and_propose_are_the_defaults_and_approve_runs_the_command(act, capsys):
    s = act()
    code, body = post(s, am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="0", xid="79")))
    assert code == 200 and body["results"][0]["state"] == "proposed", body
    rec = next(iter(s.actor.ledger.records.values()))
    assert rec.command == "drain n1 'ranksight: RanksightGpuXidError'" and not s.engine.drained
    # approve through the CLI: the default dry run logs the command, runs nothing
    assert main(["act", "approve", rec.id, "--url", s.url]) == 2  # no token: refused, one error line
    assert "answered 401" in capsys.readouterr().err and rec.state == "proposed"
    import os

    os.environ["RANKSIGHT__act__token_file"] = s.token_file
    try:
        assert main(["act", "approve", rec.id, "--url", s.url]) == 0
        assert f"{rec.id} RanksightGpuXidError drain_node: dry_run" in capsys.readouterr().out
        assert main(["act", "list", "--url", s.url]) == 0
        assert "drain n1 'ranksight: RanksightGpuXidError'" in capsys.readouterr().out
    finally:
        del os.environ["RANKSIGHT__act__token_file"]
    assert rec.state == "dry_run" and not s.engine.drained
    m = metrics(s)
    assert m[("RanksightGpuXidError", "drain_node", "proposed")] == 1
    assert m[("RanksightGpuXidError", "drain_node", "dry_run")] == 1


def test_each_rule_auto(act):
    s = act(mode="auto", dry_run="false", max_drains_per_hour="10")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s.agent.ranks = [{"job": "j", "rank": 1, "node": "n1", "pid": worker.pid, "up": True, "step": 7},
                         {"job": "k", "rank": 0, "node": "n1", "pid": other.pid, "up": True, "step": 3}]
        post(s, am_webhook(am_alert("RanksightRankStalled", job="j", rank="1", node="n1", local_rank="1")))
        assert worker.wait(10) == -15 and other.poll() is None  # SIGTERM to the culprit job's worker only
        post(s, am_webhook(am_alert("RanksightDiskFilling", node="n2", path="/ckpt")))
        post(s, am_webhook(am_alert("RanksightNicSpeedLow", node="n3", device="eth0")))
        post(s, am_webhook(am_alert("RanksightRankDown", job="j", rank="0", node="n1", local_rank="0")))
        post(s, am_webhook(am_alert("RanksightStraggler", job="j", rank="1", node="n1", local_rank="1")))
        assert s.engine.drained == [("n2", "ranksight: RanksightDiskFilling"), ("n3", "ranksight: RanksightNicSpeedLow")]
        # the stalled job's ranks come back in new processes and step: recovered, with the time it took
        s.agent.ranks = [{"job": "j", "rank": 1, "node": "n1", "pid": 99999, "up": True, "step": 0}]
        time.sleep(0.6)
        s.agent.ranks[0]["step"] = 2
        assert wait_until(lambda: "recovered" in states(s), 5), states(s)
        m = metrics(s)
        assert m[("RanksightRankStalled", "restart_workers", "done")] == 1
        assert m[("RanksightRankStalled", "restart_workers", "recovered")] == 1
        assert m[("RanksightDiskFilling", "drain_node", "done")] == 1
        assert m[("RanksightRankDown", "record_recovery", "watching")] == 1
        assert m[("RanksightStraggler", "page", "paged")] == 1
        s.agent.ranks.append({"job": "j", "rank": 0, "node": "n1", "pid": 99998, "up": True, "step": 2})
        post(s, am_webhook(am_alert("RanksightRankDown", "resolved", job="j", rank="0", node="n1", local_rank="0")))
        assert metrics(s)[("RanksightRankDown", "record_recovery", "recovered")] == 1
        # a rank that does not come back (the job ended): its resolve is no recovery
        post(s, am_webhook(am_alert("RanksightRankDown", job="j", rank="5", node="n1", local_rank="5")))
        post(s, am_webhook(am_alert("RanksightRankDown", "resolved", job="j", rank="5", node="n1", local_rank="5")))
        assert metrics(s)[("RanksightRankDown", "record_recovery", "resolved")] == 1
        rec = next(r for r in s.actor.ledger.records.values() if r.verdict == "RanksightRankStalled")
        assert rec.recover_s is not None and rec.recover_s > 0.5
    finally:
        worker.kill()
        other.kill()


def test_off_mode_pages_and_a_rank_elsewhere_is_not_here(act):
    s = act(mode="auto", modes="{RanksightGpuXidError: off}")
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="0")))
    post(s, am_webhook(am_alert("RanksightRankStalled", job="j", rank="1", node="elsewhere")))
    m = metrics(s)
    assert m[("RanksightGpuXidError", "drain_node", "paged")] == 1
    assert m[("RanksightRankStalled", "restart_workers", "not_here")] == 1


def test_repeats_and_resolves_are_idempotent(act):
    s = act(mode="auto", dry_run="false")
    a = am_alert("RanksightGpuXidError", node="n1", gpu="0", fp="aaaa")
    for _ in range(3):  # Alertmanager repeats a firing group every repeat_interval
        post(s, am_webhook(a))
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="1", fp="bbbb")))  # same node, other GPU
    assert s.engine.drained == [("n1", "ranksight: RanksightGpuXidError")]
    assert metrics(s)[("RanksightGpuXidError", "drain_node", "duplicate")] == 3
    # proposed, then resolved: approving it runs nothing
    p = act()
    b = am_alert("RanksightDiskFilling", node="n5", path="/tmp", fp="cccc")
    post(p, am_webhook(b))
    post(p, am_webhook(dict(b, status="resolved")))
    post(p, am_webhook(dict(b, status="resolved")))
    rec = p.actor.ledger.by_id(next(iter(p.actor.ledger.records.values())).id)
    assert rec.state == "resolved"
    assert p.actor.approve(rec.id).state == "resolved" and not p.engine.drained
    # a resolve that arrives before its firing: the late firing does nothing
    c = am_alert("RanksightDiskFilling", node="n6", path="/tmp", fp="dddd")
    post(p, am_webhook(dict(c, status="resolved")))
    post(p, am_webhook(c))
    assert not p.engine.drained and metrics(p)[("RanksightDiskFilling", "drain_node", "duplicate")] >= 2


def test_drain_rate_limit_and_last_nodes(act):
    s = act(mode="auto", dry_run="false", max_drains_per_hour="2", job_min_nodes="2")
    s.engine.jobs = {"big": {"n1", "n2", "n3", "n4"}, "small": {"m1", "m2"}}
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="m1", gpu="0")))  # small would keep 1 < 2
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="0")))
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="n2", gpu="0")))  # big keeps n3, n4
    post(s, am_webhook(am_alert("RanksightGpuXidError", node="n3", gpu="0")))  # the third in an hour
    assert s.engine.drained == [("n1", "ranksight: RanksightGpuXidError"), ("n2", "ranksight: RanksightGpuXidError")]
    m = metrics(s)
    assert m[("RanksightGpuXidError", "drain_node", "last_nodes")] == 1
    assert m[("RanksightGpuXidError", "drain_node", "rate_limited")] == 1
    # dry runs count against the limit too: what auto would do is what the dry run shows
    d = act(mode="auto", max_drains_per_hour="1")
    post(d, am_webhook(am_alert("RanksightGpuXidError", node="x1", gpu="0")))
    post(d, am_webhook(am_alert("RanksightGpuXidError", node="x2", gpu="0")))
    assert sorted(states(d)) == ["dry_run", "rate_limited"]


def test_forged_unsigned_and_malformed_webhooks_do_nothing_and_are_counted(act):
    s = act(mode="auto", dry_run="false")
    doc = am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="0"))
    assert post(s, doc, token="")[0] == 401
    assert post(s, doc, token="forged")[0] == 401
    assert post(s, doc, token=TOKEN + "x")[0] == 401
    assert post(s, {}, token="", path="/api/v1/approve/abc")[0] == 401
    assert post(s, b"{not json")[0] == 400
    assert post(s, {"alerts": [{"labels": {}}]})[0] == 400
    assert not s.engine.drained and not s.actor.ledger.records
    m = metrics(s)
    assert m[("rejected", "unauthorized")] == 4 and m[("rejected", "malformed")] == 2
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(s.url + "/metrics", timeout=5)
    assert e.value.code == 401


def test_bad_config_is_one_error_line(tmp_path, capsys, monkeypatch):
    for k in [k for k in __import__("os").environ if k.startswith("RANKSIGHT")]:
        monkeypatch.delenv(k)
    for env, want in [({"RANKSIGHT__act__mode": "yes"}, "config act.mode: expected one of off, propose, auto"),
                      ({"RANKSIGHT__act__token_file": str(tmp_path)}, "config act.token_file: cannot read"),
                      ({"RANKSIGHT__act__engine": "nomad"}, "config act.engine: expected one of none, slurm, kubernetes"),
                      ({}, "config act.token_file: `ranksight act` needs a bearer token file")]:
        with monkeypatch.context() as m:
            for k, v in env.items():
                m.setenv(k, v)
            assert main(["act"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("ranksight: error: ") and want in err, err
    tok = tmp_path / "t"
    tok.write_text("x")
    with pytest.raises(config.ConfigError, match="RanksightNope is no alert"):
        ActServer(config.load(None, "test", env={"RANKSIGHT__act__modes": "{RanksightNope: auto}",
                                                 "RANKSIGHT__act__token_file": str(tok),
                                                 "RANKSIGHT__act__listen": "127.0.0.1:0"}))


def test_client_certificates_replace_the_token_and_a_stranger_is_refused(pki, tmp_path):
    """act.web_config_file with RequireAndVerifyClientCert (the agent's web config format): no token needed."""
    import ssl

    from test_exporter_webconfig import _write

    wc = _write(pki, "act-web.yml", {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                                                           "client_auth_type": "RequireAndVerifyClientCert",
                                                           "client_ca_file": "ca.crt"}})
    cfg = config.load(None, "test", env={"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__web_config_file": str(wc),
                                         "RANKSIGHT__act__mode": "auto", "RANKSIGHT__act__dry_run": "false"})
    eng = Recorded()
    s = ActServer(cfg, engine=eng).start()
    try:
        assert s.url.startswith("https://")
        doc = json.dumps(am_webhook(am_alert("RanksightGpuXidError", node="n1", gpu="0"))).encode()

        def send(cert: str) -> int:
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            if cert:
                ctx.load_cert_chain(str(pki / f"{cert}.crt"), str(pki / f"{cert}.key"))
            req = urllib.request.Request(s.url + "/alerts", data=doc, method="POST")
            with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
                return r.status
        for cert in ("", "stranger"):
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                send(cert)
        assert not eng.drained
        assert send("client") == 200 and eng.drained == [("n1", "ranksight: RanksightGpuXidError")]
        assert s.actor.counters.rejected["unauthorized"] == 2
    finally:
        s.stop()


def test_a_late_approval_signals_only_pids_that_are_still_the_jobs_ranks(act):
    s = act(dry_run="false")
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s.agent.ranks = [{"job": "j", "rank": 1, "node": "n1", "pid": worker.pid, "up": True, "step": 7}]
        body = post(s, am_webhook(am_alert("RanksightRankStalled", job="j", rank="1", node="n1")))[1]
        rid = body["results"][0]["id"]
        rec = s.actor.ledger.by_id(rid)
        assert rec.agent_url == s.agent.url and rec.node == "n1", rec
        assert rec.command == (f"curl -sS --fail-with-body -H \"Authorization: Bearer $(cat {s.token_file})\" "
                               "-H 'Content-Type: application/json' -d '{\"job\": \"j\", \"node\": \"n1\", "
                               f"\"pids\": [{worker.pid}], \"grace\": 2.0}}' {s.agent.url}/api/v1/ranks/end"), rec.command
        s.agent.ranks = [dict(s.agent.ranks[0], pid=worker.pid + 100000)]  # restarted meanwhile: another pid
        code, rec = post(s, {}, path=f"/api/v1/approve/{rid}")
        assert code == 200 and rec["state"] == "failed" and "no longer ranks" in rec["detail"], rec
        assert worker.poll() is None
        assert post(s, {}, path="/api/v1/approve/nope")[0] == 404
    finally:
        worker.kill()


def test_the_ledger_file_keeps_repeats_idempotent_and_the_drain_count_across_a_restart(act, tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    a = am_alert("RanksightGpuXidError", node="n1", gpu="0", fp="eeee")
    s = act(mode="auto", dry_run="false", max_drains_per_hour="1", ledger_file=str(ledger))
    post(s, am_webhook(a))
    s.stop()
    t = act(mode="auto", dry_run="false", max_drains_per_hour="1", ledger_file=str(ledger))
    assert post(t, am_webhook(a))[1]["results"][0]["state"] == "done"  # the first server's record
    assert post(t, am_webhook(am_alert("RanksightGpuXidError", node="n2", gpu="0")))[1]["results"][0]["state"] \
        == "rate_limited"
    assert s.engine.drained == [("n1", "ranksight: RanksightGpuXidError")] and not t.engine.drained


def test_rules_render_act_as_a_webhook_receiver_with_its_token_file(tmp_path):
    """alerting.receivers type webhook with credentials_file: the bearer token Alertmanager sends, from its file."""
    import yaml

    from conftest import require_binary
    from ranksight.alerts import generate

    tok = tmp_path / "act-token"
    tok.write_text(TOKEN + "\n")
    cfg = config.load(None, "default", env={
        "RANKSIGHT__alerting__receivers": f"{{act: {{type: webhook, url: 'http://n1:9948/alerts', credentials_file: '{tok}'}}}}",
        "RANKSIGHT__alerting__routes": "{critical: act, warning: act, info: none, lint: none}"})
    files = generate.render(cfg)
    am = yaml.safe_load(files["alertmanager.yml"])
    (hook,) = [r for r in am["receivers"] if r["name"] == "ranksight-act"]
    assert hook["webhook_configs"] == [{"url": "http://n1:9948/alerts", "send_resolved": True,
                                        "http_config": {"authorization": {"type": "Bearer", "credentials_file": str(tok)}}}]
    assert TOKEN not in files["alertmanager.yml"]
    for name, text in files.items():
        (tmp_path / "am" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "am" / name).write_text(text)
    r = subprocess.run([require_binary("amtool"), "check-config", str(tmp_path / "am" / "alertmanager.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    tok.write_text("")
    with pytest.raises(config.ConfigError, match="credentials_file.*is empty"):
        generate.render(cfg)
