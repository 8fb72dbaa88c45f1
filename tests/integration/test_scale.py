"""Scale benchmark: the generator's OpenMetrics backfills with real promtool, a real
Prometheus starts on it, every dashboard query is timed and the rules evaluate; plus the
model's invariants on a tiny scenario. Budget: under 90 s (the end-to-end run is ~30 s)."""
from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from ranksight import catalog as C
from ranksight import config, triage
from ranksight.triage import goodput
from ranksight.alerts import generate as alerts_generate
from ranksight.common import servers
from ranksight.tools.bench import load

scale = load("scale")

ROOT = Path(__file__).resolve().parents[2]
LINE = re.compile(r'^([a-zA-Z_:][\w:]*)\{(.*)\} (\S+) (\d+)$')


def _tiny(design: str = "as-is", nodes: int = 3, samples: int = 41):
    shape = scale.shape_for(design, 2, 2)
    scn = scale.Scenario(nodes=nodes, shape=shape, t0=1_800_000_000, samples=samples, step=15,
                         stragglers=(5,), dataloader_node=1)
    buf = io.StringIO()
    counts = scale.Generator(scn).write(buf, range(nodes))
    return scn, buf.getvalue(), counts


def _parse(text: str):
    """series (name, labels) -> [(ts, value)] and the families' TYPE order."""
    series = defaultdict(list)
    types = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            types.append(line.split()[2])
            continue
        if line == "# EOF":
            continue
        m = LINE.match(line)
        assert m, line
        series[(m.group(1), m.group(2))].append((int(m.group(4)), float(m.group(3))))
    return series, types


def test_generator_covers_the_catalog_and_the_agents_label_values():
    scn, text, counts = _tiny()
    series, types = _parse(text)
    assert text.endswith("# EOF\n")
    # OpenMetrics names a counter's family without _total: dataloader_wait_seconds_total
    # (counter) and dataloader_wait_seconds (histogram) share one family name in the
    # catalog. Prometheus' parser accepts the repeat (promtool does, below); any other
    # repeat would be a generator bug.
    fam = [m.name[:-len("_total")] if m.type == "counter" else m.name for m in C.CATALOG.values()]
    collisions = {f for f in fam if fam.count(f) > 1}
    assert {t for t in types if types.count(t) > 1} == collisions
    assert scale.Generator(scn).not_modelled == []
    names = {n for n, _ in series}
    for m in C.CATALOG.values():
        if m.short in ("gpu_xid_errors_total", "rank_finished", "rank_stall_where", "rank_collective_seq",
                       "rank_collective_wait_seconds", "gpu_timing_every_steps"):
            continue  # exposed only after an XID, while a finished rank lingers, while a rank is stuck,
            # or for a rank that samples its GPU timing
        if m.short.startswith("pipeline_"):
            continue  # exposed only for ranks watched as a pipeline stage: this job is data parallel
        if m.source != "agent":
            continue  # exposed by `ranksight act`, not by the agent
        if m.short == "lint_active" and scn.shape.lints_exposed == "active":
            continue
        want = m.bucket if m.type == "histogram" else m.name
        assert want in names, m.name
    assert counts.series == len(series)
    assert counts.samples == sum(len(v) for v in series.values()) == counts.series * scn.samples
    # the label values the agent writes
    from ranksight.exporter import ingest, ranks
    from ranksight.exporter.collectors import network

    assert scale.STALL_REASONS == tuple(ranks.STALL_REASONS)
    assert scale.INGEST_RESULTS == tuple(ingest.RESULTS)
    assert scale.TCP_EXT_COUNTERS == tuple(network.TCP_EXT_COUNTERS)
    assert set(scale.COLLECTORS) <= set(config.defaults()["agent"]["collectors"].split(","))
    rank_series = [lab for n, lab in series if n == str(C.STEPS)]
    assert len(rank_series) == scn.ranks
    assert all('job="llm-pretrain"' in lab and "instance=" in lab for lab in rank_series)
    node_series = [lab for n, lab in series if n == str(C.NET_TCP_SENT)]
    assert all(f'job="{triage.SCRAPE_JOB}"' in lab for lab in node_series)


