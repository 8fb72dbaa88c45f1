"""`ranksight dashboards`: write the Grafana dashboards (triage, ranks, node).

The dashboards are built with grafana-foundation-sdk (``build.py``) from the triage
table and the metric catalog, rendered as Grafana's classic JSON model and written
with sorted keys so that a fresh render can be compared byte for byte with the
committed files. ``ranksight dashboards`` writes into ``--out DIR`` (default
``./run/dashboards``); ``--in-place`` refreshes the committed ``dashboards/*.json``, the
render of the built-in defaults (it refuses any other config).

Pure helpers for tests and benchmarks:
- ``render(cfg)``: file name -> dashboard JSON model;
- ``queries(cfg)``: every panel query as (file name, panel title, expr);
- ``abnormal_only(cfg)``: the (file name, panel title) of the panels that draw only abnormal
  series (XID errors, PCIe below max, ranks down, ...): they return nothing while all is well;
- ``substitute(expr, ...)``: replace the dashboard variables the way Grafana does,
  so an expression can be sent to Prometheus or promtool.
"""
from __future__ import annotations

import argparse
import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ranksight import cli
from ranksight.console import error
from ranksight import config as rconfig

log = logging.getLogger(__name__)

COMMITTED_DIR = Path(__file__).resolve().parent  # dashboards/ of a checkout: what --in-place writes
OUT_DIR = COMMITTED_DIR  # the name ranksight.report reads the committed dashboards by
FILES = ("ranksight-triage.json", "ranksight-ranks.json", "ranksight-node.json")
SDK_PIN = "grafana-foundation-sdk>=0.0.21,<0.1"


class SdkMissing(RuntimeError):
    pass


def _build_module() -> Any:
    try:
        from . import build
    except ImportError as e:
        if "grafana_foundation_sdk" not in str(e):
            raise
        raise SdkMissing(f"grafana-foundation-sdk is not installed: pip install '{SDK_PIN}' "
                         "(or pip install 'ranksight[dashboards]')") from None
    return build


def render(cfg: Mapping[str, Any]) -> Dict[str, dict]:
    """file name -> dashboard JSON model (plain dicts), in FILES order."""
    build = _build_module()
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    out: Dict[str, dict] = {}
    for name, fn in build.BOARDS:
        model = fn(cfg).build()
        out[name] = json.loads(JSONEncoder(sort_keys=True).encode(model))
    return out


def dumps(model: Mapping[str, Any]) -> str:
    """The committed text of one dashboard."""
    return json.dumps(model, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def panels(model: Mapping[str, Any]) -> Iterator[dict]:
    """Every panel of a dashboard, rows' nested panels included (rows themselves excluded)."""
    for p in model.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def queries(cfg: Mapping[str, Any]) -> List[Tuple[str, str, str]]:
    """(dashboard file name, panel title, PromQL expr) for every panel query, in dashboard order."""
    rows: List[Tuple[str, str, str]] = []
    for name, model in render(cfg).items():
        for p in panels(model):
            for t in p.get("targets", []):
                rows.append((name, p["title"], t["expr"]))
    return rows


def feature_only(cfg: Mapping[str, Any]) -> Set[Tuple[str, str]]:
    """(dashboard file name, panel title) of every panel in a feature's row (pipeline stages,
    ranksight act): empty for a job that does not use the feature."""
    build = _build_module()
    return {(name, title) for name, fn in build.BOARDS for title in fn(cfg).feature}


def abnormal_only(cfg: Mapping[str, Any]) -> Set[Tuple[str, str]]:
    """(dashboard file name, panel title) of every panel built with ``abnormal=True``: its queries
    return only abnormal series, so they are empty while the job and its nodes are healthy."""
    build = _build_module()
    return {(name, title) for name, fn in build.BOARDS for title in fn(cfg).abnormal}


# ---------------------------------------------------------------- variable substitution
_REGEX_META = re.compile(r"[\\^$*+?.()|{}\[\]]")
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")


def _regex_value(value: Union[str, Sequence[str]]) -> str:
    """A multi-select variable's value inside a PromQL regex matcher, as Grafana writes it.

    A string is taken as is (an allValue such as ".*", or a hand-written regex); a list of
    selected values is escaped (regex metacharacters, doubled for the PromQL string) and
    joined as (a|b), a single value without parentheses."""
    if isinstance(value, str):
        return value
    esc = [_REGEX_META.sub(lambda m: "\\\\" + m.group(0), v) for v in value]
    if len(esc) == 1:
        return esc[0]
    return "(" + "|".join(esc) + ")"


def substitute(expr: str, job: Union[str, Sequence[str]] = ".*", node: Union[str, Sequence[str]] = ".*",
               rank: Union[str, Sequence[str]] = ".*", rate_interval: str = "1m",
               interval: Optional[str] = None, range_: str = "1h") -> str:
    """Replace $job/$node/$rank (and ${x}, [[x]]) and Grafana's $__rate_interval, $__interval,
    $__range (and their _s/_ms forms) so that the expression is plain PromQL.

    Raises ValueError on a variable the dashboards do not define."""
    interval = interval or rate_interval
    secs = rconfig.duration_seconds
    values = {
        "job": _regex_value(job), "node": _regex_value(node), "rank": _regex_value(rank),
        "__rate_interval": rate_interval, "__interval": interval, "__range": range_,
        "__rate_interval_ms": str(int(secs(rate_interval) * 1000)),
        "__interval_ms": str(int(secs(interval) * 1000)),
        "__range_s": str(int(secs(range_))), "__range_ms": str(int(secs(range_) * 1000)),
    }

    def repl(m: "re.Match[str]") -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise ValueError(f"unknown dashboard variable ${name} in {expr!r}")
        return values[name]

    return _VAR.sub(repl, expr)


# ---------------------------------------------------------------- CLI
def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", default=None,
                   help="ranksight config YAML (thresholds drawn on the panels); default: built-in defaults "
                        "or $RANKSIGHT_CONFIG")
    cli.add_output_arguments(p, "dashboards", COMMITTED_DIR)
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 if a file in the output folder differs from a fresh render")


def _rerun(args: argparse.Namespace, out: Path) -> str:
    """The command that refreshes what --check found stale."""
    where = "--in-place" if args.in_place else f"--out {shlex.quote(str(out))}"
    return f"ranksight dashboards{f' --config {shlex.quote(args.config)}' if args.config else ''} {where}"


def run(args: argparse.Namespace) -> int:
    cfg = rconfig.load(args.config)
    try:
        models = render(cfg)
    except SdkMissing as e:
        return error(str(e))
    try:
        out = cli.output_dir(args, "dashboards", COMMITTED_DIR, cli.departures(cfg, args), check=args.check)
    except cli.OutputError as e:
        return error(str(e))
    if args.check:
        stale = []
        for name, model in models.items():
            path = out / name
            try:
                same = path.read_text(encoding="utf-8") == dumps(model)
            except OSError:
                same = False
            if not same:
                stale.append(str(path))
        if stale:
            print(f"stale dashboards (run `{_rerun(args, out)}`): {', '.join(stale)}")
            return 1
        print(f"dashboards up to date in {out}")
        return 0
    try:
        for name, model in models.items():
            path = out / name
            cli.write_file(path, dumps(model))
            print(f"wrote {path} ({sum(1 for _ in panels(model))} panels)")
    except OSError as e:
        return error(f"cannot write dashboards to {out}: {e.strerror or e}")
    return 0
