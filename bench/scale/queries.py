"""The rules the benchmark backfills and evaluates, and the dashboard queries it times."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from ranksight import triage
from .server import BenchError


# ------------------------------------------------------------------------------ rules and queries
def rules_source(rules_file: Optional[str], cfg: Mapping[str, Any]) -> Tuple[str, str]:
    """(rule file text, where it came from): ``--rules FILE`` as it is, else ``rules_text(cfg)``.
    A file that is not a Prometheus rule file (groups, each with a name and rules, each rule a record
    or an alert with an expr) is a BenchError naming the first thing wrong."""
    if not rules_file:
        return rules_text(cfg)
    try:
        text = Path(rules_file).read_text()
        doc = yaml.safe_load(text)
    except OSError as e:
        raise BenchError(f"--rules {rules_file}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise BenchError(f"--rules {rules_file}: not YAML: {str(e).splitlines()[0]}") from None
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list) or not groups:
        raise BenchError(f"--rules {rules_file}: not a rule file (no list of groups)")
    for i, g in enumerate(groups):
        rules = g.get("rules") if isinstance(g, dict) else None
        if not isinstance(rules, list) or not isinstance(g.get("name"), str):
            raise BenchError(f"--rules {rules_file}: group {i + 1} needs a name and a list of rules")
        for r in rules:
            if not (isinstance(r, dict) and isinstance(r.get("expr"), str) and (r.get("record") or r.get("alert"))):
                raise BenchError(f"--rules {rules_file}: group {g['name']}: every rule needs a record or an "
                                 f"alert and an expr")
    return text, rules_file


def rules_text(cfg: Mapping[str, Any]) -> Tuple[str, str]:
    """(rule file text, where it came from): the alerts generator's output, or the triage
    table rendered here while that generator is missing."""
    try:
        from ranksight.alerts import generate as agen
        files = agen.render(cfg)
        name = getattr(agen, "RULES_FILE", "ranksight-rules.yml")
        return files[name], "ranksight.alerts.generate.render"
    except ImportError:
        pass
    groups = [
        {"name": "ranksight.recording",
         "rules": [{"record": r.record, "expr": r.expr} for r in triage.recording_rules(cfg)]},
        {"name": "ranksight.alerts",
         "rules": [{"alert": e.alert, "expr": e.expr, "for": e.for_, "labels": {"severity": e.severity}}
                   for e in triage.table(cfg)]},
    ]
    return yaml.safe_dump({"groups": groups}, sort_keys=False), "ranksight.triage (fallback)"


_EQUAL = re.compile(r'\s*([a-zA-Z_]\w*)\s*=\s*"([^"\\,]*)"\s*')


def _equal_filter(matchers: str) -> Optional[str]:
    """``{a="x", b="y"}`` as what follows ``and`` to keep only the series with those labels: ``on
    (a, b)`` a one-series vector labelled a="x", b="y". None for any other matcher (regex, negated)."""
    labels, vec = [], "vector(1)"
    for part in matchers.strip()[1:-1].split(","):
        m = _EQUAL.fullmatch(part)
        if not m:
            return None
        labels.append(m.group(1))
        vec = f'label_replace({vec}, "{m.group(1)}", "{m.group(2)}", "", "")'
    return f"on ({', '.join(labels)}) {vec}"


def expand_recording_rules(text: str) -> Tuple[str, List[str]]:
    """A rule file with only the recording rules, each expression with the recording rules it
    reads inlined, so ``promtool tsdb create-blocks-from rules`` can backfill all of them in
    one pass (it evaluates every rule against the raw data only). A read with equality matchers,
    ``R{a="x"}``, inlines as ``((E) and on (a) <a one-series vector labelled a="x">)``. Returns
    (yaml text, records that could not be inlined because they are read with a range or another
    matcher)."""
    doc = yaml.safe_load(text) or {}
    recs: Dict[str, str] = {}
    groups_out = []
    for g in doc.get("groups", []):
        rules = [r for r in g.get("rules", []) if "record" in r]
        for r in rules:
            recs[r["record"]] = r["expr"]
    names = sorted(recs, key=len, reverse=True)
    skipped: List[str] = []

    def inline(expr: str, depth: int = 0) -> Optional[str]:
        if depth > 8:
            return None
        for name in names:
            pat = re.compile(r"(?<![\w:])" + re.escape(name) + r"(?![\w:])(\s*\{[^{}]*\})?(\s*\[)?")
            reads = list(pat.finditer(expr))
            if not reads:
                continue
            filters = [_equal_filter(m.group(1)) if m.group(1) else "" for m in reads]
            if any(m.group(2) for m in reads) or None in filters:
                return None
            sub = inline(recs[name], depth + 1)
            if sub is None:
                return None
            pieces = iter(f"(({sub}) and {f})" if f else f"({sub})" for f in filters)
            expr = pat.sub(lambda _m: next(pieces), expr)
        return expr

    for g in doc.get("groups", []):
        out_rules = []
        for r in g.get("rules", []):
            if "record" not in r:
                continue
            e = inline(r["expr"])
            if e is None:
                skipped.append(r["record"])
                continue
            nr = {"record": r["record"], "expr": e}
            if r.get("labels"):
                nr["labels"] = r["labels"]
            out_rules.append(nr)
        if out_rules:
            ng = {"name": g["name"], "rules": out_rules}
            if g.get("interval"):
                ng["interval"] = g["interval"]
            groups_out.append(ng)
    return yaml.safe_dump({"groups": groups_out}, sort_keys=False), skipped


def split_rule_file(text: str, out_dir: Path) -> List[Path]:
    """One rule file per recording rule (same group name and interval), for parallel backfill."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in (yaml.safe_load(text) or {}).get("groups", []):
        for r in g.get("rules", []):
            ng = {"name": g["name"], "rules": [r]}
            if g.get("interval"):
                ng["interval"] = g["interval"]
            path = out_dir / f"rule{len(paths):03d}.yml"
            path.write_text(yaml.safe_dump({"groups": [ng]}, sort_keys=False))
            paths.append(path)
    return paths