def test_values_are_consistent_counters_histograms_and_the_scenario():
    scn, text, _ = _tiny()
    series, _ = _parse(text)
    for (name, lab), pts in series.items():
        ts = [t for t, _ in pts]
        assert ts == sorted(ts) and len(set(ts)) == len(ts)
        if name.endswith(("_total", "_bucket", "_count", "_sum")):
            vals = [v for _, v in pts]
            assert all(b >= a for a, b in zip(vals, vals[1:])), (name, lab)
    # histogram buckets are cumulative in le and end with +Inf == _count
    by_rank = defaultdict(dict)
    for (name, lab), pts in series.items():
        if name == C.STEP_DURATION.bucket:
            le = re.search(r'le="([^"]+)"', lab).group(1)
            rank = re.search(r'rank="(\d+)"', lab).group(1)
            by_rank[rank][math.inf if le == "+Inf" else float(le)] = pts[-1][1]
    counts = {re.search(r'rank="(\d+)"', lab).group(1): pts[-1][1]
              for (name, lab), pts in series.items() if name == C.STEP_DURATION.count}
    for rank, bk in by_rank.items():
        vals = [bk[k] for k in sorted(bk)]
        assert vals == sorted(vals)
        assert bk[math.inf] == counts[rank]

    def rate(name: str, rank: int) -> float:
        (pts,) = [p for (n, lab), p in series.items() if n == name and f',rank="{rank}"' in lab]
        return (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])

    rpn = scn.shape.ranks_per_node
    step = rate(str(C.STEP_SECONDS), 0)
    # the dataloader-bound node waits on data, the others do not
    assert rate(str(C.DATALOADER_WAIT), scn.dataloader_node * rpn) / step > 0.2
    assert rate(str(C.DATALOADER_WAIT), 0) / step < 0.02
    # synchronous data parallel: the straggler's busy time is longer, its exposed comm shorter
    busy = {r: step - rate(str(C.DATALOADER_WAIT), r) - rate(str(C.EXPOSED_COMM_SECONDS), r)
            - rate(str(C.CHECKPOINT_SECONDS), r) for r in (0, 5)}
    assert busy[5] / busy[0] > 1.2
    assert abs(rate(str(C.STEP_SECONDS), 5) - step) < 1e-3 * step


def test_the_agent_is_under_the_series_target_and_all_series_is_not():
    every = scale.series_per_node(scale.shape_for("all-series", 8, 8))
    as_is = scale.series_per_node(scale.shape_for("as-is", 8, 8))
    assert every["total"] - every["scrape"] > scale.TARGET_SERIES_PER_NODE
    assert as_is["total"] - as_is["scrape"] <= scale.TARGET_SERIES_PER_NODE
    assert as_is["rank"] == 8 * as_is["per_rank"]


def _long_window_records() -> list:
    """The records read over a range of another record or of their own (not backfilled), in
    rule-file order: the step-time baseline, the NIC's day-best, the steady loss held for a later
    resume (records that read their own last value), and the loss before and since a resume with
    the jump ratio, which read those."""
    longer = (triage.REC["nic_best_1d"], triage.REC["loss_steady_seen"], triage.REC["loss_last_steady"],
              triage.REC["loss_steady_sum"], triage.REC["loss_steady_readings"], triage.REC["loss_pre_resume"],
              triage.REC["loss_post_resume"], triage.REC["loss_resume_jump"])
    return [r.record for r in triage.recording_rules(config.load())
            if r.group in goodput.CROSS_GROUP_READERS or r.record in longer]


