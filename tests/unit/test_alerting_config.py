"""The `alerting` config (receivers and severity routes, ranksight/oncall.py) and what
`ranksight rules` makes of it (alerts/notify.py): validation with one line naming the key,
the standalone config and the fragment merged into an existing config checked by Debian's
amtool 0.25, and the routes resolved by `amtool config routes test`."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from ranksight import config, oncall, triage
from ranksight.alerts import generate, notify

ROOT = Path(__file__).resolve().parents[2]


def _amtool() -> str:
    path = shutil.which("amtool") or "/usr/bin/amtool"
    assert Path(path).exists(), "amtool not found: install Debian's prometheus-alertmanager"
    return path


@pytest.fixture
def secrets(tmp_path: Path) -> Dict[str, Path]:
    files = {"slack": "https://hooks.slack.com/services/T0/B0/xyz\n", "pd": "0123456789abcdef0123456789abcdef\n",
             "mailpw": "hunter2\n", "og": "opsgenie-key\n"}
    out = {}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        out[name] = tmp_path / name
    return out


def _cfg(tmp_path: Path, alerting: Dict[str, Any], profile: str = "default") -> config.Config:
    p = tmp_path / "ranksight.yml"
    p.write_text(yaml.safe_dump({"alerting": alerting}))
    return config.load(str(p), profile, env={})


def _every_type(s: Dict[str, Path]) -> Dict[str, Any]:
    return {
        "receivers": {
            "pager": {"type": "pagerduty", "routing_key_file": str(s["pd"])},
            "chat": {"type": "slack", "api_url_file": str(s["slack"]), "channel": "#train-oncall"},
            "mail": {"type": "email", "to": "oncall@example.com", "from": "am@example.com",
                     "smarthost": "smtp.example.com:587", "auth_username": "am", "auth_password_file": str(s["mailpw"])},
            "genie": {"type": "opsgenie", "api_key_file": str(s["og"])},
            "hook": {"type": "webhook", "url": "https://hooks.example.com/ranksight"},
        },
        "routes": {"critical": ["pager", "mail"], "warning": "chat", "info": "hook", "lint": ["chat", "genie"]},
    }


def _write(files: Dict[str, str], out: Path) -> None:
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


def _check_config(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([_amtool(), "check-config", str(path)], capture_output=True, text=True, timeout=60)


def _route(path: Path, **labels: str) -> List[str]:
    r = subprocess.run([_amtool(), "config", "routes", "test", f"--config.file={path}",
                        *[f"{k}={v}" for k, v in labels.items()]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(",")


# ------------------------------------------------------------------ defaults: as before, one webhook

def test_no_receivers_sends_every_ranksight_alert_to_the_webhook(tmp_path):
    cfg = config.load(None, "default", env={})
    assert cfg["alerting"]["receivers"] == {} and cfg["alerting"]["routes"] == {}
    assert all(v == [oncall.WEBHOOK] for v in oncall.effective_routes(cfg["alerting"]).values())
    files = generate.render(cfg)
    _write(files, tmp_path)
    am = yaml.safe_load(files["alertmanager.yml"])
    assert [r["name"] for r in am["receivers"]] == ["ranksight-webhook"]
    assert am["receivers"][0]["webhook_configs"] == [{"url": cfg["alerting"]["webhook_url"], "send_resolved": True}]
    sub = am["route"]["routes"][0]
    assert sub["matchers"] == ['alertname=~"Ranksight.*"'] and sub["group_by"] == ["job"]
    for e in triage.table(cfg):
        assert _route(tmp_path / "alertmanager.yml", alertname=e.alert, severity=e.severity, job="j") == [
            "ranksight-webhook"], e.alert
    r = _check_config(tmp_path / "alertmanager.yml")
    assert r.returncode == 0 and " - 1 templates" in r.stdout, r.stdout + r.stderr


def test_every_alert_severity_has_a_route():
    routes = oncall.ROUTE_KEYS
    assert {e.severity for e in triage.table(config.load(None, "default", env={}))} <= set(routes)


# ------------------------------------------------------------------ receivers and routes

def test_every_receiver_type_passes_amtool_and_routes_by_severity(tmp_path, secrets):
    cfg = _cfg(tmp_path, _every_type(secrets))
    files = generate.render(cfg)
    out = tmp_path / "out"
    _write(files, out)
    r = _check_config(out / "alertmanager.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    am = out / "alertmanager.yml"
    assert _route(am, alertname="RanksightRankDown", severity="critical", job="j") == ["ranksight-pager", "ranksight-mail"]
    assert _route(am, alertname="RanksightStraggler", severity="warning", job="j") == ["ranksight-chat"]
    assert _route(am, alertname="RanksightLintNumaBinding", severity="info", job="j") == ["ranksight-chat", "ranksight-genie"]
    assert _route(am, alertname="RanksightIngestDropping", severity="info", job="j") == ["ranksight-hook"]
    doc = yaml.safe_load(files["alertmanager.yml"])
    recv = {x["name"]: x for x in doc["receivers"]}
    # secrets stay in their files: the rendered config names the file, never its content
    text = files["alertmanager.yml"] + files["alertmanager-fragment.yml"]
    for p in secrets.values():
        assert p.read_text().strip() not in text
    assert recv["ranksight-chat"]["slack_configs"][0]["api_url_file"] == str(secrets["slack"])
    assert recv["ranksight-pager"]["pagerduty_configs"][0]["routing_key_file"] == str(secrets["pd"])
    assert recv["ranksight-mail"]["email_configs"][0]["auth_password_file"] == str(secrets["mailpw"])
    assert recv["ranksight-genie"]["opsgenie_configs"][0]["api_key_file"] == str(secrets["og"])
    for x in doc["receivers"]:  # every templated receiver uses the ranksight template
        for key in ("slack_configs", "pagerduty_configs", "email_configs", "opsgenie_configs"):
            for c in x.get(key, []):
                assert "ranksight.title" in json.dumps(c) and "ranksight.text" in json.dumps(c), x["name"]


def test_default_routes_apply_to_the_receivers_named_pager_and_chat(tmp_path, secrets):
    cfg = _cfg(tmp_path, {"receivers": {k: v for k, v in _every_type(secrets)["receivers"].items()
                                        if k in ("pager", "chat")}})
    _write(generate.render(cfg), tmp_path / "o")
    am = tmp_path / "o" / "alertmanager.yml"
    assert _route(am, alertname="RanksightRankDown", severity="critical", job="j") == ["ranksight-pager"]
    assert _route(am, alertname="RanksightStraggler", severity="warning", job="j") == ["ranksight-chat"]
    assert _route(am, alertname="RanksightLintNumaBinding", severity="info", job="j") == ["ranksight-chat"]
    assert _route(am, alertname="RanksightIngestDropping", severity="info", job="j") == ["ranksight-none"]


def test_receivers_from_an_env_override(secrets):
    env = {"RANKSIGHT__alerting__receivers": f"{{chat: {{type: slack, api_url_file: {secrets['slack']}}}}}",
           "RANKSIGHT__alerting__routes": "{critical: chat}"}
    cfg = config.load(None, "default", env=env)
    assert cfg["alerting"]["receivers"]["chat"]["type"] == "slack"
    assert oncall.effective_routes(cfg["alerting"])["critical"] == ["chat"]


BAD = [
    ({"receivers": {"chat": {"type": "slak", "api_url_file": "/x"}}}, "alerting.receivers.chat.type", "unknown receiver type"),
    ({"receivers": {"chat": {"type": "slack"}}, "routes": {"critical": "chat"}}, "alerting.receivers.chat.api_url_file", "needs"),
    ({"receivers": {"chat": {"type": "slack", "api_url_file": "/x", "chanel": "#a"}}}, "alerting.receivers.chat.chanel",
     "unknown key"),
    ({"receivers": {"chat": {"type": "slack", "api_url_file": "slack-url"}}}, "alerting.receivers.chat.api_url_file",
     "absolute path"),
    ({"receivers": {"hook": {"type": "webhook", "url": "htp:/example.com"}}}, "alerting.receivers.hook.url",
     "http:// or https:// URL"),
    ({"receivers": {"pager": {"type": "pagerduty", "routing_key_file": "/k", "url": "events.pagerduty.com"}}},
     "alerting.receivers.pager.url", "URL"),
    ({"receivers": {"m": {"type": "email", "to": "oncall", "from": "a@b.c", "smarthost": "h:25"}}},
     "alerting.receivers.m.to", "mail addresses"),
    ({"receivers": {"m": {"type": "email", "to": "a@b.c", "from": "a@b.c", "smarthost": "smtp.example.com"}}},
     "alerting.receivers.m.smarthost", "host:port"),
    ({"receivers": {"m": {"type": "email", "to": "a@b.c", "from": "a@b.c", "smarthost": "h:25",
                          "auth_password_file": "/p"}}}, "alerting.receivers.m.auth_username", "needs"),
    ({"receivers": {"none": {"type": "webhook", "url": "http://x"}}}, "alerting.receivers.none", "name"),
    ({"receivers": ["chat"]}, "alerting.receivers", "mapping"),
    ({"routes": {"critcal": "pager"}}, "alerting.routes.critcal", "unknown route"),
    ({"routes": {"critical": ["none", "chat"]}}, "alerting.routes.critical", "none cannot be combined"),
    ({"routes": {"critical": "pgr"}}, "alerting.routes.critical", "no receiver named 'pgr'"),
    ({"receivers": {"chat": {"type": "slack", "api_url_file": "/x"}}}, "alerting.routes.critical",
     "no receiver named 'pager' (the default route)"),
]


@pytest.mark.parametrize("alerting,key,what", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_a_bad_receiver_names_its_key(tmp_path, alerting, key, what):
    with pytest.raises(config.ConfigError) as e:
        _cfg(tmp_path, alerting)
    msg = str(e.value)
    assert f"config {key}" in msg and what in msg and "\n" not in msg, msg


def test_secret_files_are_checked_when_the_config_is_rendered(tmp_path, secrets):
    # loading (as an agent on another node does) does not need the files; rendering does
    cfg = _cfg(tmp_path, {"receivers": {"chat": {"type": "slack", "api_url_file": str(tmp_path / "missing")}},
                          "routes": {"critical": "chat"}})
    with pytest.raises(config.ConfigError, match=r"alerting\.receivers\.chat\.api_url_file: cannot read .*missing"):
        generate.render(cfg)
    (tmp_path / "empty").write_text("\n")
    cfg = _cfg(tmp_path, {"receivers": {"pager": {"type": "pagerduty", "routing_key_file": str(tmp_path / "empty")}},
                          "routes": {"warning": "pager", "lint": "pager"}})
    with pytest.raises(config.ConfigError, match=r"alerting\.receivers\.pager\.routing_key_file: .* is empty"):
        generate.render(cfg)
    cfg = _cfg(tmp_path, {"receivers": {"chat": {"type": "slack", "api_url_file": str(secrets["pd"])}},
                          "routes": {"critical": "chat"}})
    with pytest.raises(config.ConfigError, match="does not hold an absolute http") as e:
        generate.render(cfg)
    assert secrets["pd"].read_text().strip() not in str(e.value)  # the secret is never printed


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin"})


@pytest.mark.parametrize("alerting,key", [
    ({"receivers": {"chat": {"type": "hipchat", "url": "https://x"}}}, "alerting.receivers.chat.type"),
    ({"receivers": {"chat": {"type": "slack", "api_url_file": "/nonexistent/slack-url"}}, "routes": {"critical": "chat"}},
     "alerting.receivers.chat.api_url_file"),
    ({"receivers": {"hook": {"type": "webhook", "url": "http//hooks.example.com"}}, "routes": {
        "critical": "hook", "warning": "hook", "lint": "hook"}}, "alerting.receivers.hook.url"),
])
def test_cli_bad_receiver_one_line_exit_2(tmp_path, alerting, key):
    (tmp_path / "c.yml").write_text(yaml.safe_dump({"alerting": alerting}))
    r = _cli("rules", "--config", str(tmp_path / "c.yml"), "--out", str(tmp_path / "o"))
    msg = (r.stderr + r.stdout).strip()
    assert r.returncode == 2, msg
    assert "Traceback" not in msg and len(msg.splitlines()) == 1 and f"config {key}" in msg, msg
    assert not (tmp_path / "o" / "alertmanager.yml").exists()


# ------------------------------------------------------------------ the fragment, merged

EXISTING = """\
global:
  resolve_timeout: 5m
