"""Generated rules, Alertmanager config and runbooks: fresh, valid (promtool, amtool), tested
(the hand-written promtool unit tests), and the test profile only shortens time."""
from __future__ import annotations

import collections
import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest
import yaml

from ranksight import catalog, config, triage
from ranksight.triage import goodput
from ranksight.alerts import generate

from conftest import require_binary

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"


def _run(*cmd: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def default_cfg() -> config.Config:
    return config.load(None, "default", env={})


@pytest.fixture(scope="module")
def test_cfg() -> config.Config:
    return config.load(None, "test", env={})


def _write(files: Dict[str, str], out: Path) -> None:
    for name, text in files.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)


# ------------------------------------------------------------------ freshness and purity

def test_committed_files_equal_a_fresh_render(default_cfg):
    files = generate.render(default_cfg)
    stale = [name for name, text in files.items()
             if not (ALERTS / name).exists() or (ALERTS / name).read_text() != text]
    extra = sorted(f"runbooks/{p.name}" for p in (ALERTS / "runbooks").glob("*.md")
                   if f"runbooks/{p.name}" not in files)
    assert not stale and not extra, (
        f"alerts/ differ from a fresh render (stale: {stale}, no longer generated: {extra}); "
        "run `ranksight rules --in-place` and commit the result")


