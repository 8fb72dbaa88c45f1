#!/usr/bin/env python3
"""Issue 9's proposed design changes, as files the scale benchmark can measure.

    .venv/bin/python bench/scale/proposed.py --out run/scale-bench
    ranksight bench scale --design proposed --rules run/scale-bench/proposed-rules.yml \\
        --queries run/scale-bench/proposed-queries.json --baseline-queries run/scale-bench/queries.json

writes:
- proposed-rules.yml: the generated rule file plus a "ranksight.recording.fleet" group of
  node-level recording rules that the fleet-wide panels read instead of raw high-cardinality
  counters (RDMA port counters, GPU utilization samples, interface counters, ingest);
- proposed-queries.json: every dashboard query, variables set to All, with the panels that
  would draw one series per rank, GPU, device or port rewritten to draw the k worst
  (topk/bottomk) or only the abnormal ones (== 0, < max), or to read the fleet rules;
- queries.json: the dashboards as they are (the baseline), same substitution.

The agent-side changes (RDMA counter allowlist, lint_active only while a lint applies) are
`--design proposed` of the benchmark itself (ranksight/scale.py: shape_for).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Tuple

import yaml

from ranksight import catalog as C
from ranksight import config as rconfig
from ranksight import scale

K = 10  # series a fleet-wide panel draws

RANK_SEL = 'job=~"$job", node=~"$node", rank=~"$rank"'
NODE_SEL = 'node=~"$node"'

REC = {
    "rdma_errors": "node:ranksight_rdma_port_errors:rate",
    "rdma_packets": "node:ranksight_rdma_port_packets:rate",
    "util_samples": "node:ranksight_gpu_utilization_samples_bucket:rate",
    "if_errors": "node:ranksight_net_interface_errors:rate",
    "if_drops": "node:ranksight_net_interface_drops:rate",
    "if_bytes": "node:ranksight_net_interface_bytes:rate",
    "ingest": "node:ranksight_ingest_datagrams:rate",
    "b2o": "rank:ranksight_backward_to_optimizer_seconds:mean_rate",
    # second round (measured at 1,024 nodes: these panels still took 1.3-2.9 s)
    "ckpt_age": "rank:ranksight_checkpoint_age:seconds",
    "ckpt_age_median": "job:ranksight_checkpoint_age_seconds:median",
    "ranks_up": "job:ranksight_ranks_up:sum",
    "ranks": "job:ranksight_ranks:count",
    "alloc_retries": "rank:ranksight_cuda_alloc_retries:per_minute_rate",
    "disk_free": "node:ranksight_disk_free:ratio",
    "throttled": "gpu:ranksight_gpu_throttled:max",
}
THROTTLE = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
RDMA_TRAFFIC = "port_(rcv|xmit)_(packets|data)|(unicast|multicast)_(rcv|xmit)_packets"


def fleet_rules(cfg: Mapping[str, Any]) -> List[Dict[str, str]]:
    w = cfg["windows"]["rate"]
    return [
        {"record": REC["rdma_errors"],
         "expr": f'sum by (node, counter) (rate({C.RDMA_PORT_COUNTER}{{counter!~"{RDMA_TRAFFIC}"}}[{w}]))'},
        {"record": REC["rdma_packets"],
         "expr": f'sum by (node, counter) (rate({C.RDMA_PORT_COUNTER}{{counter=~"port_(rcv|xmit)_packets"}}[{w}]))'},
        {"record": REC["util_samples"], "expr": f"sum by (node, le) (rate({C.GPU_UTILIZATION_SAMPLES.bucket}[{w}]))"},
        {"record": REC["if_errors"], "expr": f"sum by (node, direction) (rate({C.NET_IF_ERRORS}[{w}]))"},
        {"record": REC["if_drops"], "expr": f"sum by (node, direction) (rate({C.NET_IF_DROPS}[{w}]))"},
        {"record": REC["if_bytes"], "expr": f"sum by (node, direction) (rate({C.NET_IF_BYTES}[{w}]))"},
        {"record": REC["ingest"], "expr": f"sum by (node, result) (rate({C.INGEST_DATAGRAMS}[{w}]))"},
        {"record": REC["b2o"],
         "expr": f"rate({C.BACKWARD_TO_OPTIMIZER.sum}[{w}]) / (rate({C.BACKWARD_TO_OPTIMIZER.count}[{w}]) > 0)"},
        {"record": REC["ckpt_age"], "expr": f"time() - {C.LAST_CHECKPOINT}"},
        {"record": REC["ckpt_age_median"], "expr": f"quantile by (job) (0.5, time() - {C.LAST_CHECKPOINT})"},
        {"record": REC["ranks_up"], "expr": f"sum by (job) ({C.RANK_UP})"},
        {"record": REC["ranks"], "expr": f"count by (job) ({C.RANK_UP})"},
        {"record": REC["alloc_retries"], "expr": f"rate({C.CUDA_ALLOC_RETRIES}[{w}]) * 60"},
        {"record": REC["disk_free"], "expr": f"{C.DISK_FREE} / ({C.DISK_TOTAL} > 0)"},
        {"record": REC["throttled"],
         "expr": f'max by (node, gpu, reason) ({C.GPU_CLOCKS_EVENT}{{reason=~"{"|".join(THROTTLE)}"}} == 1)'},
    ]


# per-rank rates of the step counters, each read from the raw series once per evaluation
RATES = {
    "step_s": ("rank:ranksight_step_seconds:rate", C.STEP_SECONDS),
    "steps": ("rank:ranksight_steps:rate", C.STEPS),
    "data_s": ("rank:ranksight_dataloader_wait_seconds:rate", C.DATALOADER_WAIT),
    "comm_s": ("rank:ranksight_comm_seconds:rate", C.COMM_SECONDS),
    "xcomm_s": ("rank:ranksight_exposed_comm_seconds:rate", C.EXPOSED_COMM_SECONDS),
    "ckpt_s": ("rank:ranksight_checkpoint_seconds:rate", C.CHECKPOINT_SECONDS),
}
HEAVY_NODE = {REC["rdma_errors"], REC["rdma_packets"], REC["util_samples"], REC["if_errors"], REC["if_drops"],
              REC["if_bytes"]}


def restructured_groups(cfg: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The recording rules regrouped (round 3): the generated rules read rate(step_seconds_total)
    five times and every step counter two to four times per evaluation, all in one group; here
    each counter's rate is recorded once and the shares, busy time and job aggregates are
    arithmetic on those records (same record names, same values), and the groups Prometheus
    evaluates concurrently are split by level; fleet histograms and high-cardinality node
    counters are evaluated every minute (their panels draw 5-minute rates anyway)."""
    from ranksight import triage

    w = cfg["windows"]["rate"]
    R = {k: v[0] for k, v in RATES.items()}
    T = triage.REC
    rank_rules = [{"record": rec, "expr": f"rate({m}[{w}])"} for rec, m in RATES.values()] + [
        {"record": T["data_share"], "expr": f"{R['data_s']} / ({R['step_s']} > 0)"},
        {"record": T["comm_share"], "expr": f"{R['comm_s']} / ({R['step_s']} > 0)"},
        {"record": T["xcomm_share"], "expr": f"{R['xcomm_s']} / ({R['step_s']} > 0)"},
        {"record": T["ckpt_share"], "expr": f"{R['ckpt_s']}"},
        {"record": T["step_mean"], "expr": f"{R['step_s']} / ({R['steps']} > 0)"},
        {"record": T["busy"], "expr": f"clamp_min({R['step_s']} - {R['data_s']} - {R['xcomm_s']} - {R['ckpt_s']}, 0)"
                                      f" / ({R['steps']} > 0)"},
        {"record": T["busy_median"], "expr": f"quantile by (job) (0.5, {T['busy']})"},
        {"record": T["straggler"], "expr": f"{T['busy']} / on (job) group_left () ({T['busy_median']} > 0)"},
        {"record": T["job_steps"], "expr": f"avg by (job) ({R['steps']})"},
        {"record": T["job_data_share"], "expr": f"sum by (job) ({R['data_s']}) / (sum by (job) ({R['step_s']}) > 0)"},
        {"record": T["job_comm_share"], "expr": f"sum by (job) ({R['comm_s']}) / (sum by (job) ({R['step_s']}) > 0)"},
        {"record": T["job_xcomm_share"], "expr": f"sum by (job) ({R['xcomm_s']}) / (sum by (job) ({R['step_s']}) > 0)"},
        {"record": T["job_ckpt_share"], "expr": f"avg by (job) ({R['ckpt_s']})"},
    ]
    fleet = fleet_rules(cfg)
    rank_rules += [r for r in fleet if r["record"].startswith(("rank:", "job:"))]
    gen = {r.record: r.expr for r in triage.recording_rules(cfg)}
    node_rules = [{"record": T[k], "expr": gen[T[k]]} for k in ("retrans", "gpu_util", "gpu_swings", "node_gpu_util")]
    node_rules += [r for r in fleet if r["record"].startswith(("node:", "gpu:")) and r["record"] not in HEAVY_NODE]
    covered = {r["record"] for r in rank_rules + node_rules} | {T["job_p50"], T["job_p99"]} | HEAVY_NODE
    missing = set(gen) - covered
    if missing:  # a recording rule added to the triage table since: keep it, unchanged
        node_rules += [{"record": rec, "expr": gen[rec]} for rec in sorted(missing)]
    return [
        {"name": "ranksight.recording.rank", "rules": rank_rules},
        {"name": "ranksight.recording.node", "rules": node_rules},
        {"name": "ranksight.recording.histograms", "interval": "1m",
         "rules": [{"record": T["job_p50"], "expr": gen[T["job_p50"]]},
                   {"record": T["job_p99"], "expr": gen[T["job_p99"]]}]},
        {"name": "ranksight.recording.node_counters", "interval": "1m",
         "rules": [r for r in fleet if r["record"] in HEAVY_NODE]},
    ]