templates:
  - team/*.tmpl
route:
  receiver: team-default
  group_by: [alertname, cluster]
  routes:
    - receiver: team-db
      matchers: ['service="postgres"']
receivers:
  - name: team-default
    webhook_configs:
      - url: https://hooks.example.com/team
  - name: team-db
    email_configs:
      - to: dba@example.com
        from: am@example.com
        smarthost: smtp.example.com:587
inhibit_rules:
  - source_matchers: ['alertname="ClusterDown"']
    target_matchers: ['severity="warning"']
    equal: [cluster]
"""


def merge(existing: Dict[str, Any], fragment: Dict[str, Any]) -> Dict[str, Any]:
    """The README's merge steps, done by code."""
    out = dict(existing)
    out["templates"] = list(existing.get("templates", [])) + fragment["templates"]
    route = dict(existing["route"])
    route["routes"] = fragment["routes"] + list(route.get("routes", []))
    out["route"] = route
    out["receivers"] = list(existing["receivers"]) + fragment["receivers"]
    out["inhibit_rules"] = list(existing.get("inhibit_rules", [])) + fragment["inhibit_rules"]
    return out


@pytest.mark.parametrize("with_receivers", [False, True])
def test_fragment_merged_into_an_existing_config_checks_and_routes(tmp_path, secrets, with_receivers):
    cfg = _cfg(tmp_path, _every_type(secrets)) if with_receivers else config.load(None, "default", env={})
    files = generate.render(cfg)
    fragment = yaml.safe_load(files["alertmanager-fragment.yml"])
    assert set(fragment) == {"templates", "routes", "receivers", "inhibit_rules"}
    assert fragment["routes"][0]["matchers"] == ['alertname=~"Ranksight.*"']
    assert "Inhibit rules are global" in files["alertmanager-fragment.yml"]
    team = tmp_path / "team-am"
    _write({notify.TEMPLATE_FILE: files[notify.TEMPLATE_FILE], "team/team.tmpl": '{{ define "team.x" }}x{{ end }}'}, team)
    merged = merge(yaml.safe_load(EXISTING), fragment)
    (team / "alertmanager.yml").write_text(yaml.safe_dump(merged, sort_keys=False))
    r = _check_config(team / "alertmanager.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(notify.inhibit_rules(cfg)) + 1
    assert f" - {n} inhibit rules" in r.stdout and " - 2 templates" in r.stdout, r.stdout
    am = team / "alertmanager.yml"
    # the team's alerts keep their routes; ranksight's take the subtree
    assert _route(am, alertname="DiskFull", service="postgres") == ["team-db"]
    assert _route(am, alertname="Whatever", severity="critical") == ["team-default"]
    want = ["ranksight-pager", "ranksight-mail"] if with_receivers else ["ranksight-webhook"]
    assert _route(am, alertname="RanksightRankDown", severity="critical", job="j", service="postgres") == want
    # the standalone file is the same subtree under a root of its own
    standalone = yaml.safe_load(files["alertmanager.yml"])
    assert standalone["route"]["routes"] == fragment["routes"]
    assert standalone["receivers"] == fragment["receivers"]
    assert standalone["inhibit_rules"] == fragment["inhibit_rules"]


def test_committed_fragment_and_template_are_fresh_and_check():
    files = generate.render(config.load(None, "default", env={}))
    for name in (notify.FRAGMENT_FILE, notify.TEMPLATE_FILE):
        assert (ROOT / "alerts" / name).read_text() == files[name], f"run `ranksight rules --in-place`: alerts/{name} is stale"
    r = _check_config(ROOT / "deploy" / "alertmanager.yml")  # compose's file, with its template beside it
    assert r.returncode == 0 and " - 1 templates" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------------------------ the template's facts

def test_template_names_what_each_cause_mutes_from_the_same_table():
    cfg = config.load(None, "default", env={})
    tmpl = generate.render(cfg)[notify.TEMPLATE_FILE]
    for source, target, equal in triage.inhibit_pairs(cfg):
        line = next(ln for ln in tmpl.splitlines() if f'eq . "{source}" }}}}Mutes' in ln)
        assert f"{target} (same " in line and ", ".join(equal) in line, (source, target, line)
    causes = {s for s, _, _ in triage.inhibit_pairs(cfg)}
    assert sum(1 for ln in tmpl.splitlines() if 'eq . "Ranksight' in ln and "Mutes " in ln) == len(causes)


def test_template_gives_each_alerts_next_check_from_the_table():
    """The next check is looked up by alert name (the rules carry no such annotation)."""
    cfg = config.load(None, "default", env={})
    tmpl = generate.render(cfg)[notify.TEMPLATE_FILE]
    table = triage.table(cfg)
    lines = [ln for ln in tmpl.splitlines() if "Next check: " in ln and 'eq . "' in ln]
    assert len(lines) == len(table)
    for e in table:
        assert any(f'eq . "{e.alert}" }}}}Next check: {e.next_check}' in ln for ln in lines), e.alert


def test_dashboard_links_use_the_generated_dashboards_uids():
    uids = {json.loads(p.read_text())["uid"] for p in (ROOT / "dashboards").glob("*.json")}
    assert {notify.TRIAGE_DASHBOARD, notify.NODE_DASHBOARD} <= uids
    tmpl = generate.render(config.load(None, "default", env={}))[notify.TEMPLATE_FILE]
    assert f"/d/{notify.TRIAGE_DASHBOARD}/?var-job=" in tmpl and triage.SCRAPE_JOB in tmpl


def test_grafana_url_is_checked(tmp_path):
    cfg = config.load(None, "default", env={"RANKSIGHT__alerting__grafana_url": "grafana:3000"})
    with pytest.raises(config.ConfigError, match="alerting.grafana_url"):
        generate.render(cfg)


def test_readme_on_call_snippets_render_and_check(tmp_path):
    """The README's three-line configs for Slack and for PagerDuty work as written (with the
    secret files in a temporary folder)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## On-call"):text.index("\n## ", text.index("## On-call") + 1)]
    blocks = [b.split("```", 1)[0] for b in section.split("```yaml\n")[1:]]
    assert len(blocks) == 2 and all(len(b.strip().splitlines()) == 3 for b in blocks), blocks
    for i, block in enumerate(blocks):
        (tmp_path / "slack-url").write_text("https://hooks.slack.com/services/T0/B0/x\n")
        (tmp_path / "pagerduty-key").write_text("0123456789abcdef0123456789abcdef\n")
        (tmp_path / f"c{i}.yml").write_text(block.replace("/etc/ranksight/", f"{tmp_path}/"))
        cfg = config.load(str(tmp_path / f"c{i}.yml"), "default", env={})
        out = tmp_path / f"o{i}"
        _write(generate.render(cfg), out)
        r = _check_config(out / "alertmanager.yml")
        assert r.returncode == 0, r.stdout + r.stderr
        name = next(iter(cfg["alerting"]["receivers"]))
        assert _route(out / "alertmanager.yml", alertname="RanksightRankDown", severity="critical", job="j") == [
            f"ranksight-{name}"]
