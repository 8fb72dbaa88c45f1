"""The panel library the ranksight dashboards are built from (grafana-foundation-sdk): PromQL
helpers over the catalog and the recording rules, panel builders, descriptions, variables
and ``Board``.

No metric name is written here: every series comes from ``catalog`` or from the
recording-rule names in ``triage.REC``. Rank-level panels read the recording rules (one
precomputed series per rank) so that they stay fast at thousands of ranks. A panel that would
draw one series per rank, GPU, device, port or node draws the ``K`` worst (topk/bottomk) or
only the abnormal ones (``abnormal=True``: empty while healthy), and fleet panels read node-
and job-level recording rules instead of the raw high-cardinality families (RDMA port
counters, GPU utilization samples, interface counters, ingest). The $job/$node/$rank
variables still select one rank or node, which the bounded query then draws alone.
"""
from __future__ import annotations

import warnings
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

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
from ranksight.common import units
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
    """Panel ids and positions for one dashboard, the titles of its abnormal-only panels, and of
    the panels of a feature's row (``Board.row(title, feature)``: series only for jobs using it)."""
    next_id: int = 1
    abnormal: List[str] = field(default_factory=list)
    feature: List[str] = field(default_factory=list)
    feature_now: str = ""  # the feature of the row being filled ("" for none)

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
    if lay.feature_now:
        lay.feature.append(title)
        desc = f"{desc} Only jobs that use {lay.feature_now} have these series."
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


@dataclass(frozen=True)
class Band:
    start: float  # the band's lower edge (the first band's is ignored: it starts at -inf)
    end: Optional[float]  # its upper edge (None: +inf)
    color: str
    name: str


def _band_thresholds(bands: Sequence[Band]) -> Any:
    steps = [dm.Threshold(value=None if i == 0 else b.start, color=b.color) for i, b in enumerate(bands)]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps)


def _band_mappings(bands: Sequence[Band]) -> List[Any]:
    """Range value mappings: each band's name (and colour) instead of the value."""
    return [dm.RangeMap(options=dm.DashboardRangeMapOptions(
        from_val=None if i == 0 else b.start, to=b.end,
        result=dm.ValueMappingResult(text=b.name, color=b.color, index=i))) for i, b in enumerate(bands)]


def stat_panel(lay: Layout, title: str, desc: str, unit: str, queries: Sequence[Q], *,
               threshold: Optional[Threshold] = None, w: int = 6, h: int = 8,
               bands: Sequence[Band] = (), band_names: bool = False) -> Any:
    """``bands``: the value's colour by band (instead of ``threshold``); ``band_names``: show the
    band's name instead of the value."""
    p = _base(stat.Panel(), lay, title, desc, unit, queries, w, h)
    if band_names:
        p = p.mappings(_band_mappings(bands))
    return (p.thresholds(_band_thresholds(bands) if bands else _thresholds(threshold))
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
def signal_description(e: triage.Entry, lines: str) -> str:
    word = "high" if e.op == ">" else "low"
    thr = f" (abnormal when {e.op} {units.threshold(e.threshold, e.unit)})" if e.threshold is not None else ""
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

    @property
    def feature(self) -> Tuple[str, ...]:
        """Titles of the panels in a feature's row: empty for a job that does not use the feature."""
        return tuple(self.lay.feature)

    def row(self, title: str, feature: str = "") -> List[Any]:
        """A new row; ``feature``: its panels draw series only jobs using that feature have."""
        self.lay.feature_now = feature
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
