"""The three ranksight dashboards, built with grafana-foundation-sdk from the triage
table (ranksight/triage.py) and the metric catalog (ranksight/catalog.py).

No metric name is written here: every series comes from ``catalog`` or from the
recording-rule names in ``triage.REC``. Rank-level panels read the recording
rules (one precomputed series per rank) so that they stay fast at thousands of
ranks; the triage rows show the three worst ranks/GPUs/nodes and the median
rather than one line per rank.

Issue 9 (1,024 nodes x 8 GPUs x 8 ranks): a panel that would draw one series per rank, GPU,
device, port or node draws the ``K`` worst (topk/bottomk) or only the abnormal ones
(``abnormal=True``: empty while healthy), and fleet panels read node- and job-level
recording rules instead of the raw high-cardinality families (RDMA port counters, GPU
utilization samples, interface counters, ingest). The $job/$node/$rank variables still
select one rank or node, which the bounded query then draws alone.

Imported only by ``generate.render()``: the SDK is an optional dependency.
"""
from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

with warnings.catch_warnings():
    # The SDK's classic dashboard builder warns "prefer dashboardv2" at import. Grafana 12
    # provisions the classic (v1) JSON model, which is also what the schemas describe.
    warnings.simplefilter("ignore", DeprecationWarning)
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import heatmap, prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import heatmap as hm
    from grafana_foundation_sdk.models import prometheus as pm

from ranksight import catalog as C
from ranksight import triage
from ranksight.catalog import Metric

DS = cm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "ranksight"
ALL = ".*"  # allValue of job/node/rank: also matches series without the label (ALERTS of node alerts)

# Variable matchers by label. Only labels a series carries get a matcher.
VAR_LABELS = ("job", "node", "rank")

# Triage-table units -> Grafana unit ids (Grafana's valueFormats/categories.ts).
UNITS = {"ratio": "percentunit", "seconds": "s", "count": "short", "bool": "short",
         "per_minute": "cpm", "bytes": "Bps"}

K = 10  # series a per-rank/GPU/device/port/node panel draws at most: the K worst at each instant


def top(expr: str) -> str:
    """The K highest series (the worst where high is bad)."""
    return f"topk({K}, {expr})"


def bottom(expr: str) -> str:
    """The K lowest series (the worst where low is bad)."""
    return f"bottomk({K}, {expr})"


ONE_RANK = "select one with the $rank variable (or its node with $node) to see it alone"


def one_node(what: str) -> str:
    return f"select a node with the $node variable to see all of its {what}"


def worst(what: str, how: str = "highest value", see: str = ONE_RANK, lines: str = "Lines") -> str:
    """The description sentence of a top/bottom-K panel: what it draws and how to see one."""
    return (f"{lines}: the {K} {what} with the {how} at each instant (one each would be unreadable "
            f"and slow at thousands); {see}.")


ABNORMAL = "Only abnormal series are drawn: the panel is empty while all is well."


# ---------------------------------------------------------------- PromQL helpers
def _matchers(labels: Sequence[str], extra: str = "") -> str:
    parts = [f'{lab}=~"${lab}"' for lab in VAR_LABELS if lab in labels]
    if extra:
        parts.insert(0, extra)
    return "{" + ", ".join(parts) + "}"


def _rec_labels(name: str) -> Tuple[str, ...]:
    """Labels a recording rule keeps, from its level prefix (level:metric:operation)."""
    level = name.split(":", 1)[0]
    return {"rank": C.RANK_LABELS, "job": ("job",), "node": ("node",), "gpu": C.GPU_LABELS}[level]


def sel(metric: Union[Metric, str], extra: str = "", part: str = "") -> str:
    """A series selector with the dashboard variables the series' labels allow.

    ``metric`` is a catalog Metric (``part`` = bucket|sum|count for histogram series) or
    a recording-rule name from ``triage.REC``."""
    if isinstance(metric, Metric):
        name = getattr(metric, part) if part else metric.name
        return name + _matchers(metric.labels, extra)
    return metric + _matchers(_rec_labels(metric), extra)


def rate(metric: Metric, extra: str = "", part: str = "", fn: str = "rate") -> str:
    return f"{fn}({sel(metric, extra, part)}[$__rate_interval])"


def _known_series() -> Dict[str, Tuple[str, ...]]:
    known: Dict[str, Tuple[str, ...]] = {}
    for m in C.CATALOG.values():
        known[m.name] = m.labels
        if m.type == "histogram":
            for part in (m.bucket, m.sum, m.count):
                known[part] = m.labels
    for rec in triage.REC.values():
        known[rec] = _rec_labels(rec)
    return known


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|(?<![\w:])([A-Za-z_:][\w:]*)(\{[^}]*\})?')
_WINDOW = re.compile(r"\b(rate|irate|increase)\(([^()\[\]]*)\[[^\]]+\]\)")


def dashboard_expr(expr: str) -> str:
    """A triage-table PromQL expression as a dashboard query: every known series gets the
    job/node/rank variable matchers it can carry, and every rate()/increase() window
    becomes $__rate_interval."""
    known = _known_series()

    def repl(mo: "re.Match[str]") -> str:
        name = mo.group(1)
        if name is None or name not in known:  # a string literal, a function, a label, a keyword
            return mo.group(0)
        existing = (mo.group(2) or "{}")[1:-1].strip()
        return name + _matchers(known[name], existing)

    out = _TOKEN.sub(repl, expr)
    return _WINDOW.sub(r"\1(\2[$__rate_interval])", out)


# ---------------------------------------------------------------- panel specs
@dataclass(frozen=True)
class Q:
    """One panel query."""
    expr: str
    legend: str = ""
    instant: bool = False
    fmt: str = "time_series"  # time_series | table | heatmap


@dataclass(frozen=True)
class Threshold:
    value: float
    op: str  # ">": red at and above; "<": red below


