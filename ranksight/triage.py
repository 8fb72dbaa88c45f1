"""The triage table: the six signals in order, the extra causes, the lints and the
stack's own health. Alert rules, recording rules, Alertmanager inhibition, runbooks,
dashboards and `ranksight triage` are all generated from ``table(cfg)``.

Recording-rule names follow ``level:metric:operation``. They carry no window in
the name (``ratio_rate``, not ``ratio_rate5m``) because the window is a config
value the test profile shortens; dashboards and alerts must use the same names
under both profiles.

Labels, as Prometheus stores them (the scrape config sets ``honor_labels: true``):

- rank series carry ``job`` (the *training* job, exposed by the agent and kept by
  honor_labels), ``node``, ``rank``, ``local_rank`` and ``instance`` (the agent);
- node series (GPU, network, disk, the agent's own health) expose no ``job``, so
  Prometheus attaches the scrape job's: ``job="ranksight-agent"`` (SCRAPE_JOB).

So an inhibition between a node-level alert and a rank-level one can only match
on ``node``; ``equal: [job]`` is only meaningful between two rank-level alerts, or
with a node alert that joins the training job of its node's ranks onto itself
(``Entry.joined``: the TCP retransmit alert, so that loss on one host mutes the comm
share of every rank of the jobs it carries). ``tests/test_alerts.py`` checks this
for every rule.

PromQL is written for Prometheus 2.42 and 3.x alike. Where a choice was made for
that, a comment says ``compat:``. In short: no ``holt_winters`` (renamed in 3.x),
no regex that relies on ``.`` (it matches newlines in 3.x), no selector on a ``le``
or ``quantile`` label value (3.x normalises "1" to "1.0"; ``histogram_quantile``
merges equal bounds, so aggregating ``by (le)`` is safe), no range-selector
arithmetic that depends on whether the left edge is included (3.x makes it open),
no 3.x-only rule-group fields (``query_offset``). Under 3.x's left-open ranges a
window holds one sample fewer: keep the scrape interval at most a third of the
shortest window (the test profile's 30s windows assume scrapes every 10 s or less).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, Optional, Tuple

from . import catalog as C
from .config import duration_seconds

SCRAPE_JOB = "ranksight-agent"  # Prometheus scrape job name for the agents (deploy/, stack, tests)
# Default runbook location; `alerting.runbook_base_url` in the config overrides it. Alertmanager
# and Grafana need an absolute URL, so this is never a relative docs path.
RUNBOOK_BASE = "https://github.com/ranksight/ranksight/blob/main/alerts/runbooks"

# NVML clocks-event reason bits -> label value (gpu_clocks_event_active{reason}).
CLOCK_EVENT_REASONS: Dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# sw_power_cap is left out on purpose: a healthy H200 under full load sits at its 700 W cap with
# that reason set (measured 2026-11-29, bench/RESULTS.md), so it would fire on normal training.
HW_COLLECTORS = "gpu|rdma"  # collectors whose absence on a node is normal (no GPU, no InfiniBand)
THROTTLE_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

# Setup lints: id -> (CamelCase, one-line summary).
LINTS: Dict[str, Tuple[str, str]] = {
    "io_amplification": ("IoAmplification", "every rank reads the whole dataset (no DistributedSampler)"),
    "sampler_epoch": ("SamplerEpochNotSet", "DistributedSampler.set_epoch() is never called: every epoch has the same order"),
    "rank_disagreement": ("RankDisagreement", "ranks disagree on sampler seed or initial parameters"),
    "dataloader_workers_rss": ("DataloaderWorkersMemory", "DataLoader workers hold too much host memory"),
    "numa_binding": ("NumaBinding", "rank CPU affinity excludes its GPU's NUMA node"),
    "uneven_last_batch": ("UnevenLastBatch", "drop_last=False with an uneven last batch across ranks"),
    "incomplete_checkpoint": ("IncompleteCheckpoint", "checkpoint lacks optimizer/scheduler/RNG/data/step state"),
    "global_batch_lr": ("GlobalBatchLr", "the global batch changed since the job's last start but the learning rate did not"),
    "disk_headroom": ("DiskHeadroom", "too little free disk for the next checkpoints"),
}

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
    # each per-rank step counter's rate, recorded once; the shares, busy time and job aggregates
    # above are arithmetic on these (one rate() per raw series per evaluation)
    "step_s": "rank:ranksight_step_seconds:rate",
    "steps": "rank:ranksight_steps:rate",
    "data_s": "rank:ranksight_dataloader_wait_seconds:rate",
    "comm_s": "rank:ranksight_comm_seconds:rate",
    "xcomm_s": "rank:ranksight_exposed_comm_seconds:rate",
    "ckpt_s": "rank:ranksight_checkpoint_seconds:rate",
    "b2o": "rank:ranksight_backward_to_optimizer_seconds:mean_rate",
    "alloc_retries": "rank:ranksight_cuda_alloc_retries:per_minute_rate",
    "ckpt_age": "rank:ranksight_checkpoint_age:seconds",
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
}

RANK_BY = "job, node, rank, local_rank"


# Recording-rule groups, in the order they are written. Prometheus evaluates groups concurrently
# and the rules of one group in order (a rule reads the earlier rules' results of the same
# evaluation), so rules that read each other share a group. Groups whose panels draw 5-minute
# rates of large families run at `durations.slow_rule_interval` (at 1,024 nodes they are
# the costliest rules and nothing alerts on them).
# The rank records split in two groups that evaluate side by side: the step counters' rates with
# the shares, busy time and job aggregates computed from them (a chain: one group), and the rank
# state records that read their own raw series and nothing else of the chain (checkpoint share and
# age, backward-to-optimizer, allocator retries, ranks up). The node counters split the same way:
# RDMA ports apart from the GPU samples and interfaces.
RULE_GROUPS: Dict[str, Optional[str]] = {
    "ranksight.recording.rank": None,  # None: Prometheus' evaluation_interval
    "ranksight.recording.rank_state": None,
    "ranksight.recording.node": None,
    "ranksight.recording.histograms": "slow_rule_interval",
    "ranksight.recording.node_counters": "slow_rule_interval",
    "ranksight.recording.rdma": "slow_rule_interval",
}
# Alert groups, by where an alert's series live (a functional shard evaluates each where its series
# are: docs/SCALING.md). Prometheus evaluates groups concurrently, the rules of a group one after the
# other. `waiting` holds the symptoms whose instances grow with the ranks that wait: every rank of a
# job behind one straggler is one RanksightCommBound instance, each costing its label and annotation
# templates on every evaluation (bench/scale/alert_cost.py), so they evaluate beside the causes.
ALERT_GROUPS: Tuple[str, ...] = ("ranksight.alerts.rank", "ranksight.alerts.waiting", "ranksight.alerts.node",
                                 "ranksight.alerts.job")
WAITING_SYMPTOMS: Tuple[str, ...] = ("RanksightCommBound", "RanksightRankBlocked")
# RDMA traffic counters (everything else the agent exposes for a port is an error or congestion count)
RDMA_TRAFFIC = "port_(rcv|xmit)_(packets|data)|(unicast|multicast)_(rcv|xmit)_packets"
# Clocks-event reasons the throttling panel shows (the alert ignores sw_power_cap, see THROTTLE_REASONS)
THROTTLE_SHOWN = ("sw_power_cap",) + THROTTLE_REASONS


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    group: str = "ranksight.recording.rank"


@dataclass(frozen=True)
class Inhibit:
    targets: Tuple[str, ...]  # alert names muted while the source fires
    equal: Tuple[str, ...]  # labels that must match


@dataclass(frozen=True)
class Entry:
    id: str  # stable id, also the runbook file stem
    alert: str  # RanksightCamelCase
    kind: str  # "signal" | "cause" | "symptom" | "lint" | "health"
    order: int  # 1..6 for the six signals, 0 otherwise
    title: str
    severity: str  # critical | warning | info
    expr: str  # alert expression
    for_: str  # `for:` duration
    threshold: Optional[float]  # the headline threshold (drawn on dashboards)
    unit: str  # unit of the indicator: ratio | seconds | bytes | count | bool | per_minute
    indicator: str  # PromQL of the value the triage walks and dashboards draw (by the entry's labels)
    op: str  # ">" or "<": abnormal when indicator op threshold
    scope: Tuple[str, ...]  # labels that identify where it fires
    summary: str
    description: str
    meaning: str
    impact: str
    diagnosis: str
    mitigation: str
    next_check: str
    inhibits: Tuple[Inhibit, ...] = field(default=())
    runbook_base: str = RUNBOOK_BASE  # from config alerting.runbook_base_url
    # Labels the alert takes from the rank series of its node, beyond scope (the training `job` of
    # the ranks on a node, for a node cause that must mute symptoms job-wide). The indicator keeps
    # the plain scope labels.
    joined: Tuple[str, ...] = ()

    @property
    def runbook(self) -> str:
        return f"{self.runbook_base.rstrip('/')}/{self.id}.md"

    @property
    def group(self) -> str:
        """The alert group (ALERT_GROUPS) the alert evaluates in."""
        rank_g, waiting_g, node_g, job_g = ALERT_GROUPS
        if self.alert in WAITING_SYMPTOMS:
            return waiting_g
        if "rank" in self.scope:
            return rank_g
        return job_g if "job" in self.scope else node_g

    @property
    def rank_level(self) -> bool:
        """True when the alert carries the training job's label: rank level (job, node, rank), or job
        level (records aggregated by job from rank series)."""
        return "rank" in self.scope or "job" in self.scope


def recording_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    """Every recording rule, group by group (RULE_GROUPS order), in evaluation order within a group.

    Each raw per-rank counter is read once per evaluation (its rate is recorded: `step_s`, ...);
    the shares, the busy time and the job aggregates are arithmetic on those records. At 8,192
    ranks that halves the rank group's cost against reading `rate(step_seconds_total)` five times
    (bench/RESULTS.md, "Scale"). Fleet panels read node- and job-level records instead of
    thousands of raw series."""
    w = cfg["windows"]["rate"]
    ckpt_w = cfg["windows"].get("checkpoint_share", w)
    RANK, STATE, NODE, HIST, NODEC, RDMA = list(RULE_GROUPS)[:6]

    def rate(m: Any, window: str = w) -> str:
        return f"rate({m}[{window}])"

    R = {k: REC[k] for k in ("step_s", "steps", "data_s", "comm_s", "xcomm_s", "ckpt_s")}

    def or_zero(rec: str) -> str:
        # A rank that never checkpointed (or has no exposed comm yet) must still get a busy time:
        # an absent counter counts as 0, with the rank's own labels (those of step_seconds_total).
        return f"({rec} or 0 * {R['step_s']})"

    def share(key: str) -> str:
        return f"{R[key]} / ({R['step_s']} > 0)"

    def job_share(key: str) -> str:
        return f"sum by (job) ({R[key]}) / (sum by (job) ({R['step_s']}) > 0)"

    busy = REC["busy"]
    # Checkpoint seconds per wall second = the share of wall time spent checkpointing, over a
    # window longer than the checkpoint interval (1 h): over the 5 min rate window, every write
    # longer than 15 s would read as a 5% share.
    rank = [
        Recording(R["step_s"], rate(C.STEP_SECONDS)),
        Recording(R["steps"], rate(C.STEPS)),
        Recording(R["data_s"], rate(C.DATALOADER_WAIT)),
        Recording(R["comm_s"], rate(C.COMM_SECONDS)),
        Recording(R["xcomm_s"], rate(C.EXPOSED_COMM_SECONDS)),
        Recording(R["ckpt_s"], rate(C.CHECKPOINT_SECONDS)),
        Recording(REC["data_share"], share("data_s")),
        Recording(REC["comm_share"], share("comm_s")),
        Recording(REC["xcomm_share"], share("xcomm_s")),
        Recording(REC["step_mean"], f"{R['step_s']} / ({R['steps']} > 0)"),
        # Busy time per step: the step minus the time the rank only waited (data, exposed comm,
        # checkpoint). Under synchronous data parallel all step times are equal, so the step itself
        # never blames a rank; the fast ranks show the straggler's extra work as exposed comm.
        Recording(
            busy,
            f"clamp_min({R['step_s']} - {or_zero(R['data_s'])} - {or_zero(R['xcomm_s'])}"
            f" - {or_zero(R['ckpt_s'])}, 0) / ({R['steps']} > 0)",
        ),
        # The job's median busy time. For a two-rank job the median of two is their mean, which
        # halves the gap (a rank 1.5x slower than its peer would read 1.2x): there the reference
        # is the faster rank, i.e. the lower median, which is the median of the straggler's peers.
        Recording(
            REC["busy_median"],
            f"(quantile by (job) (0.5, {busy}) unless on (job) (count by (job) ({busy}) == 2))"
            f" or (min by (job) ({busy}) and on (job) (count by (job) ({busy}) == 2))",
        ),
        Recording(REC["straggler"], f"{busy} / on (job) group_left () ({REC['busy_median']} > 0)"),
        Recording(REC["job_steps"], f"avg by (job) ({R['steps']})"),
        Recording(REC["job_data_share"], job_share("data_s")),
        Recording(REC["job_comm_share"], job_share("comm_s")),
        # The job's own communication cost: the comm share of its least-waiting rank (the last to arrive
        # at a collective waits for nobody: its collectives take only their transfer), less the largest
        # share any rank spends in its data loader or writing a checkpoint (its peers wait for that in
        # their collectives, the last to arrive included). A straggler explains only comm above it.
        Recording(REC["job_comm_min"],
                  f"clamp_min(min by (job) ({REC['comm_share']}) - on (job) "
                  f"max by (job) (({or_zero(R['data_s'])} + {or_zero(R['ckpt_s'])}) / ({R['step_s']} > 0)), 0)"),
        Recording(REC["job_xcomm_share"], job_share("xcomm_s")),
    ]
    state = [
        Recording(REC["ckpt_share"], rate(C.CHECKPOINT_SECONDS, ckpt_w)),
        # The job loses the largest rank's checkpoint share: the other ranks wait for it in their
        # next collective (rank-0-only saves), so the mean would understate it by the world size.
        Recording(REC["job_ckpt_share"], f"max by (job) ({REC['ckpt_share']})"),
        Recording(REC["b2o"], f"{rate(C.BACKWARD_TO_OPTIMIZER.sum)} / ({rate(C.BACKWARD_TO_OPTIMIZER.count)} > 0)"),
        Recording(REC["alloc_retries"], f"{rate(C.CUDA_ALLOC_RETRIES)} * 60"),
        Recording(REC["ckpt_age"], f"time() - {C.LAST_CHECKPOINT}"),
        Recording(REC["ckpt_age_median"], f"quantile by (job) (0.5, {REC['ckpt_age']})"),
        Recording(REC["ranks_up"], f"sum by (job) ({C.RANK_UP})"),
        Recording(REC["ranks"], f"count by (job) ({C.RANK_UP})"),
    ]
    node = [
        Recording(REC["retrans"], f"{rate(C.NET_TCP_RETRANS)} / ({rate(C.NET_TCP_SENT)} > 0)"),
        Recording(REC["gpu_util"], rate(C.GPU_BUSY_SECONDS)),
        Recording(REC["gpu_swings"], f"{rate(C.GPU_SWINGS)} * 60"),
        Recording(REC["node_gpu_util"], f"avg by (node) ({REC['gpu_util']})"),
        Recording(REC["ingest"], f"sum by (node, result) ({rate(C.INGEST_DATAGRAMS)})"),
        Recording(REC["disk_free"], f"{C.DISK_FREE} / ({C.DISK_TOTAL} > 0)"),
        # filter before aggregating: only the reasons that are active become series
        Recording(REC["throttled"],
                  f'max by (node, gpu, reason) ({C.GPU_CLOCKS_EVENT}{{reason=~"{"|".join(THROTTLE_SHOWN)}"}} == 1)'),
    ]
    # compat: aggregate by (le) and never select on a `le` value; 3.x writes le="1.0" where 2.x
    # wrote "1", and histogram_quantile merges buckets of equal bound across the two spellings.
    hist = [
        Recording(REC["job_buckets"], f"sum by (job, le) ({rate(C.STEP_DURATION.bucket)})"),
        Recording(REC["job_p50"], f"histogram_quantile(0.5, {REC['job_buckets']})"),
        Recording(REC["job_p99"], f"histogram_quantile(0.99, {REC['job_buckets']})"),
    ]
    rdma_errors = f'{C.RDMA_PORT_COUNTER}{{counter!~"{RDMA_TRAFFIC}"}}'
    rdma_packets = f'{C.RDMA_PORT_COUNTER}{{counter=~"port_(rcv|xmit)_packets"}}'
    rdma = [
        Recording(REC["rdma_errors"], f"sum by (node, counter) ({rate(rdma_errors)})"),
        Recording(REC["rdma_packets"], f"sum by (node, counter) ({rate(rdma_packets)})"),
    ]
    node_counters = [
        Recording(REC["util_samples"], f"sum by (node, le) ({rate(C.GPU_UTILIZATION_SAMPLES.bucket)})"),
        Recording(REC["if_errors"], f"sum by (node, direction) ({rate(C.NET_IF_ERRORS)})"),
        Recording(REC["if_drops"], f"sum by (node, direction) ({rate(C.NET_IF_DROPS)})"),
        Recording(REC["if_bytes"], f"sum by (node, direction) ({rate(C.NET_IF_BYTES)})"),
    ]
    chain, job_state = _goodput.rank_group_rules(cfg)
    rank += chain
    state += job_state
    out: List[Recording] = []
    for group, rules in ((RANK, rank), (STATE, state), (NODE, node), (HIST, hist), (NODEC, node_counters),
                         (RDMA, rdma)):
        out += [replace(r, group=group) for r in rules]
    return out + _goodput.goodput_rules(cfg) + _goodput.baseline_rules(cfg)


def recording_groups(cfg: Mapping[str, Any]) -> List[Tuple[str, Optional[str], List[Recording]]]:
    """(group name, interval or None, rules) in RULE_GROUPS order."""
    rules = recording_rules(cfg)
    return [(g, cfg["durations"][key] if key else None, [r for r in rules if r.group == g])
            for g, key in RULE_GROUPS.items()]


RANK_DESC = "job={{ $labels.job }} rank={{ $labels.rank }} node={{ $labels.node }}"
NODE_DESC = "node={{ $labels.node }}"
GPU_DESC = "node={{ $labels.node }} gpu={{ $labels.gpu }}"
VAL = '{{ printf "%.2f" $value }}'
# RanksightCollectiveDesync's positions: each blocked rank's collective and sequence number in the group.
DESYNC_POS = (f'{{{{ range $i, $s := query (printf "{C.RANK_COLLECTIVE_SEQ}{{job=%q,pg=%q}}" $labels.job $labels.pg)'
              ' | sortByLabel "rank" }}{{ if $i }}, {{ end }}rank {{ $s.Labels.rank }} in {{ $s.Labels.op }} '
              '#{{ printf "%.0f" $s.Value }}{{ end }}')
# RankStalled's place: the stalled rank's where series (ranksight_rank_stall_where), read at notification
# time (only firing stalls run the query; the alert's labels stay the same when the stack moves).
STALL_WHERE = (f'{{{{ with query (printf "{C.RANK_STALL_WHERE}{{job=%q,rank=%q}}" $labels.job $labels.rank) }}}}'
               '{{ with index . 0 }}: stalled {{ printf "%.0f" .Value }} s at {{ .Labels.where }}'
               '{{ if eq .Labels.phase "data" }}, inside the data loader: a data-pipeline hang{{ end }}'
               '{{ end }}{{ end }}')


def with_gpu(expr: str) -> str:
    """``expr`` (a rank alert's expression) with the ``gpu`` label of the rank's GPU added where the
    agent knows it (``ranksight_rank_gpu_info``), and unchanged for ranks without one (CPU jobs).
    A GPU cause (throttling, XID, PCIe) then mutes exactly the alert of the rank on that GPU
    (``equal: [node, gpu]``). Matched on job, node and rank: a rank is on one GPU of one node."""
    info = f"max by (job, node, rank, gpu) ({C.RANK_GPU_INFO})"
    return f"(({expr}) * on (job, node, rank) group_left (gpu) {info}) or on (job, node, rank) ({expr})"


def table(cfg: Mapping[str, Any]) -> List[Entry]:
    t = cfg["thresholds"]
    d = cfg["durations"]
    w = cfg["windows"]
    rate_w = w["rate"]
    base = dict(cfg.get("alerting") or {}).get("runbook_base_url") or RUNBOOK_BASE
    R = ("job", "node", "rank")
    # Inhibition targets. Rank-level targets are muted on the same training `job`; node-level
    # ones (the GPU sawtooth) only on the same `node`: node series carry job="ranksight-agent".
    comm = ("RanksightCommBound",)
    stuck_job_targets = ("RanksightCommBound", "RanksightStraggler", "RanksightRankBlocked")
    on_node = Inhibit(("RanksightGpuSawtooth",), ("node",))
    # a GPU cause explains the straggler or the down rank on exactly that GPU (ranksight_rank_gpu_info)
    gpu_rank = Inhibit(("RanksightStraggler", "RanksightRankDown"), ("node", "gpu"))
    retries = REC["alloc_retries"]
    # distinct (op, sequence number) positions per group: count_values turns the number into a label
    # NIC speed: a node's training job (one per node; a NIC serves every job of its node), the
    # speed of each NIC with that job, the NIC below its own day's best or its job's best for that
    # device name, and the NICs that carry at least nic_min_traffic_share of their node's bytes.
    node_job = f"topk by (node) (1, group by (node, job) ({C.RANK_UP}))"
    speed_job = f"({C.NET_IF_SPEED} * on (node) group_left (job) {node_job})"
    nic_peer_low = f"{speed_job} < on (job, device) group_left () max by (job, device) ({speed_job})"
    nic_self_low = f"{C.NET_IF_SPEED} < max_over_time({C.NET_IF_SPEED}[1d])"
    nic_bytes = f"sum by (node, device) (rate({C.NET_IF_BYTES}[{rate_w}]))"
    nic_busy = (f"{nic_bytes} / on (node) group_left () (sum by (node) ({nic_bytes}) > 0)"
                f" >= {t['nic_min_traffic_share']:g}")
    desync = f"count by (job, pg) (count_values by (job, pg, op) (\"seq\", {C.RANK_COLLECTIVE_SEQ}))"
    retrans_bad = (f"({REC['retrans']} > {t['retransmit_ratio']:g}) and on (node) "
                   f"(rate({C.NET_TCP_RETRANS}[{rate_w}]) > {t['retransmit_min_rate']:g})")
    ckpt_recent = duration_seconds(rate_w)
    # An xid series that appeared within the window, on an agent Prometheus already scraped then
    # (so a fresh Prometheus, or a first scrape, does not report an agent's old errors as new).
    xid_new = (f"((({C.GPU_XID_ERRORS} > 0) unless ({C.GPU_XID_ERRORS} offset {rate_w}))"
               f" and on (instance) (up{{job=\"{SCRAPE_JOB}\"}} offset {rate_w}))")
    throttled = f"max by (node, gpu) ({C.GPU_CLOCKS_EVENT}{{reason=~\"{'|'.join(THROTTLE_REASONS)}\"}})"
    # the alert reads the node group's record of the active reasons (a few series) instead of every
    # GPU's nine reason series; the value the triage reads stays the raw one (0 or 1 for every GPU)
    throttled_rec = f"max by (node, gpu) ({REC['throttled']}{{reason=~\"{'|'.join(THROTTLE_REASONS)}\"}})"
    drop_ratio = (f"sum by (node) ({REC['ingest']}{{result!=\"ok\"}}) / "
                  f"(sum by (node) ({REC['ingest']}) > 0)")
    entries: List[Entry] = [
        # ------------------------------------------------------------ 1. dataloader wait
        Entry(
            id="dataloader-bound", alert="RanksightDataloaderBound", kind="signal", order=1,
            title="Dataloader wait per step", severity="warning",
            expr=f"{REC['data_share']} > {t['dataloader_wait_share']:g}",
            for_=d["dataloader_bound"], threshold=t["dataloader_wait_share"], unit="ratio",
            indicator=REC["data_share"], op=">", scope=R,
            summary="Rank waits on its data loader for over {:.0%} of each step".format(t["dataloader_wait_share"]),
            description=f"{RANK_DESC} spends {VAL} of its step time waiting in next() on the data loader.",
            meaning="The input pipeline (storage, decoding, augmentation, too few workers) cannot keep up; the GPU idles between batches.",
            impact="Every step of the job is as slow as the slowest rank's input pipeline; GPUs show a sawtooth and "
                   "the other ranks wait for this one in their collectives.",
            diagnosis="Compare ranksight_dataloader_wait_seconds by rank; check DataLoader num_workers, pin_memory, "
                      "prefetch_factor, storage throughput and CPU saturation on the node; look for the io_amplification lint.",
            mitigation="Raise num_workers/prefetch_factor, move decoding off the critical path, cache or pre-shard the data, "
                       "use a DistributedSampler so each rank reads only its shard.",
            next_check="GPU utilization waveform (sawtooth) on the same node",
            # mutes the sawtooth it causes on its node, and the comm share of the ranks waiting for it;
            # data comes first in the triage order, so a straggler call in the same job waits until the
            # input pipeline keeps up (a peer's wait for the slow loader can read as busy time)
            inhibits=(on_node, Inhibit(comm + ("RanksightStraggler",), ("job",))),
        ),
        # ------------------------------------------------------------ 2. GPU waveform
        Entry(
            id="gpu-sawtooth", alert="RanksightGpuSawtooth", kind="signal", order=2,
            title="GPU utilization waveform", severity="warning",
            expr=f"({REC['gpu_util']} < {t['gpu_util_mean']:g}) and on (node, gpu) "
                 f"({REC['gpu_swings']} >= {t['gpu_swings_per_min']:g})",
            for_=d["gpu_sawtooth"], threshold=t["gpu_util_mean"], unit="ratio",
            indicator=REC["gpu_util"], op="<", scope=("node", "gpu"),
            summary="GPU utilization swings high to low: work is not overlapped",
            description=f"{GPU_DESC} averages {VAL} utilization with repeated high-to-low swings (sawtooth).",
            meaning="Compute alternates with idle gaps: data loading, host work, communication or checkpoints are not overlapped with compute.",
            impact="GPU time is wasted in every gap; throughput falls by the idle share.",
            diagnosis="Check the dataloader wait share first (signal 1), then the exposed communication share (signal 3), "
                      "then checkpoint timing (signal 5) against the gap period.",
            mitigation="Overlap: more loader workers and prefetch, DDP bucket tuning / FSDP prefetch, async checkpointing.",
            next_check="communication share of step time",
        ),
        # ------------------------------------------------------------ 3. comm share
        Entry(
            id="comm-bound", alert="RanksightCommBound", kind="signal", order=3,
            title="Communication share of step time", severity="warning",
            expr=f"{REC['comm_share']} > {t['comm_share']:g}",
            for_=d["comm_bound"], threshold=t["comm_share"], unit="ratio",
            indicator=REC["comm_share"], op=">", scope=R,
            summary="Collectives take over {:.0%} of step time: the job is communication-bound".format(t["comm_share"]),
            description=f"{RANK_DESC} spends {VAL} of its step time in collectives.",
            meaning="Gradient/parameter collectives dominate the step; either the network is slow or compute is too small to hide it. "
                    "A rank that waits for a slow peer also shows high comm time: dataloader-bound ranks, stragglers, "
                    "down or stalled ranks, retransmits and slow links are checked first (they mute this alert). "
                    "When even the job's least-waiting rank is over the share, the comm is the job's own cost: "
                    "no rank is then called a straggler.",
            impact="Adding GPUs will not speed the job up; the step scales with the network.",
            diagnosis="Check TCP retransmits and NIC link speed on the nodes (signal 4), RDMA port counters, the exposed-comm share, "
                      "and whether one rank is a straggler.",
            mitigation="Larger per-rank batch, gradient accumulation, bigger DDP buckets, overlap (FSDP prefetch), compression; fix the link.",
            next_check="network retransmits and link speed",
        ),
        # ------------------------------------------------------------ 4. retransmits
        Entry(
            id="tcp-retransmits", alert="RanksightTcpRetransmits", kind="signal", order=4,
            title="Network retransmits", severity="warning",
            # One alert per (node, training job with a rank on the node), so that it can mute the comm
            # share of every rank of those jobs, on any node: loss on one host's link slows the whole
            # job's collectives. A node without ranks alerts with job="ranksight-agent".
            expr=f"(max by (node) ({retrans_bad}) * on (node) group_right () group by (node, job) ({C.RANK_UP}))"
                 f" or max by (node, job) ({retrans_bad} unless on (node) group by (node) ({C.RANK_UP}))",
            for_=d["tcp_retransmits"], threshold=t["retransmit_ratio"], unit="ratio",
            indicator=REC["retrans"], op=">", scope=("node",), joined=("job",),
            summary="TCP retransmits above {:.0%} of sent segments".format(t["retransmit_ratio"]),
            description=f"{NODE_DESC} retransmits {VAL} of its TCP segments.",
            meaning="Packets are lost on the node's links: bad cable or port, a congested or misconfigured switch, a NIC at the wrong speed.",
            impact="TCP collectives (gloo, NCCL socket transport, storage) stall on retransmit timeouts; comm share rises.",
            diagnosis="Check ranksight_net_interface_errors_total / drops by device, the negotiated link speed, and the switch port counters.",
            mitigation="Reseat or replace the cable/transceiver, move the node off the bad port, fix MTU/flow control, drain the node.",
            next_check="checkpoint write duration",
            # on its own node whatever the job, and job-wide through the joined training job
            inhibits=(Inhibit(comm, ("node",)), Inhibit(comm, ("job",))),
        ),
        # ------------------------------------------------------------ 5. checkpoint
        Entry(
            id="checkpoint-slow", alert="RanksightCheckpointSlow", kind="signal", order=5,
            title="Checkpoint write duration", severity="warning",
            # A write still running past the limit (so it fires, and mutes the stalls, during the
            # write), or one that finished within the last rate window past the limit (the last-
            # duration gauge keeps its value until the next write, hence the recency guard), or
            # checkpoints taking too large a share of wall time.
            expr=f"({C.CHECKPOINT_IN_PROGRESS} > {t['checkpoint_write_seconds']:g})"
                 f" or (({C.LAST_CHECKPOINT_DURATION} > {t['checkpoint_write_seconds']:g})"
                 f" and (time() - {C.LAST_CHECKPOINT} < {ckpt_recent:g}))"
                 f" or ({REC['ckpt_share']} > {t['checkpoint_wall_share']:g})",
            for_=d["checkpoint_slow"], threshold=t["checkpoint_wall_share"], unit="ratio",
            indicator=REC["ckpt_share"], op=">", scope=R,
            summary="Checkpoint writes take over {:g} s or over {:.0%} of wall time".format(
                t["checkpoint_write_seconds"], t["checkpoint_wall_share"]),
            description=f"{RANK_DESC}: checkpoint writes take {VAL} (seconds of the current or last write, "
                        f"or share of wall time).",
            meaning="Checkpoints block training for too long: slow or full storage, a synchronous save of a large state, fsync storms.",
            impact="Effective training time drops by the checkpoint share; a periodic gap appears in GPU utilization, and the "
                   "other ranks block in their next collective while one rank writes.",
            diagnosis="Check ranksight_checkpoint_write_seconds, the target filesystem's throughput and free space, and whether every rank writes the full state.",
            mitigation="Use torch.distributed.checkpoint async_save, shard the save across ranks, write to local NVMe then copy, checkpoint less often.",
            next_check="heartbeat misses",
            # the ranks blocked while one rank writes are not hung; the utilization gap is the write
            inhibits=(Inhibit(("RanksightRankStalled", "RanksightRankBlocked", "RanksightCommBound"), ("job",)), on_node),
        ),
        Entry(
            id="checkpoint-stale", alert="RanksightCheckpointStale", kind="signal", order=5,
            title="Checkpoint age", severity="warning",
            expr=f"(time() - {C.LAST_CHECKPOINT} > {t['checkpoint_max_age_seconds']:g}) and on ({RANK_BY}) ({C.RANK_UP} == 1)",
            for_=d["checkpoint_stale"], threshold=t["checkpoint_max_age_seconds"], unit="seconds",
            indicator=f"time() - {C.LAST_CHECKPOINT}", op=">", scope=R,
            summary="No checkpoint for too long: a failure now loses hours",
            description=f"{RANK_DESC} last checkpointed {VAL} seconds ago.",
            meaning="The job stopped writing checkpoints (a failing save, a disabled callback, a full disk).",
            impact="A crash or preemption loses all work since the last checkpoint.",
            diagnosis="Check ranksight_checkpoint_failures_total, the training logs around the save, and free space of the checkpoint directory.",
            mitigation="Fix the save path or space; trigger a manual checkpoint.",
            next_check="heartbeat misses",
        ),
        # ------------------------------------------------------------ 6. heartbeats
        Entry(
            id="heartbeat-missed", alert="RanksightHeartbeatMissed", kind="signal", order=6,
            title="Heartbeat misses", severity="warning",
            expr=f"increase({C.HEARTBEAT_MISSES}[{w['heartbeat']}]) >= {t['heartbeat_misses']:g}",
            for_=d["heartbeat_missed"], threshold=t["heartbeat_misses"], unit="count",
            indicator=f"increase({C.HEARTBEAT_MISSES}[{w['heartbeat']}])", op=">", scope=R,
            summary="A rank missed heartbeats: it may be dying or its host is overloaded",
            description=f"{RANK_DESC} missed {VAL} heartbeats in {w['heartbeat']}.",
            meaning="The rank's process did not report for at least one heartbeat interval: it is paused, swapping, killed, or its host is starved.",
            impact="Every collective of the job waits on that rank; a dead rank stops the job until the collective timeout.",
            diagnosis="Check ranksight_rank_up, the process (OOM killer in dmesg, SIGKILL by the scheduler), host load and memory.",
            mitigation="Restart the rank (torchrun elastic), drain the node if it repeats.",
            next_check="rank stalled / rank down",
            inhibits=(Inhibit(stuck_job_targets, ("job",)), on_node),
        ),
        Entry(
            id="rank-down", alert="RanksightRankDown", kind="signal", order=6,
            title="Rank down", severity="critical",
            expr=with_gpu(f"{C.RANK_UP} == 0"),
            for_=d["rank_down"], threshold=0.5, unit="bool", joined=("gpu",),
            indicator=f"{C.RANK_UP}", op="<", scope=R,
            summary="A rank stopped heartbeating: the job is stuck in its next collective",
            description=f"{RANK_DESC} has missed several heartbeats in a row and is considered down.",
            meaning="The rank process died or froze without a goodbye (SIGKILL, OOM kill, node failure).",
            impact="All other ranks block in their next collective until the NCCL/gloo timeout, then the job fails.",
            diagnosis="Check the scheduler and dmesg on the node (OOM killer, XID errors), the rank's last log lines.",
            mitigation="Restart from the last checkpoint; drain the node if hardware is at fault.",
            next_check="XID errors and host logs on the node",
            # a down rank's own missed heartbeats say nothing more
            inhibits=(Inhibit(stuck_job_targets, ("job",)), Inhibit(("RanksightHeartbeatMissed",), ("job", "rank")), on_node),
        ),
        # ------------------------------------------------------------ extra causes
        Entry(
            id="rank-stalled", alert="RanksightRankStalled", kind="cause", order=0,
            title="Rank stalled (hang)", severity="critical",
            expr=f"{C.RANK_STALLED}{{reason=\"no_progress\"}} == 1",
            for_=d["rank_stalled"], threshold=0.5, unit="bool",
            indicator=f"{C.RANK_STALLED}{{reason=\"no_progress\"}}", op=">", scope=R,
            summary="A rank is alive but makes no progress, outside any collective: it is the hang's culprit",
            description=f"{RANK_DESC} heartbeats but has not finished a step for longer than its stall limit, and it is "
                        f"not waiting in a collective{STALL_WHERE}.",
            meaning="The rank is stuck in its own code (deadlock, infinite loop, blocking I/O, a sleep); its peers wait for it "
                    "in their collectives. A stall in phase=data (inside next() on the data loader) is a data-pipeline "
                    "hang: a dead worker, a blocked read from storage, a deadlocked collate.",
            impact="The whole job is stopped; the NCCL watchdog will eventually time out and kill it.",
            diagnosis=f"The description names where the rank is stuck: {C.RANK_STALL_WHERE}'s where label, the innermost "
                      f"frame outside the standard library and torch; the whole stack is on the node agent's "
                      f"/api/v1/ranks and in its log. In phase=data, check the loader's workers and the storage it reads.",
            mitigation="Kill and restart the rank from the last checkpoint; fix the blocking call.",
            next_check="the stack on the node agent's /api/v1/ranks",
            inhibits=(Inhibit(stuck_job_targets, ("job",)), on_node),
        ),
        Entry(
            id="rank-blocked", alert="RanksightRankBlocked", kind="symptom", order=0,
            title="Rank blocked in a collective", severity="warning",
            expr=f"{C.RANK_STALLED}{{reason=\"waiting_in_collective\"}} == 1",
            for_=d["rank_stalled"], threshold=0.5, unit="bool",
            indicator=f"{C.RANK_STALLED}{{reason=\"waiting_in_collective\"}}", op=">", scope=R,
            summary="A rank is blocked in a collective, waiting on a peer",
            description=f"{RANK_DESC} has been inside a collective for longer than its stall limit; it waits for a peer.",
            meaning="A symptom: some other rank is dead, hung, far behind or writing a checkpoint. Find the culprit "
                    "(RanksightRankStalled / RanksightRankDown / RanksightCheckpointSlow mute this alert).",
            impact="The job makes no progress.",
            diagnosis="Look for a rank of the same job that is stalled with reason=no_progress or down; if none, suspect the network.",
            mitigation="Fix the culprit; set TORCH_NCCL_ASYNC_ERROR_HANDLING / timeouts so hangs fail fast.",
            next_check="the stalled or down rank of the same job",
        ),
        Entry(
            id="collective-desync", alert="RanksightCollectiveDesync", kind="cause", order=0,
            title="Ranks desynchronized in their collectives", severity="critical",
            # the blocked ranks of one group wait at more than one (op, sequence number)
            expr=f"{desync} > 1",
            for_=d["collective_desync"], threshold=1, unit="count",
            indicator=desync, op=">", scope=("job", "pg"), joined=("job",),  # the training job (rank series)
            summary="Ranks of one process group wait in different collectives: the job is desynchronized",
            description=f"job={{{{ $labels.job }}}} group={{{{ $labels.pg }}}}: its blocked ranks wait at {VAL} "
                        f"different positions: {DESYNC_POS}.",
            meaning="The ranks issued collectives in a different order or a different number of times (a rank-dependent "
                    "branch, an uneven last batch, a skipped barrier): each waits for peers that will never join its "
                    "collective.",
            impact="The job is hung until the collective timeout kills it.",
            diagnosis=f"Compare each rank's position in the description ({C.RANK_COLLECTIVE_SEQ}: op and sequence "
                      f"number in the group): the ranks at the odd position took another code path. Their stacks are on "
                      f"the node agents' /api/v1/ranks.",
            mitigation="Make every rank issue the same collectives in the same order (drop_last=True, no rank-dependent "
                       "collectives); restart from the last checkpoint.",
            next_check="the stacks of the ranks at the odd position",
            inhibits=(Inhibit(stuck_job_targets, ("job",)),),
        ),
        Entry(
            id="straggler", alert="RanksightStraggler", kind="cause", order=0,
            title="Straggler rank", severity="warning",
            # The ratio alone is not enough: on a short, communication-heavy step a 2 ms difference in
            # 10 ms of busy time reads 1.2x while nobody waits for anyone. The extra busy time must
            # also be a real part of the step the job loses. And a job whose least-waiting rank still
            # spends over the comm-bound share in collectives is communication-bound whatever its
            # ranks' busy times do (scheduling noise moves busy time by 20% on a loaded host): its comm
            # would page without any straggler, so no rank is called one and RanksightCommBound
            # stays loud (the straggler mutes only comm above that irreducible share).
            expr=with_gpu(f"(({REC['straggler']} > {t['straggler_ratio']:g}) and on ({RANK_BY}) "
                          f"(({REC['busy']} - on (job) group_left () {REC['busy_median']}) / ({REC['step_mean']} > 0)"
                          f" > {t['straggler_min_step_share']:g})) "
                          f"unless on (job) ({REC['job_comm_min']} > {t['comm_share']:g})"),
            for_=d["straggler"], threshold=t["straggler_ratio"], unit="ratio", joined=("gpu",),
            indicator=REC["straggler"], op=">", scope=R,
            summary="One rank computes over {:.0%} slower than the job median: every other rank waits for it".format(
                t["straggler_ratio"] - 1),
            description=f"{RANK_DESC} busy time per step is {VAL}x the job median "
                        f"(step minus data wait, exposed comm and checkpoint).",
            meaning="The rank's own work is slower (throttled or faulty GPU, noisy neighbour, CPU contention, bad NUMA binding); "
                    "its peers show the difference as collective wait. Long steps alone never blame a rank: under "
                    "synchronous data parallel every rank's step is equally long. A job whose least-waiting rank "
                    "(the one that would be the straggler) spends over the comm-bound share in collectives is "
                    "communication-bound, not straggling: it is reported as RanksightCommBound instead.",
            impact="The job runs at the straggler's speed.",
            diagnosis="Check the rank's GPU clocks-event reasons, temperature, PCIe link, XIDs, CPU load on its node and its NUMA lint.",
            mitigation="Drain or fix the node; rebind CPUs; replace the GPU.",
            next_check="GPU throttling and PCIe link on the rank's node",
            # the rest of the job waits for it in its collectives
            inhibits=(Inhibit(comm, ("job",)),),
        ),
        Entry(
            id="cuda-alloc-retries", alert="RanksightCudaAllocRetries", kind="cause", order=0,
            title="CUDA allocator retries (fragmentation)", severity="warning",
            # frequent retries, or any retries while the step time crept up against `creep_offset` ago
            expr=f"({retries} > {t['alloc_retries_per_min']:g}) or (({retries} > 0) and on ({RANK_BY}) "
                 f"({REC['step_mean']} / ({REC['step_mean']} offset {w['creep_offset']}) > {t['step_creep_ratio']:g}))",
            for_=d["alloc_retries"], threshold=t["alloc_retries_per_min"], unit="per_minute",
            indicator=retries, op=">", scope=R,
            summary="CUDA allocator keeps flushing its cache and retrying: memory is fragmented",
            description=f"{RANK_DESC} has {VAL} allocator retries per minute.",
            meaning="cudaMalloc failed and the caching allocator freed its cache to retry: memory is fragmented or nearly full. "
                    "Each retry synchronizes the device, so steps slow down (by 30% over days in one reported case).",
            impact="Steps creep up; an OOM may follow.",
            diagnosis="Watch ranksight_cuda_memory_reserved_bytes vs allocated; compare the step time with an hour ago; torch.cuda.memory_summary().",
            mitigation="PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, lower the batch, free caches at phase changes, avoid varying shapes.",
            next_check="step-time creep on the per-rank dashboard",
        ),
        Entry(
            id="nic-speed-low", alert="RanksightNicSpeedLow", kind="cause", order=0,
            title="NIC link speed below its own or its peers'", severity="warning",
            # Judged by what that NIC should do, not a fixed floor (a 1 GbE management NIC is fine):
            # below its own highest speed of the last day (a renegotiation after a flap), or below the
            # same interface on the other nodes of its job (one node's NIC up at 100 Mb/s), and only
            # for a NIC that carries a real share of its node's traffic.
            expr=f"{C.NET_IF_SPEED} and on (node, device) (({nic_self_low}) or on (node, device) ({nic_peer_low}))"
                 f" and on (node, device) ({nic_busy})",
            for_=d["nic_speed_low"], threshold=None, unit="bytes",
            indicator=f"{C.NET_IF_SPEED}", op="<", scope=("node", "device"),
            summary="A busy NIC negotiated a link speed below its own recent best or its job peers'",
            description=f"{NODE_DESC} device={{{{ $labels.device }}}} links at {VAL} bytes/s.",
            meaning="The interface auto-negotiated down (a bad cable or port, e.g. 100 Mb/s instead of 100 Gb/s): it links "
                    "below its own best of the last day, or below the same interface on the job's other nodes. A NIC "
                    "that carries little of its node's traffic (a 1 GbE management port) is not paged.",
            impact="Every transfer through that NIC is slow: collectives, data loading, checkpoints.",
            diagnosis="ethtool DEVICE on the node; compare with other nodes; check switch port logs.",
            mitigation="Replace the cable/transceiver, force the speed, move the node to another port; exclude management "
                       "NICs with agent.nic_exclude.",
            next_check="network retransmits and comm share",
            inhibits=(Inhibit(comm, ("node",)),),
        ),
        Entry(
            id="disk-filling", alert="RanksightDiskFilling", kind="cause", order=0,
            title="Watched disk filling", severity="warning",
            # The prediction pages only once its fit spans a whole window (a sample one window ago: no
            # linear fit over the first seconds of a checkpoint burst on a new agent) and the free share
            # is already under a guard (node-mixin's fsSpaceFillingUp does the same).
            expr=f"({C.DISK_FREE} / ({C.DISK_TOTAL} > 0) < {t['disk_free_ratio']:g}) or "
                 f"((predict_linear({C.DISK_FREE}[{w['disk_predict']}], {t['disk_full_horizon_seconds']:g}) < 0)"
                 f" and on (node, path) ({C.DISK_FREE} / ({C.DISK_TOTAL} > 0) < {t['disk_predict_free_ratio']:g})"
                 f" and on (node, path) ({C.DISK_FREE} offset {w['disk_predict']}))",
            for_=d["disk_filling"], threshold=t["disk_free_ratio"], unit="ratio",
            indicator=f"{C.DISK_FREE} / ({C.DISK_TOTAL} > 0)", op="<", scope=("node", "path"),
            summary="A watched disk (tmp, log or checkpoint) is nearly full or will be within {:g} s".format(
                t["disk_full_horizon_seconds"]),
            description=f"{NODE_DESC} path={{{{ $labels.path }}}}: free share {VAL} (or, when negative, "
                        f"the free bytes predicted at the horizon).",
            meaning="The tmp, log or checkpoint filesystem is running out of space.",
            impact="Checkpoints fail, compile caches and NCCL/torch temp files fail in odd ways (/tmp full), logs stop.",
            diagnosis="du -xh --max-depth=1 on the path; look for old checkpoints, core dumps, compile caches.",
            mitigation="Delete or move old checkpoints, point TMPDIR elsewhere, add retention.",
            next_check="checkpoint failures",
        ),
        Entry(
            id="gpu-pcie-degraded", alert="RanksightGpuPcieDegraded", kind="cause", order=0,
            title="GPU PCIe link below max", severity="warning",
            expr=f"(({C.GPU_PCIE_GEN}{{state=\"current\"}} < ignoring (state) {C.GPU_PCIE_GEN}{{state=\"max\"}}) or "
                 f"({C.GPU_PCIE_WIDTH}{{state=\"current\"}} < ignoring (state) {C.GPU_PCIE_WIDTH}{{state=\"max\"}}))"
                 f" and on (node, gpu) ({REC['gpu_util']} > 0.5)",
            for_=d["pcie_degraded"], threshold=None, unit="count",
            indicator=f"{C.GPU_PCIE_WIDTH}{{state=\"current\"}}", op="<", scope=("node", "gpu"),
            summary="A busy GPU's PCIe link runs below its max generation or width",
            description=f"{GPU_DESC}: PCIe link below max while busy (current generation or width {VAL}).",
            meaning="The link trained down (riser, slot, or a GPU falling off the bus). Idle GPUs downshift on purpose, so only busy GPUs count.",
            impact="Host-device copies and GPU-direct traffic are slower; this rank may become a straggler.",
            diagnosis="nvidia-smi -q -d PCIE; lspci -vv for LnkSta vs LnkCap; XID errors.",
            mitigation="Reseat the GPU/riser; drain the node.",
            next_check="straggler ratio of the ranks on that node",
            inhibits=(gpu_rank,),
        ),
        Entry(
            id="gpu-xid", alert="RanksightGpuXidError", kind="cause", order=0,
            title="GPU XID error", severity="critical",
            # increase() misses the first error of a new xid series (created at 1), hence the second arm
            expr=f"(increase({C.GPU_XID_ERRORS}[{rate_w}]) > 0) or {xid_new}",
            for_=d["xid"], threshold=0.0, unit="count",
            indicator=f"increase({C.GPU_XID_ERRORS}[{rate_w}])", op=">", scope=("node", "gpu"),
            summary="A GPU reported an XID error",
            description=f"{GPU_DESC} raised XID {{{{ $labels.xid }}}} ({VAL} in the window, or in total for a new xid).",
            meaning="The driver reported a GPU fault (ECC, fell off the bus, MMU fault, NVLink error); see NVIDIA's XID catalog.",
            impact="The rank on that GPU may crash or hang; results may be corrupted.",
            diagnosis="dmesg | grep -i xid; nvidia-smi -q; NVIDIA's XID table for the number.",
            mitigation="Drain the node; reset the GPU; RMA on repeated hardware XIDs.",
            next_check="rank down / stalled on that node",
            inhibits=(Inhibit(("RanksightGpuSawtooth", "RanksightRankStalled"), ("node",)), gpu_rank),
        ),
        Entry(
            id="gpu-throttling", alert="RanksightGpuThrottling", kind="cause", order=0,
            title="GPU thermal or power throttling", severity="warning",
            # compat: a plain alternation, no `.` (which matches newlines in 3.x regexes)
            expr=f"{throttled_rec} == 1",
            for_=d["throttling"], threshold=0.5, unit="bool",
            indicator=throttled, op=">", scope=("node", "gpu"),
            summary="A GPU is thermally or power throttled",
            description=f"{GPU_DESC} has had a thermal or power clocks-event reason active.",
            meaning="Clocks are held down by temperature, power cap or a hardware slowdown signal.",
            impact="That GPU computes slower; its rank becomes a straggler.",
            diagnosis="nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER; check airflow, fans, power supplies.",
            mitigation="Fix cooling/power; lower the power cap consistently across GPUs; drain the node.",
            next_check="straggler ratio of the rank on that GPU",
            inhibits=(gpu_rank,),
        ),
        # ------------------------------------------------------------ the stack's own health
        Entry(
            id="exporter-down", alert="RanksightExporterDown", kind="health", order=0,
            title="ranksight agent down", severity="warning",
            expr=f"up{{job=\"{SCRAPE_JOB}\"}} == 0",
            for_=d["exporter_down"], threshold=0.5, unit="bool",
            indicator=f"up{{job=\"{SCRAPE_JOB}\"}}", op="<", scope=("instance",),
            summary="Prometheus cannot scrape a ranksight agent",
            description="instance={{ $labels.instance }} has been unreachable.",
            meaning="The node agent is not running or not reachable; the node's ranks and GPUs are unobserved.",
            impact="No triage for that node.",
            diagnosis="systemctl status / container logs of the agent; curl http://NODE:9945/healthz.",
            mitigation="Restart the agent; check the listen port and firewall.",
            next_check="the agent's log",
        ),
        Entry(
            id="collector-down", alert="RanksightCollectorDown", kind="health", order=0,
            title="ranksight collector down", severity="warning",
            # gpu and rdma report down where the hardware is absent (no NVML, no /sys/class/infiniband):
            # they alert only when they ran on this node within the last day, so a CPU or Ethernet-only
            # node does not alert forever while a driver that breaks under a running agent still does.
            expr=f"({C.COLLECTOR_UP}{{collector!~\"{HW_COLLECTORS}\"}} == 0) or "
                 f"(({C.COLLECTOR_UP}{{collector=~\"{HW_COLLECTORS}\"}} == 0) and on (node, collector) "
                 f"(max_over_time({C.COLLECTOR_UP}{{collector=~\"{HW_COLLECTORS}\"}}[1d]) == 1))",
            for_=d["collector_down"], threshold=0.5, unit="bool",
            indicator=f"{C.COLLECTOR_UP}", op="<", scope=("node", "collector"),
            summary="A ranksight collector cannot run",
            description=f"{NODE_DESC} collector={{{{ $labels.collector }}}} is down.",
            meaning="A collector failed (no NVML, a missing /proc or /sys file); its signals are missing.",
            impact="Triage lacks that signal on the node.",
            diagnosis="The agent logs one line saying why when the collector goes down.",
            mitigation="Install the driver / mount /proc and /sys into the agent's container, or disable the collector.",
            next_check="the agent's log",
        ),
        Entry(
            id="ingest-dropping", alert="RanksightIngestDropping", kind="health", order=0,
            title="ranksight ingest dropping datagrams", severity="warning",
            expr=f"{drop_ratio} > {t['ingest_drop_ratio']:g}",
            for_=d["ingest_dropping"], threshold=t["ingest_drop_ratio"], unit="ratio",
            indicator=drop_ratio, op=">", scope=("node",),
            summary="The agent drops rank datagrams",
            description=f"{NODE_DESC} drops {VAL} of received datagrams.",
            meaning="Datagrams are malformed, oversize, rejected (bad version, out-of-range fields) or over the rank cap.",
            impact="Rank metrics are incomplete.",
            diagnosis="ranksight_ingest_datagrams_total by result; a version mismatch between hooks and agent; a spoofing sender.",
            mitigation="Upgrade hooks and agent together; raise agent.max_ranks.",
            next_check="the agent's log",
        ),
    ]
    for lint, (camel, what) in LINTS.items():
        entries.append(Entry(
            id=f"lint-{lint.replace('_', '-')}", alert=f"RanksightLint{camel}", kind="lint", order=0,
            title=f"Setup lint: {lint}", severity="info",
            expr=f"{C.LINT_ACTIVE}{{lint=\"{lint}\"}} == 1",
            for_=d["lint"], threshold=0.5, unit="bool",
            indicator=f"{C.LINT_ACTIVE}{{lint=\"{lint}\"}}", op=">", scope=R,
            summary=f"Setup lint: {what}",
            description=f"{RANK_DESC}: {what}.",
            meaning=f"ranksight.watch() found a setup mistake: {what}.",
            impact="This mistake is a known cause of slow or wrong training: it wastes GPU hours or changes what the model learns.",
            diagnosis="The rank logged one warning line naming the object at fault.",
            mitigation=f"Fix the setup; this lint can be turned off with lints.{lint}: false in the config.",
            next_check="the rank's log line",
        ))
    entries = _goodput.with_goodput_inhibitions(entries + _goodput.entries(cfg))
    if base != RUNBOOK_BASE:
        entries = [_with_base(e, base) for e in entries]
    return entries


def _with_base(e: Entry, base: str) -> Entry:
    return replace(e, runbook_base=base)


def signals(cfg: Mapping[str, Any]) -> List[Entry]:
    """The triage walk: the six signals in order (entries with order 1..6)."""
    return sorted((e for e in table(cfg) if e.order), key=lambda e: e.order)


def by_alert(cfg: Mapping[str, Any]) -> Dict[str, Entry]:
    return {e.alert: e for e in table(cfg)}


def inhibit_pairs(cfg: Mapping[str, Any]) -> List[Tuple[str, str, Tuple[str, ...]]]:
    """(source alert, target alert, equal labels) for every inhibition, in table order."""
    return [(e.alert, target, inh.equal) for e in table(cfg) for inh in e.inhibits for target in inh.targets]


# ------------------------------------------------------------------ goodput and step-time regression
# (ranksight/triage_goodput.py; imported last: it builds on Entry, Recording and REC above)
from . import triage_goodput as _goodput  # noqa: E402

REC.update(_goodput.REC)
RULE_GROUPS.update(_goodput.GROUPS)
