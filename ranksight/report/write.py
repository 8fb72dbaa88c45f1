"""Write the report: PNGs of the shipped dashboards' panels, report.html (self-contained: the PNGs
are embedded), report.md (next to the PNGs) and report.json (the numbers and, per plot, how many
series and points it drew)."""
from __future__ import annotations

import base64
import datetime as dt
import html
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ranksight import catalog as C
from ranksight import triage
from ranksight.common import units

from . import make, panels as P


@dataclass
class Plot:
    name: str  # file name
    title: str
    panels: List[P.Drawn]
    note: str = ""

    def stats(self) -> Dict[str, Any]:
        return {"file": self.name, "title": self.title,
                "panels": [{"title": d.panel.title, "series": len(d.series), "rows": len(d.rows), "points": d.points}
                           for d in self.panels]}


@dataclass
class Report:
    job: str
    prometheus: str
    run: make.Run
    summary: make.Summary
    fired: List[make.Fired]
    verdict: str
    baseline: Optional[make.Summary] = None
    baseline_note: str = ""
    flags: List[make.Flag] = field(default_factory=list)
    plots: List[Plot] = field(default_factory=list)
    actions: Optional[List[Dict[str, Any]]] = None  # `ranksight act`'s ledger records of the job (--act)


def _ts(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def plots(prom: Any, rep: Report, boards: Mapping[str, dict], cfg: Mapping[str, Any], out: Path,
          dashboard: Optional[str] = None) -> List[Plot]:
    """Fetch and draw: goodput, the six signals in triage order, the per-rank heatmaps (and one
    whole dashboard as a grid when asked)."""
    run, job = rep.run, rep.job
    step = max(1.0, run.seconds / 300.0)
    rate = cfg["windows"]["rate"]
    tri = P.panels(boards["triage"], "triage")
    ranks = P.panels(boards["ranks"], "ranks")

    def fetch(ps: Sequence[P.Panel]) -> List[P.Drawn]:
        return [P.fetch(prom, p, job, run.start, run.end, step, rate) for p in ps]

    out.mkdir(parents=True, exist_ok=True)
    made: List[Plot] = []
    made.append(Plot("goodput.png", "Goodput: where the wall time went", fetch([p for p in tri if p.row == "Goodput"])))
    made.append(Plot("overview.png", "Overview", fetch([p for p in tri if p.row == "Overview" and p.type != "table"])))
    for e in triage.signals(cfg):
        row = next((r for r in dict.fromkeys(p.row for p in tri) if r.startswith(f"{e.order}. ")), None)
        if row and not any(pl.title == row for pl in made):
            made.append(Plot(f"signal-{e.order}.png", row, fetch([p for p in tri if p.row == row])))
    heat = [P.find(ranks, "Step time by rank"), P.find(ranks, "Busy time per step")]
    made.append(Plot("ranks-heatmap.png", "Per rank: step time and busy time per step", fetch(heat),
                     note="one row per rank (the dashboards' per-rank queries), colour = seconds"))
    if dashboard:
        ps = P.panels(boards[dashboard], dashboard)
        made.append(Plot(f"dashboard-{dashboard}.png", f"Dashboard: {dashboard} (every panel)", fetch(ps)))
    for pl in made:
        P.figure(pl.panels, run.start, out / pl.name, cols=4 if pl.name.startswith("dashboard-") else 2,
                 title=f"{pl.title} — job {job}", as_heatmap=pl.name == "ranks-heatmap.png")
    return made


def _duration(v: float) -> str:
    """Seconds as s, min or h (an ETA can be days)."""
    return f"{v / 3600:.1f} h" if v >= 3 * 3600 else units.value(v, "seconds")


def _summary_rows(s: make.Summary) -> List[List[str]]:
    rows = [["step p50", f"{s.step_p50:.3g} s" if s.step_p50 else "-"],
            ["goodput", f"{s.goodput:.1%}" if s.goodput is not None else "-"],
            ["restarts (launcher)", str(s.restarts)], ["ranks", str(s.ranks)],
            ["ETA at the end", _duration(s.eta) if s.eta is not None else "- (no total steps)"],
            ["GPU-hours spent", f"{s.gpu_hours:.2f}" if s.gpu_hours is not None else "-"],
            ["GPU-hours to finish", f"{s.gpu_hours_to_finish:.2f}" if s.gpu_hours_to_finish is not None else "-"]]
    if s.currency:  # a price per GPU-hour was set (cost.gpu_hour_price)
        rows += [[f"cost spent ({s.currency})", f"{s.cost_spent:,.2f}" if s.cost_spent is not None else "-"],
                 [f"cost to finish ({s.currency})",
                  f"{s.cost_to_finish:,.2f}" if s.cost_to_finish is not None else "-"]]
    for c in C.GOODPUT_CATEGORIES:
        if c in s.shares:
            rows.append([f"{c}", f"{s.shares[c]:.1%} ({s.seconds.get(c, 0.0):.1f} s per rank)"])
    return rows


def _alert_rows(rep: Report) -> List[List[str]]:
    return [[f.alert, f.where, _ts(f.start), _ts(f.end),
             ("muted by " + ", ".join(f.muted_by)) if f.muted_by else "cause", f.labels.get("severity", "")]
            for f in rep.fired]


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(out)


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{th}</tr>{trs}</table>"


def _sections(rep: Report) -> List[Dict[str, Any]]:
    """The report's sections, in order, as (title, text, table, plot) dicts both writers render."""
    secs: List[Dict[str, Any]] = [{"title": "Run", "text": f"{_ts(rep.run.start)} to {_ts(rep.run.end)} "
                                   f"({rep.run.seconds / 60:.1f} min), read from {rep.prometheus}."}]
    secs.append({"title": "Summary", "table": (["", "this run"], _summary_rows(rep.summary))})
    head = ["alert", "where", "first firing", "last firing", "role", "severity"]
    secs.append({"title": "Alerts that fired", "table": (head, _alert_rows(rep)) if rep.fired else None,
                 "text": "" if rep.fired else "No ranksight alert fired during the run."})
    comp: Dict[str, Any] = {"title": "Comparison with the job's previous run"}
    if rep.baseline is None:
        comp["text"] = rep.baseline_note or "No earlier run of this job in the lookback."
    else:
        b = rep.baseline
        comp["text"] = f"Baseline: {_ts(b.run.start)} to {_ts(b.run.end)}. " + (
            "Regressions are flagged below." if rep.flags else "No regression against it.")
        mine, theirs = dict(map(tuple, _summary_rows(rep.summary))), dict(map(tuple, _summary_rows(b)))
        rows = [[k, mine.get(k, "-"), theirs.get(k, "-")] for k in dict.fromkeys(list(mine) + list(theirs))]
        comp["table"] = (["", "this run", "baseline"], rows)
        if rep.flags:
            comp["flags"] = (["flagged", "this run", "baseline", "change"],
                             [[f.what, f.now, f.before, f.note] for f in rep.flags])
    secs.append(comp)
    if rep.actions is not None:
        secs.append(_actions_section(rep.actions))
    for pl in rep.plots:
        secs.append({"title": pl.title, "plot": pl.name, "text": pl.note})
    return secs


def _actions_section(actions: List[Dict[str, Any]]) -> Dict[str, Any]:
    """What `ranksight act` did with the run's verdicts, each with its time to recover where it recovered."""
    def where(lb: Mapping[str, str]) -> str:
        return " ".join(f"{k} {lb[k]}" for k in ("rank", "node", "gpu", "device", "path") if k in lb)

    rows = [[a["id"], a["verdict"], where(a["labels"]), a["action"], a["mode"], a["state"],
             _ts(a["acted"] or a["received"]), "-" if a.get("recover_s") is None else f"{a['recover_s']:.1f} s",
             a.get("command") or ""]
            for a in sorted(actions, key=lambda a: a["received"]) if a["action"] != triage.ACT_PAGE]
    head = ["id", "verdict", "where", "action", "mode", "result", "at", "time to recover", "command"]
    return {"title": "Actions", "table": (head, rows) if rows else None,
            "text": "" if rows else "`ranksight act` took no action on this job's verdicts."}


def write(rep: Report, out: Path) -> Dict[str, Path]:
    secs = _sections(rep)
    md = [f"# ranksight report: job {rep.job}", "", f"**{rep.verdict}**", ""]
    body = [f"<h1>ranksight report: job {html.escape(rep.job)}</h1>", f"<p class=verdict>{html.escape(rep.verdict)}</p>"]
    for s in secs:
        md += [f"## {s['title']}", ""]
        body.append(f"<h2>{html.escape(s['title'])}</h2>")
        if s.get("text"):
            md += [s["text"], ""]
            body.append(f"<p>{html.escape(s['text'])}</p>")
        for key in ("table", "flags"):
            if s.get(key):
                md += [_md_table(*s[key]), ""]
                body.append(_html_table(*s[key]))
        if s.get("plot"):
            md += [f"![{s['title']}]({s['plot']})", ""]
            data = base64.b64encode((out / s["plot"]).read_bytes()).decode()
            body.append(f'<img alt="{html.escape(s["title"])}" src="data:image/png;base64,{data}">')
    style = ("body{font-family:sans-serif;max-width:1300px;margin:2em auto;color:#222}"
             "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;"
             "font-size:13px;text-align:left}.verdict{font-weight:bold;font-size:15px;padding:.5em;"
             "background:#f3f3f3}img{max-width:100%}")
    page = (f"<!doctype html><html><head><meta charset=utf-8><title>ranksight report: {html.escape(rep.job)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
    paths = {"html": out / "report.html", "md": out / "report.md", "json": out / "report.json"}
    paths["html"].write_text(page, encoding="utf-8")
    paths["md"].write_text("\n".join(md) + "\n", encoding="utf-8")
    doc = {"job": rep.job, "verdict": rep.verdict, "run": asdict(rep.run), "summary": asdict(rep.summary),
           "baseline": asdict(rep.baseline) if rep.baseline else None, "flags": [asdict(f) for f in rep.flags],
           "alerts": [asdict(f) for f in rep.fired], "plots": [pl.stats() for pl in rep.plots]}
    paths["json"].write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return paths
