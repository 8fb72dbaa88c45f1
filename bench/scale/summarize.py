#!/usr/bin/env python3
"""Markdown tables from `ranksight bench scale --json` results (for bench/RESULTS.md).

    .venv/bin/python bench/scale/summarize.py result.json [more.json ...]
"""
from __future__ import annotations

import json
import sys
from typing import Any, Dict, List


def _q(r: Dict[str, Any], key: str) -> List[str]:
    q = r.get(key)
    if not q:
        return []
    out = [f"**{key}** ({q['source']}, {q['count']} queries, {q['repeat']} round(s), median per query): "
           f"p50 {q['p50_seconds']:.3f} s, p99 {q['p99_seconds']:.3f} s, max {q['max_seconds']:.3f} s; "
           f"{len(q['over_target'])} over 1 s, {len(q['errors'])} errors", "",
           "| seconds | series | points | kind | dashboard / panel |", "|---:|---:|---:|---|---|"]
    for it in sorted(q["items"], key=lambda x: -x["seconds"])[:15]:
        err = f" ({it['error'][:60]})" if it.get("error") else ""
        out.append(f"| {it['seconds']:.3f} | {it['series']} | {it['points']} | {it.get('kind', 'range')} | "
                   f"{it['dashboard']} / {it['panel']}{err} |")
    return out + [""]


def summarize(r: Dict[str, Any]) -> str:
    sc, se = r["scenario"], r["series"]
    lines = [f"{sc['nodes']} nodes x {sc['gpus_per_node']} GPUs, {sc['ranks']} ranks, {sc['hours']:g} h at "
             f"{sc['step_seconds']} s, design {sc['design']}", "",
             f"- series per node {se['per_node']} (+{se['scrape_per_target']} scrape), per rank {se['per_rank']}, "
             f"per GPU {se['per_gpu']}, node-level {se['node_level']}; Prometheus: {se.get('prometheus_per_node')} "
             f"per node, {se.get('prometheus_per_rank')} per rank, {se.get('prometheus_total')} raw in all; "
             f"recorded {se.get('recorded_per_node')} per node, {se.get('recorded_total')} in all"]
    g, b, p = r.get("generate", {}), r.get("backfill", {}), r.get("prometheus", {})
    if g:
        lines.append(f"- generated {g['samples']:,} samples, {g['series']:,} series, "
                     f"{g['openmetrics_bytes'] / 1e9:.1f} GB of OpenMetrics in {g['parts']} slices")
    if b:
        lines.append(f"- backfill: openmetrics {b['openmetrics_seconds']} s, rules {b['rules_seconds']} s "
                     f"({b['rule_blocks']} blocks)")
    if p:
        lines.append(f"- Prometheus: compaction wait {p.get('compaction_seconds')} s, RSS "
                     f"{p.get('rss_bytes', 0) / 2**30:.2f} GiB (peak {p.get('rss_peak_bytes', 0) / 2**30:.2f} GiB), "
                     f"Go heap {p.get('go_heap_inuse_bytes', 0) / 2**30:.2f} GiB"
                     + (f"; after the baseline set RSS {p['after_baseline_rss_bytes'] / 2**30:.2f} GiB, peak "
                        f"{p['after_baseline_rss_peak_bytes'] / 2**30:.2f} GiB" if "after_baseline_rss_bytes" in p else ""))
    if r.get("checks"):
        lines.append(f"- scenario as the rules see it: {r['checks']}")
    lines.append("")
    lines += _q(r, "queries") + _q(r, "baseline_queries")
    ru = r.get("rules")
    if ru:
        lines += ["| rule group | rules | evaluations | median s | max s | slowest rules |", "|---|---:|---:|---:|---:|---|"]
        for gr in ru["groups"]:
            slow = ", ".join(f"{x['rule']} {x['seconds']:.3f}" for x in gr.get("slowest_rules", [])[:3])
            lines.append(f"| {gr['name']} | {gr['rules']} | {gr['evaluations']} | {gr['evaluation_seconds_median']} | "
                         f"{gr['evaluation_seconds_max']} | {slow} |")
        lines.append("")
    lines.append(f"wall {r.get('wall_seconds')} s" + (" (incomplete)" if r.get("incomplete") else ""))
    return "\n".join(lines)


def main(argv: List[str]) -> int:
    for path in argv[1:]:
        with open(path) as f:
            print(summarize(json.load(f)))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
