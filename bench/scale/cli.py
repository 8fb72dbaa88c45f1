"""`ranksight bench scale` arguments, the text report and the entry point."""
from __future__ import annotations

import argparse
import json
import signal
from pathlib import Path
from typing import Any, Callable, Mapping

from ranksight import config as rconfig
from ranksight.console import error
from ranksight.common.units import binary_bytes
from .scenario import DESIGNS, PROMETHEUS, PROMTOOL, Scenario
from .server import BenchError
from .queries import rules_source, substituted_queries
from .runner import Bench, Options
from .common import rule_cost_lines


def _duration_arg(s: str) -> int:
    if not rconfig.is_duration(s):
        raise argparse.ArgumentTypeError(f"expected a duration like 15s or 1m, got {s!r}")
    v = rconfig.duration_seconds(s)
    if v < 1 or v != int(v):
        raise argparse.ArgumentTypeError(f"step must be a whole number of seconds >= 1, got {s!r}")
    return int(v)


def _int_from(least: int) -> Callable[[str], int]:
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {s!r}") from None
        if v < least:
            raise argparse.ArgumentTypeError(f"expected a number >= {least}, got {s!r}")
        return v
    return parse


_pos_int, _count = _int_from(1), _int_from(0)


def _hours(s: str) -> float:
    try:
        v = rconfig.duration_seconds(s) / 3600.0 if rconfig.is_duration(s) else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected hours (1.5) or a duration (10m), got {s!r}") from None
    if not (1 / 60 <= v <= 24):
        raise argparse.ArgumentTypeError(f"--hours must be between 1/60 and 24, got {s!r}")
    return v