def test_expand_recording_rules_inlines_dependencies():
    text, _ = scale.rules_text(config.load())
    expanded, skipped = scale.expand_recording_rules(text)
    # the step-time baseline averages its inputs over hours and days, and a NIC's day-best reads its
    # 5-minute best over a day: nothing to backfill in an hour
    baseline = _long_window_records()
    assert skipped == baseline
    rules = [r for g in yaml.safe_load(expanded)["groups"] for r in g["rules"]]
    records = {r["record"] for r in rules}
    assert records == {r.record for r in triage.recording_rules(config.load())} - set(baseline)
    for r in rules:
        for other in records:
            assert re.search(r"(?<![\w:])" + re.escape(other) + r"(?![\w:])", r["expr"]) is None, (r["record"], other)


def test_expand_recording_rules_inlines_a_read_with_equality_matchers(tmp_path):
    """``R{a="x"}`` inlines as a filter that promtool evaluates to the same value as the record read;
    any other matcher leaves the rule out."""
    text = yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "job:x:sum", "expr": "sum by (job, category) (x_total)"},
        {"record": "job:x_p:ratio", "expr": 'job:x:sum{category="p"} / on (job) group_left () sum by (job) (job:x:sum)'},
        {"record": "job:x_re:ratio", "expr": 'job:x:sum{category=~"p"}'}]}]})
    expanded, skipped = scale.expand_recording_rules(text)
    assert skipped == ["job:x_re:ratio"]
    (ratio,) = [r["expr"] for r in yaml.safe_load(expanded)["groups"][0]["rules"] if r["record"] == "job:x_p:ratio"]
    assert "job:x:sum" not in ratio, ratio
    (tmp_path / "rules.yml").write_text(expanded)
    (tmp_path / "test.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": 'x_total{job="a", category="p"}', "values": "3"},
                         {"series": 'x_total{job="a", category="q"}', "values": "1"}],
        "promql_expr_test": [{"expr": "job:x_p:ratio", "eval_time": "0m",
                              "exp_samples": [{"labels": 'job:x_p:ratio{job="a", category="p"}', "value": 0.75}]}]}]}))
    r = subprocess.run([servers.find_binary("promtool"), "test", "rules", "test.yml"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_end_to_end_small_run_backfills_and_times_every_query(tmp_path):
    keep = tmp_path / "keep"
    cfg = tmp_path / "ranksight.yml"  # the slow recording groups every 10 s, so two evaluations fit the budget
    cfg.write_text("durations:\n  slow_rule_interval: 10s\n  baseline_rule_interval: 10s\n")
    cmd = [sys.executable, "-m", "ranksight", "bench", "scale", "--nodes", "4", "--gpus", "2",
           "--ranks-per-node", "2", "--hours", "10m", "--step", "5s", "--repeat", "1", "--rule-evals", "2",
           "--no-compaction-wait", "--parts", "2", "--keep", str(keep), "--config", str(cfg), "--rule-costs", "1",
           "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    # each rule alone, on the data and the backfilled records: every group, every rule, no error
    costs = {g["name"]: g for g in r["rule_costs"]["groups"]}
    assert set(costs) == {g["name"] for g in yaml.safe_load(alerts_generate.render_rules(config.load(str(cfg))))["groups"]}
    assert all(x["error"] is None and x["seconds"] > 0 for g in costs.values() for x in g["rules"])
    assert costs["ranksight.recording.rank"]["sum_seconds"] > 0 and r["rule_costs"]["repeat"] == 1
    shape = scale.shape_for("as-is", 2, 2)
    per = scale.series_per_node(shape)
    se = r["series"]
    # what the generator wrote is what Prometheus holds
    assert se["per_node"] == per["total"] - per["scrape"] == se["prometheus_per_node"]
    assert se["per_rank"] == per["per_rank"] == se["prometheus_per_rank"]
    assert se["prometheus_total"] == r["generate"]["series"] - 4 * per["scrape"]
    # the recording rules were backfilled (rank-level ones exist for the probe rank)
    # (not the pipeline stages' records, which a data-parallel job has no series for, nor the loss
    # since a resume: none happened)
    absent = set(_long_window_records()) | {triage.REC["loss_post_resume"]}
    rank_rules = [x for x in triage.recording_rules(config.load()) if x.record.startswith("rank:")
                  and x.record not in absent and not x.record.startswith("rank:ranksight_pipeline")]
    assert se["recorded_per_rank"] == len(rank_rules)
    # only the step-time baseline and the NIC day-best (windows over hours and days) are not backfilled
    assert r["backfill"]["rules_not_backfilled"] == _long_window_records()
    assert r["backfill"]["rules_source"] == "ranksight.alerts.generate.render"
    # every dashboard query ran, over the range, without error
    q = r["queries"]
    from ranksight.dashboards import generate as dgen

    assert q["source"].startswith("ranksight.dashboards.generate")
    assert q["count"] == len(dgen.queries(config.load())) == len(q["items"])
    kinds = {it["kind"] for it in q["items"]}
    assert kinds == {"range", "instant"}  # tables are instant queries, as Grafana sends them
    assert q["errors"] == []
    assert all(it["seconds"] > 0 for it in q["items"])
    assert q["slowest"]["seconds"] == max(it["seconds"] for it in q["items"])
    assert q["p50_seconds"] <= q["p99_seconds"] <= q["max_seconds"]
    with_data = [it for it in q["items"] if it["series"]]
    assert len(with_data) >= 0.8 * len(q["items"])
    # the rule groups evaluated live, healthy
    rules = {g["name"]: g for g in r["rules"]["groups"]}
    rule_doc = yaml.safe_load((keep / "ranksight-rules.yml").read_text())
    assert set(rules) == {g["name"] for g in rule_doc["groups"]}
    assert r["rules"]["data_lag_seconds"] < 60  # the live rules read the data's last minutes
    for g in rules.values():
        assert g["evaluations"] >= 2 and g["unhealthy"] == 0, g
        assert g["evaluation_seconds_max"] > 0
    # the scenario is visible to the rules: the straggler and the dataloader-bound node
    chk = r["checks"]
    assert chk["stragglers_flagged"] == [str(x) for x in r["scenario"]["stragglers"]]
    assert chk["dataloader_bound_nodes"] == [r["scenario"]["dataloader_node"]]
    assert r["prometheus"]["rss_bytes"] > 0
    # the kept TSDB holds the blocks promtool wrote
    listed = subprocess.run([scale.PROMTOOL, "tsdb", "list", str(keep / "tsdb")], capture_output=True,
                            text=True, timeout=30)
    assert listed.returncode == 0 and len(listed.stdout.strip().splitlines()) >= 3, listed.stdout


def test_bad_usage_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "x").write_text("")
    (tmp_path / "list.yml").write_text("- a\n- b\n")
    (tmp_path / "norules.yml").write_text("groups:\n- name: g\n")
    (tmp_path / "noexpr.yml").write_text("groups:\n- name: g\n  rules:\n  - record: r\n")
    for args in (["--nodes", "0"], ["--step", "fast"], ["--ranks-per-node", "9"], ["--keep", str(tmp_path)],
                 ["--concurrency", "4,x"], ["--concurrency", "4"], ["--rule-costs", "-1"],
                 ["--rules", str(tmp_path / "missing.yml")], ["--rules", str(tmp_path / "list.yml")],
                 ["--rules", str(tmp_path / "norules.yml")],
                 ["--engine", "victoriametrics", "--rules", str(tmp_path / "noexpr.yml")]):
        out = subprocess.run([sys.executable, "-m", "ranksight", "bench", "scale", *args],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert out.returncode == 2, (args, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr, out.stderr


@pytest.mark.slow
def test_victoriametrics_engine_reports_the_same_figures(tmp_path):
    for name in ("victoria-metrics", "vmalert"):
        try:
            servers.find_binary(name)
        except servers.MissingBinary as e:
            pytest.skip(f"--engine victoriametrics needs its binaries: {e}")
    cfg = tmp_path / "ranksight.yml"
    cfg.write_text("durations:\n  slow_rule_interval: 10s\n  baseline_rule_interval: 10s\n")
    keep = tmp_path / "kept"
    cmd = [sys.executable, "-m", "ranksight", "bench", "scale", "--engine", "victoriametrics", "--nodes", "2",
           "--gpus", "2", "--ranks-per-node", "2", "--hours", "3m", "--step", "5s", "--repeat", "1",
           "--rule-evals", "2", "--config", str(cfg), "--keep", str(keep), "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout)
    from ranksight.dashboards import generate as dgen

    q = r["queries"]
    assert q["count"] == len(dgen.queries(config.load())) == len(q["items"]) and q["errors"] == []
    assert q["p50_seconds"] <= q["p99_seconds"] <= q["max_seconds"]
    assert len([it for it in q["items"] if it["series"]]) >= 0.8 * len(q["items"])  # the records were backfilled
    groups = {g["name"]: g for g in r["rules"]["groups"]}
    rule_doc = yaml.safe_load(alerts_generate.render_rules(config.load()))
    assert set(groups) == {g["name"] for g in rule_doc["groups"]}
    for g in groups.values():
        assert g["evaluations"] >= 1 and g["evaluation_seconds_max"] > 0 and g["iterations_missed"] == 0, g
    assert r["store"]["rows_ignored"] == 0 and r["rules"]["vmalert_dropped_rows"] == 0
    assert r["store"]["rss_bytes"] > 0 and r["store"]["disk_bytes"] > 0
    assert r["import"]["samples"] > 0
    # the data reached past the live evaluation, so its rules read full windows and wrote records
    assert r["rules"]["data_left_seconds"] > 0 and "rules_warning" not in r, r["rules"]
    assert r["rules"]["records_last_evaluation_samples"] > 0
    assert r["scenario"]["data_end"] - r["scenario"]["data_start"] > 3 * 60  # the queried hours and a lead

    # the kept store measured again, once per concurrency, each rule's cost alone too, with a rule file
    # of its own (--rules: the config's rules and one more group)
    own = yaml.safe_load(alerts_generate.render_rules(config.load(str(cfg))))
    own["groups"].append({"name": "bench.extra", "rules": [{"record": "job:bench_steps:sum",
                                                            "expr": "sum by (job) (rank:ranksight_steps:rate)"}]})
    own_file = tmp_path / "own-rules.yml"
    own_file.write_text(yaml.safe_dump(own, sort_keys=False, width=100000))
    again = [sys.executable, "-m", "ranksight", "bench", "scale", "--engine", "victoriametrics", "--reuse", str(keep),
             "--repeat", "1", "--rule-evals", "2", "--config", str(cfg), "--concurrency", "2,all",
             "--concurrency-rounds", "1", "--rule-costs", "1", "--rules", str(own_file), "--json"]
    out = subprocess.run(again, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    r2 = json.loads(out.stdout)
    assert r2["import"] == {"reused": str(keep)} and r2["scenario"] == r["scenario"]
    assert r2["rules_source"] == str(own_file)
    by = r2["rules_by_concurrency"]
    assert list(by) == ["2", "all"] and all(len(v["rounds"]) == 1 for v in by.values())
    for v in by.values():
        assert set(v["groups"]) == set(groups) | {"bench.extra"} and v["rounds"][0]["records_last_evaluation_samples"] > 0
    costs = {g["name"]: g for g in r2["rule_costs"]["groups"]}
    assert set(costs) == set(groups) | {"bench.extra"}
    assert all(x["seconds"] > 0 and x["error"] is None for g in costs.values() for x in g["rules"])
    # a --reuse of a directory no VictoriaMetrics run kept: one error line
    out = subprocess.run(again[:8] + [str(tmp_path)] + again[9:], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