def test_render_is_pure_and_deterministic(default_cfg, tmp_path):
    before = copy.deepcopy(dict(default_cfg))
    a, b = generate.render(default_cfg), generate.render(default_cfg)
    assert a == b and dict(default_cfg) == before
    entries = triage.table(default_cfg)
    assert set(a) == {"ranksight-rules.yml", "alertmanager.yml", "alertmanager-fragment.yml",
                      "templates/ranksight.tmpl", "runbooks/README.md"} | {
        f"runbooks/{e.id}.md" for e in entries}
    written = generate.write(default_cfg, tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == sorted(a)
    (tmp_path / "runbooks" / "gone-alert.md").write_text("old")
    generate.write(default_cfg, tmp_path)
    assert not (tmp_path / "runbooks" / "gone-alert.md").exists()


# ------------------------------------------------------------------ promtool / amtool

@pytest.mark.parametrize("profile", ["default", "test"])
def test_promtool_check_rules(profile, tmp_path):
    cfg = config.load(None, profile, env={})
    rules = tmp_path / "ranksight-rules.yml"
    rules.write_text(generate.render(cfg)["ranksight-rules.yml"])
    r = _run(require_binary("promtool"), "check", "rules", str(rules))
    assert r.returncode == 0, r.stdout + r.stderr
    n = len(triage.recording_rules(cfg)) + len(triage.table(cfg))
    assert f"SUCCESS: {n} rules found" in r.stdout


def test_promtool_unit_tests():
    files = sorted(str(p.relative_to(ROOT)) for p in (ALERTS / "tests").glob("*.yml"))
    assert files, "no promtool test files under alerts/tests"
    r = _run(require_binary("promtool"), "test", "rules", *files)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("SUCCESS") == len(files)


def test_promtool_tests_evaluate_the_groups_in_dependency_order():
    """promtool evaluates the groups of one evaluation time in an arbitrary order unless a test file
    names it: every file lists every group, in the order of the generated rule file."""
    want = list(triage.RULE_GROUPS) + list(triage.ALERT_GROUPS)
    for path in sorted((ALERTS / "tests").glob("*.yml")):
        assert yaml.safe_load(path.read_text()).get("group_eval_order") == want, path.name


def test_promtool_tests_cover_every_alert_and_recording_rule(default_cfg):
    """Each alert has a case where it fires (non-empty exp_alerts) and one where it must not
    (an empty exp_alerts); each recording rule has its value checked."""
    fires, silent, recorded = set(), set(), set()
    for path in (ALERTS / "tests").glob("*.yml"):
        doc = yaml.safe_load(path.read_text())
        assert doc["rule_files"] == ["../ranksight-rules.yml"], path
        for case in doc["tests"]:
            for t in case.get("alert_rule_test", []):
                (fires if t.get("exp_alerts") else silent).add(t["alertname"])
            for t in case.get("promql_expr_test", []):
                if t.get("exp_samples"):
                    recorded.add(t["expr"].strip())
    alerts = {e.alert for e in triage.table(default_cfg)}
    assert alerts - fires == set(), "alerts without a firing case"
    assert alerts - silent == set(), "alerts without a must-not-fire case"
    assert {r.record for r in triage.recording_rules(default_cfg)} - recorded == set()


@pytest.mark.parametrize("profile", ["default", "test"])
def test_amtool_check_config(profile, tmp_path):
    am = tmp_path / "alertmanager.yml"
    am.write_text(generate.render(config.load(None, profile, env={}))["alertmanager.yml"])
    r = _run(require_binary("amtool"), "check-config", str(am))
    assert r.returncode == 0, r.stdout + r.stderr
    n = sum(len(e.inhibits) for e in triage.table(config.load(None, profile, env={})))
    assert f"{n} inhibit rules" in r.stdout


def test_committed_alertmanager_config_checks():
    r = _run(require_binary("amtool"), "check-config", str(ALERTS / "alertmanager.yml"))
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------------------------ profiles

_TIME = [
    (re.compile(r"\[\d+(?:ms|[smhd])\]"), "[W]"),  # range selectors
    (re.compile(r"offset \d+(?:ms|[smhd])"), "offset W"),
    (re.compile(r"(offset W\) >= 0\) / )\d+(?:\.\d+)?"), r"\1W"),  # a window's increase per second
    (re.compile(r"(time\(\) - \w+ < )\d+(?:\.\d+)?"), r"\1W"),  # checkpoint-slow recency = rate window in seconds
    (re.compile(r" in \d+(?:ms|[smhd])\."), " in W."),  # heartbeat description names its window
    (re.compile(r"over the (last )?\d+(?:ms|[smhd])\b"), r"over the \1W"),  # the loss spike's windows
    (re.compile(r"(> time\(\) - )\d+(?:\.\d+)?"), r"\1W"),  # how long a held record is kept, in seconds
]


def _without_time(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _without_time(v) for k, v in doc.items() if k not in ("for", "interval")}
    if isinstance(doc, list):
        return [_without_time(v) for v in doc]
    if isinstance(doc, str):
        for rx, sub in _TIME:
            doc = rx.sub(sub, doc)
    return doc


def test_test_profile_differs_only_in_for_and_windows(default_cfg, test_cfg):
    d = yaml.safe_load(generate.render(default_cfg)["ranksight-rules.yml"])
    t = yaml.safe_load(generate.render(test_cfg)["ranksight-rules.yml"])
    assert d != t
    assert _without_time(d) == _without_time(t)
    alerts = [i for i, g in enumerate(d["groups"]) if g["name"] in triage.ALERT_GROUPS]
    assert len(alerts) == len(triage.ALERT_GROUPS)
    fors = [(a.get("for"), b.get("for")) for i in alerts for a, b in zip(d["groups"][i]["rules"], t["groups"][i]["rules"])]
    # the slow recording groups run at durations.slow_rule_interval, shorter in the test profile
    ivals = [(a.get("interval"), b.get("interval")) for a, b in zip(d["groups"], t["groups"])]
    assert all((df is None) == (tf is None) for df, tf in ivals)
    assert all(config.duration_seconds(tf) <= config.duration_seconds(df) for df, tf in ivals if df)
    assert all(config.duration_seconds(tf) <= config.duration_seconds(df) for df, tf in fors)
    assert any(tf != df for df, tf in fors)
    # the Alertmanager config and the fragment differ in the ranksight route's timings only
    for name, route in (("alertmanager.yml", lambda doc: doc["route"]["routes"][0]),
                        ("alertmanager-fragment.yml", lambda doc: doc["routes"][0])):
        ad = yaml.safe_load(generate.render(default_cfg)[name])
        at = yaml.safe_load(generate.render(test_cfg)[name])
        for k in ("group_wait", "group_interval", "repeat_interval"):
            route(ad).pop(k), route(at).pop(k)
        assert ad == at, name


# ------------------------------------------------------------------ the table's own rules

def test_every_alert_carries_the_contract(default_cfg):
    groups = yaml.safe_load(generate.render(default_cfg)["ranksight-rules.yml"])["groups"]
    assert [g["name"] for g in groups] == list(triage.RULE_GROUPS) + list(triage.ALERT_GROUPS)
    rules = [r for g in groups[len(triage.RULE_GROUPS):] for r in g["rules"]]
    # every alert once, each group in table order
    table = triage.table(default_cfg)
    assert [r["alert"] for r in rules] == [e.alert for g in triage.ALERT_GROUPS for e in table if e.group == g]
    assert sorted(r["alert"] for r in rules) == sorted(e.alert for e in table)
    units = {e.alert: e.unit for e in triage.table(default_cfg)}
    for r in rules:
        assert re.fullmatch(r"Ranksight[A-Z][A-Za-z]+", r["alert"])
        assert r["labels"]["severity"] in ("critical", "warning", "info")
        ann = r["annotations"]
        assert set(ann) == {"summary", "description", "runbook_url"}
        assert "$labels." in ann["description"], r["alert"]
        assert ann["runbook_url"].startswith("https://") and ann["runbook_url"].endswith(".md")
        if units[r["alert"]] == "count" and "step" in ann["description"]:  # a step number, printed whole
            assert '{{ printf "%.0f" $value }}' in ann["description"], r["alert"]
        elif units[r["alert"]] != "bool":  # boolean alerts have no value worth printing
            assert '{{ printf "%.2f" $value }}' in ann["description"], r["alert"]


def test_runbooks_have_the_four_sections(default_cfg):
    files = generate.render(default_cfg)
    for e in triage.table(default_cfg):
        text = files[f"runbooks/{e.id}.md"]
        heads = re.findall(r"^## (\w+)", text, re.M)
        assert heads[:4] == ["Meaning", "Impact", "Diagnosis", "Mitigation"], e.id
        assert e.expr in text
    index = files["runbooks/README.md"]
    pos = [index.index(f"[{e.alert}]({e.id}.md)") for e in triage.signals(default_cfg)]
    assert pos == sorted(pos), "the index lists the six signals in triage order"


def test_runbook_base_url_is_configurable(tmp_path):
    cfg = config.load(None, "default", env={"RANKSIGHT__alerting__runbook_base_url": "https://wiki.example/rb/"})
    files = generate.render(cfg)
    assert "runbook_url: https://wiki.example/rb/straggler.md" in files["ranksight-rules.yml"]
    bad = config.load(None, "default", env={"RANKSIGHT__alerting__runbook_base_url": "docs/runbooks"})
    with pytest.raises(config.ConfigError, match="alerting.runbook_base_url"):
        generate.render(bad)


def test_inhibitions_match_labels_both_sides_carry(default_cfg):
    by = triage.by_alert(default_cfg)
    for source, target, equal in triage.inhibit_pairs(default_cfg):
        assert target in by, f"{source} inhibits unknown alert {target}"
        s, t = by[source], by[target]
        assert source != target
        for label in equal:
            assert label in s.scope + s.joined and label in t.scope + t.joined, (source, target, label)
        if "job" in equal:  # node series carry job="ranksight-agent", not the training job
            assert (s.rank_level or "job" in s.joined) and (t.rank_level or "job" in t.joined), (source, target)


def test_rules_avoid_what_changed_in_prometheus_3(default_cfg, test_cfg):
    for cfg in (default_cfg, test_cfg):
        exprs = [r.expr for r in triage.recording_rules(cfg)] + [e.expr for e in triage.table(cfg)] + [
            e.indicator for e in triage.table(cfg)]
        for x in exprs:
            assert "holt_winters" not in x and "double_exponential" not in x
            assert not re.search(r"\ble\s*(=|!=|=~|!~)", x), f"selects on a le value: {x}"
            assert not re.search(r"\bquantile\s*(=|!=|=~|!~)\s*\"", x), f"selects on a quantile value: {x}"
            for rx in re.findall(r'=~\s*"([^"]*)"', x) + re.findall(r'!~\s*"([^"]*)"', x):
                assert "." not in rx, f"regex with '.' (matches newlines in 3.x): {x}"
    rules = yaml.safe_load(generate.render(default_cfg)["ranksight-rules.yml"])
    for g in rules["groups"]:
        assert set(g) <= {"name", "interval", "rules"}  # no 3.x-only group fields (query_offset, ...)


# ------------------------------------------------------------------ the CLI

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight", *args], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin"})


