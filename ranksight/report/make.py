"""One run of a job, read back from Prometheus: its runs, its summary, the alerts that fired (with
the causes and the symptoms they muted, from the triage table's inhibitions), the comparison with
an earlier run, and the verdict line. Rendering is in ``write.py``; the plots in ``panels.py``."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ranksight import catalog as C
from ranksight import triage
from ranksight.common.plumbing import PrometheusAPI as Prometheus

log = logging.getLogger("ranksight.report")
R = triage.REC


class ReportError(Exception):
    """One line for the user; ``code`` is the exit status."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


@dataclass(frozen=True)
class Run:
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1.0)

    def window(self) -> str:
        return f"{int(self.seconds) + 1}s"


@dataclass
class Summary:
    """What one run of the job came to."""
    run: Run
    step_p50: Optional[float] = None
    goodput: Optional[float] = None
    shares: Dict[str, float] = field(default_factory=dict)
    seconds: Dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    ranks: int = 0
    # the run's progress at its end (efficiency.run_rules): time left at the step rate, GPU-hours
    # spent and to finish, their cost at cost.gpu_hour_price (None: unknown, or no price)
    eta: Optional[float] = None
    gpu_hours: Optional[float] = None
    gpu_hours_to_finish: Optional[float] = None
    cost_spent: Optional[float] = None
    cost_to_finish: Optional[float] = None
    currency: str = ""


