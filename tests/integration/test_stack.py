"""`ranksight stack`: real Debian Prometheus + Alertmanager scraping a real agent; deploy/prometheus.yml."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from ranksight import catalog, config, protocol, triage
from ranksight.common.plumbing import AlertmanagerAPI, PrometheusAPI, free_port, pid_alive, wait_until
from ranksight.tools.stack import LocalStack, render_alert_files, render_prometheus_config

from conftest import require_binary

REPO = Path(__file__).resolve().parents[2]


def ranksight(*args: str, env=None, timeout: float = 60, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)


def _ps_lines(needle: str):
    out = subprocess.run(["ps", "-eo", "pid,stat,args"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if needle in ln and " Z" not in ln and "ps -eo" not in ln]


def test_stack_up_scrapes_agent_loads_rules_and_down_leaves_nothing(agent, tmp_path):
    """From a folder of its own, `stack up` uses ./run/stack, says to stop it with the bare
    `ranksight stack down`, and that works; the rules of its profile go into the run dir only."""
    a = agent()
    run_dir = tmp_path / "run" / "stack"
    pport, aport = free_port(), free_port()
    up = ranksight("stack", "up", "--profile", "test", "--targets", a.target, "--prometheus-port", str(pport),
                   "--alertmanager-port", str(aport), "--scrape-interval", "1s", cwd=tmp_path)
    pids = {}
    try:
        assert up.returncode == 0, up.stderr
        assert f"http://127.0.0.1:{pport}" in up.stdout and f"http://127.0.0.1:{aport}" in up.stdout
        assert "stop with     ranksight stack down\n" in up.stdout, up.stdout
        assert "(profile: test)" in (run_dir / "rules" / "ranksight-rules.yml").read_text().splitlines()[0]
        assert "(profile: default)" in (REPO / "alerts" / "ranksight-rules.yml").read_text().splitlines()[0]
        pids = {n: int((run_dir / f"{n}.pid").read_text()) for n in ("prometheus", "alertmanager")}
        assert all(pid_alive(p) for p in pids.values())
        prom, am = PrometheusAPI(f"http://127.0.0.1:{pport}"), AlertmanagerAPI(f"http://127.0.0.1:{aport}")
        assert prom.ready() and am.ready()

        # every rule of the triage table (test profile) is loaded, through the HTTP API
        cfg = config.load(None, "test", env={})
        want = {e.alert for e in triage.table(cfg)} | {r.record for r in triage.recording_rules(cfg)}
        assert want <= set(prom.rule_names())
        alerting = {r["name"]: r for g in prom.rules() for r in g["rules"] if r["type"] == "alerting"}
        assert alerting["RanksightCommBound"]["duration"] == 10  # the test profile's `for:`

        # the agent target is up, and the agents' `job` label survives (honor_labels)
        target = wait_until(lambda: [t for t in prom.targets() if t["labels"]["instance"] == a.target
                                     and t["health"] == "up"], timeout=15)
        assert target and target[0]["labels"]["job"] == triage.SCRAPE_JOB
        ingest_port = int(a.ingest.rsplit(":", 1)[1])
        rec = {"v": 1, "t": "step", "job": "my-training-job", "rank": 0, "lr": 0, "ws": 1, "node": "n1",
               "pid": os.getpid(), "ts": time.time(), "seq": 1, "dur": 0.1, "data": 0.01}
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(protocol.encode(rec), ("127.0.0.1", ingest_port))
        got = wait_until(lambda: prom.query(f'{catalog.STEPS}{{job="my-training-job"}}'), timeout=15)
        assert got, "the agent's job label did not reach Prometheus"
        assert "exported_job" not in got[0]["metric"]
        assert prom.value(f'up{{job="{triage.SCRAPE_JOB}"}}') == 1.0

        st = ranksight("stack", "status", "--run-dir", str(run_dir))
        assert st.returncode == 0, st.stdout + st.stderr
        assert "prometheus    running" in st.stdout and "alertmanager  running" in st.stdout
        assert f"{a.target}" in st.stdout and " up" in st.stdout

        again = ranksight("stack", "up", "--run-dir", str(run_dir), "--prometheus-port", str(pport))
        assert again.returncode == 0 and "already running" in again.stdout
        named = re.search(r"\(ranksight stack down --run-dir (\S+) first\)", again.stdout)
        assert named and (REPO / named.group(1)).resolve() == run_dir.resolve(), again.stdout
    finally:
        down = ranksight("stack", "down", cwd=tmp_path)
    assert down.returncode == 0, down.stderr
    assert "stopped" in down.stdout
    # init reaps the orphaned servers a moment later; until then they are zombies (not running)
    assert wait_until(lambda: not any(pid_alive(p) for p in pids.values()), timeout=15)
    assert wait_until(lambda: not _ps_lines(str(run_dir)), timeout=15), _ps_lines(str(run_dir))
    assert not list(run_dir.glob("*.pid"))
    st = ranksight("stack", "status", "--run-dir", str(run_dir))
    assert st.returncode == 3 and "prometheus    stopped" in st.stdout
    assert ranksight("stack", "down", "--run-dir", str(run_dir)).returncode == 0  # idempotent


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ranksight: error: "), p.stderr
    assert "Traceback" not in p.stderr + p.stdout
    return lines[0]


def test_missing_binary_names_the_debian_package(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))  # no /usr/bin
    line = _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), env=env))
    assert "apt-get install prometheus" in line
    env = dict(os.environ, RANKSIGHT_ALERTMANAGER_BIN=str(tmp_path / "nope"))
    line = _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), env=env))
    assert "apt-get install prometheus-alertmanager" in line
    assert not list(tmp_path.glob("*.pid"))


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), "--prometheus-port", str(port),
                                         "--alertmanager-port", str(free_port())))
        assert f"127.0.0.1:{port}" in line and "in use" in line and "--prometheus-port" in line
        line = _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), "--alertmanager-port", str(port),
                                         "--prometheus-port", str(free_port())))
        assert "--alertmanager-port" in line
    assert not list(tmp_path.glob("*.pid"))


def test_bad_usage_is_one_line(tmp_path):
    assert "bad target" in _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), "--targets", "nohost"))
    assert "port" in _one_error_line(ranksight("stack", "up", "--run-dir", str(tmp_path), "--prometheus-port", "70000"))
    p = ranksight("stack", "sideways")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_deploy_prometheus_yml_is_valid_and_wired(tmp_path):
    promtool = require_binary("promtool")
    path = REPO / "deploy" / "prometheus.yml"
    r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = yaml.safe_load(path.read_text())
    (job,) = doc["scrape_configs"]
    assert job["job_name"] == triage.SCRAPE_JOB and job["honor_labels"] is True
    assert job["static_configs"][0]["targets"][0].endswith(":9945")
    assert doc["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    assert doc["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["alertmanager:9093"]

    # the local stack's copy, rendered from the same template with real rules, passes promtool too
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "ranksight-rules.yml").write_text(
        render_alert_files(config.load(None, "test", env={}))["ranksight-rules.yml"])
    text = render_prometheus_config(path.read_text(), ["127.0.0.1:9945", "10.0.0.2:9945"], "127.0.0.1:9093",
                                    str(tmp_path / "rules" / "*.yml"), "1s")
    (tmp_path / "prometheus.yml").write_text(text)
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 1 rule files found" in r.stdout + r.stderr
    rendered = yaml.safe_load(text)
    assert rendered["scrape_configs"][0]["honor_labels"] is True
    assert rendered["global"]["scrape_timeout"] == "1s"


def test_local_stack_fixture_api(local_stack, agent):
    """The fixture other suites build on: rules from files, targets, inhibition visible in Alertmanager."""
    a = agent()
    rules = """groups:
- name: t
  rules:
  - alert: Cause
    expr: vector(1)
    labels: {job: j}
  - alert: Symptom
    expr: vector(1)
    labels: {job: j}
"""
    am = """route: {receiver: "null", group_wait: 1s}
receivers: [{name: "null"}]
inhibit_rules:
- source_matchers: ['alertname="Cause"']
  target_matchers: ['alertname="Symptom"']
  equal: [job]
"""
    s: LocalStack = local_stack(targets=["127.0.0.1:9"], files={"t.yml": rules, "alertmanager.yml": am})
    assert set(s.prom.rule_names()) == {"Cause", "Symptom"}
    s.set_targets([a.target])
    assert wait_until(lambda: s.prom.value(f'up{{instance="{a.target}"}}') == 1.0, timeout=15)
    assert wait_until(lambda: s.am.inhibited_names() == ["Symptom"], timeout=20)
    firing = {x["labels"]["alertname"] for x in s.prom.alerts() if x["state"] == "firing"}
    assert firing == {"Cause", "Symptom"}
    assert all(p for p in s.pids().values())
    s.stop()
    assert not any(s.pids().values())
