"""`ranksight rules --engine victoriametrics` (alerts/engines.py) and the VictoriaMetrics layout's
configs (ranksight/tools/vmstack.py): the rule file for vmalert reads no result of its own
group's evaluation, and differs from the Prometheus one in expressions only; the layout's
configs come from deploy/ and the generated files. The live comparison of both engines is
tests/integration/test_engines.py."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ranksight import config, triage
from ranksight.alerts import engines, generate
from ranksight.tools import vmstack

ROOT = Path(__file__).resolve().parents[2]
_HISTORY = re.compile(r"(min|max|last)_over_time\(([\w:]+)(\{[^{}]*\})?\[\w+\]\)")


@pytest.fixture(scope="module", params=["default", "test"])
def both(request):
    cfg = config.load(None, request.param, env={})
    text = generate.render_rules(cfg)
    return yaml.safe_load(text), yaml.safe_load(engines.victoriametrics(text))


def test_vmalert_rules_read_no_result_of_their_own_evaluation(both):
    prom, vm = both
    rewritten = 0
    for group in vm["groups"]:
        earlier = []
        for rule in group["rules"]:
            # a record's own history (min, max, last over a range) is read from earlier evaluations, as intended
            expr = _HISTORY.sub("", rule["expr"])
            read = [r for r in earlier if re.search(rf"(?<![\w:]){re.escape(r)}(?![\w:])", expr)]
            assert not read, f"{group['name']}: {rule.get('record') or rule.get('alert')} reads {read}"
            if "record" in rule:
                earlier.append(rule["record"])
    for pg, vg in zip(prom["groups"], vm["groups"]):
        # the same group, and its rules at once (none reads another's result of this evaluation, above)
        assert {k: v for k, v in pg.items() if k != "rules"} == {k: v for k, v in vg.items()
                                                                  if k not in ("rules", "concurrency")}
        assert vg.get("concurrency") == (min(len(vg["rules"]), engines.GROUP_CONCURRENCY)
                                         if len(vg["rules"]) > 1 else None), vg["name"]
        for pr, vr in zip(pg["rules"], vg["rules"]):
            assert {k: v for k, v in pr.items() if k != "expr"} == {k: v for k, v in vr.items() if k != "expr"}
            rewritten += pr["expr"] != vr["expr"]
    assert len(prom["groups"]) == len(vm["groups"])
    assert rewritten >= 20  # the baseline, goodput, rank, job, rank-state, efficiency, histogram and NIC chains


def test_concurrency_caps_each_group_or_takes_all_its_rules():
    text = generate.render_rules(config.load(None, "default", env={}))
    for c, want in ((2, lambda n: min(n, 2)), (0, lambda n: n)):
        for g in yaml.safe_load(engines.victoriametrics(text, c))["groups"]:
            n = len(g["rules"])
            assert g.get("concurrency") == (want(n) if n > 1 else None), (c, g["name"])


def test_baseline_history_keeps_this_evaluations_value():
    rules = [{"record": "job:a:avg", "expr": "avg_over_time(job:x:rate[1h])"},
             {"record": "job:a:baseline", "expr": "min_over_time(job:a:avg[7d])"},
             {"record": "job:a:ratio", "expr": 'job:a:avg{cause="c"} / on (job) (job:a:baseline{cause="c"} > 0)'}]
    out = [r["expr"] for r in engines._group_free(rules)]
    assert out[0] == rules[0]["expr"]
    assert out[1] == ("((min_over_time(job:a:avg[7d]) < (avg_over_time(job:x:rate[1h]))) or "
                      "(avg_over_time(job:x:rate[1h])) or min_over_time(job:a:avg[7d]))")
    assert out[2] == ('(avg_over_time(job:x:rate{cause="c"}[1h])) / on (job) '
                      '((((min_over_time(job:a:avg{cause="c"}[7d]) < (avg_over_time(job:x:rate{cause="c"}[1h]))) or '
                      '(avg_over_time(job:x:rate{cause="c"}[1h])) or min_over_time(job:a:avg{cause="c"}[7d]))) > 0)')


def test_last_over_time_reads_this_evaluations_value_first():
    """A record's last value over a window, read in its own group (the loss before a resume): the
    value this evaluation records where there is one, else the history's last."""
    rules = [{"record": "rank:l:steady", "expr": "avg_over_time(rank:l:mean[1m]) unless on (rank) recent"},
             {"record": "rank:l:before", "expr": "last_over_time(rank:l:steady[3h]) and on (rank) recent"}]
    out = [r["expr"] for r in engines._group_free(rules)]
    assert out[1] == ("((avg_over_time(rank:l:mean[1m]) unless on (rank) recent) or "
                      "last_over_time(rank:l:steady[3h])) and on (rank) recent")