@dataclass
class Fired:
    alert: str
    labels: Dict[str, str]
    start: float
    end: float
    muted_by: List[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        keep = [k for k in ("job", "node", "rank", "gpu", "cause", "category", "reason") if self.labels.get(k)]
        return " ".join(f"{k}={self.labels[k]}" for k in keep)


@dataclass
class Flag:
    what: str
    now: str
    before: str
    note: str


def _sel(job: str) -> str:
    return '{job="' + job.replace("\\", "\\\\").replace('"', '\\"') + '"}'


def jobs_with_data(prom: Prometheus, start: float, end: float) -> List[str]:
    rng = f"{max(int(end - start), 1)}s"
    got = prom.samples(f"count by (job) (last_over_time({C.RANK_UP}[{rng}]))", end)
    return sorted(s.labels.get("job", "") for s in got if s.labels.get("job"))


def find_runs(prom: Prometheus, job: str, start: float, end: float) -> List[Run]:
    """Maximal intervals in [start, end] in which the job had ranks tracked (a restart under torchrun
    keeps them tracked, so it stays one run; runs are apart when the job's series were gone)."""
    step = max(1.0, (end - start) / 10000.0)
    res = prom.query_range(f"count({C.RANK_UP}{_sel(job)})", start, end, step)
    times = sorted(t for _, pts in res for t, _ in pts)
    runs: List[Run] = []
    for t in times:
        if runs and t - runs[-1].end <= 2.5 * step:
            runs[-1] = Run(runs[-1].start, t)
        else:
            runs.append(Run(t, t))
    return runs


def summarize(prom: Prometheus, job: str, run: Run, cost: Optional[Mapping[str, Any]] = None) -> Summary:
    """``cost``: the config's cost section (the price of a GPU-hour and its currency), for the cost
    of the GPU-hours; without it (or with no price) the summary has GPU-hours only."""
    s = Summary(run)
    at, w, j = run.end, run.window(), _sel(job)

    def one(expr: str) -> Optional[float]:
        got = prom.samples(expr, at)
        return got[0].value if got else None

    s.step_p50 = one(f"avg_over_time({R['job_p50']}{j}[{w}])")
    if s.step_p50 is None:  # histograms are recorded every slow_rule_interval: a short run may have none
        s.step_p50 = one(f"avg_over_time({R['job_step_mean']}{j}[{w}])")
    s.goodput = one(f"last_over_time({R['goodput']}{j}[{w}])")
    s.shares = {x.labels.get("category", ""): x.value
                for x in prom.samples(f"last_over_time({R['goodput_share']}{j}[{w}])", at)}
    s.seconds = {x.labels.get("category", ""): x.value
                 for x in prom.samples(f"last_over_time({R['goodput_split']}{j}[{w}])", at)}
    s.restarts = int(one(f"max(max_over_time({C.RANK_RESTARTS}{j}[{w}]))") or 0)
    s.ranks = int(one(f"max(max_over_time({R['ranks']}{j}[{w}]))") or 0)
    s.eta = one(f"last_over_time({R['eta']}{j}[{w}])")
    s.gpu_hours = one(f"last_over_time({R['gpu_hours']}{j}[{w}])")
    s.gpu_hours_to_finish = one(f"last_over_time({R['gpu_hours_to_finish']}{j}[{w}])")
    price = float((cost or {}).get("gpu_hour_price", 0.0))
    if price > 0:
        s.currency = str((cost or {}).get("currency", ""))
        s.cost_spent = s.gpu_hours * price if s.gpu_hours is not None else None
        s.cost_to_finish = s.gpu_hours_to_finish * price if s.gpu_hours_to_finish is not None else None
    return s


def fired_alerts(prom: Prometheus, job: str, run: Run, cfg: Mapping[str, Any]) -> List[Fired]:
    """Alerts that fired during the run on the job (and node alerts on its nodes), each with the
    causes that muted it (Alertmanager's inhibition, evaluated from the triage table)."""
    step = max(1.0, run.seconds / 2000.0)
    nodes = {x.labels.get("node", "") for x in prom.samples(
        f"group by (node) (last_over_time({C.RANK_UP}{_sel(job)}[{run.window()}]))", run.end)}
    out: List[Fired] = []
    exprs = [f'ALERTS{{alertstate="firing", job="{job}"}}']
    if nodes - {""}:
        exprs.append(f'ALERTS{{alertstate="firing", job="{triage.SCRAPE_JOB}", node=~"{"|".join(sorted(nodes - {""}))}"}}')
    for expr in exprs:
        for labels, pts in prom.query_range(expr, run.start, run.end, step):
            if pts:
                out.append(Fired(labels.get("alertname", ""), labels, pts[0][0], pts[-1][0]))
    return mute(out, cfg)


def mute(fired: List[Fired], cfg: Mapping[str, Any]) -> List[Fired]:
    """Sort by triage order and mark each alert with the causes that muted it while both fired: the
    triage table's inhibitions (source, target, equal labels), as Alertmanager applies them."""
    order = {e.alert: i for i, e in enumerate(triage.table(cfg))}
    fired.sort(key=lambda f: (order.get(f.alert, len(order)), f.start))
    for target in fired:
        for src, tgt, equal in triage.inhibit_pairs(cfg):
            if tgt != target.alert or src in target.muted_by:
                continue
            if any(s.alert == src and s.start <= target.end and target.start <= s.end
                   and all(s.labels.get(k) == target.labels.get(k) for k in equal) for s in fired):
                target.muted_by.append(src)
    return fired


def compare(now: Summary, base: Summary, cfg: Mapping[str, Any]) -> List[Flag]:
    """Regressions of ``now`` against ``base``."""
    t = cfg["thresholds"]
    delta = t["report_share_delta"]
    flags: List[Flag] = []
    if now.step_p50 and base.step_p50 and now.step_p50 / base.step_p50 > t["step_regression_ratio"]:
        flags.append(Flag("step p50", f"{now.step_p50:.3g} s", f"{base.step_p50:.3g} s",
                          f"{now.step_p50 / base.step_p50:.2f}x the baseline"))
    if now.goodput is not None and base.goodput is not None and base.goodput - now.goodput > delta:
        flags.append(Flag("goodput", f"{now.goodput:.1%}", f"{base.goodput:.1%}",
                          f"{(now.goodput - base.goodput) * 100:+.1f} pp"))
    for c in C.GOODPUT_CATEGORIES[1:]:
        a, b = now.shares.get(c), base.shares.get(c, 0.0)
        if a is not None and a - b > delta:
            flags.append(Flag(f"{c} share", f"{a:.1%}", f"{b:.1%}", f"{(a - b) * 100:+.1f} pp"))
    if now.restarts > base.restarts:
        flags.append(Flag("restarts", str(now.restarts), str(base.restarts),
                          f"{now.restarts - base.restarts} more restart(s) (recovery "
                          f"{now.seconds.get('recovery', 0.0):.0f} s, wasted progress "
                          f"{now.seconds.get('wasted_progress', 0.0):.0f} s)"))
    return flags


def verdict(job: str, s: Summary, fired: Sequence[Fired], flags: Sequence[Flag],
            base: Optional[Summary]) -> str:
    causes = [f for f in fired if not f.muted_by]
    gp = f"goodput {s.goodput:.0%}" if s.goodput is not None else "goodput unknown"
    parts = [f"job {job}: {gp}"]
    if base is not None and base.goodput is not None:
        parts[0] += f" (baseline {base.goodput:.0%})"
    if causes:
        names = ", ".join(dict.fromkeys(f.alert for f in causes))
        parts.append(f"cause in triage order: {names}")
    if flags:
        parts.append("regressed: " + "; ".join(f"{f.what} {f.note}" for f in flags))
    if not causes and not flags:
        parts.append("healthy: no alert fired" + (", no regression against the baseline run" if base else ""))
    return "VERDICT: " + "; ".join(parts)


def choose_baseline(runs: Sequence[Run], current: Run) -> Optional[Run]:
    earlier = [r for r in runs if r.end < current.start]
    return earlier[-1] if earlier else None


def top_badput(s: Summary) -> List[Tuple[str, float]]:
    return sorted(((c, v) for c, v in s.shares.items() if c != "productive"), key=lambda x: -x[1])
