"""The triage table's types and shared constants: an entry (one alert and its runbook), a recording
rule, an inhibition; the scrape job, the runbook location, label-value sets the table and the
agent share, the description templates and the alert groups."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from .. import catalog as C

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

# Alert groups, by where an alert's series live (a functional shard evaluates each where its series
# are: docs/SCALING.md). Prometheus evaluates groups concurrently, the rules of a group one after the
# other. `waiting` holds the symptoms whose instances grow with the ranks that wait: every rank of a
# job behind one straggler is one RanksightCommBound instance, each costing its label and annotation
# templates on every evaluation (bench/scale/alert_cost.py), so they evaluate beside the causes.
ALERT_GROUPS: Tuple[str, ...] = ("ranksight.alerts.rank", "ranksight.alerts.waiting", "ranksight.alerts.node",
                                 "ranksight.alerts.gpu", "ranksight.alerts.job", "ranksight.alerts.efficiency",
                                 "ranksight.alerts.loss")
EFFICIENCY_ALERTS: Tuple[str, ...] = ("RanksightMfuLow", "RanksightMfuDrop")  # the efficiency group's
WAITING_SYMPTOMS: Tuple[str, ...] = ("RanksightCommBound", "RanksightRankBlocked")
# the training loss's alerts (ranksight.loss): a model problem, not a performance one, in a group of their own
LOSS_ALERTS: Tuple[str, ...] = ("RanksightLossNonFinite", "RanksightLossSpike", "RanksightLossDivergence")
# RDMA traffic counters (everything else the agent exposes for a port is an error or congestion count)
RDMA_TRAFFIC = "port_(rcv|xmit)_(packets|data)|(unicast|multicast)_(rcv|xmit)_packets"
# Clocks-event reasons the throttling panel shows (the alert ignores sw_power_cap, see THROTTLE_REASONS)
THROTTLE_SHOWN = ("sw_power_cap",) + THROTTLE_REASONS
# What `ranksight act` does on an entry's verdict (Entry.action; ranksight/tools/act.py carries them out):
# page only; end the job's workers on the culprit's node so the elastic launcher restarts them from the
# last checkpoint; drain the node in the job's engine (Slurm, Kubernetes); record a launcher's own recovery.
ACT_PAGE, ACT_RESTART, ACT_DRAIN, ACT_RECOVERY = "page", "restart_workers", "drain_node", "record_recovery"
ACTIONS: Tuple[str, ...] = (ACT_PAGE, ACT_RESTART, ACT_DRAIN, ACT_RECOVERY)


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
    # Labels the alert carries beyond scope: taken from the rank series of its node (the training
    # `job` of the ranks on a node, for a node cause that must mute symptoms job-wide; the rank's
    # `gpu`), or set by its expression (`comm`: own or waiting). The indicator keeps the plain scope
    # labels.
    joined: Tuple[str, ...] = ()
    action: str = ACT_PAGE  # what `ranksight act` does on this verdict (ACTIONS)

    @property
    def runbook(self) -> str:
        return f"{self.runbook_base.rstrip('/')}/{self.id}.md"

    @property
    def group(self) -> str:
        """The alert group (ALERT_GROUPS) the alert evaluates in."""
        rank_g, waiting_g, node_g, gpu_g, job_g, efficiency_g, loss_g = ALERT_GROUPS
        if self.alert in EFFICIENCY_ALERTS:
            return efficiency_g
        if self.alert in LOSS_ALERTS:
            return loss_g
        if self.alert in WAITING_SYMPTOMS:
            return waiting_g
        if "rank" in self.scope:
            return rank_g
        if "job" in self.scope:
            return job_g
        return gpu_g if "gpu" in self.scope else node_g

    @property
    def rank_level(self) -> bool:
        """True when the alert carries the training job's label: rank level (job, node, rank), or job
        level (records aggregated by job from rank series)."""
        return "rank" in self.scope or "job" in self.scope


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
