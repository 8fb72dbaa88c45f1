"""The records table of the triage table: every recording rule's name (REC), the rule groups in the
order they are written (RULE_GROUPS, each with the config key of its interval) and the groups whose
records another group reads (GROUP_INPUTS). The expressions are in records.py and goodput.py."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

# Goodput, its ratios and the step-time baseline (goodput.py) evaluate in groups of their own.
GOODPUT_GROUP = "ranksight.recording.goodput"
GOODPUT_RATIO_GROUP = "ranksight.recording.goodput_ratio"
BASELINE_GROUP = "ranksight.recording.baseline"
# Groups that read the job records of other groups (their evaluation lags by one interval at most).
CROSS_GROUP_READERS = (BASELINE_GROUP,)


# ----------------------------------------------------------------- recording rule names
REC = {
    "data_share": "rank:ranksight_dataloader_wait_share:ratio_rate",
    "comm_share": "rank:ranksight_comm_share:ratio_rate",
    "xcomm_share": "rank:ranksight_exposed_comm_share:ratio_rate",
    "ckpt_share": "rank:ranksight_checkpoint_share:ratio_rate",
    "step_mean": "rank:ranksight_step_duration_seconds:mean_rate",
    "busy": "rank:ranksight_busy_seconds_per_step:rate",
    "busy_median": "job:ranksight_busy_seconds_per_step:median",
    "straggler": "rank:ranksight_straggler:ratio",
    "job_buckets": "job:ranksight_step_duration_seconds_bucket:rate",
    "job_p50": "job:ranksight_step_duration_seconds:p50_rate",
    "job_p99": "job:ranksight_step_duration_seconds:p99_rate",
    "job_steps": "job:ranksight_steps:rate",
    "job_data_share": "job:ranksight_dataloader_wait_share:ratio_rate",
    "job_comm_share": "job:ranksight_comm_share:ratio_rate",
    # the job's irreducible comm share: that of its least-waiting rank (a straggler waits for nobody)
    "job_comm_min": "job:ranksight_comm_share:min",
    "job_xcomm_share": "job:ranksight_exposed_comm_share:ratio_rate",
    "job_ckpt_share": "job:ranksight_checkpoint_share:ratio_rate",
    "retrans": "node:ranksight_tcp_retransmit:ratio_rate",
    "gpu_util": "gpu:ranksight_gpu_utilization:ratio_rate",
    "gpu_swings": "gpu:ranksight_gpu_swings:per_minute_rate",
    "node_gpu_util": "node:ranksight_gpu_utilization:ratio_rate",
    # each per-rank step counter's rate, recorded once, under its step-record field's key
    # (ranksight/record.py) where it has one; the shares, busy time and job aggregates above are
    # arithmetic on these (one rate() per raw series per evaluation)
    "dur": "rank:ranksight_step_seconds:rate",
    "steps": "rank:ranksight_steps:rate",
    "data": "rank:ranksight_dataloader_wait_seconds:rate",
    "comm": "rank:ranksight_comm_seconds:rate",
    "xcomm": "rank:ranksight_exposed_comm_seconds:rate",
    "ckpt": "rank:ranksight_checkpoint_seconds:rate",
    "samples": "rank:ranksight_samples:rate",
    "tokens": "rank:ranksight_tokens:rate",
    "b2o": "rank:ranksight_backward_to_optimizer_seconds:mean_rate",
    "alloc_retries": "rank:ranksight_cuda_alloc_retries:per_minute_rate",
    # CUDA memory (memory.py): the job's peers' median of the ranks' peak allocated bytes (the job's
    # median without its highest rank), each rank's peak over it, and each rank's peak reserved bytes
    # over its GPU's total memory
    "mem_peers": "job:ranksight_cuda_memory_allocated_peak_bytes:peer_median",
    "mem_imbalance": "rank:ranksight_cuda_memory_allocated_peak:peer_ratio",
    "mem_gpu_share": "rank:ranksight_cuda_memory_reserved_peak:gpu_ratio",
    "ckpt_age": "rank:ranksight_checkpoint_age:seconds",
    # the training loss (ranksight.loss): each rank's mean over the short window, over the long
    # window before it, their ratio, and the job's spread of the short means (highest / lowest)
    "loss_short": "rank:ranksight_loss:mean_short",
    "loss_before": "rank:ranksight_loss:mean_before",
    "loss_spike": "rank:ranksight_loss_spike:ratio",
    "loss_spread": "job:ranksight_loss_spread:ratio",
    # a pipeline stage (triage/pipeline.py): its compute and schedule time rates, its bubble share,
    # the schedule's ideal bubble for the rank, the job's median stage busy time without the busiest,
    # and each stage's busy time over that median
    "pipe_busy": "rank:ranksight_pipeline_busy_seconds:rate",
    "pipe_step": "rank:ranksight_pipeline_step_seconds:rate",
    "pipe_bubble": "rank:ranksight_pipeline_bubble:ratio",
    "pipe_ideal": "rank:ranksight_pipeline_bubble_ideal:ratio",
    "pipe_busy_median": "job:ranksight_pipeline_busy_seconds:median",
    "pipe_straggler": "rank:ranksight_pipeline_straggler:ratio",
    # the loss after a checkpoint restore: a rank's short mean while no restore is recent, the time of
    # the last evaluation without one, and the short mean, loss sum and readings of that evaluation,
    # held (the "before" of a later resume); the last mean before the restore, the mean since the
    # restore (the counters minus their last steady values on the node), and their ratio
    "loss_steady": "rank:ranksight_loss:mean_steady",
    "loss_steady_seen": "rank:ranksight_loss_steady:timestamp",
    "loss_last_steady": "rank:ranksight_loss:last_steady",
    "loss_steady_sum": "rank:ranksight_loss_sum:last_steady",
    "loss_steady_readings": "rank:ranksight_loss_readings:last_steady",
    "loss_pre_resume": "rank:ranksight_loss:mean_before_resume",
    "loss_post_resume": "rank:ranksight_loss:mean_since_resume",
    "loss_resume_jump": "rank:ranksight_loss_resume_jump:ratio",
    # job level, for the triage dashboard's fleet panels
    "ckpt_age_median": "job:ranksight_checkpoint_age_seconds:median",
    "ranks_up": "job:ranksight_ranks_up:sum",
    "ranks": "job:ranksight_ranks:count",
    # node level (fleet panels read these instead of thousands of raw port/device/GPU series)
    "rdma_errors": "node:ranksight_rdma_port_errors:rate",
    "rdma_packets": "node:ranksight_rdma_port_packets:rate",
    "util_samples": "node:ranksight_gpu_utilization_samples_bucket:rate",
    "if_errors": "node:ranksight_net_interface_errors:rate",
    "if_drops": "node:ranksight_net_interface_drops:rate",
    "if_bytes": "node:ranksight_net_interface_bytes:rate",
    "ingest": "node:ranksight_ingest_datagrams:rate",
    "disk_free": "node:ranksight_disk_free:ratio",
    "throttled": "gpu:ranksight_gpu_throttled:max",
    # a NIC's best link speed: over each baseline interval, and over a day of those (RanksightNicSpeedLow)
    "nic_best": "node:ranksight_net_interface_speed_bytes:interval_max",
    "nic_best_1d": "node:ranksight_net_interface_speed_bytes:max_1d",
    # each rank's GPU, joined once per evaluation (the ranks dashboard draws these per rank)
    "rank_gpu_util": "rank:ranksight_gpu_utilization:ratio_rate",
    "rank_gpu_min": "rank:ranksight_gpu_utilization_window:min",
    "rank_gpu_max": "rank:ranksight_gpu_utilization_window:max",
    # throughput and MFU (the efficiency group): model FLOP/s = tokens/s x FLOPs per token, over the
    # peak dense FLOP/s of the rank's GPU; only ranks with tokens, FLOPs per token and a known peak
    "rank_flops": "rank:ranksight_model_flops:rate",
    "rank_peak": "rank:ranksight_gpu_peak_flops:max",
    "mfu": "rank:ranksight_mfu:ratio",
    "job_tokens": "job:ranksight_tokens:rate",
    "job_flops": "job:ranksight_model_flops:rate",
    "job_mfu": "job:ranksight_mfu:ratio",
    # the run's progress (efficiency group): steps left at the current rate, GPU-hours spent and to
    # finish, and their cost at cost.gpu_hour_price (recorded only when a price is set)
    "remaining_steps": "rank:ranksight_remaining_steps:count",
    "eta": "job:ranksight_eta:seconds",
    "gpu_hours": "job:ranksight_gpu_hours:sum",
    "gpu_hours_to_finish": "job:ranksight_gpu_hours_to_finish:sum",
    "cost_spent": "job:ranksight_cost_spent:sum",
    "cost_to_finish": "job:ranksight_cost_to_finish:sum",
    # goodput and the step-time baseline (goodput.py): the job's split of its wall time and its
    # step time against its own history
    # rank group (arithmetic on the rank group's records)
    "job_step_mean": "job:ranksight_step_duration_seconds:mean_rate",
    "job_components": "job:ranksight_step_component_seconds:mean_rate",  # {cause}
    "job_alloc_retries": "job:ranksight_cuda_alloc_retries:per_minute_rate",
    # baseline group
    "p50_avg": "job:ranksight_step_duration_seconds:p50_avg",
    "p50_baseline": "job:ranksight_step_duration_seconds:p50_baseline",
    "components_avg": "job:ranksight_step_component_seconds:avg",  # {cause}
    "components_baseline": "job:ranksight_step_component_seconds:baseline",  # {cause}
    "retries_avg": "job:ranksight_cuda_alloc_retries:avg",
    "retries_baseline": "job:ranksight_cuda_alloc_retries:baseline",
    "regression_growth": "job:ranksight_step_regression_growth:seconds",  # {cause}
    "step_ratio": "job:ranksight_step_duration_seconds:baseline_ratio",
    # goodput group
    "productive": "job:ranksight_productive_seconds:avg",
    "goodput_split": "job:ranksight_goodput_seconds:avg",  # {category}: every category, productive included
    "wall": "job:ranksight_wall_seconds:avg",
    "goodput_share": "job:ranksight_goodput_share:ratio",  # {category}
    "goodput": "job:ranksight_goodput:ratio",
    "badput": "job:ranksight_badput_seconds:avg",  # {category}: every category but productive
}

RANK_BY = "job, node, rank, local_rank"


def stepped_a_window(steps: str, window: str) -> str:
    """The ranks whose steps counter (``steps``) was past 0 a whole rate ``window`` ago: their rate
    window no longer reaches back before their first step. A verdict that compares ranks' rates is
    judged only on them. Before that a rank's rates are its start-up steps (allocation, compilation,
    the first collectives) and little else, and their skew between ranks is neither a straggler nor
    a rank waiting for one; after it, they are diluted by a whole window of steady steps. This
    matters where for: is shorter than the window (the test profile: 10 s against 30 s); under the
    default profile (10m against 5m) a start-up skew leaves the window before for: ends, and the
    gate only delays a verdict at a job's start. The last value within a window before that (not
    the instant one) so that a missed scrape a window ago does not reset a firing alert. The agent
    carries a restarted rank's counters (same job, rank and node), so a restart is not gated."""
    return f"(last_over_time({steps}[{window}] offset {window}) > 0)"


