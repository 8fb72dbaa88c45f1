"""`ranksight triage`: walk the six triage checks against Prometheus and name the first cause.

The walk is generated from the triage table (``ranksight.triage``): the six
signals in order, then the extra causes, then the symptoms. For every entry it
asks Prometheus for the alert expression without its ``for:`` (which series are
abnormal now, or at any point of ``--since``) and for the entry's indicator (the
value to print). A job can be slow long before an alert's ``for:`` elapses, so
the verdict comes from the alert's condition, not from whether the alert fires yet;
firing and pending ``ALERTS`` are shown beside it.

An indicator past its headline threshold whose alert condition does not hold (the
alert needs more: the straggler's extra time must be a real share of the step, a
young job's goodput is not judged) keeps the verdict "ok" in JSON, with
``threshold_crossed`` true and the reason in ``not_alerting``; the text reads "watch".
Every check's ``status`` in JSON is the text's verdict column (with names in full).

A symptom whose known cause is also abnormal is reported as explained by that
cause, using the same relation Alertmanager uses to mute it (the entries'
``inhibits`` with their ``equal`` labels): a high comm share on rank 0 is
explained by rank 1 being a straggler; rank 0 blocked in a collective is
explained by rank 1 being stalled. The first abnormal entry that nothing
explains is the cause.

``--job`` of a job that has no series now (it ended, or its agent is gone) is looked
up the way ``ranksight report`` finds runs, within LOOKBACK: it is triaged as of
its last data, and a line says so. The monitoring's own health (an agent Prometheus
cannot scrape) is judged now, whatever ``--since`` or the job's end.

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
import urllib.error
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from .. import catalog as C
from .. import config, triage
from ..console import error
from ..report import make as report_runs
from ..triage import Entry
from . import triage_text as T
from ..common.plumbing import ApiError, PrometheusAPI, Sample, connect, http_get

WALK_KINDS = ("signal", "cause", "symptom")  # what can be "the cause"; lints and health are notes
# Symptoms of waiting on peers in collectives: a cause on any node of the job explains them (see Walk._explain).
JOB_WIDE_SYMPTOMS = frozenset(e.alert for e in triage.table(config.defaults()) if e.id in ("comm-bound", "rank-blocked"))
# How far back `--job` looks for a job that has no series now (`ranksight report --lookback`'s default).
LOOKBACK = "7d"
SEARCH = ("1h", "1d", LOOKBACK)  # the ranges searched for its last data, in turn
PROMETHEUS_HINT = "point --prometheus at Prometheus (it listens on :9090 by default: http://localhost:9090)"


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


def not_prometheus(prom: PrometheusAPI, err: ApiError) -> str:
    """The one line for the first query's failure: ``err`` as it is when the URL is unreachable or is a
    Prometheus that refused; when the URL answers HTTP but not as a Prometheus API, that, and whether
    it looks like a ranksight agent (its /metrics serves ranksight series)."""
    try:
        doc = json.loads(http_get(f"{prom.url}/api/v1/status/buildinfo", prom.timeout))
        if isinstance(doc, dict) and doc.get("status") == "success":
            return str(err)  # a Prometheus API: it refused the query itself
    except urllib.error.HTTPError:
        pass  # it answers, but has no Prometheus API
    except (urllib.error.URLError, OSError):
        return str(err)  # unreachable: err says so
    except ValueError:
        pass  # it answers, but not with JSON
    metrics = b""
    for url in [f"{prom.url}/metrics"] + ([prom.url] if prom.url.endswith("/metrics") else []):
        try:
            metrics += http_get(url, prom.timeout)
        except (urllib.error.URLError, OSError, ValueError):
            pass
    if re.search(rb"^ranksight_\w+", metrics, re.M):
        return (f"{prom.url} answers but is not a Prometheus API: it looks like a ranksight agent "
                f"(it serves ranksight series on /metrics); {PROMETHEUS_HINT}")
    return f"{prom.url} answers but is not a Prometheus API ({err}); {PROMETHEUS_HINT}"


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
    pending: List[Dict[str, str]] = field(default_factory=list)  # pending ALERTS series (inside their `for:`)
    not_alerting: Optional[str] = None  # why no alert condition holds while the worst value is past the threshold

    @property
    def crossed(self) -> bool:
        """The worst indicator value is past the headline threshold (over it, or under it for "<")."""
        return T.crosses(self.entry, self.worst.value if self.worst else None)

    @property
    def verdict(self) -> str:
        if self.findings:
            if all(f.explained_by for f in self.findings):
                return "explained"
            return "abnormal"
        if self.firing:
            return "firing"  # the alert still fires but its condition no longer holds (or its window differs)
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
    ended: Optional[str] = None  # the line saying the job ended and when (triaged as of its last data)
    ended_at: Optional[float] = None
    parallel: Dict[Tuple[str, str], Tuple[str, str]] = field(default_factory=dict)  # (job, rank) -> strategy, ZeRO stage

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


def _quote(value: str) -> str:
    """A PromQL string literal (JSON's escapes are PromQL's)."""
    return json.dumps(value)


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def _ago(seconds: float) -> str:
    m = seconds / 60
    return f"{seconds:.0f} s" if seconds < 120 else f"{m:.0f} min" if m < 120 else f"{m / 60:.1f} h"


def _minutes(seconds: float) -> str:
    """A --since that covers ``seconds``: whole minutes, rounded up."""
    return f"{max(1, math.ceil(seconds / 60))}m"


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

    def _alerts(self) -> Tuple[Dict[str, List[Dict[str, str]]], Dict[str, List[Dict[str, str]]]]:
        """(firing, pending) ALERTS series by alert name."""
        sel = 'ALERTS{alertname=~"Ranksight.*"}'
        out: Dict[str, Dict[str, List[Dict[str, str]]]] = {"firing": {}, "pending": {}}
        for s in self.q(_over(sel, self.since, "max_over_time")):
            state = out.get(s.labels.get("alertstate", ""))
            if state is not None:
                state.setdefault(s.labels.get("alertname", ""), []).append(s.labels)
        return out["firing"], out["pending"]

    def check(self, e: Entry, firing: Dict[str, List[Dict[str, str]]],
              pending: Optional[Dict[str, List[Dict[str, str]]]] = None) -> Check:
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
            # and the labels the alert adds (comm="waiting", category=...): inhibitions match on them
            labels.update({k: v for k, v in s.labels.items() if k not in labels and k != "__name__"})
            findings.append(Finding(e, labels, i.value if i else None))
        fired = [l for l in firing.get(e.alert, []) if self._keep(e, l)]
        # the places whose alert fired first (what Alertmanager pages), then the worst value: an
        # instance whose condition holds but whose `for:` has not passed yet is named after them
        paged = {tuple(l.get(n, "") for n in e.scope) for l in fired}
        findings.sort(key=lambda f: (tuple(f.labels.get(n, "") for n in e.scope) not in paged, f.value is None,
                                     -(f.value or 0) if e.op == ">" else (f.value or 0)))
        waiting = [l for l in (pending or {}).get(e.alert, []) if self._keep(e, l)
                   and tuple(l.get(n, "") for n in e.scope) not in paged]
        c = Check(e, worst, len(ind), findings, fired, waiting)
        if not findings and c.crossed:
            c.not_alerting = T.gate(e, self.cfg)
        return c

    def run(self) -> Report:
        try:
            jobs = self._jobs()
        except ApiError as e:
            raise TriageError(not_prometheus(self.prom, e)) from None
        notes: List[str] = []
        ended: Optional[Tuple[str, float]] = None
        if self.job is not None:
            if self.job not in jobs:
                ended = self._ended()
                jobs = self._jobs()  # as of the job's last data
            self.nodes = jobs.get(self.job, set())
        elif not jobs:
            notes.append("no rank reports any data (is a watched job running and its node agent scraped?)")
        firing, pending = self._alerts()
        table = triage.table(self.cfg)
        notes += self._rules_mismatch(table)
        rank = {k: i for i, k in enumerate(WALK_KINDS)}
        walk = sorted((e for e in table if e.kind in WALK_KINDS),
                      key=lambda e: (rank[e.kind], e.order))  # stable: table order within a kind
        checks = [self.check(e, firing, pending) for e in walk]
        self._explain([f for c in checks for f in c.findings], jobs)
        causes = [f for c in checks for f in c.findings if not f.explained_by]
        for e in table:
            if e.kind == "lint":
                for f in self.check(e, firing).findings:  # a lint's summary says "Setup lint"
                    notes.append(f"{e.summary} ({T.where(e, f.labels, show_job=self.job is None)})")
        notes += self._health(table)
        return Report(self.prom.url, self.job, self.since, self.at, checks, causes[0] if causes else None, causes, notes,
                      self._places() if causes else [], ended[0] if ended else None, ended[1] if ended else None,
                      self._parallel())

    def _parallel(self) -> Dict[Tuple[str, str], Tuple[str, str]]:
        """(job, rank) -> (strategy, ZeRO stage), from the ranks' hello (ranksight_rank_parallel_info)."""
        sel = str(C.RANK_PARALLEL) + (f"{{job={_quote(self.job)}}}" if self.job is not None else "")
        out: Dict[Tuple[str, str], Tuple[str, str]] = {}
        for s in self.q(_over(sel, self.since, "max_over_time")):
            lab = s.labels
            out[(lab.get("job", ""), lab.get("rank", ""))] = (lab.get("strategy", ""), lab.get("zero_stage", ""))
        return out

    def _ended(self) -> Tuple[str, float]:
        """The job has no series in the triaged range: find its last data within LOOKBACK (the runs
        `ranksight report` finds), move the walk there and return the line that says so with the time;
        TriageError when it has none, or when --since does not reach it."""
        now = self.at
        run, step = None, 1.0
        # find_runs samples its range at 1/10,000 of it: the last hour first, to the second, so that a
        # short job that ended minutes ago is not stepped over; then further back, coarser
        for back in SEARCH:
            lookback = config.duration_seconds(back)
            runs = report_runs.find_runs(self.prom, self.job, now - lookback, now)
            if runs:
                run, step = runs[-1], max(1.0, lookback / 10000.0)
                break
        if run is None:  # name the jobs of the last hour (over a week, that query reads every rank's week)
            recent = config.duration_seconds(SEARCH[0])
            seen = report_runs.jobs_with_data(self.prom, now - recent, now)
            raise TriageError(f"no ranksight series for job {self.job!r} in Prometheus in the last {LOOKBACK} "
                              f"(jobs seen in the last {SEARCH[0]}: {', '.join(seen) or 'none'})")
        end = run.end
        if step > 1.0:  # read the run's end again, to the second
            fine = report_runs.find_runs(self.prom, self.job, run.end - step, min(now, run.end + 2 * step))
            end = fine[-1].end if fine else run.end
        ago = _ago(now - end)
        whole = _minutes(now - run.start)
        if self.since is not None:
            raise TriageError(f"no ranksight series for job {self.job!r} in the last {self.since}: its last data is "
                              f"from {_ts(end)} ({ago} ago); pass --since {whole} to cover its last run, "
                              f"or leave --since out to triage it as of its last minute")
        self.at = end
        gone = self._agents_down(end)
        why = (f"job {self.job} has had no data since {_ts(end)} ({ago} ago): Prometheus cannot scrape its agent "
               f"{', '.join(sorted(gone))} now" if gone else f"job {self.job} ended at {_ts(end)} ({ago} ago)")
        return f"{why}; triaged as of its last minute; pass --since {whole} to judge its worst over its last run", end

    def _agents_down(self, at: float) -> Set[str]:
        """The agents that carried the job's ranks at ``at`` and that Prometheus cannot scrape now."""
        down = self._down_targets()
        if not down:
            return set()
        sel = f"{{job={_quote(self.job or '')}}}"
        return {s.labels.get("instance", "") for s in self.prom.samples(f"{C.RANK_UP}{sel}", at)} & down

    def _down_targets(self) -> Optional[Set[str]]:
        """Instances of the agents' scrape job that Prometheus fails to scrape now (its active targets);
        None when it cannot say (no targets API)."""
        try:
            targets = self.prom.targets()
        except ApiError:
            return None
        return {t.get("labels", {}).get("instance", "") for t in targets
                if t.get("labels", {}).get("job") == triage.SCRAPE_JOB and t.get("health") == "down"}

    def _health(self, table: Sequence[Entry]) -> List[str]:
        """The monitoring's blind spots now (never over --since, nor at an ended job's time): an agent
        is reported down only while it is an active target whose last scrape failed."""
        now = time.time()
        down: Optional[Set[str]] = None
        notes = []
        for e in table:
            if e.kind != "health":
                continue
            bad = [s for s in self.prom.samples(e.expr, now) if self._keep(e, s.labels)]
            if e.scope == ("instance",) and bad:
                down = self._down_targets() if down is None else down
                if down is not None:
                    bad = [s for s in bad if s.labels.get("instance", "") in down]
            for s in bad:
                notes.append(f"monitoring blind spot: {e.summary} ({T.where(e, s.labels, show_job=self.job is None)})")
        return notes

    def _places(self) -> List[str]:
        """The chain of a hang: each stalled rank's place (its stack's innermost user frame) and the
        collective each blocked rank waits in, from the agents' where and collective series."""
        sel = f"{{job={_quote(self.job)}}}" if self.job is not None else ""
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
render_text = T.render_text


