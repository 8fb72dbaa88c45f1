"""The shipped dashboards' panels, drawn with matplotlib: the same queries (with the dashboard
variables substituted as Grafana does), units, legends, thresholds and stacking as the Grafana
JSON, so a report shows what the dashboards show. No PromQL is written here.

matplotlib is imported when a panel is drawn (``ranksight[report]``), never by the core.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ranksight.common import units
from ranksight.config import duration_seconds
from ranksight.dashboards import generate as dgen

BOARDS = {"triage": "ranksight-triage.json", "ranks": "ranksight-ranks.json", "node": "ranksight-node.json"}
Series = Tuple[str, List[Tuple[float, float]]]  # (legend, [(t, v)])


@dataclass
class Target:
    expr: str
    legend: str
    instant: bool
    fmt: str


@dataclass
class Panel:
    board: str
    row: str
    title: str
    type: str
    unit: str
    description: str
    targets: List[Target]
    thresholds: List[Tuple[Optional[float], str]]
    stacked: bool = False
    threshold_lines: bool = False
    w: int = 12
    columns: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # table field -> (display name, unit)
    hidden: Tuple[str, ...] = ()  # table fields the panel's "organize" transformation hides


@dataclass
class Drawn:
    """A panel's fetched data: one list of series per target (range), or table rows (instant)."""
    panel: Panel
    series: List[Series] = field(default_factory=list)
    rows: List[Dict[str, str]] = field(default_factory=list)
    error: str = ""

    @property
    def points(self) -> int:
        return sum(len(pts) for _, pts in self.series) + len(self.rows)


def load_boards(cfg: Mapping[str, Any]) -> Dict[str, dict]:
    """board name -> dashboard JSON model: a fresh render when the SDK is installed (it follows the
    config's thresholds), else the committed files."""
    try:
        models = dgen.render(cfg)
        return {name: models[f] for name, f in BOARDS.items()}
    except dgen.SdkMissing:
        return {name: json.loads((dgen.OUT_DIR / f).read_text(encoding="utf-8")) for name, f in BOARDS.items()}


def panels(model: Mapping[str, Any], board: str) -> List[Panel]:
    out: List[Panel] = []
    row = ""
    for p in model.get("panels", []):
        if p.get("type") == "row":
            row = p.get("title", "")
            continue
        fc = p.get("fieldConfig", {}).get("defaults", {})
        custom = fc.get("custom", {}) or {}
        steps = [(s.get("value"), s.get("color", "")) for s in (fc.get("thresholds") or {}).get("steps", [])]
        targets = [Target(t.get("expr", ""), t.get("legendFormat", ""), bool(t.get("instant")), t.get("format") or "time_series")
                   for t in p.get("targets", [])]
        columns: Dict[str, Tuple[str, str]] = {}
        for o in p.get("fieldConfig", {}).get("overrides", []) or []:
            props = {x.get("id"): x.get("value") for x in o.get("properties", [])}
            if (o.get("matcher") or {}).get("id") == "byName" and "displayName" in props:
                columns[o["matcher"]["options"]] = (props["displayName"], props.get("unit", fc.get("unit", "")))
        hidden: Tuple[str, ...] = ()
        for tr in p.get("transformations", []) or []:
            if tr.get("id") == "organize":
                hidden = tuple(k for k, v in (tr.get("options", {}).get("excludeByName") or {}).items() if v)
        out.append(Panel(board, row, p.get("title", ""), p.get("type", ""), fc.get("unit", ""), p.get("description", ""),
                         targets, steps, (custom.get("stacking") or {}).get("mode") == "normal",
                         (custom.get("thresholdsStyle") or {}).get("mode", "off") != "off",
                         (p.get("gridPos") or {}).get("w", 12), columns, hidden))
    return out


def find(ps: Sequence[Panel], title: str) -> Panel:
    for p in ps:
        if p.title == title:
            return p
    raise KeyError(f"no panel titled {title!r}")


_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    if not fmt:
        inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return "{" + inner + "}"
    return _LEGEND.sub(lambda m: labels.get(m.group(1), ""), fmt)