@dataclass
class Layout:
    """Panel ids and positions for one dashboard, and the titles of its abnormal-only panels."""
    next_id: int = 1
    abnormal: List[str] = field(default_factory=list)

    def take(self) -> int:
        i = self.next_id
        self.next_id += 1
        return i


def _targets(p: Any, queries: Sequence[Q]) -> Any:
    for i, q in enumerate(queries):
        t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DS)
        if q.legend:
            t = t.legend_format(q.legend)
        t = t.instant() if q.instant else t.range()
        if q.fmt != "time_series":
            t = t.format(pm.PromQueryFormat(q.fmt))
        p = p.with_target(t)
    return p


def _thresholds(th: Optional[Threshold]) -> Any:
    if th is None:
        steps = [dm.Threshold(value=None, color="green")]
    elif th.op == ">":
        steps = [dm.Threshold(value=None, color="green"), dm.Threshold(value=th.value, color="red")]
    else:
        steps = [dm.Threshold(value=None, color="red"), dm.Threshold(value=th.value, color="green")]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _base(p: Any, lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], w: int, h: int,
          abnormal: bool = False) -> Any:
    """``abnormal``: the queries return only abnormal series (nothing while healthy); the title is
    recorded (``Board.abnormal``, exported by ``generate.abnormal_only``) and the description says so."""
    if abnormal:
        lay.abnormal.append(title)
        desc = f"{desc} {ABNORMAL}"
    p = (p.id(lay.take()).title(title).description(desc).datasource(DS).unit(unit)
         .span(w).height(h))
    return _targets(p, queries)


def ts(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
       threshold: Optional[Threshold] = None, w: int = 12, h: int = 8, min0: bool = True,
       band: Optional[Tuple[str, str]] = None, abnormal: bool = False, stack: bool = False) -> Any:
    p = _base(timeseries.Panel(), lay, title, desc, unit, queries, w, h, abnormal)
    if stack:  # stacked areas (a whole split into parts)
        p = p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
    p = (p.line_width(1).fill_opacity(60 if stack else 0).span_nulls(False)
         .legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.LIST)
                 .placement(cm.LegendPlacement.BOTTOM).calcs([]))
         .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
         .thresholds(_thresholds(threshold)))
    if min0:
        p = p.min(0)
    if threshold is not None:
        p = p.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    if band is not None:  # fill between two named series (a min/max band)
        upper, lower = band
        p = p.override_by_name(upper, [dm.DynamicConfigValue(id_val="custom.fillBelowTo", value=lower),
                                       dm.DynamicConfigValue(id_val="custom.fillOpacity", value=20)])
    return p


def stat_panel(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
               threshold: Optional[Threshold] = None, w: int = 6, h: int = 8) -> Any:
    p = _base(stat.Panel(), lay, title, desc, unit, queries, w, h)
    return (p.thresholds(_thresholds(threshold))
            .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA)
            .text_mode(cm.BigValueTextMode.VALUE_AND_NAME))


def table_panel(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
                columns: Sequence[Tuple[str, str, str]] = (), hide: Sequence[str] = ("Time",),
                sort: Optional[str] = None, w: int = 12, h: int = 8, abnormal: bool = False) -> Any:
    """An instant table. ``columns``: (field name, display name, unit) per query value."""
    p = _base(table.Panel(), lay, title, desc, unit, queries, w, h, abnormal)
    if len(queries) > 1:
        p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(dm.DataTransformerConfig(
        id_val="organize", options={"excludeByName": {name: True for name in hide}}))
    for name, display, u in columns:
        p = p.override_by_name(name, [dm.DynamicConfigValue(id_val="displayName", value=display),
                                      dm.DynamicConfigValue(id_val="unit", value=u)])
    if sort:
        p = p.sort_by([cb.TableSortByFieldState().display_name(sort).desc(True)])
    return p.thresholds(_thresholds(None))


def heatmap_panel(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
                  y_unit: str = "", w: int = 12, h: int = 8) -> Any:
    """A heatmap of ready-made rows: histogram buckets (format heatmap) or one series per rank."""
    p = _base(heatmap.Panel(), lay, title, desc, unit, queries, w, h)
    y = heatmap.YAxisConfig()
    if y_unit:
        y = y.unit(y_unit)
    return (p.calculate(False).y_axis(y).cell_values(heatmap.CellValues().unit(unit))
            .color(heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME)
                   .scheme("Oranges").steps(64).exponent(0.5).fill("dark-orange").reverse(False))
            .show_value(cm.VisibilityMode.NEVER).show_legend())


def timeline(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
             threshold: Optional[Threshold] = None, w: int = 12, h: int = 8, abnormal: bool = False) -> Any:
    p = _base(statetimeline.Panel(), lay, title, desc, unit, queries, w, h, abnormal)
    return (p.thresholds(_thresholds(threshold)).show_value(cm.VisibilityMode.NEVER)
            .merge_values(True).row_height(0.9))


# ---------------------------------------------------------------- descriptions
def _fmt(value: float, unit: str) -> str:
    if unit == "ratio":
        return f"{value:.0%}"
    if unit == "seconds":
        return f"{value:g} s"
    if unit == "bytes":
        return f"{value / 1e9:g} GB/s"
    if unit == "per_minute":
        return f"{value:g} per minute"
    return f"{value:g}"


def signal_description(e: triage.Entry, lines: str) -> str:
    word = "high" if e.op == ">" else "low"
    thr = f" (abnormal when {e.op} {_fmt(e.threshold, e.unit)})" if e.threshold is not None else ""
    return (f"{e.meaning} If {word}{thr}, look at {e.next_check}. {lines} "
            f"Alert: {e.alert}; runbook: {e.runbook}")