def _finding_json(f: Finding) -> Dict[str, Any]:
    return {"alert": f.entry.alert, "id": f.entry.id, "labels": f.labels, "value": f.value,
            "explained_by": [{"alert": g.entry.alert, "labels": g.where} for g in f.explained_by]}


def render_json(r: Report) -> Dict[str, Any]:
    def cause(f: Optional[Finding]) -> Optional[Dict[str, Any]]:
        if f is None:
            return None
        e = f.entry
        local = T.runbook_path(e)
        return {"alert": e.alert, "id": e.id, "kind": e.kind, "title": e.title, "labels": f.labels,
                "value": f.value, "threshold": e.threshold, "op": e.op, "unit": e.unit, "runbook": e.runbook,
                "runbook_path": str(local) if local else None,
                "next_check": e.next_check, "meaning": e.meaning,
                "explains": [_finding_json(g) for c in r.checks for g in c.findings if f in g.explained_by]}

    show_job = r.job is None
    return {
        "prometheus": r.prometheus, "job": r.job, "since": r.since, "time": r.at, "ended_at": r.ended_at,
        "healthy": r.healthy,
        "checks": [{
            "id": c.entry.id, "alert": c.entry.alert, "kind": c.entry.kind, "order": c.entry.order,
            "title": c.entry.title, "threshold": c.entry.threshold, "op": c.entry.op, "unit": c.entry.unit,
            "verdict": c.verdict, "status": T.status(c, show_job), "threshold_crossed": c.crossed,
            "not_alerting": c.not_alerting, "series": c.series,
            "worst": {"labels": c.worst.labels, "value": c.worst.value} if c.worst else None,
            "findings": [_finding_json(f) for f in c.findings],
            "firing": c.firing, "pending": c.pending,
        } for c in r.checks],
        "cause": cause(r.cause),
        "causes": [cause(f) for f in r.causes],
        "places": r.places,
        "parallel": [{"job": j, "rank": rk, "strategy": st, "zero_stage": z}
                     for (j, rk), (st, z) in sorted(r.parallel.items())],
        "notes": ([r.ended] if r.ended else []) + r.notes,
    }


# ------------------------------------------------------------------ CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus base URL, e.g. http://localhost:9090 (not the node agent's port)")
    p.add_argument("--job", metavar="JOB",
                   help="the training job to triage (its `job` label); default: every job. A job with no series "
                        f"now is triaged as of its last data within the last {LOOKBACK}")
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