def test_cli_writes_the_test_profile(tmp_path):
    r = _cli("rules", "--profile", "test", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ranksight-rules.yml").read_text() == generate.render(
        config.load(None, "test", env={}))["ranksight-rules.yml"]
    assert (tmp_path / "runbooks" / "README.md").exists()


def test_cli_bad_input_one_line_exit_2(tmp_path):
    bad = tmp_path / "c.yml"
    bad.write_text("alerting: {webhook_url: 'ftp://x'}\n")
    for args in (["rules", "--config", str(bad), "--out", str(tmp_path / "o")],
                 ["rules", "--profile", "nope"],
                 ["rules", "--out", "/proc/ranksight-cannot-write"]):
        r = _cli(*args)
        msg = (r.stderr + r.stdout).strip()
        assert r.returncode == 2, (args, msg)
        assert "Traceback" not in msg and len(msg.splitlines()) <= 2, msg


def test_recording_rules_read_each_raw_series_once_per_evaluation(default_cfg):
    """At 8,192 ranks the cost of the recording rules is the raw series they read. Each
    rate() of a raw counter over a window appears once; shares and aggregates read the records."""
    reads = collections.Counter(
        m for r in triage.recording_rules(default_cfg) for m in re.findall(r"rate\((ranksight_[a-z_]+(?:\{[^}]*\})?\[\w+\])", r.expr))
    assert reads, "no rate() found in the recording rules?"
    assert {m: n for m, n in reads.items() if n > 1} == {}
    # every record a rule reads is produced by an earlier rule of the same group (Prometheus
    # evaluates a group's rules in order, and groups concurrently), or by an earlier group the
    # group names as its input (the rank and job arithmetic read the rates' group); the baseline
    # group reads the job records of the other groups too (hour averages: one evaluation's lag is
    # immaterial)
    seen: Dict[str, str] = {}
    order = list(triage.RULE_GROUPS)
    for g, inputs in triage.GROUP_INPUTS.items():
        assert all(order.index(i) < order.index(g) for i in inputs), (g, inputs)
    for r in triage.recording_rules(default_cfg):
        for name in re.findall(r"\b((?:rank|job|node|gpu):ranksight_[a-z_]+:[a-z0-9_]+)", r.expr):
            if name == r.record:  # a held record reads its own value from an earlier evaluation
                assert f"last_over_time({name}[" in r.expr, r.record
                continue
            if r.group in goodput.CROSS_GROUP_READERS and seen.get(name, r.group) != r.group:
                assert name.startswith("job:"), (r.record, name)
                continue
            assert seen.get(name) in (r.group,) + triage.GROUP_INPUTS.get(r.group, ()), (r.record, name)
        seen[r.record] = r.group


