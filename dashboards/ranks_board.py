"""The ranks dashboard: per-rank step time, its parts, stragglers, pipeline stages, memory and checkpoints."""
from __future__ import annotations

from typing import Any, Mapping

from ranksight import catalog as C
from ranksight import triage
from .panels import (Board, K, Q, Threshold, bottom, heatmap_panel, rate, sel, signal_description, table_panel, top, ts,
                     worst)


# ---------------------------------------------------------------- ranks dashboard
def ranks_board(cfg: Mapping[str, Any]) -> Board:
    R = triage.REC
    t = cfg["thresholds"]
    by = {e.id: e for e in triage.table(cfg)}  # triage entries by id
    b = Board("ranksight-ranks", "ranksight / Ranks",
              "Per-rank view: spot the straggler. Under synchronous data parallel every rank's step time is the "
              "same; the slow rank shows as high busy time per step, the others as collective wait. At thousands "
              f"of ranks each panel draws the {K} worst; the $job/$node/$rank variables select one rank.")
    b2o = sel(R["b2o"])
    who = "{{job}}/{{rank}}"
    # heatmap rows named "<rank> (<job>)": Grafana's heatmap sorts rows numerically only when every
    # row name parses as a number (parseFloat reads the leading rank), otherwise as text (10 before 2)
    row_name = "{{rank}} ({{job}})"

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
        _breakdown_table(b),
    ]
    straggler = by["straggler"]
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
    # each rank's GPU series, joined to the rank by a recording rule (the rank-to-GPU info series)
    low_min = bottom(sel(R["rank_gpu_min"]))
    gpu_max = sel(R["rank_gpu_max"])
    rows = b.row("GPU of each rank")
    rows += [
        ts(b.lay, "GPU busy ratio by rank",
           "The exact mean utilization of the GPU each rank runs on (the agent joins a rank to its GPU by the "
           "device UUID). A rank whose GPU is much less busy than its peers' waits for data or for others; "
           "a straggler's GPU is busier. If one is low, look at its dataloader wait share. "
           + worst("ranks", "lowest busy ratio"), "percentunit",
           [Q(bottom(sel(R["rank_gpu_util"])), who)], w=12),
        ts(b.lay, "GPU utilization waveform by rank (window min / max)",
           "The lowest and highest NVML utilization sample of each rank's GPU over the agent's window. A max "
           "near 100% with a min near 0 is the sawtooth: compute alternates with idle gaps. If so, look at the "
           f"rank's dataloader wait, then its exposed communication. Lines: the {K} ranks with the lowest "
           "window minimum, with their maximum; select one with the $rank variable to see it alone.",
           "percentunit",
           [Q(low_min, who + " min"), Q(f"{gpu_max} and on (job, rank) {low_min}", who + " max")], w=12),
    ]
    rows = b.row("Shares of step time by rank")
    for key, entry, title in (("data_share", "dataloader-bound", "Dataloader wait share"),
                              ("comm_share", "comm-bound", "Communication share"),
                              ("xcomm_share", None, "Exposed communication share"),
                              ("ckpt_share", "checkpoint-slow", "Checkpoint share of wall time")):
        if entry:
            e = by[entry]
            rows.append(ts(b.lay, title, signal_description(e, worst("ranks")), "percentunit",
                           [Q(top(sel(R[key])), who)], threshold=Threshold(e.threshold, e.op), w=6))
        else:
            rows.append(ts(b.lay, title,
                           "Share of step time blocked waiting on collectives (not overlapped with compute). If "
                           "high on all ranks but one, that one is the straggler; if high everywhere, look at the "
                           "network (retransmits, link speed). " + worst("ranks"), "percentunit",
                           [Q(top(sel(R[key])), who)], w=6))
    alloc = by["cuda-alloc-retries"]
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
    return _pipeline_row(_loss_row(_memory_peak_row(b, by, who), cfg, by, who), cfg, by)


