"""`ranksight report`: read one run of a job from Prometheus and write report.html (self-contained),
report.md and report.json with PNG plots of the shipped dashboards' own panels: goodput and its
breakdown, the six signals in triage order, the per-rank step and busy-time heatmap, the alerts that
fired (causes and the symptoms they muted), a verdict line, and a comparison with the job's previous
run (or ``--baseline FROM..TO``) that flags regressions.

Exit 0 with the report written; 1 when the job has no data in the range (the line names the jobs that
do); 2 on bad usage or an unreachable Prometheus.
"""
from __future__ import annotations

import argparse
import datetime as dt
import re
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ranksight import config as rconfig
from ranksight.config import duration_seconds
from ranksight.common.plumbing import ApiError, UsageError, connect
from ranksight.console import error

from . import make, write

DEFAULT_LOOKBACK = "7d"


def parse_time(s: str, now: float) -> float:
    """unix seconds, RFC 3339 / ISO 8601 (UTC unless it says otherwise), ``now`` or ``now-30m``."""
    s = s.strip()
    m = re.fullmatch(r"now(?:-((?:\d+(?:ms|[smhd]))+))?", s)
    if m:
        return now - (duration_seconds(m.group(1)) if m.group(1) else 0.0)
    try:
        return float(s)
    except ValueError:
        pass
    try:
        t = dt.datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise make.ReportError(f"bad time {s!r}: expected unix seconds, an ISO 8601 time or now-DURATION", 2) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t.timestamp()


def _range(s: str, now: float) -> Tuple[float, float]:
    if ".." not in s:
        raise make.ReportError(f"--baseline {s!r}: expected FROM..TO", 2)
    a, b = s.split("..", 1)
    lo, hi = parse_time(a, now), parse_time(b, now)
    if hi <= lo:
        raise make.ReportError(f"--baseline {s!r}: TO must be after FROM", 2)
    return lo, hi


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus", required=True, metavar="URL", help="Prometheus base URL, e.g. http://localhost:9090")
    p.add_argument("--job", required=True, metavar="NAME", help="the training job (its `job` label)")
    p.add_argument("--from", dest="start", metavar="TIME", default=None,
                   help="start of the run (unix seconds, ISO 8601, now-2h); default: the job's latest run")
    p.add_argument("--to", dest="end", metavar="TIME", default=None, help="end of the run (default: now)")
    p.add_argument("--baseline", metavar="FROM..TO", default=None,
                   help="compare with this time range; default: the job's previous run within --lookback")
    p.add_argument("--lookback", metavar="DURATION", default=DEFAULT_LOOKBACK,
                   help=f"how far back to look for the job's runs (default {DEFAULT_LOOKBACK})")
    p.add_argument("--out", metavar="DIR", default=None, help="output directory (default: ./ranksight-report-JOB)")
    p.add_argument("--dashboard", choices=("triage", "ranks", "node"), default=None,
                   help="also render every panel of this dashboard to one PNG grid")
    p.add_argument("--config", metavar="FILE", default=None, help="ranksight config YAML (thresholds, windows)")
    p.add_argument("--profile", default="default", help="config profile the rules were generated with (default|test)")
    p.add_argument("--act", metavar="URL", default=None,
                   help="a running `ranksight act` (http://host:9948): list each action it took on the job's verdicts "
                        "during the run, with its time to recover (its bearer token from act.token_file)")
    p.add_argument("--timeout", type=float, default=15.0, help="seconds per Prometheus request (default 15)")