def proposed_rules_text(cfg: Mapping[str, Any]) -> str:
    """The generated alert group, with the recording rules restructured (restructured_groups)."""
    text, _ = scale.rules_text(cfg)
    doc = yaml.safe_load(text)
    alerts = [g for g in doc["groups"] if any("alert" in r for r in g.get("rules", []))]
    doc["groups"] = restructured_groups(cfg) + alerts
    return yaml.safe_dump(doc, sort_keys=False)


def _top(e: str) -> str:
    return f"topk({K}, {e})"


def _bottom(e: str) -> str:
    return f"bottomk({K}, {e})"


def _worst_ranks(e: str) -> str:
    """A per-rank table column, for the K ranks with the highest straggler ratio."""
    return f"{e} and on (job, rank) topk({K}, rank:ranksight_straggler:ratio{{{RANK_SEL}}})"


def _below_max(metric: C.Metric) -> Callable[[str], str]:
    return lambda e: (f'{metric}{{state="current", {NODE_SEL}}} < ignoring (state) '
                      f'{metric}{{state="max", {NODE_SEL}}}')


# panel title -> rewrite of each of its (unsubstituted) expressions
REWRITES: Dict[str, Callable[[str], str]] = {
    # ranks dashboard: one series per rank
    "Step time by rank": _top,
    "Backward-to-optimizer time by rank": lambda e: _top(f"{REC['b2o']}{{{RANK_SEL}}}"),
    "Per-rank step breakdown": lambda e: _worst_ranks(
        f"max without () ({REC['b2o']}{{{RANK_SEL}}})" if "backward_to_optimizer" in e else e),
    "Straggler ratio": _top,
    "Busy time per step": lambda e: e if e.startswith("job:") else _top(e),
    "Dataloader wait share": _top,
    "Communication share": _top,
    "Exposed communication share": _top,
    "Checkpoint share of wall time": lambda e: e if e.startswith(("topk", "quantile")) else _top(e),
    "CUDA allocator retries per minute": lambda e: _top(f"{REC['alloc_retries']}{{{RANK_SEL}}}"),
    "CUDA memory reserved / allocated": _top,
    "Hook errors and dropped events": _top,
    # node dashboard: one series per GPU, device, port or path
    "GPU busy ratio by GPU": _bottom,
    "GPU utilization samples": lambda e: f"sum by (le) ({REC['util_samples']}{{{NODE_SEL}}})",
    "GPU utilization swings per minute": lambda e: e if e.startswith(("topk", "quantile")) else _top(e),
    "GPM SM and tensor activity": _bottom,
    # the rule filters before it aggregates: max by (node, gpu, reason) over every reason series
    # keeps them all, so aggregating first is pure cost
    "Throttling reasons": lambda e: f"{REC['throttled']}{{{NODE_SEL}}}",
    "XID errors": lambda e: f"{e} > 0",
    "GPU temperature": _top,
    "GPU power": _top,
    "SM clock": _bottom,
    "GPU memory used": _top,
    "PCIe link generation (current / max)": _below_max(C.GPU_PCIE_GEN),
    "PCIe link width (current / max)": _below_max(C.GPU_PCIE_WIDTH),
    "TCP retransmit ratio": _top,
    "TCP segments retransmitted and sent": _top,
    "TCP loss counters": _top,
    "Interface errors and drops": lambda e: _top(
        f"{REC['if_errors'] if 'errors' in e else REC['if_drops']}{{{NODE_SEL}}}"),
    "Interface throughput": lambda e: _top(f"{REC['if_bytes']}{{{NODE_SEL}}}"),
    "NIC link speed": lambda e: e if e.startswith("bottomk") else _bottom(e),
    "RDMA packets": lambda e: _top(f"{REC['rdma_packets']}{{{NODE_SEL}}}"),
    "RDMA error and congestion counters": lambda e: _top(f"{REC['rdma_errors']}{{{NODE_SEL}}}"),
    "RDMA port rate": _bottom,
    "Disk free": _bottom,
    "Disk free share": lambda e: _bottom(f"{REC['disk_free']}{{{NODE_SEL}}}"),
    "Ranks on these nodes": lambda e: f"{e} == 0",
    "Collectors up": lambda e: f"min by (collector) ({e})",
    "Agent ingest": lambda e: f"sum by (result) ({REC['ingest']}{{{NODE_SEL}}})",
}