def _concurrency_list(s: str) -> tuple:
    out = []
    for part in s.split(","):
        part = part.strip()
        try:
            v = 0 if part == "all" else int(part)
        except ValueError:
            v = -1
        if v < 0:
            raise argparse.ArgumentTypeError(f"expected whole numbers >= 1 or 'all', comma-separated, got {s!r}")
        out.append(v)
    return tuple(dict.fromkeys(out))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nodes", type=_pos_int, default=1024, help="nodes (default 1024)")
    p.add_argument("--gpus", type=_pos_int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--ranks-per-node", type=_pos_int, default=8, help="ranks per node, one per GPU (default 8)")
    p.add_argument("--hours", type=_hours, default=1.0, help="data the dashboards query: hours (1) or a duration (10m) (default 1)")
    p.add_argument("--step", type=_duration_arg, default=15, help="scrape interval and query step (default 15s)")
    p.add_argument("--design", choices=DESIGNS, default="as-is",
                   help="as-is: the series the agent exposes today; all-series: every RDMA counter "
                        "file and a 0/1 series per lint checked (agent.rdma_counters: all)")
    p.add_argument("--repeat", type=_pos_int, default=3, help="rounds of every query; the median is reported (default 3)")
    p.add_argument("--parts", type=int, default=0, help="node slices backfilled as separate blocks (default: 64 nodes each)")
    p.add_argument("--jobs", type=_pos_int, default=2, help="promtool processes at once; with --engine victoriametrics, import processes (default 2)")
    p.add_argument("--rule-evals", type=_pos_int, default=4, help="live evaluations of every rule group to read (default 4)")
    p.add_argument("--no-compaction-wait", dest="wait_compaction", action="store_false",
                   help="measure right away instead of after Prometheus has merged the backfilled blocks "
                        "(its first compaction runs a minute after start; for quick runs)")
    p.add_argument("--config", metavar="FILE", default=None, help="ranksight config YAML (rules and dashboards from it)")
    p.add_argument("--rules", metavar="FILE", default=None,
                   help="rule file to backfill and evaluate (default: `ranksight rules` output for --config)")
    p.add_argument("--queries", metavar="FILE", default=None,
                   help="JSON list of [dashboard, panel, expr] to time (default: every query of the generated "
                        "dashboards, variables set to All)")
    p.add_argument("--baseline-queries", metavar="FILE", default=None,
                   help="a second query list (same format), timed once after --queries and reported as "
                        "baseline_queries: e.g. the dashboards before a change")
    p.add_argument("--dump-queries", metavar="FILE", default=None,
                   help="write the substituted dashboard queries (the --queries format) and exit")
    p.add_argument("--workdir", metavar="DIR", default=None, help="where the temporary TSDB goes (default: $TMPDIR)")
    p.add_argument("--keep", metavar="DIR", default=None, help="keep the TSDB, rules and logs in DIR (new or empty)")
    p.add_argument("--future", type=_duration_arg, default=0, metavar="DURATION",
                   help="how far past now the generated data reaches: the rules evaluate live once its "
                        "last sample has passed (so their windows are full and their results in-order); "
                        "default: the expected generation + backfill time; raise it on a busy machine")
    p.add_argument("--reuse", metavar="DIR", default=None,
                   help="a --keep directory of an earlier run: skip generation and backfill, backfill only "
                        "the recording rules it lacks, then measure (iterate on rules and dashboards at scale); "
                        "with --engine victoriametrics, its store as it is: the queries and the live evaluation "
                        "again (e.g. with --concurrency)")
    p.add_argument("--query-timeout", type=_pos_int, default=120, metavar="SECONDS",
                   help="Prometheus --query.timeout for the measured queries (default 120, Prometheus' own)")
    p.add_argument("--prometheus", metavar="PATH", default=PROMETHEUS, help=f"Prometheus binary (default {PROMETHEUS})")
    p.add_argument("--promtool", metavar="PATH", default=PROMTOOL, help=f"promtool binary (default {PROMTOOL})")
    p.add_argument("--partial", metavar="FILE", default=None,
                   help="write the result so far to FILE at the start of every phase (a run cut at its time "
                        "limit keeps what it measured: the live rule evaluation comes before the dashboard queries)")
    p.add_argument("--engine", choices=("prometheus", "victoriametrics"), default="prometheus",
                   help="prometheus (default), or victoriametrics: the data imported into a VictoriaMetrics store, "
                        "the records backfilled by vmalert -replay, the same dashboard queries timed against the "
                        "store, each group's evaluation from vmalert's metrics, dropped samples, the store's RSS and "
                        "disk (bench/scale/vm.py)")
    p.add_argument("--concurrency", type=_concurrency_list, default=(), metavar="LIST",
                   help="with --engine victoriametrics: run the live evaluation once per value of the rule "
                        "groups' concurrency (e.g. 4,all: at most 4 rules of a group at once, then all of "
                        "them), interleaved on the same data, and report each group's median per value "
                        "(default: the rule file's own)")
    p.add_argument("--concurrency-rounds", type=_pos_int, default=2, metavar="N",
                   help="rounds of the --concurrency live evaluations (default 2)")
    p.add_argument("--rule-costs", type=_count, default=0, metavar="N",
                   help="time each rule's expression alone as an instant query at the data's end, on the data "
                        "and the backfilled records (their whole history, which a live evaluation does not "
                        "have), N times (the median), and report each group's sum and its costliest rules "
                        "(default 0: not)")
    p.add_argument("--json", action="store_true", help="print the full result as JSON")


def report(r: Mapping[str, Any]) -> str:
    sc, se, q, ru, pr = r["scenario"], r["series"], r["queries"], r["rules"], r["prometheus"]
    lines = [
        f"ranksight bench scale: {sc['nodes']} nodes x {sc['gpus_per_node']} GPUs, {sc['ranks']} ranks, "
        + (f"{sc['hours']:g} h" if sc["hours"] >= 1 else f"{sc['hours'] * 60:.0f} min")
        + f" at {sc['step_seconds']} s ({sc['design']})",
        f"series per node: {se['per_node']} (+{se['scrape_per_target']} scrape series; target <= "
        f"{r['targets']['series_per_node']}); per rank {se['per_rank']}, per GPU {se['per_gpu']}, "
        f"node-level {se['node_level']}; in Prometheus: {se.get('prometheus_per_node')} per node, "
        f"{se.get('prometheus_total')} in all, recorded {se.get('recorded_per_node')} per node",
        f"slowest query: {q['slowest']['seconds']:.3f} s  {q['slowest']['dashboard']} / {q['slowest']['panel']}"
        if q.get("slowest") else "slowest query: none",
        f"queries: {q['count']} from {q['source']}; p50 {q['p50_seconds']:.3f} s, p99 {q['p99_seconds']:.3f} s; "
        f"{len(q['over_target'])} over {r['targets']['query_seconds']:g} s; {len(q['errors'])} errors",
    ]
    for it in sorted(q["items"], key=lambda x: -x["seconds"])[:10]:
        lines.append(f"  {it['seconds']:8.3f} s  {it['series'] or 0:6d} series  {it['dashboard']} / {it['panel']}")
    for g in ru["groups"]:
        lines.append(f"rule group {g['name']}: {g['rules']} rules, evaluation median "
                     f"{g['evaluation_seconds_median']} s, max {g['evaluation_seconds_max']} s "
                     f"({g['evaluations']} evaluations)")
    lines += rule_cost_lines(r)
    lines.append(f"prometheus: RSS {binary_bytes(pr['rss_bytes'])} (peak {binary_bytes(pr['rss_peak_bytes'])}), "
                 f"Go heap {binary_bytes(pr['go_heap_inuse_bytes'])}; compaction {pr['compaction_seconds']} s")
    g = r["generate"]
    b = r["backfill"]
    lines.append(f"generated {g['samples']:,} samples in {g['series']:,} series ({binary_bytes(g['openmetrics_bytes'])}); "
                 f"backfill {b['openmetrics_seconds']} s, rules backfill {b['rules_seconds']} s; "
                 f"total {r['wall_seconds']} s")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.dump_queries:
        try:
            rows = substituted_queries(rconfig.load(args.config), Scenario.job, args.step, args.hours)
            Path(args.dump_queries).write_text(json.dumps([list(r) for r in rows], indent=1) + "\n")
        except OSError as e:
            return error(f"cannot write {args.dump_queries}: {e.strerror or e}")
        print(f"wrote {len(rows)} queries to {args.dump_queries}")
        return 0
    def _term(signum: int, frame: Any) -> None:  # stop Prometheus and clean up on kill too
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, _term)
    opts = Options(nodes=args.nodes, gpus=args.gpus, ranks_per_node=args.ranks_per_node, hours=args.hours,
                   step=args.step, design=args.design, repeat=args.repeat, parts=max(0, args.parts),
                   jobs=args.jobs, workdir=args.workdir, keep=args.keep, config=args.config,
                   rule_evals=args.rule_evals, wait_compaction=args.wait_compaction,
                   rules_file=args.rules, queries_file=args.queries,
                   baseline_queries_file=args.baseline_queries, prometheus=args.prometheus,
                   promtool=args.promtool, query_timeout=args.query_timeout, future=args.future,
                   reuse=args.reuse, partial=args.partial, concurrency=args.concurrency,
                   concurrency_rounds=args.concurrency_rounds, rule_costs=args.rule_costs)
    if args.concurrency and args.engine != "victoriametrics":
        return error("--concurrency needs --engine victoriametrics (Prometheus evaluates a group's rules in order)")
    if args.rules:  # a bad rule file fails now, not after the data's generation
        try:
            rules_source(args.rules, {})
        except BenchError as e:
            return error(str(e))
    if args.engine == "victoriametrics":
        from .vm import VMBench, report as vm_report
        vm = VMBench(opts)
        try:
            result = vm.run()
        except (BenchError, ValueError, OSError) as e:
            return error(str(e))
        print(json.dumps(result, indent=2) if args.json else vm_report(result))
        return 0
    bench = Bench(opts)
    try:
        result = bench.run()
    except SystemExit:  # killed (timeout): print what was measured
        bench.result["incomplete"] = True
        print(json.dumps(bench.result, indent=2) if args.json else json.dumps(bench.result))
        return 143
    except (BenchError, ValueError) as e:
        return error(str(e))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(report(result))
    return 0