def _memory_peak_row(b: Board, by: Mapping[str, Any], who: str) -> Board:
    """``b`` with the CUDA memory peaks row: each rank's peak allocated bytes with its job's peers' median, and
    each rank's peak over that median (RanksightMemoryImbalance)."""
    R = triage.REC
    imb = by["memory-imbalance"]
    rows = b.row("CUDA memory peaks")
    rows += [
        ts(b.lay, "Peak CUDA memory by rank",
           "Each rank's peak allocated CUDA memory (the caching allocator's high-water mark, or over the last "
           "peak windows with hooks.memory_peak_seconds set: a tensor freed within its step still counts) and its peak "
           "reserved memory, with the job's peers' median peak. Under data parallel the ranks draw one band; a "
           "rank above it does work or holds data the others do not (rank 0's logging, checkpoint or "
           "evaluation, a larger batch): when it rises (each step, at epoch ends, at checkpoint intervals) "
           f"names what. Lines: the {K} ranks with the highest allocated peak, with their reserved peak; "
           "select one with the $rank variable to see it alone.", "bytes",
           [Q(top(sel(C.CUDA_ALLOCATED_PEAK)), who + " allocated peak"),
            Q(f"{sel(C.CUDA_RESERVED_PEAK)} and on (job, rank) {top(sel(C.CUDA_ALLOCATED_PEAK))}",
              who + " reserved peak"),
            Q(sel(R["mem_peers"]), "{{job}} peers' median")], w=12),
        ts(b.lay, "Memory imbalance by rank (peak / peers' median)",
           signal_description(imb, worst("ranks")), "none",
           [Q(top(sel(R["mem_imbalance"])), who)], threshold=Threshold(imb.threshold, ">"), min0=False, w=12),
    ]
    return b


def _pipeline_row(b: Board, cfg: Mapping[str, Any], by: Mapping[str, Any]) -> Board:
    """``b`` with the pipeline stages row (hooks/pipeline.py): each stage's bubble share against the
    schedule's ideal, its busy time against its peers', its P2P waits. Empty for jobs without
    pipeline parallelism (the series exist only for ranks watched as a stage)."""
    bubble, straggler = by["pipeline-bubble"], by["pipeline-straggler"]
    R, t = triage.REC, cfg["thresholds"]
    stage = "{{job}} stage {{stage}} (rank {{rank}})"
    rows = b.row("Pipeline stages", feature="pipeline parallelism (ranksight.watch(schedule, ...))")
    rows += [
        ts(b.lay, "Pipeline bubble share by stage",
           "Each pipeline stage's share of its schedule step spent not computing (1 - busy / step), with the "
           f"schedule's ideal (p-1)/(m+p-1) for the job. {bubble.alert} pages a stage over "
           f"{t['pipeline_bubble_excess']:g} above the ideal. All stages high: too few micro-batches or slow "
           "P2P; one stage low and the rest high: that stage is the slow one. "
           + worst("stages", "highest bubble share"), "percentunit",
           [Q(top(sel(R["pipe_bubble"])), stage), Q(f"max by (job) ({sel(R['pipe_ideal'])})", "{{job}} ideal")],
           w=8),
        ts(b.lay, "Pipeline stage busy time",
           "Each stage's compute (forward and backward chunks) per second of wall time, with the job's median "
           f"of its peers. {straggler.alert} names a stage over {t['pipeline_straggler_ratio']:g}x that median: "
           f"look at {straggler.next_check}. " + worst("stages"), "percentunit",
           [Q(top(sel(R["pipe_busy"])), stage), Q(sel(R["pipe_busy_median"]), "{{job}} median")], w=8),
        ts(b.lay, "Pipeline P2P wait by stage",
           "Time each stage blocks on P2P work per second: on the previous stage (its activations, or sending "
           "it gradients) and on the next (its gradients, or sending it activations). The first stage waits on "
           "the next, the last on the previous; a large wait between two middle stages points at their link. "
           + worst("stages"), "percentunit",
           [Q(top(rate(C.PIPELINE_WAIT_PREV)), stage + " on previous"),
            Q(top(rate(C.PIPELINE_WAIT_NEXT)), stage + " on next")], w=8),
    ]
    return b