def test_runbook_prose_files_are_each_used_and_complete(default_cfg):
    """Every entry's Meaning, Impact, Diagnosis and Mitigation come from ranksight/triage/prose/: one
    file per entry id (lint.md for every lint without a lint-<id>.md of its own, triage/goodput.py
    writes its own), none unused."""
    from ranksight.triage import prose as tp

    stems = {p.stem for p in tp.PROSE_DIR.glob("*.md")}
    table = triage.table(default_cfg)
    own = {e.id for e in table if e.kind != "lint" and e.alert not in
           (goodput.GOODPUT_LOW, goodput.STEP_REGRESSION)}
    lint_own = {e.id for e in table if e.kind == "lint" and (tp.PROSE_DIR / f"{e.id}.md").exists()}
    assert lint_own == {"lint-partial-resume"}
    assert stems == own | lint_own | {"lint"}
    for stem in stems:
        assert all(tp.prose(stem, what="w", lint="l").values()), stem
    by_id = {e.id: e for e in table}
    for stem in own:
        assert {k: getattr(by_id[stem], k) for k in tp.SECTIONS} == tp.prose(stem), stem


def test_triage_package_files_stay_small():
    for path in sorted((ROOT / "ranksight" / "triage").glob("*.py")):
        assert len(path.read_text().splitlines()) <= 600, path.name