# Recording-rule groups, in the order they are written. Prometheus evaluates groups concurrently
# and the rules of one group in order (a rule reads the earlier rules' results of the same
# evaluation), so rules that read each other share a group. Groups whose panels draw 5-minute
# rates of large families run at `durations.slow_rule_interval` (at 1,024 nodes they are
# the costliest rules and nothing alerts on them).
# The rank records split in four groups that evaluate side by side. The step counters' rates come
# first, in a group of their own (each raw family read once); the rank arithmetic on them (shares,
# busy time, the straggler ratio) and the job aggregates of them (job shares, step components) are
# two more groups that read the rates' latest evaluation, at most one interval old, and nothing of
# each other. The rank state records read their own raw series and nothing else of the chain
# (checkpoint share and age, backward-to-optimizer, allocator retries, ranks up). The slow node
# families are three groups of independent rules: interface counters, GPU utilization sample
# buckets, RDMA ports. At 1,024 nodes no group then evaluates in more than half its budget
# (bench/RESULTS.md, "Scale"). The loss after a resume is judged in a group of its own, on the
# steady loss rank_state holds: read across groups, it is not inlined into the judgement's
# expressions on vmalert (alerts/engines.py), and it is at most one interval old. Goodput splits
# the same way: its seconds records read the raw counters, and its ratios are a group of their own
# on the seconds' latest evaluation (numerator and denominator both from it), so vmalert does not
# inline the seconds' raw expressions into each ratio.
RULE_GROUPS: Dict[str, Optional[str]] = {
    "ranksight.recording.rank_rates": None,  # None: Prometheus' evaluation_interval
    "ranksight.recording.rank": None,
    "ranksight.recording.job": None,
    "ranksight.recording.rank_state": None,
    "ranksight.recording.node": None,
    "ranksight.recording.rank_gpu": None,
    "ranksight.recording.efficiency": None,
    "ranksight.recording.histograms": "slow_rule_interval",
    "ranksight.recording.node_counters": "slow_rule_interval",
    "ranksight.recording.gpu_samples": "slow_rule_interval",
    "ranksight.recording.rdma": "slow_rule_interval",
    "ranksight.recording.nic": "baseline_rule_interval",
    "ranksight.recording.loss_resume": None,
    GOODPUT_GROUP: "slow_rule_interval",
    GOODPUT_RATIO_GROUP: "slow_rule_interval",
    BASELINE_GROUP: "baseline_rule_interval",
}


# The earlier groups whose records a group reads: their latest evaluation, at most one interval old
# (every other record a rule reads comes from an earlier rule of its own group).
GROUP_INPUTS: Dict[str, Tuple[str, ...]] = {
    "ranksight.recording.rank": ("ranksight.recording.rank_rates",),
    "ranksight.recording.job": ("ranksight.recording.rank_rates",),
    "ranksight.recording.rank_gpu": ("ranksight.recording.node",),
    "ranksight.recording.efficiency": ("ranksight.recording.rank_rates",),
    "ranksight.recording.loss_resume": ("ranksight.recording.rank_state",),
    GOODPUT_RATIO_GROUP: (GOODPUT_GROUP,),
}
