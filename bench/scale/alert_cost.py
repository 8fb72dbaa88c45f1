#!/usr/bin/env python3
"""What one pending alert instance costs Prometheus per evaluation, against its annotations.

    .venv/bin/python bench/scale/alert_cost.py --ranks 8192 --evals 8

Backfills one gauge per rank (``rank:ranksight_comm_share:ratio_rate``, 0.5 for every rank, the
labels the agent and the rank group give it) into a fresh TSDB with promtool, then starts a real
Prometheus once per variant with one alert rule and reads the group's ``evaluationTime`` from
``/api/v1/rules`` over ``--evals`` evaluations (5 s apart). Variants, in interleaved rounds:

  rank        one instance per rank, the generated rule's five annotations (the comm-bound rule)
  rank-bare   one instance per rank, no annotations (the cost of the instances alone)
  rank-desc   one instance per rank, only the templated description
  rank-static one instance per rank, only the four annotations without a template action
  node        one instance per (job, node), five annotations
  job         one instance per job, five annotations

Prints the median evaluation time per variant and per instance. The point: a pending alert
instance costs Prometheus its label and annotation templates (each expanded, parsed and run
again, on every evaluation) and its ALERTS / ALERTS_FOR_STATE samples, so an alert's cost is
its instance count times that.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import yaml

from ranksight import config, triage
from ranksight.common import servers
from ranksight.common.plumbing import ApiError, PrometheusAPI

RECORD = triage.REC["comm_share"]
COMM_BOUND = {e.id: e.alert for e in triage.table(config.defaults())}["comm-bound"]
ANNOTATIONS = {
    "summary": "Collectives take over 30% of step time: the job is communication-bound",
    "description": 'job={{ $labels.job }} rank={{ $labels.rank }} node={{ $labels.node }} spends '
                   '{{ printf "%.2f" $value }} of its step time in collectives.',
    "runbook_url": "https://github.com/ranksight/ranksight/blob/main/alerts/runbooks/comm-bound.md",
    "next_check": "network retransmits and link speed",
    "triage_order": "3 of 6",
}
VARIANTS = {
    "rank": (f"{RECORD} > 0.3", ANNOTATIONS),
    "rank-bare": (f"{RECORD} > 0.3", {}),
    "rank-desc": (f"{RECORD} > 0.3", {"description": ANNOTATIONS["description"]}),
    "rank-static": (f"{RECORD} > 0.3", {k: v for k, v in ANNOTATIONS.items() if k != "description"}),
    "node": (f"max by (job, node) ({RECORD}) > 0.3", ANNOTATIONS),
    "job": (f"max by (job) ({RECORD}) > 0.3", ANNOTATIONS),
}


def _openmetrics(path: Path, ranks: int, rpn: int, end: int) -> None:
    with path.open("w") as f:
        f.write(f"# TYPE {RECORD} gauge\n")
        for r in range(ranks):
            n = f"node{r // rpn:04d}"
            lab = f'job="llm",node="{n}",rank="{r}",local_rank="{r % rpn}",instance="{n}:9945"'
            for t in range(end - 600, end + 1, 15):
                f.write(f"{RECORD}{{{lab}}} 0.5 {t}\n")
        f.write("# EOF\n")


def _measure(prom: str, data: Path, work: Path, variant: str, evals: int) -> List[float]:
    expr, ann = VARIANTS[variant]
    rule = {"alert": COMM_BOUND, "expr": expr, "for": "10m", "labels": {"severity": "warning"}}
    if ann:
        rule["annotations"] = ann
    (work / "rules.yml").write_text(yaml.safe_dump({"groups": [{"name": "ranksight.alerts", "rules": [rule]}]}))
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"evaluation_interval": "5s"}, "rule_files": [str(work / "rules.yml")]}))
    view = work / "view"
    shutil.rmtree(view, ignore_errors=True)
    shutil.copytree(data, view)
    server = servers.prometheus(work / "prometheus.yml", view, work / "prometheus.log", binary=prom).start()
    api = PrometheusAPI(server.url, timeout=30.0)
    out: List[float] = []
    seen = ""
    try:
        deadline = time.monotonic() + 60 + 10 * evals
        while len(out) < evals + 1 and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                g = api.rules()[0]
            except (ApiError, KeyError, IndexError):
                continue
            last = g.get("lastEvaluation", "")
            if last and not last.startswith("0001") and last != seen:
                seen = last
                out.append(float(g["evaluationTime"]))
    finally:
        server.stop(30.0)
    return out[1:]  # the first evaluation creates the ALERTS series


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=8192)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--evals", type=int, default=6, help="evaluations read per variant and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--prometheus", default="/usr/bin/prometheus")
    p.add_argument("--promtool", default="/usr/bin/promtool")
    a = p.parse_args(argv)
    variants = a.variants.split(",")
    if bad := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown variant {bad[0]} (one of {', '.join(VARIANTS)})")
    work = Path(tempfile.mkdtemp(prefix="ranksight-alert-cost-"))
    try:
        om, data = work / "in.om", work / "data"
        _openmetrics(om, a.ranks, a.ranks_per_node, int(time.time()) - 30)
        subprocess.run([a.promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
                       check=True, stdout=subprocess.DEVNULL)
        om.unlink()
        times: Dict[str, List[float]] = {v: [] for v in variants}
        for _ in range(a.rounds):
            for v in variants:
                times[v] += _measure(a.prometheus, data, work, v, a.evals)
        instances = {"rank": a.ranks, "rank-bare": a.ranks, "rank-desc": a.ranks, "rank-static": a.ranks, "node": a.ranks // a.ranks_per_node, "job": 1}
        print(f"{a.ranks} ranks, {a.ranks_per_node} per node; median of {a.rounds} x {a.evals} evaluations")
        print(f"{'variant':<10} {'instances':>9} {'median s':>9} {'max s':>7} {'us/instance':>11}")
        for v in variants:
            ts = times[v]
            med = statistics.median(ts) if ts else float("nan")
            print(f"{v:<10} {instances[v]:>9} {med:>9.4f} {max(ts, default=float('nan')):>7.4f} "
                  f"{med / instances[v] * 1e6:>11.1f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