def _loss_row(b: Board, cfg: Mapping[str, Any], by: Mapping[str, Any], who: str) -> Board:
    """``b`` with the training loss row (ranksight.loss): each rank's mean, its spike ratio, its first
    non-finite step, its loss after a checkpoint restore against before the restart."""
    spike, spread, nonfinite = by["loss-spike"], by["loss-divergence"], by["loss-nonfinite"]
    jump = by["loss-jump-after-resume"]
    R, t = triage.REC, cfg["thresholds"]
    rows = b.row("Training loss")
    rows += [
        ts(b.lay, "Mean training loss by rank",
           f"Each rank's mean training loss over windows.loss_short ({cfg['windows']['loss_short']}), from "
           "ranksight.loss. Ranks of one job should draw one band: a rank apart from it trains another model "
           f"or other data ({spread.alert}, above {t['loss_divergence_ratio']:g}x between the highest and the "
           f"lowest: look at {spread.next_check}). " + worst("ranks", "highest loss"), "none",
           [Q(top(sel(R["loss_short"])), who)], min0=False, w=8),
        # a rank's spike ratio exists once it has windows.loss_long of history before its short window,
        # and it is drawn only while over the alert's threshold: the ranks whose loss jumped
        ts(b.lay, "Loss spikes", signal_description(spike, worst("ranks")) + " Only the ranks over the threshold "
           "are drawn.", "none",
           [Q(top(f"{sel(R['loss_spike'])} > {spike.threshold:g}"), who)], threshold=Threshold(spike.threshold, ">"),
           min0=False, w=8, abnormal=True),
        ts(b.lay, "First non-finite loss step",
           f"The step of each rank's first NaN or infinite training loss (0: none). {nonfinite.alert} pages at "
           "once; the earliest step names the rank it started on: under data parallel the all-reduce brings "
           "the NaN to every rank a step later. " + worst("ranks", "highest step"), "none",
           [Q(top(f"{sel(C.LOSS_FIRST_NONFINITE_STEP)} > 0"), who)], w=8, abnormal=True),
        # exists only for windows.loss_resume after a rank's checkpoint restore, once a mean before it is known
        ts(b.lay, "Loss after a resume",
           signal_description(jump, worst("ranks")) + " Drawn for each rank for windows.loss_resume "
           f"({cfg['windows']['loss_resume']}) after its checkpoint restore: 1 is a resume that continues "
           "where the run stopped.", "none",
           [Q(top(sel(R["loss_resume_jump"])), who)], threshold=Threshold(jump.threshold, ">"),
           min0=False, w=8, abnormal=True),
    ]
    return b


def _worst_ranks(expr: str) -> str:
    """A table column, for the K ranks with the highest straggler ratio."""
    return f"{expr} and on (job, rank) {top(sel(triage.REC['straggler']))}"


def _with_parallel(expr: str) -> str:
    """``expr`` with the rank's strategy and ZeRO stage as labels (the hello's info series), and
    unchanged for a rank without that series."""
    info = f"max by (job, rank, strategy, zero_stage) ({sel(C.RANK_PARALLEL)})"
    return f"({expr} * on (job, rank) group_left (strategy, zero_stage) {info} or on (job, rank) {expr})"


def _breakdown_table(b: Board) -> Any:
    """The per-rank step breakdown: the K ranks with the highest straggler ratio, one row each."""
    R = triage.REC
    b2o = sel(R["b2o"])
    p99 = sel(C.STEP_QUANTILE, 'quantile="0.99"')
    worst_ranks, with_parallel = _worst_ranks, _with_parallel
    return table_panel(b.lay, "Per-rank step breakdown",
                f"One row per rank, now, for the {K} ranks with the highest straggler ratio (busy time / job "
                "median; sorted, worst first): how the rank's model is parallelized (strategy: ddp, fsdp, "
                "deepspeed, pipeline or none; zero stage: DeepSpeed's ZeRO stage, so a slow shard group "
                "shows), mean and p99 step time, backward-to-optimizer, busy time per "
                "step and the shares of step time. If one rank's straggler ratio is high, look at its node's "
                "GPU throttling and PCIe link. Select ranks with the $rank variable to list those.",
                "s",
                [Q(worst_ranks(with_parallel(f"max without () ({sel(R['step_mean'])})")), instant=True,
                   fmt="table"),
                 Q(worst_ranks(f"max without (quantile) ({p99})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({b2o})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({sel(R['busy'])})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({sel(R['straggler'])})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({sel(R['data_share'])})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({sel(R['comm_share'])})"), instant=True, fmt="table"),
                 Q(worst_ranks(f"max without () ({sel(R['ckpt_share'])})"), instant=True, fmt="table")],
                columns=[("strategy", "strategy", "none"), ("zero_stage", "zero stage", "none"),
                         ("Value #A", "step mean", "s"), ("Value #B", "step p99", "s"),
                         ("Value #C", "backward to optimizer", "s"), ("Value #D", "busy per step", "s"),
                         ("Value #E", "straggler ratio", "none"), ("Value #F", "data share", "percentunit"),
                         ("Value #G", "comm share", "percentunit"), ("Value #H", "checkpoint share", "percentunit")],
                hide=("Time", "instance", "local_rank"), sort="straggler ratio", w=24, h=10)