JOB_SEL = 'job=~"$job"'
# triage dashboard panels that read raw per-rank series (second round)
TRIAGE_REWRITES: Dict[str, Callable[[str], str]] = {
    "Ranks up": lambda e: (f"{REC['ranks_up']}{{{JOB_SEL}}}" if e.startswith("sum") else f"{REC['ranks']}{{{JOB_SEL}}}"),
    "Ranks down": lambda e: f"{REC['ranks']}{{{JOB_SEL}}} - {REC['ranks_up']}{{{JOB_SEL}}}",
    "Checkpoint age": lambda e: (f"topk by (job) (3, {REC['ckpt_age']}{{{RANK_SEL}}})" if e.startswith("topk")
                                 else f"{REC['ckpt_age_median']}{{{JOB_SEL}}}"),
}


def proposed_queries(cfg: Mapping[str, Any]) -> List[Tuple[str, str, str, str, str]]:
    """(dashboard, panel, proposed raw expr, as-is raw expr, kind) for every dashboard query."""
    rows, _, _ = scale.dashboard_queries(cfg)
    out = []
    for dash, title, expr, kind in rows:
        # the triage dashboard's fleet rows already draw topk/quantile: only the raw ones change
        fn = TRIAGE_REWRITES.get(title) if dash == "ranksight-triage.json" else REWRITES.get(title)
        new = fn(expr) if fn is not None else expr
        out.append((dash, title, new, expr, kind))
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="directory for the three files")
    p.add_argument("--config", default=None)
    p.add_argument("--step", type=scale._duration_arg, default=15)
    p.add_argument("--hours", type=scale._hours, default=1.0)
    a = p.parse_args(argv)
    cfg = rconfig.load(a.config)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    _, _, substitute = scale.dashboard_queries(cfg)

    def sub(e: str) -> str:
        return scale.substitute_all(substitute, e, scale.Scenario.job, a.step, a.hours)

    rows = proposed_queries(cfg)
    proposed = [(d, t, sub(new), k) for d, t, new, _, k in rows]
    baseline = [(d, t, sub(old), k) for d, t, _, old, k in rows]
    (out / "proposed-queries.json").write_text(json.dumps(proposed, indent=1) + "\n")
    (out / "queries.json").write_text(json.dumps(baseline, indent=1) + "\n")
    (out / "proposed-rules.yml").write_text(proposed_rules_text(cfg))
    changed = sum(1 for _, _, new, old, _ in rows if new != old)
    print(f"wrote {out}/proposed-rules.yml (recording rules regrouped, +{len(fleet_rules(cfg))} fleet rules), "
          f"{out}/proposed-queries.json ({changed} of {len(rows)} queries rewritten), {out}/queries.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