# ---------------------------------------------------------------- variables and dashboard
def _variables(d: Any, node_query: str) -> Any:
    d = d.with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus")
                        .regex("").multi(False).include_all(False))
    queries = [
        ("job", "Job", f"label_values({C.RANK_UP}, job)", dm.VariableSort.ALPHABETICAL_ASC),
        ("node", "Node", node_query, dm.VariableSort.NATURAL_ASC),
        ("rank", "Rank", f'label_values({C.RANK_UP}{{job=~"$job", node=~"$node"}}, rank)',
         dm.VariableSort.NUMERICAL_ASC),
    ]
    for name, label, q, sort in queries:
        d = d.with_variable(
            db.QueryVariable(name).label(label).datasource(DS).query(q).definition(q)
            .multi(True).include_all(True).all_value(ALL)
            .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"]))
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(sort))
    return d


def _dashboard(uid: str, title: str, desc: str, node_query: str) -> Any:
    d = (db.Dashboard(title).uid(uid).description(desc).tags([TAG]).editable()
         .timezone("browser").time("now-1h", "now").refresh("30s")
         .tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .link(db.DashboardLink("ranksight").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG])
               .as_dropdown(False).include_vars(True).keep_time(True)))
    return _variables(d, node_query)


NODE_OF_JOB = f'label_values({C.RANK_UP}{{job=~"$job"}}, node)'
NODE_OF_AGENT = f"label_values({C.COLLECTOR_UP}, node)"


@dataclass
class Board:
    """A dashboard under construction: rows of panels."""
    uid: str
    title: str
    desc: str
    node_query: str = NODE_OF_JOB
    lay: Layout = field(default_factory=Layout)
    rows: List[Tuple[str, int, List[Any]]] = field(default_factory=list)

    @property
    def abnormal(self) -> Tuple[str, ...]:
        """Titles of the panels that draw only abnormal series (empty while healthy)."""
        return tuple(self.lay.abnormal)

    def row(self, title: str) -> List[Any]:
        panels: List[Any] = []
        self.rows.append((title, self.lay.take(), panels))
        return panels

    def build(self) -> Any:
        d = _dashboard(self.uid, self.title, self.desc, self.node_query)
        for title, row_id, panels in self.rows:
            d = d.with_row(db.Row(title).id(row_id).collapsed(False))
            for p in panels:
                d = d.with_panel(p)
        model = d.build()
        for link in model.links or []:
            # The SDK defaults links to "inControlsMenu" (a Grafana 12.x controls-menu placement);
            # without a placement Grafana shows them in the dashboard's top bar, on every 12.x.
            link.placement = None
        return model


# ---------------------------------------------------------------- triage dashboard
RANK_WORST = "Lines: the 3 worst ranks of each job and the job's median rank."
NODE_WORST = "Lines: the 3 worst {what} and the median."


def _scope(e: triage.Entry) -> str:
    if "rank" in e.scope:
        return "rank"
    return "gpu" if "gpu" in e.scope else "node"


def _signal_queries(e: triage.Entry, expr: str) -> Tuple[List[Q], str]:
    """Worst-k and median lines of one indicator, bounded at any number of ranks."""
    scope = _scope(e)
    R = triage.REC
    if e.id == "rank-down":  # tracked minus heartbeating, from the job-level rules (not 8,000 rank series)
        return [Q(f"{sel(R['ranks'])} - {sel(R['ranks_up'])}", f"{{{{job}}}}: {e.title.lower()}")], \
            "Line: how many ranks of each job are down (tracked minus heartbeating)."
    if e.id == "checkpoint-stale":  # per-rank age and the job median, recorded
        return [Q(f"topk by (job) (3, {sel(R['ckpt_age'])})", "{{job}} rank {{rank}}"),
                Q(sel(R["ckpt_age_median"]), "{{job}} median")], RANK_WORST
    if e.unit == "bool":  # count the abnormal ones per job (0 when none)
        cmp = f"{expr} {e.op} bool {e.threshold:g}"
        return [Q(f"sum by (job) ({cmp})", f"{{{{job}}}}: {e.title.lower()}")], \
            "Line: how many ranks of each job are in this state."
    k = "topk" if e.op == ">" else "bottomk"
    if scope == "rank":
        return [Q(f"{k} by (job) (3, {expr})", "{{job}} rank {{rank}}"),
                Q(f"quantile by (job) (0.5, {expr})", "{{job}} median")], RANK_WORST
    if scope == "gpu":
        return [Q(f"{k}(3, {expr})", "{{node}} gpu {{gpu}}"), Q(f"quantile(0.5, {expr})", "median")], \
            NODE_WORST.format(what="GPUs")
    return [Q(f"{k}(3, {expr})", "{{node}}"), Q(f"quantile(0.5, {expr})", "median")], \
        NODE_WORST.format(what="nodes")


# Panel titles where the entry's title names the row rather than what its indicator draws.
PANEL_TITLES = {"checkpoint-slow": "Checkpoint share of wall time", "rank-down": "Ranks down"}


def _signal_panel(lay: Layout, e: triage.Entry) -> Any:
    queries, lines = _signal_queries(e, dashboard_expr(e.indicator))
    thr = None
    if e.threshold is not None:
        thr = Threshold(1.0, ">") if e.unit == "bool" else Threshold(e.threshold, e.op)
    return ts(lay, PANEL_TITLES.get(e.id, e.title), signal_description(e, lines), UNITS[e.unit], queries,
              threshold=thr, w=8)