def fetch(prom: Any, p: Panel, job: str, start: float, end: float, step: float, rate_interval: str) -> Drawn:
    """Run the panel's queries for ``job`` over [start, end] (tables: instant, at ``end``)."""
    d = Drawn(p)
    rng = f"{max(int(end - start), 1)}s"
    tail = duration_seconds(rate_interval)
    merged: Dict[Tuple[Tuple[str, str], ...], Dict[str, str]] = {}
    for i, t in enumerate(p.targets):
        expr = dgen.substitute(t.expr, job=[job], rate_interval=rate_interval, range_=rng)
        if t.instant or p.type == "table":
            # Grafana's "merge": one row per label set, one column per query ("Value #A", ...)
            col = f"Value #{chr(ord('A') + i)}" if len(p.targets) > 1 else "Value"
            name, unit = p.columns.get(col, (col, p.unit))
            for s in prom.samples(expr, end):
                labels = {k: v for k, v in s.labels.items() if k != "__name__" and k not in p.hidden}
                row = merged.setdefault(tuple(sorted(labels.items())), dict(labels))
                row[name] = units.grafana(s.value, unit)
            continue
        for labels, pts in prom.query_range(expr, start, end, step):
            # a per-rank series that ends within one rate window of the start is the previous run's
            # tail (rate() windows reach back over the gap between runs), not this run
            if "rank" in labels and pts and pts[-1][0] < start + tail and end - start > tail:
                continue
            d.series.append((legend(t.legend, labels), pts))
    d.rows = list(merged.values())
    return d


# ---------------------------------------------------------------- units (Grafana unit ids)
UNIT_LABEL = {"percentunit": "%", "s": "seconds", "ops": "per second", "cpm": "per minute", "cps": "per second",
              "pps": "packets/s", "Bps": "bytes/s", "bytes": "bytes", "celsius": "°C", "watt": "W", "hertz": "Hz"}


def _scale(unit: str) -> float:
    return 100.0 if unit == "percentunit" else 1.0


# ---------------------------------------------------------------- drawing
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _times(pts: Sequence[Tuple[float, float]], t0: float) -> List[float]:
    return [(t - t0) / 60.0 for t, _ in pts]