def test_a_read_the_rewrite_cannot_carry_is_an_error():
    with pytest.raises(engines.EngineError, match="read as a range by rate"):
        engines._group_free([{"record": "a:b:c", "expr": "x"}, {"record": "a:b:d", "expr": "rate(a:b:c[5m])"}])
    with pytest.raises(engines.EngineError, match="cannot push"):
        engines._group_free([{"record": "a:b:c", "expr": "x + y"}, {"record": "a:b:d", "expr": 'a:b:c{k="v"}'}])
    with pytest.raises(engines.EngineError, match="unknown engine"):
        engines.render("", "mimir")


def _cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "ranksight", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_rules_cli_engine(tmp_path):
    r = _cli("rules", "--engine", "victoriametrics", "--out", str(tmp_path))
    assert r.returncode == 0 and "engine victoriametrics" in r.stdout, r.stderr
    text = (tmp_path / generate.RULES_FILE).read_text()
    assert text == engines.victoriametrics(generate.render_rules(config.load(None, "default", env={})))
    for bad in (["--engine", "vm"], ["--engine", "victoriametrics", "--in-place"]):
        r = _cli("rules", *bad)
        assert r.returncode != 0 and "Traceback" not in r.stderr
        assert r.stderr.startswith("ranksight: error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_layout_configs_come_from_deploy_and_the_generated_files():
    cfg = config.load(None, "default", env={})
    files = vmstack.render_layout(cfg, ["10.0.0.1:9945", "10.0.0.2:9945"], "http://127.0.0.1:8428")
    scrape = yaml.safe_load(files[vmstack.SCRAPE_FILE])
    assert set(scrape) == {"global", "scrape_configs"}  # vmagent refuses rule_files and alerting
    (job,) = scrape["scrape_configs"]
    assert job["job_name"] == triage.SCRAPE_JOB and job["honor_labels"] is True
    assert job["static_configs"] == [{"targets": ["10.0.0.1:9945", "10.0.0.2:9945"]}]
    rendered = generate.render(cfg)
    assert files[f"{vmstack.RULES_DIR}/{generate.RULES_FILE}"] == engines.victoriametrics(rendered[generate.RULES_FILE])
    assert files["alertmanager.yml"] == rendered["alertmanager.yml"]  # the same routes and inhibitions
    ds = yaml.safe_load(files[vmstack.DATASOURCE_FILE])["datasources"]
    prom = [d for d in ds if d["type"] == "prometheus"]
    assert [d["url"] for d in prom] == ["http://127.0.0.1:8428"] and prom[0]["uid"] == "prometheus"
    argv = vmstack.vmagent_argv("vmagent", 1, 3, "s.yml", "http://s:8428", "127.0.0.1:1", "/tmp/x")
    assert "-promscrape.cluster.membersCount=3" in argv and "-promscrape.cluster.memberNum=1" in argv
    assert "-remoteWrite.url=http://s:8428/api/v1/write" in argv
    assert not any("cluster" in a for a in vmstack.vmagent_argv("vmagent", 0, 1, "s", "u", "l", "t"))
    va = vmstack.vmalert_argv("vmalert", "r/*.yml", "http://s:8428", "http://am:9093", "l", "15s", "http://va")
    assert {"-remoteWrite.url=http://s:8428", "-remoteRead.url=http://s:8428", "-datasource.url=http://s:8428",
            "-notifier.url=http://am:9093"} <= set(va)


def test_stack_cli_bad_flags_are_one_line(tmp_path):
    for bad in (["--shards", "0"], ["--store-port", "70000"], ["--engine", "thanos"], ["--scrape-interval", "fast"]):
        r = _cli("stack", "up", "--engine", "victoriametrics", "--run-dir", str(tmp_path / "s"), *bad)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert r.stderr.startswith("ranksight: error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "s" / "stack.json").exists()