def _extra_signal_panels(lay: Layout, order: int, t: Mapping[str, Any]) -> List[Any]:
    """Panels a row needs beyond its alert entries' indicators."""
    R = triage.REC
    if order == 2:
        expr = sel(R["gpu_swings"])
        return [ts(lay, "GPU utilization swings per minute",
                   "High-to-low utilization crossings per minute (the sawtooth detector; RanksightGpuSawtooth needs "
                   f"at least {t['gpu_swings_per_min']:g}/min together with a low mean). If high, look at the "
                   "dataloader wait share (row 1), then the exposed communication share (row 3). "
                   + NODE_WORST.format(what="GPUs"),
                   "cpm", [Q(f"topk(3, {expr})", "{{node}} gpu {{gpu}}"), Q(f"quantile(0.5, {expr})", "median")],
                   threshold=Threshold(t["gpu_swings_per_min"], ">"), w=8)]
    if order == 3:
        expr = sel(R["xcomm_share"])
        return [ts(lay, "Exposed communication share",
                   "Share of step time blocked waiting on collectives (communication not hidden behind compute). "
                   "If high while the comm share is high, the network is the limit: look at retransmits and link "
                   "speed (row 4); if only one rank is low, the others wait for it (a straggler). " + RANK_WORST,
                   "percentunit", [Q(f"topk by (job) (3, {expr})", "{{job}} rank {{rank}}"),
                                   Q(f"quantile by (job) (0.5, {expr})", "{{job}} median")], w=8)]
    if order == 4:
        expr = sel(C.NET_IF_SPEED)
        return [ts(lay, "NIC link speed",
                   "Negotiated link speed per interface (bytes/s). If low (below "
                   f"{t['nic_min_speed_bytes'] / 1e9:g} GB/s, or below the highest seen), look at the cable, the "
                   "transceiver and the switch port (RanksightNicSpeedLow). Lines: the 3 slowest interfaces.",
                   "Bps", [Q(f"bottomk(3, {expr})", "{{node}} {{device}}")],
                   threshold=Threshold(t["nic_min_speed_bytes"], "<"), w=8)]
    if order == 5:
        expr = sel(C.LAST_CHECKPOINT_DURATION)
        return [ts(lay, "Last checkpoint write duration",
                   "Duration of each rank's last checkpoint write. If high (above "
                   f"{t['checkpoint_write_seconds']:g} s, RanksightCheckpointSlow), look at the checkpoint "
                   "filesystem's throughput and free space, and whether every rank writes the full state. "
                   + RANK_WORST, "s",
                   [Q(f"topk by (job) (3, {expr})", "{{job}} rank {{rank}}"),
                    Q(f"quantile by (job) (0.5, {expr})", "{{job}} median")],
                   threshold=Threshold(t["checkpoint_write_seconds"], ">"), w=8)]
    if order == 6:
        return [ts(lay, "Ranks stalled",
                   "Ranks alive but making no progress. reason=no_progress: the rank is stuck in its own code, it is "
                   "the hang's culprit (RanksightRankStalled); reason=waiting_in_collective: it waits on a peer "
                   "(RanksightRankBlocked). If any, look at the culprit's stack (py-spy dump). "
                   "Line: how many ranks of each job are stalled, by reason.",
                   "short", [Q(f"sum by (job, reason) ({sel(C.RANK_STALLED)})", "{{job}} {{reason}}")],
                   threshold=Threshold(1.0, ">"), w=8)]
    return []


def triage_board(cfg: Mapping[str, Any]) -> Board:
    R = triage.REC
    b = Board("ranksight-triage", "ranksight / Training triage",
              "Walk the rows top to bottom: the six triage signals in order. A symptom counts only once the "
              "rows above it are fine. Generated by `ranksight dashboards` from the triage table.")
    job = _matchers(("job",))
    alerts = 'alertname=~"Ranksight.*", alertstate="firing"'
    _goodput_row(b, cfg)
    top = b.row("Overview")
    top += [
        ts(b.lay, "Step time p50 / p99",
           "Job step duration quantiles from the step-duration histograms of all ranks (recording rules). "
           "If p99 is far above p50, steps are uneven: walk the triage rows below.", "s",
           [Q(f"{R['job_p50']}{job}", "{{job}} p50"), Q(f"{R['job_p99']}{job}", "{{job}} p99")], w=8),
        ts(b.lay, "Throughput",
           "Optimizer steps per second of each job (mean over its ranks). If it drops, look at the step time and "
           "the triage rows below.", "ops", [Q(f"{R['job_steps']}{job}", "{{job}}")], w=6),
        stat_panel(b.lay, "Ranks up",
                   "Ranks heartbeating (up) and tracked by the agents, per job. If up < tracked, look at row 6 "
                   "(heartbeats) and the rank-down alert.", "short",
                   [Q(sel(R["ranks_up"]), "{{job}} up"), Q(sel(R["ranks"]), "{{job}} tracked")], w=4),
        table_panel(b.lay, "Firing ranksight alerts",
                    "Ranksight alerts firing now in Prometheus (before Alertmanager's inhibition, which mutes "
                    "symptoms while their cause fires). The first one in triage order is the verdict; its runbook "
                    "link is in the alert's annotations.", "none",
                    [Q(f"ALERTS{{{alerts}, job=~\"$job\"}} or "
                       f"ALERTS{{{alerts}, job=\"{triage.SCRAPE_JOB}\", node=~\"$node\"}}", instant=True, fmt="table")],
                    hide=("Time", "Value", "__name__", "alertstate", "instance"), w=6),
    ]
    t = cfg["thresholds"]
    groups: Dict[int, List[triage.Entry]] = {}
    for e in triage.signals(cfg):
        groups.setdefault(e.order, []).append(e)
    for order, entries in groups.items():
        panels = b.row(f"{order}. {entries[0].title}")
        panels += [_signal_panel(b.lay, e) for e in entries]
        panels += _extra_signal_panels(b.lay, order, t)
    return b