Query = Tuple[str, str, str, str]  # (dashboard, panel title, expr, "range" | "instant")


def dashboard_queries(cfg: Mapping[str, Any]) -> Tuple[List[Query], str, Callable[..., str]]:
    """(queries, source, substitute): every panel target of the generated dashboards, with
    "instant" for targets Grafana sends to /api/v1/query (tables), "range" otherwise; or the
    triage table's indicators while the dashboards generator is missing."""
    try:
        from ranksight.dashboards import generate as dgen
    except ImportError:
        rows = [("triage-indicators", e.title, e.indicator, "range") for e in triage.table(cfg)]

        def substitute(expr: str, **_: Any) -> str:
            return expr

        return rows, "ranksight.triage indicators (fallback)", substitute
    out: List[Query] = []
    for name, model in dgen.render(cfg).items():
        for p in dgen.panels(model):
            for t in p.get("targets", []):
                if not t.get("expr"):
                    continue
                instant = bool(t.get("instant")) and not t.get("range", False)
                out.append((name, p["title"], t["expr"], "instant" if instant else "range"))
    return out, "ranksight.dashboards.generate (every panel target)", dgen.substitute


def load_queries_file(path: str) -> Tuple[List[Query], str, Callable[..., str]]:
    """A JSON list of [dashboard, panel, expr] or [dashboard, panel, expr, "range"|"instant"]
    whose variables are already substituted (``--dump-queries`` writes one)."""
    try:
        rows = json.loads(Path(path).read_text())
        out: List[Query] = []
        for row in rows:
            d, t, e = row[:3]
            kind = row[3] if len(row) > 3 else "range"
            if kind not in ("range", "instant"):
                raise ValueError(f"kind {kind!r}")
            out.append((str(d), str(t), str(e), kind))
    except (OSError, ValueError, TypeError) as e:
        raise BenchError(f"--queries {path}: expected a JSON list of [dashboard, panel, expr, kind]: {e}") from None

    def substitute(expr: str, **_: Any) -> str:
        return expr

    return out, path, substitute


def substitute_all(substitute: Callable[..., str], expr: str, job: str, step: int, hours: float) -> str:
    """The variables Grafana sends with every variable at All: all nodes and ranks of the job,
    $__rate_interval = max(4 x scrape interval, 1m), $__interval = the step."""
    rate_interval = f"{max(4 * step, 60)}s"
    try:
        return substitute(expr, job=[job], node=".*", rank=".*", rate_interval=rate_interval,
                          interval=f"{step}s", range_=f"{int(hours * 3600)}s")
    except TypeError:
        return substitute(expr, job=[job], node=".*", rank=".*", rate_interval=rate_interval)


def substituted_queries(cfg: Mapping[str, Any], job: str, step: int, hours: float) -> List[Query]:
    rows, _, substitute = dashboard_queries(cfg)
    return [(d, t, substitute_all(substitute, e, job, step, hours), k) for d, t, e, k in rows]


