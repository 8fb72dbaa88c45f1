"""Dashboards: schema, dashboard-linter rules, triage order, freshness, promtool, CLI.

Budget: a few seconds (one render per module, one promtool run, three CLI runs).
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import jsonschema
import pytest
import yaml

from ranksight import catalog as C
from ranksight import config, triage
from ranksight.dashboards import build, generate

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = Path(__file__).resolve().parents[1] / "data" / "grafana-schemas"
DS_UIDS = {"$datasource", "${datasource}"}

# Grafana unit ids (packages/grafana-data/src/valueFormats/categories.ts), the categories a
# training dashboard can use; the dashboard-linter's panel-units-rule checks against this list.
VALID_UNITS = {
    "none", "string", "short", "percent", "percentunit", "locale", "sci",
    "bytes", "decbytes", "bits", "decbits", "kbytes", "mbytes", "gbytes",
    "pps", "binBps", "Bps", "binbps", "bps", "KiBs", "MiBs", "GiBs", "KBs", "MBs", "GBs", "Gbits", "Mbits",
    "hertz", "ns", "µs", "ms", "s", "m", "h", "d", "dtdurationms", "dtdurations", "dthms", "dtdhms",
    "cps", "ops", "reqps", "rps", "wps", "iops", "cpm", "opm", "rpm", "wpm",
    "celsius", "fahrenheit", "kelvin", "watt", "kwatt", "mwatt", "joule",
    "bool", "bool_yes_no", "bool_on_off",
    "flops",  # Grafana's Computation category: FLOP/s
}


@pytest.fixture(scope="module")
def cfg():
    return config.load(env={})


@pytest.fixture(scope="module")
def boards(cfg) -> Dict[str, dict]:
    return generate.render(cfg)


def _panels(model) -> List[dict]:
    return list(generate.panels(model))


def _exprs(model) -> Iterator[Tuple[str, str]]:
    for p in _panels(model):
        for t in p.get("targets", []):
            yield p["title"], t["expr"]


def _schema(name: str) -> dict:
    return json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- JSON schema
def _dashboard_schema() -> dict:
    """The SDK's dashboard schema, with one documented correction.

    The schemas are generated from Grafana's CUE kinds, where a matcher's ``options`` and an
    override property's ``value`` are ``_`` (any value). The generator writes ``_`` as
    ``{"type": "object"}``, which would reject every real override (a byName matcher's
    options is the field name, a unit override's value is a string). Those two fields are
    relaxed to "any"; the assertion fails if a newer copy of the schemas changes them."""
    s = _schema("dashboard")
    d = s["definitions"]
    for defn, prop in (("MatcherConfig", "options"), ("DynamicConfigValue", "value")):
        assert d[defn]["properties"][prop].get("type") == "object", (defn, prop)
        d[defn]["properties"][prop] = {}
    return s


def _sub_validator(file: str, definition: str) -> jsonschema.Draft7Validator:
    s = _schema(file)
    return jsonschema.Draft7Validator({"$ref": f"#/definitions/{definition}", "definitions": s["definitions"]})


def _schema_errors(model: dict) -> List[str]:
    errors = [f"dashboard {list(e.absolute_path)}: {e.message[:200]}"
              for e in jsonschema.Draft7Validator(_dashboard_schema()).iter_errors(model)]
    query = jsonschema.Draft7Validator(_schema("prometheus"))
    for p in _panels(model):
        plugin = p["type"].replace("-", "")  # state-timeline -> statetimeline.jsonschema.json
        defs = _schema(plugin)["definitions"]
        checks = [("Options", p.get("options")), ("FieldConfig", p["fieldConfig"]["defaults"].get("custom"))]
        for definition, data in checks:
            if data is None:
                continue
            if definition not in defs:
                if data:
                    errors.append(f"{p['title']}: {plugin} has no {definition} schema but the panel sets {data}")
                continue
            for e in _sub_validator(plugin, definition).iter_errors(data):
                errors.append(f"{p['title']} {definition} {list(e.absolute_path)}: {e.message[:200]}")
        for t in p["targets"]:
            errors += [f"{p['title']} target: {e.message[:200]}" for e in query.iter_errors(t)]
    return errors


def test_dashboards_validate_against_sdk_schemas(boards):
    assert set(boards) == set(generate.FILES)
    for name, model in boards.items():
        assert _schema_errors(model) == [], name


def test_schema_check_can_fail(boards):
    bad = copy.deepcopy(boards["ranksight-triage.json"])
    p = next(p for p in _panels(bad) if p["type"] == "timeseries")
    p["options"]["legend"]["displayMode"] = "sideways"
    p["targets"][0]["format"] = "csv"
    bad["templating"]["list"][1]["refresh"] = 7
    errors = _schema_errors(bad)
    assert any("sideways" in e for e in errors) and any("csv" in e for e in errors)
    assert any("templating" in e for e in errors)


# ---------------------------------------------------------------- freshness
def test_committed_dashboards_equal_a_fresh_render(boards):
    for name, model in boards.items():
        path = ROOT / "dashboards" / name
        assert path.exists(), f"{path} is missing: run `ranksight dashboards --in-place`"
        assert path.read_text(encoding="utf-8") == generate.dumps(model), \
            f"{path} differs from a fresh render: run `ranksight dashboards --in-place` and commit the result"


def test_generator_writes_no_metric_name_literal():
    for f in sorted((ROOT / "dashboards").glob("*.py")):
        text = f.read_text(encoding="utf-8")
        assert C.PREFIX not in text.replace("ranksight_dashboard", ""), f"{f} spells a metric name"


# ---------------------------------------------------------------- dashboard-linter rules
def test_template_datasource_rule(boards):
    for name, model in boards.items():
        ds = [v for v in model["templating"]["list"] if v["type"] == "datasource"]
        assert len(ds) == 1, name
        assert ds[0]["name"] == "datasource" and ds[0]["label"] == "Data source" and ds[0]["query"] == "prometheus"


def test_panel_datasource_rule(boards):
    for name, model in boards.items():
        for p in _panels(model):
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            for t in p["targets"]:
                assert t.get("datasource", p["datasource"])["uid"] in DS_UIDS, (name, p["title"])


def test_panel_units_and_descriptions(boards):
    for name, model in boards.items():
        for p in _panels(model):
            where = (name, p["title"])
            assert p["fieldConfig"]["defaults"].get("unit") in VALID_UNITS, where
            for o in p["fieldConfig"]["overrides"]:
                for prop in o["properties"]:
                    if prop["id"] == "unit":
                        assert prop["value"] in VALID_UNITS, where
            assert len(p.get("description", "")) > 40, where
            assert p["targets"], where
            if p["type"] == "heatmap":
                assert p["options"]["cellValues"].get("unit") in VALID_UNITS, where


def test_panel_ids_unique_and_grid_within_24_columns(boards):
    for name, model in boards.items():
        ids = [p["id"] for p in model["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in model["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, (name, p["title"])


_RANGE = re.compile(r"\[([^\]]*)\]")


def test_rate_interval_rule(boards):
    """Every range selector (so every rate/irate/increase) uses $__rate_interval."""
    for name, model in boards.items():
        for title, expr in _exprs(model):
            for window in _RANGE.findall(expr):
                assert window == "$__rate_interval", (name, title, expr)
            for fn in ("rate(", "irate(", "increase("):
                for m in re.finditer(re.escape(fn), expr):
                    if m.start() and (expr[m.start() - 1].isalnum() or expr[m.start() - 1] == "_"):
                        continue  # e.g. "irate(" inside "rate(" search
                    tail = expr[m.end():]
                    assert re.match(r"[\w:]+(\{[^}]*\})?\[\$__rate_interval\]\)", tail), (name, title, expr)


_SERIES = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w:])([A-Za-z_:][\w:]*)(\{[^}]*\})?(\[[^\]]*\])?')


def _counter_names() -> set:
    names = {m.name for m in C.CATALOG.values() if m.type == "counter"}
    for m in C.CATALOG.values():
        if m.type == "histogram":
            names |= {m.bucket, m.sum, m.count}
    return names


def test_counters_only_inside_rate_or_increase(boards):
    counters = _counter_names()
    for name, model in boards.items():
        for title, expr in _exprs(model):
            for mo in _SERIES.finditer(expr):
                if mo.group(1) not in counters:
                    continue
                before = expr[:mo.start()]
                assert re.search(r"(?<![\w])(rate|irate|increase)\(\s*$", before) and mo.group(3), \
                    (name, title, f"counter {mo.group(1)} outside rate/increase: {expr}")


def test_job_node_rank_variables(boards):
    """job/node/rank: multi-select query variables with All, refreshed on time change, and every
    selector of a series that carries one of those labels filters on the variable."""
    known = build._known_series()
    for name, model in boards.items():
        variables = {v["name"]: v for v in model["templating"]["list"]}
        for var, label in (("job", "Job"), ("node", "Node"), ("rank", "Rank")):
            v = variables[var]
            assert v["type"] == "query" and v["label"] == label, (name, var)
            assert v["multi"] and v["includeAll"] and v["refresh"] == 2, (name, var)
            assert v["datasource"]["uid"] in DS_UIDS, (name, var)
            assert f"${var}" in json.dumps([e for _, e in _exprs(model)]), f"{name}: ${var} unused"
        for title, expr in _exprs(model):
            for mo in _SERIES.finditer(expr):
                series = mo.group(1)
                if series not in known:
                    continue
                matchers = mo.group(2) or ""
                for lab in ("job", "node", "rank"):
                    if lab in known[series]:
                        assert f'{lab}=~"${lab}"' in matchers, (name, title, series, lab)


# ---------------------------------------------------------------- triage order
def test_triage_rows_follow_the_triage_table(boards, cfg):
    model = boards["ranksight-triage.json"]
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    expected: List[str] = []
    by_order: Dict[int, List[triage.Entry]] = {}
    for e in triage.signals(cfg):
        by_order.setdefault(e.order, []).append(e)
    expected = [f"{order}. {entries[0].title}" for order, entries in by_order.items()]
    assert [order for order in by_order] == sorted(by_order) == [1, 2, 3, 4, 5, 6]
    assert rows == ["Goodput", "Overview"] + expected + ["Efficiency", "Progress", "Actions"]

    # Each signal entry has a panel in its own row that names its alert and draws its threshold.
    current, in_row = None, {}
    for p in model["panels"]:
        if p["type"] == "row":
            current = p["title"]
            in_row[current] = []
        else:
            in_row[current].append(p)
    for order, entries in by_order.items():
        panels = in_row[f"{order}. {entries[0].title}"]
        for e in entries:
            mine = [p for p in panels if f"Alert: {e.alert};" in p["description"]]
            assert len(mine) == 1, e.alert
            p = mine[0]
            assert "look at" in p["description"] and e.next_check in p["description"]
            steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
            drawn = 1.0 if e.unit == "bool" else e.threshold
            assert [s["value"] for s in steps] == [None, drawn], e.alert
            assert p["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] != "off"


def test_efficiency_row_draws_the_mfu_bands(boards, tmp_path):
    """After the six rows: MFU coloured and named by band (edges from the config), tokens/s and the
    model FLOP/s per GPU, from the efficiency group's records."""
    def row(model):
        panels = model["panels"]
        start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == "Efficiency")
        return {p["title"]: p for p in panels[start + 1:]}

    eff = row(boards["ranksight-triage.json"])
    steps = eff["MFU"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [(s["value"], s["color"]) for s in steps] == [
        (None, "red"), (0.15, "yellow"), (0.30, "green"), (0.45, "dark-green"), (0.55, "blue")]
    assert triage.REC["job_mfu"] in eff["MFU"]["targets"][0]["expr"]
    names = [(m["options"]["from"], m["options"]["to"], m["options"]["result"]["text"])
             for m in eff["MFU band"]["fieldConfig"]["defaults"]["mappings"]]
    assert names == [(None, 0.15, "serious problem"), (0.15, 0.30, "normal"), (0.30, 0.45, "good"),
                     (0.45, 0.55, "excellent"), (0.55, None, "near the hardware limit")]
    assert triage.REC["job_tokens"] in eff["Tokens per second"]["targets"][0]["expr"]
    assert triage.REC["rank_flops"] in eff["Model TFLOPS per GPU"]["targets"][0]["expr"]
    p = tmp_path / "c.yml"
    p.write_text("thresholds: {mfu_low: 0.2, mfu_good: 0.35}\n")
    steps = row(generate.render(config.load(str(p), env={}))["ranksight-triage.json"])["MFU"]
    assert [s["value"] for s in steps["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.2, 0.35, 0.45, 0.55]


def test_triage_top_row(boards):
    model = boards["ranksight-triage.json"]
    top = []
    rows = [i for i, p in enumerate(model["panels"]) if p["type"] == "row"]
    for p in model["panels"][rows[1] + 1:]:  # the Overview row (the Goodput row comes first)
        if p["type"] == "row":
            break
        top.append(p)
    exprs = " ".join(t["expr"] for p in top for t in p["targets"])
    for rec in (triage.REC["job_p50"], triage.REC["job_p99"], triage.REC["job_steps"],
                triage.REC["ranks_up"], triage.REC["ranks"]):
        assert rec in exprs
    assert 'ALERTS{alertname=~"Ranksight.*", alertstate="firing"' in exprs


def test_thresholds_follow_the_config(tmp_path):
    p = tmp_path / "c.yml"
    p.write_text("thresholds: {dataloader_wait_share: 0.25, straggler_ratio: 1.5}\n")
    models = generate.render(config.load(str(p), env={}))
    triage_steps = [pp["fieldConfig"]["defaults"]["thresholds"]["steps"] for pp in _panels(models["ranksight-triage.json"])
                    if "RanksightDataloaderBound;" in pp["description"]]
    assert triage_steps[0][1]["value"] == 0.25
    ranks = {pp["title"]: pp for pp in _panels(models["ranksight-ranks.json"])}
    assert ranks["Straggler ratio"]["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 1.5


# ---------------------------------------------------------------- scale: bounded panels
# The raw families with one series per port/counter, bucket, interface or node x result: at 1,024
# nodes a panel reading them directly took 26-88 s. Panels read their node-level recording rules.
RAW_HEAVY = {C.RDMA_PORT_COUNTER.name, C.GPU_UTILIZATION_SAMPLES.bucket, C.NET_IF_ERRORS.name,
             C.NET_IF_DROPS.name, C.NET_IF_BYTES.name, C.INGEST_DATAGRAMS.name}
# labels whose values number in the thousands at 1,024 nodes x 8 GPUs x 8 ranks
MANY = {"node", "rank", "local_rank", "gpu", "device", "port", "path"}
_AGG = re.compile(r"\s*(topk|bottomk|sum|min|max|avg|count|quantile)\s*(?:(by|without)\s*\(([^)]*)\))?\s*\(")


def _close(expr: str, i: int) -> int:
    """Index just past the parenthesis that closes the one at expr[i] (string literals skipped)."""
    depth, j = 0, i
    while j < len(expr):
        c = expr[j]
        if c == '"':
            j += 1
            while expr[j] != '"':
                j += 2 if expr[j] == "\\" else 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError(f"unbalanced: {expr}")


def _outer(expr: str):
    """(function, by|without|None, grouping labels, first argument, rest after the call) of an
    expression that starts with an aggregation, else None."""
    m = _AGG.match(expr)
    if not m:
        return None
    end = _close(expr, m.end() - 1)
    args, rest = expr[m.end():end - 1], expr[end:].strip()
    mode, labels = m.group(2), m.group(3)
    post = re.match(r"(by|without)\s*\(([^)]*)\)", rest)  # sum (x) by (job)
    if post and mode is None:
        mode, labels, rest = post.group(1), post.group(2), rest[post.end():].strip()
    grouping = {lab.strip() for lab in (labels or "").split(",") if lab.strip()}
    return m.group(1), mode, grouping, args.split(",", 1)[0].strip(), rest


def _bounded(expr: str, known: Dict[str, Tuple[str, ...]]) -> bool:
    """True when the query draws a bounded number of series however many ranks, GPUs, devices,
    ports and nodes there are: it reads only job-level series, or it is a topk/bottomk of at most
    K (per job), or an aggregation that keeps none of the many-valued labels, or a table column
    restricted to a topk."""
    names = {mo.group(1) for mo in _SERIES.finditer(expr) if mo.group(1) in known}
    if all(set(known[n]) <= {"job"} for n in names):
        return True
    o = _outer(expr)
    if o is not None:
        fn, mode, grouping, first, rest = o
        if rest == "":
            if fn in ("topk", "bottomk"):
                return first.isdigit() and int(first) <= build.K and not (grouping & MANY)
            return mode != "without" and not (grouping & MANY)
    m = re.search(r"\sand on \(([^)]*)\) ", expr)  # the series of the K worst (ranks, GPUs)
    return bool(m) and bool(m.group(1).strip()) and _bounded(expr[m.end():], known)


def test_bounded_check_can_fail():
    known = build._known_series()
    R = triage.REC
    assert _bounded(f'topk(10, {R["straggler"]}{{job=~"$job"}})', known)
    assert _bounded(f'sum by (le) ({R["util_samples"]})', known)
    assert _bounded(f'{R["ranks"]}{{job=~"$job"}} - {R["ranks_up"]}{{job=~"$job"}}', known)
    assert _bounded(f'max without () ({R["busy"]}) and on (job, rank) topk(10, {R["straggler"]})', known)
    for bad in (f'{R["straggler"]}{{job=~"$job"}}', f'topk(5000, {R["straggler"]})',
                f'sum by (node, gpu) ({R["gpu_util"]})', f'topk(10, {R["busy"]}) / {R["busy"]}',
                f'max without () ({R["busy"]}) and on (job, rank) {R["straggler"]}',
                f'max without () ({R["busy"]}) and on () topk(10, {R["straggler"]})',
                f'sum without (rank) ({R["busy"]})', f'{R["retrans"]} > 0.01'):
        assert not _bounded(bad, known), bad


def test_every_fleet_panel_is_bounded_or_abnormal_only(cfg, boards):
    """At 1,024 nodes x 8 GPUs x 8 ranks no panel draws one series per rank, GPU, device, port
    or node: it draws the K worst, an aggregate, or (abnormal-only panels) a comparison filter."""
    known = build._known_series()
    abnormal = generate.abnormal_only(cfg)
    rules = {r.record: r.expr for r in triage.recording_rules(cfg)}
    unbounded = []
    for name, model in boards.items():
        for title, expr in _exprs(model):
            if (name, title) in abnormal:
                # a comparison filter in the query, or in the rule it reads (a series only while active)
                reads = [rules[n] for n in rules if n in expr]
                assert re.search(r" (==|>|<) ", " ".join([expr] + reads)), (name, title, expr)
                continue
            if not _bounded(expr, known):
                unbounded.append(f"{name} | {title} | {expr}")
    assert unbounded == [], "\n".join(unbounded)


def test_no_panel_reads_a_raw_high_cardinality_family(cfg, boards):
    rules = {r.record: r.expr for r in triage.recording_rules(cfg)}
    read = set()
    for name, model in boards.items():
        for title, expr in _exprs(model):
            names = {mo.group(1) for mo in _SERIES.finditer(expr)}
            assert not names & RAW_HEAVY, (name, title, expr)
            read |= {n for n in names if ":" in n}
    # every recording rule a panel reads exists, and the raw families are read there
    assert read - set(rules) == set(), "panels read recording rules nobody records"
    for raw in RAW_HEAVY:
        assert any(raw in e for r, e in rules.items() if r in read), raw


def test_bounded_panels_say_so(cfg, boards):
    abnormal = generate.abnormal_only(cfg)
    assert ("ranksight-node.json", "Ranks on these nodes") in abnormal
    assert ("ranksight-node.json", "XID errors") in abnormal
    for name, model in boards.items():
        for p in _panels(model):
            exprs = " ".join(t["expr"] for t in p["targets"])
            if re.search(rf"(topk|bottomk)\({build.K},", exprs):
                assert f"the {build.K} " in p["description"], (name, p["title"])
                assert "$rank" in p["description"] or "$node" in p["description"], (name, p["title"])
            # one place: the flag, the export and the description agree
            assert (build.ABNORMAL in p["description"]) == ((name, p["title"]) in abnormal), (name, p["title"])


def test_rdma_panels_name_only_counters_the_agent_exposes(boards):
    """The agent exposes a curated allowlist of RDMA counters (catalog.RDMA_CURATED_COUNTERS, which
    the scale benchmark models): a panel naming any other would stay empty. The named error
    counters are not traffic (they fall into the error rule), and the traffic regex matches the
    traffic counters."""
    from ranksight.tools.bench import load

    scale = load("scale")
    curated = set(C.RDMA_CURATED_COUNTERS)
    assert curated == set(scale.RDMA_CURATED)
    named = set(build.RDMA_ERRORS_NAMED + build.RDMA_CONGESTION_NAMED)
    assert named <= curated, named - curated
    traffic = re.compile(f"^(?:{triage.RDMA_TRAFFIC})$")
    assert not [c for c in named if traffic.match(c)]
    for c in ("port_rcv_packets", "port_xmit_packets", "port_rcv_data", "port_xmit_data", "unicast_rcv_packets",
              "multicast_xmit_packets"):
        assert traffic.match(c), c
    rdma = [p for p in _panels(boards["ranksight-node.json"]) if p["title"].startswith("RDMA")]
    assert len(rdma) == 3
    words = set()
    for p in rdma:
        words |= set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", p["description"]))
        for t in p["targets"]:
            for m in re.finditer(r'counter=~?"([^"]*)"', t["expr"]):
                words |= {c for c in curated | named if re.fullmatch(m.group(1), c)}
    assert len(words) >= 10 and words <= curated, words - curated


def test_rank_heatmap_rows_sort_numerically(boards):
    """Grafana's heatmap orders series rows numerically only if every row name parses as a number
    (parseFloat, which reads a leading number): the rank comes first in the row name."""
    heat = [p for p in _panels(boards["ranksight-ranks.json"]) if p["type"] == "heatmap"]
    assert len(heat) == 2
    for p in heat:
        for t in p["targets"]:
            legend = t["legendFormat"]
            assert legend.startswith("{{rank}}") and re.match(r"[\d.]+", legend.replace("{{rank}}", "10", 1))


# ---------------------------------------------------------------- PromQL
def _promtool() -> str:
    exe = shutil.which("promtool") or "/usr/bin/promtool"
    assert Path(exe).exists(), "promtool missing: apt-get install prometheus (scripts/setup does)"
    return exe


def _check_rules(tmp_path: Path, exprs: List[str]) -> subprocess.CompletedProcess:
    rules = [{"record": f"ranksight_dashboard:query_{i}:check", "expr": e} for i, e in enumerate(exprs)]
    f = tmp_path / "dashboard-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}), encoding="utf-8")
    return subprocess.run([_promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=60)


def test_every_panel_expression_parses_in_promtool(cfg, tmp_path):
    qs = generate.queries(cfg)
    assert len(qs) > 60
    exprs = [generate.substitute(e) for _, _, e in qs]
    exprs += [generate.substitute(e, job=["demo.job", "b"], node=["n-1"], rank=["0", "1"]) for _, _, e in qs]
    r = _check_rules(tmp_path, exprs)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in r.stdout
    # and the check can fail
    r = _check_rules(tmp_path, [generate.substitute(qs[0][2]) + " by (job"])
    assert r.returncode != 0


def test_substitute_like_grafana():
    e = 'rate(x{job=~"$job", node=~"${node}", rank=~"[[rank]]"}[$__rate_interval]) [$__interval] $__range_s'
    assert generate.substitute(e) == 'rate(x{job=~".*", node=~".*", rank=~".*"}[1m]) [1m] 3600'
    out = generate.substitute(e, job=["a.b", "c"], node=["n1"], rank=["3"], rate_interval="2m", interval="30s")
    assert out == 'rate(x{job=~"(a\\\\.b|c)", node=~"n1", rank=~"3"}[2m]) [30s] 3600'
    with pytest.raises(ValueError):
        generate.substitute("x[$__nope]")


def test_dashboard_expr_adds_matchers_and_rate_interval():
    e = f'increase({C.HEARTBEAT_MISSES}[5m]) > 0 and {C.RANK_STALLED}{{reason="no_progress"}} == 1'
    out = build.dashboard_expr(e)
    assert out == (f'increase({C.HEARTBEAT_MISSES}{{job=~"$job", node=~"$node", rank=~"$rank"}}[$__rate_interval]) > 0'
                   f' and {C.RANK_STALLED}{{reason="no_progress", job=~"$job", node=~"$node", rank=~"$rank"}} == 1')
    assert build.dashboard_expr(f'{triage.REC["retrans"]} > 0.01') == f'{triage.REC["retrans"]}{{node=~"$node"}} > 0.01'


# ---------------------------------------------------------------- CLI
def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ranksight.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def test_cli_writes_checks_and_rejects_bad_input(tmp_path, boards):
    out = tmp_path / "d"
    r = _cli("dashboards", "--out", str(out))
    assert r.returncode == 0, r.stderr
    for name, model in boards.items():
        assert (out / name).read_text(encoding="utf-8") == generate.dumps(model)
    assert _cli("dashboards", "--out", str(out), "--check").returncode == 0
    (out / generate.FILES[0]).write_text("{}\n")
    r = _cli("dashboards", "--out", str(out), "--check")
    assert r.returncode == 1 and f"run `ranksight dashboards --out {out}`" in r.stdout
    bad = tmp_path / "bad.yml"
    bad.write_text("thresholds: {comm_share: 7}\n")
    r = _cli("dashboards", "--config", str(bad), "--out", str(out))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "comm_share" in r.stderr
