"""Core: catalog, protocol, config, triage table, CLI; one source of truth for names. Torch-free."""
import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ranksight import catalog, config, protocol, triage


def test_catalog_names_follow_contract():
    for m in catalog.CATALOG.values():
        assert m.name.startswith("ranksight_")
        if m.type == "counter":
            assert m.name.endswith("_total")
        if m.type == "histogram":
            assert m.buckets and list(m.buckets) == sorted(m.buckets)


def test_core_does_not_import_torch():
    code = "import sys, ranksight, ranksight.cli, ranksight.triage, ranksight.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def _rec(**kw):
    base = {"v": 1, "t": "step", "job": "j", "rank": 0, "lr": 0, "ws": 2, "node": "n", "pid": 1, "ts": 1.0e9,
            "seq": 1, "dur": 0.1, "data": 0.01}
    base.update(kw)
    return protocol.encode(base)


def test_protocol_roundtrip_and_rejects():
    r = protocol.decode(_rec())
    assert r["dur"] == 0.1 and r["micro"] == 1
    for bad, result in [
        (b"not json", "malformed"),
        (b"[1,2]", "malformed"),
        (_rec(v=99), "rejected"),  # a version this agent does not know
        (_rec(v=0), "rejected"),
        (_rec(rank=2), "rejected"),
        (_rec(dur=-1), "rejected"),
        (json.dumps({"v": 1, "t": "step", "job": "j", "rank": 0, "lr": 0, "ws": 1, "node": "n", "pid": 1,
                     "ts": 1.0, "seq": 1, "dur": float("nan")}).encode(), "rejected"),
        (b"{" + b" " * protocol.MAX_DATAGRAM + b"}", "oversize"),
        (_rec(job="x" * 500), "rejected"),
        (_rec(t="nope"), "rejected"),
    ]:
        with pytest.raises(protocol.ProtocolError) as e:
            protocol.decode(bad)
        assert e.value.result == result, bad[:60]


def test_config_validation_one_line(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("thresholds:\n  comm_share: 3\n")
    with pytest.raises(config.ConfigError) as e:
        config.load(str(p), env={})
    assert "thresholds.comm_share" in str(e.value) and "\n" not in str(e.value)
    p.write_text("thresholds: {comm_share: 0.4}\n")
    assert config.load(str(p), env={})["thresholds"]["comm_share"] == 0.4
    assert config.load(env={"RANKSIGHT__thresholds__comm_share": "0.5"})["thresholds"]["comm_share"] == 0.5
    with pytest.raises(config.ConfigError):
        config.load(env={"RANKSIGHT__durations__comm_bound": "ten minutes"})
    with pytest.raises(config.ConfigError):
        config.load(env={"RANKSIGHT__nosuch__x": "1"})


def test_test_profile_only_changes_durations_and_windows():
    d, t = config.load(env={}), config.load(profile="test", env={})
    for section in d:
        if section not in ("durations", "windows"):
            assert d[section] == t[section]


def test_triage_table_order_and_uniqueness():
    cfg = config.load(env={})
    entries = triage.table(cfg)
    assert len({e.alert for e in entries}) == len(entries)
    assert len({e.id for e in entries}) == len(entries)
    assert [e.order for e in triage.signals(cfg)] == sorted(e.order for e in triage.signals(cfg))
    assert {e.order for e in triage.signals(cfg)} == {1, 2, 3, 4, 5, 6}
    names = {e.alert for e in entries}
    for e in entries:
        assert e.alert.startswith("Ranksight")
        for inh in e.inhibits:
            assert set(inh.targets) <= names, (e.alert, inh.targets)


def test_cli_bad_usage_exit_2():
    out = subprocess.run([sys.executable, "-m", "ranksight", "--bogus"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([sys.executable, "-m", "ranksight", "config"], capture_output=True, text=True,
                         env={"RANKSIGHT__thresholds__comm_share": "abc", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "comm_share" in out.stderr


# ---------------------------------------------------------------- one source of truth for names
SOURCES_OF_TRUTH = re.compile(r"ranksight/(catalog\.py|triage[^/]*\.py|triage/)")
SKIPPED_DIRS = {".venv", ".git", "tests", "run", ".devbin", "build", "node_modules"}
NAME_TOKEN = re.compile(r"(?<![\w:])[A-Za-z_:][\w:]*(?![\w:])")


def _generated_names():
    """(metric series names, recording-rule names, alert names), from the catalog and the rule files
    the alerts generator writes for the default config."""
    from ranksight.alerts import generate

    metrics = set()
    for m in catalog.CATALOG.values():
        family = m.name[:-len("_total")] if m.name.endswith("_total") else m.name
        metrics |= {m.name, family, m.bucket, m.sum, m.count, m.name + "_created"}
    records, alerts = set(), set()
    for name, text in generate.render(config.defaults()).items():
        if "/" in name or not name.endswith(".yml") or name.startswith("alertmanager"):
            continue
        for g in (yaml.safe_load(text) or {}).get("groups") or []:
            for r in g.get("rules") or []:
                (alerts if "alert" in r else records).add(r.get("alert") or r.get("record"))
    return metrics, records, alerts


def _string_literals(tree):
    """(line, text) of every string constant but docstrings (f-string parts included)."""
    docs = set()
    for n in ast.walk(tree):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            docs.add(id(body[0].value))
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.lineno, n.value


def test_no_metric_alert_or_recording_rule_name_literal_outside_the_catalog_and_triage_table():
    """Every non-test Python file of the repository (tests/ aside): a metric or recording-rule
    name anywhere in a string literal (PromQL included), or an alert name used as a value (the
    whole string, quoted inside one, or after alertname=), is a copy of the catalog or of the
    triage table. Prose that mentions an alert (help text, panel descriptions) is not a value."""
    metrics, records, alerts = _generated_names()
    assert len(metrics) > 100 and len(records) > 20 and len(alerts) > 20  # the scan has something to find
    alert_value = re.compile(r'(?:["\']|alertname=~?"?)(' + "|".join(sorted(alerts)) + r")\b")
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if set(Path(rel).parts[:-1]) & SKIPPED_DIRS or SOURCES_OF_TRUTH.match(rel):
            continue
        for line, text in _string_literals(ast.parse(path.read_text(encoding="utf-8"))):
            found = set(NAME_TOKEN.findall(text)) & (metrics | records)
            found |= {text.strip()} & alerts
            found |= set(alert_value.findall(text))
            offenders += [f"{rel}:{line}: {n}" for n in sorted(found)]
    assert not offenders, "names written as literals (take them from ranksight.catalog / ranksight.triage):\n" \
        + "\n".join(offenders)


def test_the_literal_scan_finds_a_copied_name(tmp_path):
    """The scan's own check: a copied metric, recording-rule and alert name are each found."""
    metrics, records, alerts = _generated_names()
    m, r, a = sorted(metrics)[0], sorted(records)[0], sorted(alerts)[0]
    src = f'"""doc {m}"""\nX = "rate({m}[5m])"\nY = "{r} > 1"\nZ = "{a}"\nW = "mentions {a} in prose"\n'
    got = []
    alert_value = re.compile(r'(?:["\']|alertname=~?"?)(' + "|".join(sorted(alerts)) + r")\b")
    for line, text in _string_literals(ast.parse(src)):
        found = set(NAME_TOKEN.findall(text)) & (metrics | records) | ({text.strip()} & alerts) \
            | set(alert_value.findall(text))
        got += [(line, n) for n in found]
    assert sorted(got) == [(2, m), (3, r), (4, a)]