def _goodput_row(b: Board, cfg: Mapping[str, Any]) -> None:
    """The triage dashboard's first row: of the wall time the job has run, how much trained, and
    where the rest went (ranksight/triage_goodput.py); and its step time against its own baseline."""
    R = triage.REC
    by = triage.by_alert(cfg)
    low, reg = by["RanksightGoodputLow"], by["RanksightStepTimeRegression"]
    floor = Threshold(low.threshold, "<")
    panels = b.row("Goodput")
    panels += [
        stat_panel(b.lay, "Goodput",
                   "Share of the job's wall time (from its first rank's start, across restarts) that was productive "
                   f"step time. If low (below {low.threshold:.0%}), look at the breakdown beside it: the largest "
                   f"badput category is the place to start. Alert: {low.alert} (info).", "percentunit",
                   [Q(sel(R["goodput"]), "{{job}}")], threshold=floor, w=4),
        ts(b.lay, "Goodput over time",
           "The goodput ratio of each job as it evolved (cumulative since the job's first start). If it falls, the "
           "breakdown shows which category took the time.", "percentunit",
           [Q(sel(R["goodput"]), "{{job}}")], threshold=floor, w=6),
        ts(b.lay, "Where the wall time went",
           "The job's wall time per rank, split into productive step time and the badput categories: data wait, "
           "exposed comm, blocking checkpoint, startup, wasted progress (redone after a restart), recovery, "
           "stalled and other; the stack's height is the wall time. If a category grows, look at its triage row "
           "(data wait: row 1, exposed comm: row 3, checkpoint: row 5, recovery and stalled: row 6).", "s",
           [Q(f"sum by (category) ({sel(R['goodput_split'])})", "{{category}}")], stack=True, w=8),
        ts(b.lay, "Step time against its baseline",
           f"The job's step p50 averaged over {cfg['windows']['step_smooth']} and its baseline, the lowest such "
           f"average within {cfg['windows']['step_baseline']}. If the average rises above "
           f"{reg.threshold:g}x the baseline, {reg.alert} fires and names the step component that grew most; "
           f"look at {reg.next_check}.", "s",
           [Q(sel(R["p50_avg"]), "{{job}} p50 (smoothed)"), Q(sel(R["p50_baseline"]), "{{job}} baseline")], w=6),
    ]


# ---------------------------------------------------------------- ranks dashboard
def ranks_board(cfg: Mapping[str, Any]) -> Board:
    R = triage.REC
    t = cfg["thresholds"]
    by = triage.by_alert(cfg)
    b = Board("ranksight-ranks", "ranksight / Ranks",
              "Per-rank view: spot the straggler. Under synchronous data parallel every rank's step time is the "
              "same; the slow rank shows as high busy time per step, the others as collective wait. At thousands "
              f"of ranks each panel draws the {K} worst; the $job/$node/$rank variables select one rank.")
    b2o = sel(R["b2o"])
    p99 = sel(C.STEP_QUANTILE, 'quantile="0.99"')
    who = "{{job}}/{{rank}}"
    # heatmap rows named "<rank> (<job>)": Grafana's heatmap sorts rows numerically only when every
    # row name parses as a number (parseFloat reads the leading rank), otherwise as text (10 before 2)
    row_name = "{{rank}} ({{job}})"

    def worst_ranks(expr: str) -> str:
        """A table column, for the K ranks with the highest straggler ratio."""
        return f"{expr} and on (job, rank) {top(sel(R['straggler']))}"

    rows = b.row("Step time by rank")
    rows += [
        heatmap_panel(b.lay, "Step time by rank",
                      "Mean step duration per rank (one heatmap row per rank, colour = seconds, rows in rank "
                      "order). Under synchronous training every row has the same colour; a different row is a "
                      "rank out of step. If one row is darker, look at its busy time and straggler ratio below. "
                      + worst("ranks", "longest step", lines="Rows"), "s",
                      [Q(top(sel(R["step_mean"])), row_name)]),
        heatmap_panel(b.lay, "Backward-to-optimizer time by rank",
                      "Mean time from backward start to optimizer.step() start per rank (colour = seconds, rows "
                      "in rank order). It includes the gradient all-reduce, so fast ranks wait here for slow "
                      "ones: a lighter row is the likely straggler. If one row differs, look at its straggler "
                      "ratio. " + worst("ranks", "longest wait", lines="Rows"), "s",
                      [Q(top(b2o), row_name)]),
        table_panel(b.lay, "Per-rank step breakdown",
                    f"One row per rank, now, for the {K} ranks with the highest straggler ratio (busy time / job "
                    "median; sorted, worst first): mean and p99 step time, backward-to-optimizer, busy time per "
                    "step and the shares of step time. If one rank's straggler ratio is high, look at its node's "
                    "GPU throttling and PCIe link. Select ranks with the $rank variable to list those.",
                    "s",
                    [Q(worst_ranks(f"max without () ({sel(R['step_mean'])})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without (quantile) ({p99})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({b2o})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({sel(R['busy'])})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({sel(R['straggler'])})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({sel(R['data_share'])})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({sel(R['comm_share'])})"), instant=True, fmt="table"),
                     Q(worst_ranks(f"max without () ({sel(R['ckpt_share'])})"), instant=True, fmt="table")],
                    columns=[("Value #A", "step mean", "s"), ("Value #B", "step p99", "s"),
                             ("Value #C", "backward to optimizer", "s"), ("Value #D", "busy per step", "s"),
                             ("Value #E", "straggler ratio", "none"), ("Value #F", "data share", "percentunit"),
                             ("Value #G", "comm share", "percentunit"), ("Value #H", "checkpoint share", "percentunit")],
                    hide=("Time", "instance", "local_rank"), sort="straggler ratio", w=24, h=10),
    ]
    straggler = by["RanksightStraggler"]
    rows = b.row("Stragglers")
    rows += [
        ts(b.lay, "Straggler ratio",
           f"Busy time per step of each rank / the job's median busy time. {straggler.meaning} If high (above "
           f"{t['straggler_ratio']:g}), look at {straggler.next_check}. Alert: {straggler.alert}. "
           + worst("ranks"), "none",
           [Q(top(sel(R["straggler"])), who)], threshold=Threshold(t["straggler_ratio"], ">"), min0=False),
        ts(b.lay, "Busy time per step",
           "Step time minus data wait, exposed communication and checkpoint time, per rank, with the job median. "
           "If one rank is above the median, it computes slower: look at its GPU. " + worst("ranks"), "s",
           [Q(top(sel(R["busy"])), who), Q(sel(R["busy_median"]), "{{job}} median")]),
    ]
    # GPU series joined to the rank on that GPU (the rank-to-GPU info series, always 1)
    on_rank = (f"* on (node, gpu) group_left (job, rank) max by (job, node, rank, gpu) "
               f"({sel(C.RANK_GPU_INFO)})")
    stat_min, stat_max = 'stat="min"', 'stat="max"'
    low_min = bottom(f"{sel(C.GPU_UTILIZATION, stat_min)} {on_rank}")
    gpu_max = f"{sel(C.GPU_UTILIZATION, stat_max)} {on_rank}"
    rows = b.row("GPU of each rank")
    rows += [
        ts(b.lay, "GPU busy ratio by rank",
           "The exact mean utilization of the GPU each rank runs on (the agent joins a rank to its GPU by the "
           "device UUID). A rank whose GPU is much less busy than its peers' waits for data or for others; "
           "a straggler's GPU is busier. If one is low, look at its dataloader wait share. "
           + worst("ranks", "lowest busy ratio"), "percentunit",
           [Q(bottom(f"{sel(R['gpu_util'])} {on_rank}"), who)], w=12),
        ts(b.lay, "GPU utilization waveform by rank (window min / max)",
           "The lowest and highest NVML utilization sample of each rank's GPU over the agent's window. A max "
           "near 100% with a min near 0 is the sawtooth: compute alternates with idle gaps. If so, look at the "
           f"rank's dataloader wait, then its exposed communication. Lines: the {K} ranks with the lowest "
           "window minimum, with their maximum; select one with the $rank variable to see it alone.",
           "percentunit",
           [Q(low_min, who + " min"), Q(f"{gpu_max} and on (job, rank) {low_min}", who + " max")], w=12),
    ]
    rows = b.row("Shares of step time by rank")
    for key, alert, title in (("data_share", "RanksightDataloaderBound", "Dataloader wait share"),
                              ("comm_share", "RanksightCommBound", "Communication share"),
                              ("xcomm_share", None, "Exposed communication share"),
                              ("ckpt_share", "RanksightCheckpointSlow", "Checkpoint share of wall time")):
        if alert:
            e = by[alert]
            rows.append(ts(b.lay, title, signal_description(e, worst("ranks")), "percentunit",
                           [Q(top(sel(R[key])), who)], threshold=Threshold(e.threshold, e.op), w=6))
        else:
            rows.append(ts(b.lay, title,
                           "Share of step time blocked waiting on collectives (not overlapped with compute). If "
                           "high on all ranks but one, that one is the straggler; if high everywhere, look at the "
                           "network (retransmits, link speed). " + worst("ranks"), "percentunit",
                           [Q(top(sel(R[key])), who)], w=6))
    alloc = by["RanksightCudaAllocRetries"]
    rows = b.row("Memory, allocator and hooks")
    rows += [
        ts(b.lay, "CUDA allocator retries per minute",
           signal_description(alloc, worst("ranks")), "cpm",
           [Q(top(sel(R["alloc_retries"])), who)], threshold=Threshold(alloc.threshold, ">"), w=8),
        ts(b.lay, "CUDA memory reserved / allocated",
           "Caching-allocator reserved and allocated bytes per rank. If reserved is far above allocated while "
           "retries rise, memory is fragmented: try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. "
           f"Lines: the {K} ranks with the most reserved and the {K} with the most allocated bytes; select one "
           "with the $rank variable to see both of its lines.", "bytes",
           [Q(top(sel(C.CUDA_RESERVED)), who + " reserved"), Q(top(sel(C.CUDA_ALLOCATED)), who + " allocated")],
           w=8),
        ts(b.lay, "Hook errors and dropped events",
           "Exceptions caught inside the ranksight hooks and GPU timing events dropped, per second. They never "
           "reach training; if non-zero, the rank's log has one line saying why. " + worst("ranks"), "cps",
           [Q(top(rate(C.HOOK_ERRORS)), who + " errors"), Q(top(rate(C.HOOK_DROPPED_EVENTS)), who + " dropped")],
           w=8),
    ]
    return b