def draw(ax: Any, d: Drawn, t0: float) -> None:
    """Draw one fetched panel on a matplotlib axis, the way its Grafana panel type does."""
    p = d.panel
    ax.set_title(p.title, fontsize=9, loc="left")
    ax.tick_params(labelsize=7)
    k = _scale(p.unit)
    if d.error:
        ax.text(0.5, 0.5, d.error, ha="center", va="center", fontsize=7, wrap=True, transform=ax.transAxes)
        ax.set_axis_off()
        return
    if p.type == "table" or (p.type == "stat" and not d.series):
        _table(ax, d)
        return
    if not d.series:
        ax.text(0.5, 0.5, "no data" + (" (shown only when abnormal)" if dgen_abnormal(p) else ""), ha="center",
                va="center", fontsize=8, color="grey", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    if p.type == "stat":
        legend_, pts = d.series[-1]
        last = pts[-1][1]
        ax.plot(_times(pts, t0), [v * k for _, v in pts], color="tab:green", linewidth=1)
        ax.fill_between(_times(pts, t0), [v * k for _, v in pts], alpha=0.15, color="tab:green")
        ax.text(0.5, 0.55, units.grafana(last, p.unit), ha="center", va="center", fontsize=22, transform=ax.transAxes,
                color=_stat_color(p, last))
        ax.text(0.5, 0.2, legend_, ha="center", fontsize=8, transform=ax.transAxes)
        ax.set_yticks([])
        return
    if p.type == "heatmap":
        _heatmap(ax, d, t0)
        return
    series = sorted(d.series, key=lambda s: s[0])
    if p.stacked:
        times = sorted({t for _, pts in series for t, _ in pts})
        idx = {t: i for i, t in enumerate(times)}
        ys = []
        for _, pts in series:
            row = [0.0] * len(times)
            for t, v in pts:
                row[idx[t]] = v * k
            ys.append(row)
        ax.stackplot([(t - t0) / 60.0 for t in times], ys, labels=[s[0] for s in series], alpha=0.8)
    else:
        step_like = p.type == "state-timeline"
        for name, pts in series:
            xs, ys = _times(pts, t0), [v * k for _, v in pts]
            if step_like:
                ax.step(xs, ys, where="post", label=name, linewidth=1.2)
            else:
                ax.plot(xs, ys, label=name, linewidth=1.2)
    for value, color in p.thresholds:
        if value is not None and p.threshold_lines:
            ax.axhline(value * k, color="red" if color == "red" else "grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("minutes from the start of the range", fontsize=7)
    ax.set_ylabel(UNIT_LABEL.get(p.unit, p.unit or ""), fontsize=7)
    if len(series) <= 12:
        ax.legend(fontsize=6, loc="upper left", frameon=False)
    ax.grid(alpha=0.3)


def dgen_abnormal(p: Panel) -> bool:
    """The panel draws only abnormal series (dashboards/panels.py ABNORMAL): empty means all is well."""
    try:
        from ranksight.dashboards.panels import ABNORMAL
    except ImportError:  # no SDK: the committed JSON was read; say nothing more
        return False
    return ABNORMAL in p.description


def _stat_color(p: Panel, v: float) -> str:
    color = "black"
    for value, c in p.thresholds:
        if value is None or v >= value:
            color = {"green": "tab:green", "red": "tab:red"}.get(c, c or "black")
    return color


def _table(ax: Any, d: Drawn) -> None:
    ax.set_axis_off()
    if not d.rows:
        ax.text(0.5, 0.5, "no rows", ha="center", va="center", fontsize=8, color="grey", transform=ax.transAxes)
        return
    skip = {"__name__", "instance", "alertstate", "local_rank"}
    cols = [c for c in dict.fromkeys(k for r in d.rows for k in r) if c not in skip][:10]
    cells = [[str(r.get(c, ""))[:28] for c in cols] for r in d.rows[:12]]
    t = ax.table(cellText=cells, colLabels=cols, loc="upper center", cellLoc="left")
    t.auto_set_font_size(False)
    t.set_fontsize(6)


def _heatmap(ax: Any, d: Drawn, t0: float) -> None:
    """One row per series (per-rank heatmaps), colour = value."""
    def key(s: Series) -> Tuple[float, str]:
        m = re.match(r"\s*(-?\d+(?:\.\d+)?)", s[0])
        return (float(m.group(1)) if m else math.inf, s[0])

    series = sorted(d.series, key=key)
    times = sorted({t for _, pts in series for t, _ in pts})
    idx = {t: i for i, t in enumerate(times)}
    grid = [[math.nan] * len(times) for _ in series]
    for r, (_, pts) in enumerate(series):
        for t, v in pts:
            grid[r][idx[t]] = v
    x0, x1 = (times[0] - t0) / 60.0, (times[-1] - t0) / 60.0
    im = ax.imshow(grid, aspect="auto", cmap="Oranges", origin="lower", interpolation="nearest",
                   extent=(x0, max(x1, x0 + 1e-3), -0.5, len(series) - 0.5))
    ax.set_yticks(range(len(series)))
    ax.set_yticklabels([s[0] for s in series], fontsize=6)
    ax.set_xlabel("minutes from the start of the range", fontsize=7)
    cb = ax.figure.colorbar(im, ax=ax, fraction=0.04)
    cb.ax.tick_params(labelsize=6)
    cb.set_label(UNIT_LABEL.get(d.panel.unit, d.panel.unit), fontsize=6)


def figure(drawn: Sequence[Drawn], t0: float, path: Path, cols: int = 2, title: str = "",
           as_heatmap: bool = False) -> Path:
    """Draw panels into one PNG (a grid of ``cols`` columns)."""
    plt = _plt()
    n = max(len(drawn), 1)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.2 * cols, 3.0 * rows), squeeze=False)
    for i, ax in enumerate(axes.flat):
        if i < len(drawn):
            d = drawn[i]
            if as_heatmap and d.series:
                ax.set_title(d.panel.title, fontsize=9, loc="left")
                _heatmap(ax, d, t0)
            else:
                draw(ax, d, t0)
        else:
            ax.set_axis_off()
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
