"""The triage dashboard: the six signals in triage order, their causes, the goodput row."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from ranksight import catalog as C
from ranksight import triage
from .panels import (Band, Board, Layout, Q, Threshold, UNITS, _matchers, dashboard_expr, sel, signal_description, stat_panel,
                     table_panel, top, ts)


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
    _efficiency_row(b, cfg)
    _progress_row(b, cfg)
    _actions_row(b)
    return b


def _actions_row(b: Board) -> None:
    """What `ranksight act` did with the verdicts (ranksight/tools/act.py), from its /metrics."""
    panels = b.row("Actions", feature="ranksight act")
    panels += [
        ts(b.lay, "Actions on verdicts",
           "What `ranksight act` did with each verdict, by alert, action (the triage entry's: restart_workers, "
           "drain_node, record_recovery, page) and result (proposed, dry_run, done, failed, recovered, duplicate, "
           "resolved, rate_limited, last_nodes, ...). If proposals wait, approve them with `ranksight act approve "
           "ID`; if results read failed, the act log has the command's error.", "short",
           [Q(f"sum by (verdict, action, result) (increase({C.ACTIONS_TOTAL}[$__rate_interval]))",
              "{{verdict}} {{action}}: {{result}}")], w=16),
        ts(b.lay, "Refused requests to ranksight act",
           "Requests `ranksight act` refused before any action: unauthorized (no or a wrong bearer token, a forged "
           "webhook) or malformed. If unauthorized grows, something other than Alertmanager posts to it.", "short",
           [Q(f"sum by (reason) (increase({C.ACT_REJECTED}[$__rate_interval]))", "{{reason}}")], w=8),
    ]


def mfu_bands(t: Mapping[str, Any]) -> List[Band]:
    """The MFU bands, edges from the config (thresholds.mfu_low, mfu_good, mfu_excellent, mfu_near_limit)."""
    edges = [t["mfu_low"], t["mfu_good"], t["mfu_excellent"], t["mfu_near_limit"]]
    spans = list(zip([0.0] + edges, edges + [None]))
    looks = [("red", "serious problem"), ("yellow", "normal"), ("green", "good"), ("dark-green", "excellent"),
             ("blue", "near the hardware limit")]
    return [Band(lo, hi, color, name) for (lo, hi), (color, name) in zip(spans, looks)]


def _efficiency_row(b: Board, cfg: Mapping[str, Any]) -> None:
    """After the six rows: how much of the GPUs' peak the model's arithmetic uses (MFU), its tokens
    per second and the model FLOP/s per GPU (ranksight/triage/efficiency.py)."""
    R = triage.REC
    by = {e.id: e for e in triage.table(cfg)}
    low, drop = by["mfu-low"], by["mfu-drop"]
    bands = mfu_bands(cfg["thresholds"])
    named = "; ".join(f"{'under' if i == 0 else 'from'} {x.start if i else x.end:.0%} {x.name}"
                      for i, x in enumerate(bands))
    src = ("MFU = tokens/s x model FLOPs per token (hooks.flops_per_token, or 6N + 12LHT estimated by the hooks) / "
           "the peak dense FLOP/s of the rank's GPU (the agent's table by device name and dtype, or "
           "agent.peak_tflops_by_name). Jobs whose batches have no tokens, or on GPUs of unknown peak, have none.")
    mfu = sel(R["job_mfu"])
    flops = sel(R["rank_flops"])
    panels = b.row("Efficiency")
    panels += [
        stat_panel(b.lay, "MFU",
                   f"Model FLOPs utilization of each job, coloured by band ({named}). {src} If low, walk the six "
                   f"rows above in order (RanksightMfuLow names the first one firing).", "percentunit",
                   [Q(mfu, "{{job}}")], bands=bands, w=4),
        stat_panel(b.lay, "MFU band",
                   f"The band each job's MFU is in: {named}.", "percentunit",
                   [Q(mfu, "{{job}}")], bands=bands, band_names=True, w=4),
        ts(b.lay, "MFU over time",
           f"Each job's MFU. If it stays under {low.threshold:.0%} ({low.alert}) or falls under "
           f"{drop.threshold:.0%} of its value {cfg['windows']['mfu_drop_offset']} earlier ({drop.alert}), look at "
           f"{low.next_check}.", "percentunit", [Q(mfu, "{{job}}")], threshold=Threshold(low.threshold, "<"), w=6),
        ts(b.lay, "Tokens per second",
           "Tokens each job trains on per second (the sum over its ranks; from each batch's shape). If it drops "
           "while the step time holds, the batches got smaller; otherwise look at the step time and the rows above.",
           "short", [Q(sel(R["job_tokens"]), "{{job}}")], w=5),
        ts(b.lay, "Model TFLOPS per GPU",
           "Model FLOP/s each rank's GPU achieves (tokens/s x FLOPs per token), against its peak. If a rank is far "
           "below the others, look at the straggler ratio and its GPU's throttling. " + RANK_WORST, "flops",
           [Q(f"bottomk by (job) (3, {flops})", "{{job}} rank {{rank}}"),
            Q(f"quantile by (job) (0.5, {flops})", "{{job}} median"),
            Q(f"max by (job) ({sel(R['rank_peak'])})", "{{job}} peak")], w=5),
    ]


# Grafana's currency units; another currency is shown as a plain number with its code in the title
_CURRENCIES = ("USD", "GBP", "EUR", "JPY", "CHF", "INR", "KRW", "BRL", "SEK", "NOK", "DKK", "PLN", "CZK", "ZAR")


def _progress_row(b: Board, cfg: Mapping[str, Any]) -> None:
    """After Efficiency: when the run ends at its current step rate, the GPU-hours it took and will
    take, and their cost at ``cost.gpu_hour_price`` (those two panels only when a price is set)."""
    R = triage.REC
    cost = cfg["cost"]
    total = ("The run's total steps come from watch(total_steps=), hooks.total_steps or the framework "
             "(Hugging Face Trainer max_steps, Lightning max_steps or estimated_stepping_batches); a job "
             "that declares none has no ETA.")
    gpu_hours = ("One GPU per rank: spent is the ranks' wall time since their first process started "
                 "(restarts included), to finish the ranks up times the ETA.")
    panels = b.row("Progress")
    panels += [
        stat_panel(b.lay, "ETA",
                   f"Time left for each job at its current step rate: its slowest rank's steps left (the total, less "
                   f"the step it resumed from and the steps since) over that rank's steps per second. {total} "
                   "If it grows, the step rate fell: the rows above say why.", "s",
                   [Q(sel(R["eta"]), "{{job}}")], w=6),
        stat_panel(b.lay, "GPU-hours spent and to finish", f"Each job's GPU-hours so far and to its end. {gpu_hours}",
                   "short", [Q(sel(R["gpu_hours"]), "{{job}} spent"),
                             Q(sel(R["gpu_hours_to_finish"]), "{{job}} to finish")], w=6),
    ]
    price = float(cost["gpu_hour_price"])
    if price > 0:
        cur = str(cost["currency"])
        unit = f"currency{cur}" if cur in _CURRENCIES else "short"
        panels += [
            stat_panel(b.lay, f"Cost spent ({cur})",
                       f"Each job's GPU-hours so far at {price:g} {cur} a GPU-hour (cost.gpu_hour_price). {gpu_hours}",
                       unit, [Q(sel(R["cost_spent"]), "{{job}}")], w=6),
            stat_panel(b.lay, f"Cost to finish ({cur})",
                       f"Each job's GPU-hours to its end at {price:g} {cur} a GPU-hour, at its current step rate. "
                       f"{total}", unit, [Q(sel(R["cost_to_finish"]), "{{job}}")], w=6),
        ]


def _goodput_row(b: Board, cfg: Mapping[str, Any]) -> None:
    """The triage dashboard's first row: of the wall time the job has run, how much trained, and
    where the rest went (ranksight/triage/goodput.py); and its step time against its own baseline."""
    R = triage.REC
    by = {e.id: e for e in triage.table(cfg)}  # triage entries by id
    low, reg = by["goodput-low"], by["step-time-regression"]
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