def build(args: argparse.Namespace, now: Optional[float] = None) -> Tuple[write.Report, Path]:
    now = time.time() if now is None else now
    cfg = rconfig.load(args.config, args.profile)
    try:
        lookback = duration_seconds(args.lookback) if re.fullmatch(r"(\d+(ms|[smhd]))+", args.lookback) else None
    except ValueError:
        lookback = None
    if not lookback:
        raise make.ReportError(f"--lookback {args.lookback!r}: expected a duration like 7d or 12h", 2)
    if args.timeout <= 0:
        raise make.ReportError("--timeout must be positive", 2)
    end = parse_time(args.end, now) if args.end else now
    start = parse_time(args.start, now) if args.start else None
    if start is not None and start >= end:
        raise make.ReportError("--from must be before --to", 2)
    try:
        prom = connect(args.prometheus, args.timeout)
    except UsageError as e:
        raise make.ReportError(str(e), 2) from None
    scan_from = min(start if start is not None else end, end - lookback)
    runs = make.find_runs(prom, args.job, scan_from, end)
    if start is not None:
        inside = [r for r in runs if r.end >= start and r.start <= end]
        run = make.Run(max(start, inside[0].start), min(end, inside[-1].end)) if inside else None
    else:
        run = runs[-1] if runs else None
    if run is None:
        lo = start if start is not None else end - lookback
        jobs = make.jobs_with_data(prom, lo, end)
        have = ", ".join(jobs) if jobs else "none"
        raise make.ReportError(f"job {args.job!r} has no data between {write._ts(lo)} and {write._ts(end)}; "
                               f"jobs with data there: {have}", 1)
    summary = make.summarize(prom, args.job, run, cfg["cost"])
    base, note = None, ""
    if args.baseline:
        b0, b1 = _range(args.baseline, now)
        base_runs = [r for r in make.find_runs(prom, args.job, b0, b1)]
        if base_runs:
            base = make.summarize(prom, args.job, make.Run(max(b0, base_runs[0].start), min(b1, base_runs[-1].end)),
                                  cfg["cost"])
        else:
            note = f"The job has no data in the baseline range {write._ts(b0)} to {write._ts(b1)}."
    else:
        prev = make.choose_baseline(runs, run)
        if prev is not None:
            base = make.summarize(prom, args.job, prev, cfg["cost"])
        else:
            note = f"No earlier run of this job within the last {args.lookback}."
    fired = make.fired_alerts(prom, args.job, run, cfg)
    flags = make.compare(summary, base, cfg) if base is not None else []
    rep = write.Report(args.job, prom.url, run, summary, fired, make.verdict(args.job, summary, fired, flags, base),
                       base, note, flags)
    if getattr(args, "act", None):
        token = getattr(args, "act_token_file", None) or cfg["act"]["token_file"]
        rep.actions = _actions(args.act, token, args.job, run, args.timeout)
    out = Path(args.out) if args.out else Path(f"ranksight-report-{re.sub(r'[^A-Za-z0-9_.-]', '_', args.job)}")
    from . import panels

    boards = panels.load_boards(cfg)
    rep.plots = write.plots(prom, rep, boards, cfg, out, args.dashboard)
    return rep, out


def _actions(url: str, token_file: str, job: str, run: "make.Run", timeout: float) -> List[Dict[str, Any]]:
    """The ledger records of `ranksight act` at ``url`` for ``job`` (rank verdicts with its job label) that
    arrived during the run. Raises ReportError (one line) when it cannot be read."""
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url.rstrip("/") + "/api/v1/actions")
    try:
        if token_file:
            req.add_header("Authorization", "Bearer " + Path(token_file).read_text(encoding="utf-8").strip())
        with urllib.request.urlopen(req, timeout=timeout) as r:
            records = json.load(r)["actions"]
    except (OSError, ValueError, KeyError) as e:
        raise make.ReportError(f"--act {url}: cannot read the actions of `ranksight act`: {e}", 2) from None
    return [a for a in records if a["labels"].get("job") == job and run.start - 60 <= a["received"] <= run.end + 60]


def run(args: argparse.Namespace) -> int:
    try:
        rep, out = build(args)
        paths = write.write(rep, out)
    except make.ReportError as e:
        return error(str(e), e.code)
    except ApiError as e:  # unreachable or refusing Prometheus
        return error(str(e))
    except ImportError as e:
        return error(f"the report needs matplotlib: pip install 'ranksight[report]' ({e})")
    except OSError as e:
        return error(f"cannot write the report to {args.out}: {e.strerror or e}")
    print(rep.verdict)
    print(f"report: {paths['html'].resolve()}")
    print(f"        {paths['md'].resolve()}")
    return 0


def write_report(prometheus: str, job: str, out: str, profile: str = "default", start: Optional[float] = None,
                 end: Optional[float] = None, config_path: Optional[str] = None, act: Optional[str] = None,
                 act_token_file: Optional[str] = None) -> Tuple[str, Path]:
    """The report as a library call (``ranksight demo`` ends with it): returns (verdict, report.html).
    ``act``: a running `ranksight act` whose actions it lists (its token from ``act_token_file``, else
    the config's ``act.token_file``). Raises ``make.ReportError`` (one line, ``.code``) or ``ApiError``
    (Prometheus unreachable)."""
    args = argparse.Namespace(prometheus=prometheus, job=job, start=None if start is None else str(start),
                              end=None if end is None else str(end), baseline=None, lookback=DEFAULT_LOOKBACK,
                              out=out, dashboard=None, config=config_path, profile=profile, timeout=15.0, act=act,
                              act_token_file=act_token_file)
    rep, out_dir = build(args)
    return rep.verdict, write.write(rep, out_dir)["html"]