# ---------------------------------------------------------------- node dashboard
# Counters the RDMA error panel names: each must be one the agent exposes (its curated allowlist).
RDMA_ERRORS_NAMED = ("symbol_error", "link_downed", "link_error_recovery", "port_rcv_errors",
                     "port_xmit_discards", "out_of_sequence", "packet_seq_err", "local_ack_timeout_err",
                     "rnr_nak_retry_err", "out_of_buffer")
RDMA_CONGESTION_NAMED = ("port_xmit_wait", "np_cnp_sent", "rp_cnp_handled")


def node_board(cfg: Mapping[str, Any]) -> Board:
    R = triage.REC
    t = cfg["thresholds"]
    by = triage.by_alert(cfg)
    b = Board("ranksight-node", "ranksight / Node",
              "Per-node view: the GPU utilization waveform, GPU health, PCIe, network, RDMA and disk of the "
              f"selected nodes, from the ranksight agent. Across many nodes each panel draws the {K} worst GPUs, "
              "devices or nodes, or only the abnormal ones; select nodes with the $node variable to see theirs.",
              node_query=NODE_OF_AGENT)
    gpu = "{{node}} gpu {{gpu}}"
    gpus, nodes = one_node("GPUs"), "select nodes with the $node variable to see those"
    slow = cfg["durations"]["slow_rule_interval"]  # evaluation interval of the node-counter rules
    util = lambda s: sel(C.GPU_UTILIZATION, f'stat="{s}"')  # noqa: E731
    rows = b.row("GPU utilization waveform")
    saw = by["RanksightGpuSawtooth"]
    rows += [
        ts(b.lay, "GPU utilization band (min / mean / max)",
           "Across the selected GPUs: the lowest window minimum, the mean and the highest window maximum of the "
           "NVML utilization samples. A wide band with a high max and a low min is a sawtooth: compute "
           "alternates with idle gaps. If wide, look at the dataloader wait share, then the exposed comm share.",
           "percentunit", [Q(f"min({util('min')})", "min"), Q(f"avg({util('mean')})", "mean"),
                           Q(f"max({util('max')})", "max")],
           band=("max", "min")),
        ts(b.lay, "GPU busy ratio by GPU",
           signal_description(saw, "The exact mean from the busy-seconds counter. "
                              + worst("GPUs", "lowest busy ratio", gpus)),
           "percentunit", [Q(bottom(sel(R["gpu_util"])), gpu)], threshold=Threshold(saw.threshold, "<")),
        heatmap_panel(b.lay, "GPU utilization samples",
                      "NVML utilization samples of the selected GPUs per second, by utilization bucket (summed "
                      f"per node by a recording rule every {slow}, so the picture lags by up to that). Two "
                      "bright bands (near 0 and near 100%) with little between is the sawtooth; one band near the "
                      "top is healthy. If two bands, look at the swings and the dataloader wait.",
                      "cps", [Q(f"sum by (le) ({sel(R['util_samples'])})", "{{le}}", fmt="heatmap")],
                      y_unit="percentunit"),
        ts(b.lay, "GPU utilization swings per minute",
           "High-to-low utilization crossings per minute, per GPU. If high together with a low busy ratio, "
           "compute is not overlapped with IO or communication (RanksightGpuSawtooth). "
           + worst("GPUs", "most swings", gpus), "cpm",
           [Q(top(sel(R["gpu_swings"])), gpu)], threshold=Threshold(t["gpu_swings_per_min"], ">")),
    ]
    rows = b.row("GPU health")
    rows += [
        ts(b.lay, "GPM SM and tensor activity",
           "GPM (Hopper and newer) SM activity and tensor-core activity. A busy ratio near 100% with low SM "
           "activity means the GPU is 'busy' with little work per kernel: look at kernel sizes and launch overhead. "
           + worst("GPUs", "lowest activity (each of SM and tensor)", gpus),
           "percentunit", [Q(bottom(sel(C.GPU_SM_ACTIVE)), gpu + " SM"),
                           Q(bottom(sel(C.GPU_TENSOR_ACTIVE)), gpu + " tensor")],
           w=8),
        timeline(b.lay, "Throttling reasons",
                 "Thermal and power clocks-event reasons active per GPU (1 = active; sw_power_cap, the power "
                 "limit, is shown but does not alert). If any is on for long, that GPU computes slower and its "
                 "rank becomes a straggler: look at cooling and power (RanksightGpuThrottling). Only active "
                 "reasons have a row.", "bool",
                 [Q(sel(R["throttled"]), gpu + " {{reason}}")], threshold=Threshold(1.0, ">"), w=8,
                 abnormal=True),
        ts(b.lay, "XID errors",
           "NVML XID critical errors per GPU and XID number in each interval, for the GPUs that had any. Any is "
           "serious: look at dmesg and NVIDIA's XID catalog (RanksightGpuXidError).", "short",
           [Q(f"{rate(C.GPU_XID_ERRORS, fn='increase')} > 0", gpu + " xid {{xid}}")],
           threshold=Threshold(1.0, ">"), w=8, abnormal=True),
        ts(b.lay, "GPU temperature", "GPU temperature. If high and throttling reasons are on, look at airflow. "
           + worst("GPUs", "highest temperature", gpus), "celsius", [Q(top(sel(C.GPU_TEMPERATURE)), gpu)], w=6),
        ts(b.lay, "GPU power", "GPU power draw. If flat at the cap with sw_power_cap active, the power limit "
           "holds clocks down. " + worst("GPUs", "highest draw", gpus), "watt",
           [Q(top(sel(C.GPU_POWER)), gpu)], w=6),
        ts(b.lay, "SM clock", "GPU SM clock. If it drops under load, look at the throttling reasons. "
           + worst("GPUs", "lowest clock", gpus), "hertz", [Q(bottom(sel(C.GPU_SM_CLOCK)), gpu)], w=6),
        ts(b.lay, "GPU memory used", "GPU memory used and total. If used is near total, expect allocator "
           "retries and OOMs. " + worst("GPUs", "most memory used (and their totals)", gpus), "bytes",
           [Q(top(sel(C.GPU_MEMORY_USED)), gpu + " used"),
            Q(f"{sel(C.GPU_MEMORY_TOTAL)} and on (node, gpu) {top(sel(C.GPU_MEMORY_USED))}", gpu + " total")],
           w=6),
    ]

    def below_max(metric: Metric) -> str:
        current, most = sel(metric, 'state="current"'), sel(metric, 'state="max"')
        return f"{current} < ignoring (state) {most}"

    rows = b.row("PCIe link")
    rows += [
        ts(b.lay, "PCIe link generation (current / max)",
           "Current PCIe generation of the GPUs whose link runs below its max generation. If one is listed while "
           "the GPU is busy, the link trained down: look at the riser and slot (RanksightGpuPcieDegraded). Idle "
           "GPUs downshift on purpose.", "short", [Q(below_max(C.GPU_PCIE_GEN), gpu + " {{state}}")],
           abnormal=True),
        ts(b.lay, "PCIe link width (current / max)",
           "Current PCIe lane width of the GPUs whose link has fewer lanes than its max. If one is listed, the "
           "link lost lanes: reseat the GPU (RanksightGpuPcieDegraded).", "short",
           [Q(below_max(C.GPU_PCIE_WIDTH), gpu + " {{state}}")], abnormal=True),
    ]
    ret = by["RanksightTcpRetransmits"]
    rows = b.row("Network")
    rows += [
        ts(b.lay, "TCP retransmit ratio", signal_description(ret, worst("nodes", "highest ratio", nodes)),
           "percentunit", [Q(top(sel(R["retrans"])), "{{node}}")], threshold=Threshold(ret.threshold, ">"), w=8),
        ts(b.lay, "TCP segments retransmitted and sent",
           "TCP segments retransmitted and sent per second, per node. If retransmits rise with sent flat, packets "
           f"are lost on the node's links. Lines: the {K} nodes retransmitting most and the {K} sending most; "
           "select nodes with the $node variable to see both lines of each.", "pps",
           [Q(top(rate(C.NET_TCP_RETRANS)), "{{node}} retransmitted"), Q(top(rate(C.NET_TCP_SENT)), "{{node}} sent")],
           w=8),
        ts(b.lay, "TCP loss counters",
           "Selected TcpExt counters per second (lost retransmits, timeouts, SYN retransmits). If timeouts rise, "
           "collectives stall for a retransmit timeout each time. " + worst("node counters", "highest rate", nodes),
           "cps", [Q(top(rate(C.NET_TCP_EXT)), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "Interface errors and drops",
           "Errors and drops per second per node and direction, summed over its interfaces (/proc/net/dev; a "
           f"recording rule every {slow}). If non-zero, look at the cable, the transceiver and the switch port; "
           "the agent's /metrics has them per interface. "
           f"Lines: the {K} node directions with the most errors and the {K} with the most drops; {nodes}.", "cps",
           [Q(top(sel(R["if_errors"])), "{{node}} {{direction}} errors"),
            Q(top(sel(R["if_drops"])), "{{node}} {{direction}} drops")], w=8),
        ts(b.lay, "Interface throughput",
           "Bytes per second per node and direction, summed over its interfaces (a recording rule every "
           f"{slow}). If near the link speed, the link is saturated. "
           + worst("node directions", "most traffic", nodes), "Bps",
           [Q(top(sel(R["if_bytes"])), "{{node}} {{direction}}")], w=8),
        ts(b.lay, "NIC link speed",
           f"Negotiated link speed per interface. If low (below {t['nic_min_speed_bytes'] / 1e9:g} GB/s or below "
           "the highest seen), the link negotiated down: look at the cable and port (RanksightNicSpeedLow). "
           + worst("interfaces", "lowest speed", one_node("interfaces")), "Bps",
           [Q(bottom(sel(C.NET_IF_SPEED)), "{{node}} {{device}}")],
           threshold=Threshold(t["nic_min_speed_bytes"], "<"), w=8),
    ]
    rows = b.row("RDMA")
    rows += [
        ts(b.lay, "RDMA packets",
           "Packets received and transmitted per second per node, summed over its RDMA ports (port_rcv_packets, "
           f"port_xmit_packets; a recording rule every {slow}). If one node carries far less than its peers, "
           "traffic is falling back to another path. " + worst("node counters", "most packets", nodes), "pps",
           [Q(top(sel(R["rdma_packets"])), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "RDMA error and congestion counters",
           "Every RDMA port and hardware counter that is not traffic, per second per node, summed over its "
           f"ports (a recording rule every {slow}): errors ({', '.join(RDMA_ERRORS_NAMED)}) and congestion "
           f"({', '.join(RDMA_CONGESTION_NAMED)}). If an error counter rises, look at the cable and the switch; "
           "CNPs and transmit wait mean congestion. " + worst("node counters", "highest rate", nodes), "cps",
           [Q(top(sel(R["rdma_errors"])), "{{node}} {{counter}}")], w=8),
        ts(b.lay, "RDMA port rate", "Port rate (bytes/s) per RDMA port. If below its peers, the port "
           "trained down. " + worst("ports", "lowest rate", one_node("ports")), "Bps",
           [Q(bottom(sel(C.RDMA_PORT_RATE)), "{{node}} {{device}}/{{port}}")], w=8),
    ]
    disk = by["RanksightDiskFilling"]
    rows = b.row("Disk")
    rows += [
        ts(b.lay, "Disk free", "Free bytes of each watched path (tmp, log and checkpoint directories). If "
           "falling fast, checkpoints will fail: look at old checkpoints and caches. "
           + worst("paths", "least free space", one_node("paths")), "bytes",
           [Q(bottom(sel(C.DISK_FREE)), "{{node}} {{path}}")]),
        ts(b.lay, "Disk free share", signal_description(disk, worst("paths", "lowest free share",
                                                                    one_node("paths"))),
           "percentunit", [Q(bottom(sel(R["disk_free"])), "{{node}} {{path}}")],
           threshold=Threshold(disk.threshold, "<")),
    ]
    rows = b.row("Ranks and agent")
    rows += [
        table_panel(b.lay, "Ranks on these nodes",
                    "Ranks of the selected jobs on the selected nodes that are down now (0: three heartbeats "
                    "missed). If a rank is listed, look at the triage dashboard's row 6.", "bool",
                    [Q(f"max without () ({sel(C.RANK_UP)}) == 0", instant=True, fmt="table")],
                    columns=[("Value", "up", "bool")], hide=("Time", "instance"), w=8, abnormal=True),
        timeline(b.lay, "Collectors up",
                 "Each agent collector's lowest state across the selected nodes (1 = its last run succeeded on "
                 "every node). If one is down, its signals are missing: select nodes with the $node variable to "
                 "find where, and the agent's log says why (RanksightCollectorDown).", "bool",
                 [Q(f"min by (collector) ({sel(C.COLLECTOR_UP)})", "{{collector}}")],
                 threshold=Threshold(1.0, "<"), w=8),
        ts(b.lay, "Agent ingest",
           "Datagrams per second the agents of the selected nodes received, by result (a recording rule per "
           "node). If anything but ok is non-zero, hooks and agent disagree (version) or the rank cap is hit "
           "(RanksightIngestDropping): select nodes with the $node variable to find where.", "cps",
           [Q(f"sum by (result) ({sel(R['ingest'])})", "{{result}}")], w=8),
    ]
    return b


BOARDS = (("ranksight-triage.json", triage_board), ("ranksight-ranks.json", ranks_board),
          ("ranksight-node.json", node_board))
