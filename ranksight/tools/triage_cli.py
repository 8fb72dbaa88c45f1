"""`ranksight triage`: walk the six triage checks against Prometheus and name the first cause.

The walk is generated from the triage table (``ranksight.triage``): the six
signals in order, then the extra causes, then the symptoms. For every entry it
asks Prometheus for the alert expression without its ``for:`` (which series are
abnormal now, or at any point of ``--since``) and for the entry's indicator (the
value to print). A job can be slow long before an alert's ``for:`` elapses, so
the verdict comes from the indicators; firing ``ALERTS`` are shown beside them.

A symptom whose known cause is also abnormal is reported as explained by that
cause, using the same relation Alertmanager uses to mute it (the entries'
``inhibits`` with their ``equal`` labels): a high comm share on rank 0 is
explained by rank 1 being a straggler; rank 0 blocked in a collective is
explained by rank 1 being stalled. The first abnormal entry that nothing
explains is the cause.

Exit status: 0 healthy, 1 a problem was found, 2 usage error or Prometheus
unreachable (one line on stderr).
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from .. import catalog as C
from .. import config, triage
from ..cli import error
from ..triage import Entry
from .plumbing import ApiError, PrometheusAPI, Sample

WALK_KINDS = ("signal", "cause", "symptom")  # what can be "the cause"; lints and health are notes
# Symptoms of waiting on peers in collectives: a cause on any node of the job explains them (see Walk._explain).
JOB_WIDE_SYMPTOMS = frozenset(e.alert for e in triage.table(config.defaults()) if e.id in ("comm-bound", "rank-blocked"))
_SHOWN_LABELS = ("job", "node", "rank", "gpu", "device", "path", "instance", "collector", "lint", "xid")


class TriageError(ApiError):
    """One line for the user; exit 2 (as is every ApiError from the Prometheus client)."""


def alert_rules(prom: PrometheusAPI) -> Dict[str, Tuple[float, Tuple[float, ...]]]:
    """alert name -> (its `for:` in seconds, the range windows in its expression, in seconds) for
    the alerting rules Prometheus evaluates; {} when it cannot say."""
    try:
        return {rule["name"]: (float(rule.get("duration", 0)), _windows(rule.get("query", "")))
                for g in prom.rules("alert") for rule in g["rules"]}
    except (ApiError, KeyError, TypeError):
        return {}


def connect(url: str, timeout: float) -> PrometheusAPI:
    """The Prometheus client for --prometheus URL; TriageError (one line) on a bad URL."""
    try:
        return PrometheusAPI(url, timeout)
    except ApiError as e:
        raise TriageError(f"--prometheus: {e}") from None


# ------------------------------------------------------------------ the walk
@dataclass
class Finding:
    """One abnormal series of one entry."""

    entry: Entry
    labels: Dict[str, str]
    value: Optional[float]  # the indicator's value for this series (None when it has no indicator series)
    explained_by: List["Finding"] = field(default_factory=list)

    @property
    def where(self) -> Dict[str, str]:
        return {k: self.labels[k] for k in self.entry.scope if self.labels.get(k, "") != ""}


@dataclass
class Check:
    entry: Entry
    worst: Optional[Sample]  # worst indicator series (max for ">", min for "<")
    series: int  # how many indicator series were seen
    findings: List[Finding]
    firing: List[Dict[str, str]]  # firing ALERTS series of this entry

    @property
    def verdict(self) -> str:
        if self.findings:
            if all(f.explained_by for f in self.findings):
                return "explained"
            return "abnormal"
        if self.firing:
            return "firing"  # the alert still fires but the indicator recovered (or its window differs)
        return "ok" if self.series else "no data"


@dataclass
class Report:
    prometheus: str
    job: Optional[str]
    since: Optional[str]
    at: float
    checks: List[Check]
    cause: Optional[Finding]
    causes: List[Finding]
    notes: List[str]
    places: List[str] = field(default_factory=list)  # where the stalled ranks are, and what the blocked ones wait in

    @property
    def healthy(self) -> bool:
        return not self.causes


def _windows(expr: str) -> Tuple[float, ...]:
    """Range and subquery windows of a PromQL expression, in seconds, sorted (`[5m]`, `[15m:1m]`)."""
    return tuple(sorted(config.duration_seconds(w) for w in re.findall(r"\[\s*(\w+)\s*(?::[^\]]*)?\]", expr)))


def _joined(e: Entry) -> Tuple[str, ...]:
    """Labels a node-scoped alert takes from the ranks on its node (e.g. the training job)."""
    return tuple(getattr(e, "joined", ()) or ())


def _over(expr: str, since: Optional[str], fn: str) -> str:
    """The instant expression, or its worst value over the last ``since`` (a subquery at the rule interval)."""
    return expr if not since else f"{fn}(({expr})[{since}:])"


def _fmt_value(v: Optional[float], unit: str, multiple: bool = False) -> str:
    if v is None:
        return "-"
    if unit == "ratio":
        return f"{v:.2f}x" if multiple else f"{v:.1%}"
    if unit == "seconds":
        return f"{v:.3g} s" if v < 120 else f"{v / 60:.1f} min"
    if unit == "bytes":
        for suffix, div in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
            if abs(v) >= div:
                return f"{v / div:.3g} {suffix}"
        return f"{v:g} B"
    if unit == "per_minute":
        return f"{v:.3g}/min"
    return f"{v:.4g}"


def _fmt_threshold(e: Entry) -> str:
    if e.threshold is None:
        return "below max"
    if e.unit == "bool":
        return "== 0" if e.op == "<" else "== 1"
    return f"{e.op} {_fmt_value(e.threshold, e.unit, _multiple(e))}"


def _multiple(e: Entry) -> bool:
    """A ratio to a reference (the straggler's 1.2x the job median), not a share of 1."""
    return e.unit == "ratio" and e.threshold is not None and e.threshold >= 1


def _fmt_labels(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={labels[k]}" for k in _SHOWN_LABELS if labels.get(k, "") != "")


def _where(e: Entry, labels: Mapping[str, str], show_job: bool = True) -> str:
    """The labels that say where: the entry's scope (job only when not triaging one job)."""
    keep = [k for k in e.scope if show_job or k != "job"]
    return _fmt_labels({k: v for k, v in labels.items() if k in keep})


class Walk:
    """Runs the table's queries and builds the report."""

    def __init__(self, prom: PrometheusAPI, cfg: Mapping[str, Any], job: Optional[str], since: Optional[str]) -> None:
        self.prom = prom
        self.cfg = cfg
        self.job = job
        self.since = since
        self.at = time.time()
        self.nodes: Optional[set] = None  # nodes hosting the job's ranks (when --job)

    def q(self, expr: str) -> List[Sample]:
        return self.prom.samples(expr, self.at)

    # -- scoping to --job
    def _keep(self, e: Entry, labels: Mapping[str, str]) -> bool:
        if self.job is None:
            return True
        if "rank" in e.scope or "job" in e.scope:
            return labels.get("job") == self.job
        if "job" in _joined(e) and labels.get("job", "") not in ("", triage.SCRAPE_JOB):
            return labels["job"] == self.job  # a node alert that carries the training jobs of its node's ranks
        if "node" in e.scope and self.nodes is not None:
            return labels.get("node") in self.nodes
        return True

    def _jobs(self) -> Dict[str, set]:
        """job -> nodes, from the rank series the agents expose."""
        expr = _over(str(C.RANK_UP), self.since, "max_over_time")
        out: Dict[str, set] = {}
        for s in self.q(expr):
            out.setdefault(s.labels.get("job", ""), set()).add(s.labels.get("node", ""))
        return out

    def _firing(self) -> Dict[str, List[Dict[str, str]]]:
        sel = 'ALERTS{alertstate="firing",alertname=~"Ranksight.*"}'
        out: Dict[str, List[Dict[str, str]]] = {}
        for s in self.q(_over(sel, self.since, "max_over_time")):
            out.setdefault(s.labels.get("alertname", ""), []).append(s.labels)
        return out

    def check(self, e: Entry, firing: Dict[str, List[Dict[str, str]]]) -> Check:
        fn_worst = "max_over_time" if e.op == ">" else "min_over_time"
        ind = [s for s in self.q(_over(e.indicator, self.since, fn_worst)) if self._keep(e, s.labels)]
        bad = [s for s in self.q(_over(e.expr, self.since, "max_over_time")) if self._keep(e, s.labels)]
        by_scope = {s.key(e.scope): s for s in ind}
        worst = None
        if ind:
            worst = (max if e.op == ">" else min)(ind, key=lambda s: s.value)
        findings = []
        for s in bad:
            i = by_scope.get(s.key(e.scope))
            labels = dict(i.labels if i else s.labels)
            labels.update({k: s.labels[k] for k in _joined(e) if k in s.labels})  # e.g. the node's training job
            findings.append(Finding(e, labels, i.value if i else None))
        fired = [l for l in firing.get(e.alert, []) if self._keep(e, l)]
        # the places whose alert fired first (what Alertmanager pages), then the worst value: an
        # instance whose condition holds but whose `for:` has not passed yet is named after them
        paged = {tuple(l.get(n, "") for n in e.scope) for l in fired}
        findings.sort(key=lambda f: (tuple(f.labels.get(n, "") for n in e.scope) not in paged, f.value is None,
                                     -(f.value or 0) if e.op == ">" else (f.value or 0)))
        return Check(e, worst, len(ind), findings, fired)

    def run(self) -> Report:
        jobs = self._jobs()
        notes: List[str] = []
        if self.job is not None:
            if self.job not in jobs:
                known = ", ".join(sorted(jobs)) or "none"
                when = f" in the last {self.since}" if self.since else ""
                raise TriageError(f"no ranksight series for job {self.job!r} in Prometheus{when} (jobs seen: {known})")
            self.nodes = jobs[self.job]
        elif not jobs:
            notes.append("no rank reports any data (is a watched job running and its node agent scraped?)")
        firing = self._firing()
        table = triage.table(self.cfg)
        notes += self._rules_mismatch(table)
        rank = {k: i for i, k in enumerate(WALK_KINDS)}
        walk = sorted((e for e in table if e.kind in WALK_KINDS),
                      key=lambda e: (rank[e.kind], e.order))  # stable: table order within a kind
        checks = [self.check(e, firing) for e in walk]
        self._explain([f for c in checks for f in c.findings], jobs)
        causes = [f for c in checks for f in c.findings if not f.explained_by]
        for e in table:
            if e.kind in ("lint", "health"):
                c = self.check(e, firing)
                for f in c.findings:
                    what = "" if e.kind == "lint" else "monitoring blind spot: "  # a lint's summary says "Setup lint"
                    notes.append(f"{what}{e.summary} ({_where(e, f.labels, show_job=self.job is None)})")
        return Report(self.prom.url, self.job, self.since, self.at, checks, causes[0] if causes else None, causes, notes,
                      self._places() if causes else [])

    def _places(self) -> List[str]:
        """The chain of a hang: each stalled rank's place (its stack's innermost user frame) and the
        collective each blocked rank waits in, from the agents' where and collective series."""
        sel = f'{{job="{self.job}"}}' if self.job is not None else ""
        waits = {(s.labels.get("job", ""), s.labels.get("rank", "")): s for s in self.q(f"{C.RANK_COLLECTIVE_WAIT}{sel}")}
        seqs = {(s.labels.get("job", ""), s.labels.get("rank", "")): s.value for s in self.q(f"{C.RANK_COLLECTIVE_SEQ}{sel}")}
        out: List[Tuple[int, str]] = []
        for s in self.q(f"{C.RANK_STALL_WHERE}{sel}"):
            job, rank = s.labels.get("job", ""), s.labels.get("rank", "")
            who = f"rank {rank}" if self.job is not None else f"job {job} rank {rank}"
            w = waits.get((job, rank))
            if w is not None:
                seq = seqs.get((job, rank))
                out.append((1, f"{who} waits in {w.labels.get('op', '?')} #{seq:.0f} on the {w.labels.get('pg', '?')} "
                               f"group for {w.value:.0f} s (at {s.labels.get('where', '?')})"))
            else:
                what = "hangs in the data pipeline" if s.labels.get("phase") == "data" else "stuck"
                out.append((0, f"{who} {what} at {s.labels.get('where', '?')} for {s.value:.0f} s"))
        return [line for _, line in sorted(out)]

    def _rules_mismatch(self, table: Sequence[Entry]) -> List[str]:
        """The walk judges with this config's thresholds and windows; say so when Prometheus evaluates
        rules generated from another config or profile (e.g. `--profile test` for the demo stack)."""
        loaded = alert_rules(self.prom)
        ours = {e.alert: (config.duration_seconds(e.for_), _windows(e.expr)) for e in table}
        differ = sorted(a for a in ours if a in loaded and loaded[a] != ours[a])
        if not differ:
            return []
        return [f"{len(differ)} of the ranksight alert rules in Prometheus have other `for:` durations or windows than "
                f"this config's (e.g. {differ[0]}): pass the --config/--profile the rules were generated with"]

    @staticmethod
    def _explain(findings: List[Finding], jobs: Mapping[str, set]) -> None:
        """Mark each finding with the abnormal findings that would mute its alert in Alertmanager.

        One widening beyond Alertmanager's label equality: a collective symptom (comm share,
        blocked in a collective) is job-wide, since every rank of a job waits on the same
        collectives. A node-scoped cause (retransmits, a slow NIC) on any node hosting a rank
        of the job explains it, not only on the symptom's own node: loss on host A's link
        slows the all-reduce of the rank on host B just as much.
        """
        for f in findings:
            for g in findings:
                if g.entry.alert == f.entry.alert:
                    continue
                for inh in g.entry.inhibits:
                    if f.entry.alert not in inh.targets:
                        continue
                    if all(f.labels.get(l, "") == g.labels.get(l, "") for l in inh.equal) or (
                            f.entry.alert in JOB_WIDE_SYMPTOMS and inh.equal == ("node",)
                            and "rank" not in g.entry.scope
                            and g.labels.get("node", "") in jobs.get(f.labels.get("job", ""), ())):
                        f.explained_by.append(g)
                        break
        # A cycle (A explains B explains A) would leave nothing to name: keep the earlier one as a cause.
        for f in findings:
            if f.explained_by and all(f in g.explained_by for g in f.explained_by):
                f.explained_by = []


# ------------------------------------------------------------------ output
def _finding_line(f: Finding) -> str:
    return f"{f.entry.alert} ({_where(f.entry, f.labels)})"


def render_text(r: Report) -> str:
    when = datetime.fromtimestamp(r.at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    span = f"worst over the last {r.since}" if r.since else "now"
    lines = [f"ranksight triage  {r.prometheus}  job={r.job or '(all)'}  {when} ({span})", ""]
    head = f"{'#':>2}  {'check':<40} {'value':<12} {'where':<34} {'threshold':<11} verdict"
    section = None
    for c in r.checks:
        e = c.entry
        if e.kind != section:
            section = e.kind
            title = {"signal": "the six signals, in triage order", "cause": "extra causes",
                     "symptom": "symptoms"}[section]
            lines += [f"{title}:", head] if section == "signal" else ["", f"{title}:"]
        shown = c.findings[0] if c.findings else None
        value = shown.value if shown else (c.worst.value if c.worst else None)
        labels = shown.labels if shown else (c.worst.labels if c.worst else {})
        verdict = {"ok": "ok", "no data": "no data", "firing": "alert firing, indicator back to normal",
                   "abnormal": "ABNORMAL", "explained": "explained"}[c.verdict]
        if c.findings:
            n = len(c.findings)
            if n > 1:
                verdict += f" ({n} series)"
            ex = [f for f in c.findings if f.explained_by]
            if ex and c.verdict == "abnormal":
                verdict += f", {len(ex)} explained"
            if c.verdict == "explained":
                g = shown.explained_by[0]
                verdict += f" by {g.entry.alert} ({_where(g.entry, g.labels, show_job=r.job is None)})"
        if c.firing:
            verdict += f"  [{len(c.firing)} firing]"
        where = _where(e, labels, show_job=r.job is None)
        num = str(e.order) if e.order else ""
        if c.verdict == "no data":
            val = "no data"
        elif e.unit == "bool":  # how many of the series are in the bad state
            val = f"{len(c.findings)}/{c.series}"
            where = where if c.findings else ""
        else:
            val = _fmt_value(value, e.unit, _multiple(e))
        lines.append(f"{num:>2}  {e.title[:40]:<40} {val:<12} {where[:34]:<34} {_fmt_threshold(e):<11} {verdict}")
    lines.append("")
    if r.cause is None:
        lines.append("verdict: healthy: every check is within its threshold")
    else:
        f = r.cause
        e = f.entry
        explains = [g for c in r.checks for g in c.findings if f in g.explained_by]
        value = "" if e.unit == "bool" else (
            f": {_fmt_value(f.value, e.unit, _multiple(e))} (threshold {_fmt_threshold(e)})")
        lines += [
            f"cause: {e.alert}: {e.title} on {_where(e, f.labels)}{value}",
            f"  meaning:  {e.meaning}",
            f"  runbook:  {e.runbook}",
            f"  next:     {e.next_check}",
        ]
        if r.places:
            lines.append("  where:    " + "; ".join(r.places))
        if explains:
            lines.append("  explains: " + "; ".join(_finding_line(g) for g in explains))
        others = [g for g in r.causes[1:]]
        if others:
            lines.append("also abnormal and unexplained: " + "; ".join(_finding_line(g) for g in others))
    for n in r.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


def _finding_json(f: Finding) -> Dict[str, Any]:
    return {"alert": f.entry.alert, "id": f.entry.id, "labels": f.labels, "value": f.value,
            "explained_by": [{"alert": g.entry.alert, "labels": g.where} for g in f.explained_by]}


def render_json(r: Report) -> Dict[str, Any]:
    def cause(f: Optional[Finding]) -> Optional[Dict[str, Any]]:
        if f is None:
            return None
        e = f.entry
        return {"alert": e.alert, "id": e.id, "kind": e.kind, "title": e.title, "labels": f.labels,
                "value": f.value, "threshold": e.threshold, "op": e.op, "unit": e.unit, "runbook": e.runbook,
                "next_check": e.next_check, "meaning": e.meaning,
                "explains": [_finding_json(g) for c in r.checks for g in c.findings if f in g.explained_by]}

    return {
        "prometheus": r.prometheus, "job": r.job, "since": r.since, "time": r.at,
        "healthy": r.healthy,
        "checks": [{
            "id": c.entry.id, "alert": c.entry.alert, "kind": c.entry.kind, "order": c.entry.order,
            "title": c.entry.title, "threshold": c.entry.threshold, "op": c.entry.op, "unit": c.entry.unit,
            "verdict": c.verdict, "series": c.series,
            "worst": {"labels": c.worst.labels, "value": c.worst.value} if c.worst else None,
            "findings": [_finding_json(f) for f in c.findings],
            "firing": c.firing,
        } for c in r.checks],
        "cause": cause(r.cause),
        "causes": [cause(f) for f in r.causes],
        "places": r.places,
        "notes": r.notes,
    }


# ------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://localhost:9090")
    p.add_argument("--job", metavar="JOB", help="the training job to triage (its `job` label); default: every job")
    p.add_argument("--since", metavar="DURATION",
                   help="judge each check by its worst value over this range (e.g. 15m) instead of now")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--config", metavar="FILE", help="YAML config with the thresholds (default: $RANKSIGHT_CONFIG)")
    p.add_argument("--profile", default="default", choices=sorted(config.PROFILES),
                   help="config profile the rules were generated with (default, or test)")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="per-query HTTP timeout (default 10)")


def run(args: argparse.Namespace) -> int:
    try:
        if args.since is not None and not config.is_duration(args.since):
            raise TriageError(f"--since: expected a Prometheus duration like 15m or 1h, got {args.since!r}")
        if args.job is not None and not args.job:
            raise TriageError("--job: empty job name")
        if not (args.timeout > 0 and math.isfinite(args.timeout)):
            raise TriageError("--timeout: expected a positive number of seconds")
        cfg = config.load(args.config, args.profile)
        report = Walk(connect(args.prometheus, args.timeout), cfg, args.job, args.since).run()
    except ApiError as e:
        return error(str(e))
    if args.json:
        json.dump(render_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(render_text(report))
    return 0 if report.healthy else 1
