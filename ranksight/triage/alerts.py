"""The alerts of the triage table: the six signals in order, the extra causes, the symptoms and the
stack's own health, each an Entry with its PromQL, its thresholds from the config and its
runbook prose (prose/<id>.md). ``table(cfg)`` adds the lints (lints.py) and the goodput entries
(ranksight/triage/goodput.py)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Dict, List, Mapping, Tuple

from .. import catalog as C
from . import efficiency as _efficiency
from . import goodput as _goodput
from . import memory as _memory
from . import pipeline as _pipeline
from ..config import duration_seconds
from .lints import lint_entries
from .model import (ACT_DRAIN, ACT_RECOVERY, ACT_RESTART, DESYNC_POS, GPU_DESC, HW_COLLECTORS, NODE_DESC, RANK_DESC, RUNBOOK_BASE, SCRAPE_JOB,
                    STALL_WHERE, THROTTLE_REASONS, VAL, Entry, Inhibit, with_gpu)
from .prose import prose
from .names import RANK_BY, REC, stepped_a_window

# Description templates that read records when Prometheus renders an active alert's annotations
# (every evaluation, for each pending and firing instance): only for alerts with few instances.
# RanksightStraggler: its busy time, its peers' median, and the difference: under synchronous data
# parallel that is how long each of its peers waits for it every step (in their collectives).
_BUSY = f'{REC["busy"]}{{job=%q,rank=%q}}'
_PEERS = f'{REC["busy_median"]}{{job=%q}}'


def _dur(q: str, *args: str) -> str:
    return (f'{{{{ with query (printf "{q}" {" ".join(args)}) }}}}'
            '{{ with index . 0 }}{{ humanizeDuration .Value }}{{ end }}{{ end }}')


STRAGGLER_WHY = (_dur(_BUSY, "$labels.job", "$labels.rank") + " a step against "
                 + _dur(_PEERS, "$labels.job") + ", so each of its peers waits about "
                 + _dur(f"{_BUSY} - on (job) group_left () {_PEERS}", "$labels.job", "$labels.rank", "$labels.job")
                 + " a step for it in their collectives")


# Inhibition targets. Rank-level targets are muted on the same training `job`; node-level
# ones (the GPU sawtooth) only on the same `node`: node series carry job="ranksight-agent".
COMM = ("RanksightCommBound",)
STUCK_JOB_TARGETS = ("RanksightCommBound", "RanksightStraggler", "RanksightRankBlocked")
ON_NODE = Inhibit(("RanksightGpuSawtooth",), ("node",))
# a GPU cause explains the straggler or the down rank on exactly that GPU (ranksight_rank_gpu_info)
GPU_RANK = Inhibit(("RanksightStraggler", "RanksightRankDown"), ("node", "gpu"))
RANK_SCOPE = ("job", "node", "rank")


def table(cfg: Mapping[str, Any]) -> List[Entry]:
    """Every entry in table order: the six signals, the MFU alerts (efficiency.py), the causes of a
    rank, its CUDA memory (memory.py), the pipeline stages' (pipeline.py), the hardware causes, the training loss, the stack's own health, the lints, then goodput
    and the step-time baseline."""
    base = dict(cfg.get("alerting") or {}).get("runbook_base_url") or RUNBOOK_BASE
    six = _step_signals(cfg) + _progress_signals(cfg)
    entries = (six + _efficiency.entries(cfg, six) + _rank_causes(cfg) + _memory.entries(cfg) + _pipeline.entries(cfg)
               + _hardware_causes(cfg) + _loss_signals(cfg) + _stack_health(cfg))
    entries += lint_entries(cfg)
    entries = _goodput.with_goodput_inhibitions(entries + _goodput.entries(cfg))
    if base != RUNBOOK_BASE:
        entries = [_with_base(e, base) for e in entries]
    return entries


def _step_signals(cfg: Mapping[str, Any]) -> List[Entry]:
    """Signals 1 to 4, where the step time goes: dataloader wait, the GPU waveform, the comm share,
    network retransmits."""
    t, d = cfg["thresholds"], cfg["durations"]
    rate_w = cfg["windows"]["rate"]
    settled = stepped_a_window(C.STEPS, rate_w)  # the ranks past their start-up steps
    retrans_bad = (f"({REC['retrans']} > {t['retransmit_ratio']:g}) and on (node) "
                   f"(rate({C.NET_TCP_RETRANS}[{rate_w}]) > {t['retransmit_min_rate']:g})")
    # each rank over the comm share, valued at its job's comm minimum (RanksightCommBound)
    comm_over = (f"((0 * ({REC['comm_share']} > {t['comm_share']:g})) + on (job) group_left () "
                 f"{REC['job_comm_min']})")
    return [
        # ------------------------------------------------------------ 1. dataloader wait
        Entry(
            id="dataloader-bound", alert="RanksightDataloaderBound", kind="signal", order=1,
            title="Dataloader wait per step", severity="warning",
            expr=f"{REC['data_share']} > {t['dataloader_wait_share']:g}",
            for_=d["dataloader_bound"], threshold=t["dataloader_wait_share"], unit="ratio",
            indicator=REC["data_share"], op=">", scope=RANK_SCOPE,
            summary="Rank waits on its data loader for over {:.0%} of each step".format(t["dataloader_wait_share"]),
            description=f"{RANK_DESC} spends {VAL} of its step time waiting in next() on the data loader.",
            **prose("dataloader-bound"),
            next_check="GPU utilization waveform (sawtooth) on the same node",
            # mutes the sawtooth it causes on its node, and the comm share of the ranks waiting for it;
            # data comes first in the triage order, so a straggler call in the same job waits until the
            # input pipeline keeps up (a peer's wait for the slow loader can read as busy time)
            inhibits=(ON_NODE, Inhibit(COMM + ("RanksightStraggler",), ("job",))),
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
            **prose("gpu-sawtooth"),
            next_check="communication share of step time",
        ),
        # ------------------------------------------------------------ 3. comm share
        Entry(
            id="comm-bound", alert="RanksightCommBound", kind="signal", order=3,
            title="Communication share of step time", severity="warning",
            # Label `comm`: "own" when even the job's least-waiting rank spends over the share in
            # collectives (less what its peers' data wait and checkpoints explain): the comm is the
            # job's own cost, and it stays loud beside a straggler. "waiting" otherwise: the rank
            # waits for a slower peer, and a straggler on the job mutes it.
            # The alert's value is that least-waiting share (the job's comm minimum), joined onto each
            # rank over the share: the page says which of the two it is without a query in its
            # description, which Prometheus would run for each of thousands of waiting ranks on every
            # evaluation (8,190 behind two stragglers took 5.9 s where the join takes milliseconds).
            # Both are judged once the rank has stepped for a whole rate window, as a straggler is
            # (names.stepped_a_window, read once for both labels): in its first window a rank's shares
            # are its start-up steps, where each rank waits for the others' start and even the
            # least-waiting one can read over the share; that skew is neither the job's comm cost nor
            # a wait for a straggler.
            expr=f"(label_replace({comm_over} and on (job) ({REC['job_comm_min']} > {t['comm_share']:g}), "
                 f"\"comm\", \"own\", \"\", \"\") or "
                 f"label_replace({comm_over} unless on (job) ({REC['job_comm_min']} > {t['comm_share']:g}), "
                 f"\"comm\", \"waiting\", \"\", \"\")) and on ({RANK_BY}) {settled}",
            for_=d["comm_bound"], threshold=t["comm_share"], unit="ratio", joined=("comm",),
            indicator=REC["comm_share"], op=">", scope=RANK_SCOPE,
            summary="Collectives take over {:.0%} of step time: the job is communication-bound".format(t["comm_share"]),
            description=f"{RANK_DESC} spends over {t['comm_share']:.0%} of its step time in collectives; the job's "
                        f"least-waiting rank's share is {VAL}"
                        f"{{{{ if eq $labels.comm \"own\" }}}}: the comm is the job's own cost"
                        f"{{{{ else }}}}: this rank waits for a peer{{{{ end }}}}.",
            **prose("comm-bound"),
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
            **prose("tcp-retransmits"),
            next_check="checkpoint write duration",
            # on its own node whatever the job, and job-wide through the joined training job
            inhibits=(Inhibit(COMM, ("node",)), Inhibit(COMM, ("job",))),
        ),
    ]


def _progress_signals(cfg: Mapping[str, Any]) -> List[Entry]:
    """Signals 5 and 6, whether the job keeps its progress: checkpoints, heartbeats and ranks up."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    ckpt_recent = duration_seconds(w["rate"])
    return [
        # ------------------------------------------------------------ 5. checkpoint
        Entry(
            id="checkpoint-slow", alert="RanksightCheckpointSlow", kind="signal", order=5,
            title="Checkpoint write duration", severity="warning",
            # A write still running past the limit (so it fires, and mutes the stalls, during the
            # write), or one that finished within the last rate window past the limit (the last-
            # duration gauge keeps its value until the next write, hence the recency guard), or
            # saves blocking the steps for too large a share of wall time.
            expr=f"({C.CHECKPOINT_IN_PROGRESS} > {t['checkpoint_write_seconds']:g})"
                 f" or (({C.LAST_CHECKPOINT_DURATION} > {t['checkpoint_write_seconds']:g})"
                 f" and (time() - {C.LAST_CHECKPOINT} < {ckpt_recent:g}))"
                 f" or ({REC['ckpt_share']} > {t['checkpoint_wall_share']:g})",
            for_=d["checkpoint_slow"], threshold=t["checkpoint_wall_share"], unit="ratio",
            indicator=REC["ckpt_share"], op=">", scope=RANK_SCOPE,
            summary="Checkpoint writes take over {:g} s or block the steps over {:.0%} of wall time".format(
                t["checkpoint_write_seconds"], t["checkpoint_wall_share"]),
            description=f"{RANK_DESC}: checkpoint writes take {VAL} (seconds of the current or last write, "
                        f"or share of wall time the saves blocked the steps).",
            **prose("checkpoint-slow"),
            next_check="heartbeat misses",
            # the ranks blocked while one rank writes are not hung; the utilization gap is the write
            inhibits=(Inhibit(("RanksightRankStalled", "RanksightRankBlocked", "RanksightCommBound"), ("job",)), ON_NODE),
        ),
        Entry(
            id="checkpoint-stale", alert="RanksightCheckpointStale", kind="signal", order=5,
            title="Checkpoint age", severity="warning",
            expr=f"(time() - {C.LAST_CHECKPOINT} > {t['checkpoint_max_age_seconds']:g}) and on ({RANK_BY}) ({C.RANK_UP} == 1)",
            for_=d["checkpoint_stale"], threshold=t["checkpoint_max_age_seconds"], unit="seconds",
            indicator=f"time() - {C.LAST_CHECKPOINT}", op=">", scope=RANK_SCOPE,
            summary="No checkpoint for too long: a failure now loses hours",
            description=f"{RANK_DESC} last checkpointed {VAL} seconds ago.",
            **prose("checkpoint-stale"),
            next_check="heartbeat misses",
        ),
        # ------------------------------------------------------------ 6. heartbeats
        Entry(
            id="heartbeat-missed", alert="RanksightHeartbeatMissed", kind="signal", order=6,
            title="Heartbeat misses", severity="warning",
            expr=f"increase({C.HEARTBEAT_MISSES}[{w['heartbeat']}]) >= {t['heartbeat_misses']:g}",
            for_=d["heartbeat_missed"], threshold=t["heartbeat_misses"], unit="count",
            indicator=f"increase({C.HEARTBEAT_MISSES}[{w['heartbeat']}])", op=">", scope=RANK_SCOPE,
            summary="A rank missed heartbeats: it may be dying or its host is overloaded",
            description=f"{RANK_DESC} missed {VAL} heartbeats in {w['heartbeat']}.",
            **prose("heartbeat-missed"),
            next_check="rank stalled / rank down",
            inhibits=(Inhibit(STUCK_JOB_TARGETS, ("job",)), ON_NODE),
        ),
        Entry(
            id="rank-down", alert="RanksightRankDown", kind="signal", order=6,
            title="Rank down", severity="critical",
            expr=with_gpu(f"{C.RANK_UP} == 0"),
            for_=d["rank_down"], threshold=0.5, unit="bool", joined=("gpu",),
            indicator=f"{C.RANK_UP}", op="<", scope=RANK_SCOPE,
            summary="A rank stopped heartbeating: the job is stuck in its next collective",
            description=f"{RANK_DESC} has missed several heartbeats in a row and is considered down.",
            **prose("rank-down"),
            next_check="XID errors and host logs on the node", action=ACT_RECOVERY,
            # a down rank's own missed heartbeats say nothing more
            inhibits=(Inhibit(STUCK_JOB_TARGETS, ("job",)), Inhibit(("RanksightHeartbeatMissed",), ("job", "rank")), ON_NODE),
        ),
    ]


def _rank_causes(cfg: Mapping[str, Any]) -> List[Entry]:
    """The extra causes a rank's own series name: a hang, a blocked collective, a desync, a straggler,
    allocator fragmentation."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    settled = stepped_a_window(C.STEPS, w["rate"])  # the ranks past their start-up steps
    retries = REC["alloc_retries"]
    # distinct (op, sequence number) positions per group: count_values turns the number into a label
    desync = f"count by (job, pg) (count_values by (job, pg, op) (\"seq\", {C.RANK_COLLECTIVE_SEQ}))"
    return [
        Entry(
            id="rank-stalled", alert="RanksightRankStalled", kind="cause", order=0,
            title="Rank stalled (hang)", severity="critical",
            expr=f"{C.RANK_STALLED}{{reason=\"no_progress\"}} == 1",
            for_=d["rank_stalled"], threshold=0.5, unit="bool",
            indicator=f"{C.RANK_STALLED}{{reason=\"no_progress\"}}", op=">", scope=RANK_SCOPE,
            summary="A rank is alive but makes no progress, outside any collective: it is the hang's culprit",
            description=f"{RANK_DESC} heartbeats but has not finished a step for longer than its stall limit, and it is "
                        f"not waiting in a collective{STALL_WHERE}.",
            **prose("rank-stalled"),
            next_check="the stack on the node agent's /api/v1/ranks", action=ACT_RESTART,
            inhibits=(Inhibit(STUCK_JOB_TARGETS, ("job",)), ON_NODE),
        ),
        Entry(
            id="rank-blocked", alert="RanksightRankBlocked", kind="symptom", order=0,
            title="Rank blocked in a collective", severity="warning",
            expr=f"{C.RANK_STALLED}{{reason=\"waiting_in_collective\"}} == 1",
            for_=d["rank_stalled"], threshold=0.5, unit="bool",
            indicator=f"{C.RANK_STALLED}{{reason=\"waiting_in_collective\"}}", op=">", scope=RANK_SCOPE,
            summary="A rank is blocked in a collective, waiting on a peer",
            description=f"{RANK_DESC} has been inside a collective for longer than its stall limit; it waits for a peer.",
            **prose("rank-blocked"),
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
            **prose("collective-desync"),
            next_check="the stacks of the ranks at the odd position",
            inhibits=(Inhibit(STUCK_JOB_TARGETS, ("job",)),),
        ),
        Entry(
            id="straggler", alert="RanksightStraggler", kind="cause", order=0,
            title="Straggler rank", severity="warning",
            # A rank whose busy time per step is over the ratio times its peers' median (the job
            # median without its slowest rank), and whose extra busy time is a real part of the
            # step: on a short, communication-heavy step a 2 ms difference in 10 ms of busy time
            # reads 1.2x while nobody waits for anyone. Under synchronous data parallel its peers
            # wait that extra time in their collectives. The label comm="waiting" makes it mute
            # exactly their waiting comm share (RanksightCommBound with comm="waiting"): a job that
            # is communication-bound by itself keeps that page beside the straggler's.
            # Judged only while the job steps: once a rank of the job is stalled (hung, or blocked
            # on a peer that writes a checkpoint) no rank completes steps, and the rates hold the
            # steps from before the stall for a whole rate window, a stale ratio that the stall's
            # own alerts explain.
            # Not judged on a pipeline stage (RanksightPipelineStraggler judges stages): its peers
            # are other stages, which differ by design, and its exposed comm is its P2P waits.
            # Judged once the rank has stepped for a whole rate window (names.stepped_a_window).
            expr=with_gpu(f"label_replace((({REC['straggler']} > {t['straggler_ratio']:g}) and on ({RANK_BY}) "
                          f"(({REC['busy']} - on (job) group_left () {REC['busy_median']}) / ({REC['step_mean']} > 0)"
                          f" > {t['straggler_min_step_share']:g}) and on ({RANK_BY}) {settled})"
                          f" unless on (job) ({C.RANK_STALLED} == 1) "
                          f"unless on ({RANK_BY}) ({C.PIPELINE_STAGES} > 1), "
                          f"\"comm\", \"waiting\", \"\", \"\")"),
            for_=d["straggler"], threshold=t["straggler_ratio"], unit="ratio", joined=("gpu", "comm"),
            indicator=REC["straggler"], op=">", scope=RANK_SCOPE,
            summary="One rank computes over {:.0%} slower than its peers: every other rank waits for it".format(
                t["straggler_ratio"] - 1),
            description=f"{RANK_DESC} busy time per step (step minus data wait, exposed comm and checkpoint) is "
                        f"{VAL}x its peers' median: {STRAGGLER_WHY}.",
            **prose("straggler"),
            next_check="the rank's node: GPU throttling and PCIe link, or CPU load and NUMA binding",
            # the rest of the job waits for it in its collectives
            inhibits=(Inhibit(COMM, ("job", "comm")),),
        ),
        Entry(
            id="cuda-alloc-retries", alert="RanksightCudaAllocRetries", kind="cause", order=0,
            title="CUDA allocator retries (fragmentation)", severity="warning",
            # frequent retries, or any retries while the step time crept up against `creep_offset` ago
            expr=f"({retries} > {t['alloc_retries_per_min']:g}) or (({retries} > 0) and on ({RANK_BY}) "
                 f"({REC['step_mean']} / ({REC['step_mean']} offset {w['creep_offset']}) > {t['step_creep_ratio']:g}))",
            for_=d["alloc_retries"], threshold=t["alloc_retries_per_min"], unit="per_minute",
            indicator=retries, op=">", scope=RANK_SCOPE,
            summary="CUDA allocator keeps flushing its cache and retrying: memory is fragmented",
            description=f"{RANK_DESC} has {VAL} allocator retries per minute.",
            **prose("cuda-alloc-retries"),
            next_check="step-time creep on the per-rank dashboard",
        ),
    ]


def _hardware_causes(cfg: Mapping[str, Any]) -> List[Entry]:
    """The extra causes a node's hardware names: NIC speed, a filling disk, PCIe, XID errors, throttling."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    rate_w = w["rate"]
    # NIC speed: a node's training job (one per node; a NIC serves every job of its node), the
    # speed of each NIC with that job, the NIC below its own day's best or its job's best for that
    # device name, and the NICs that carry at least nic_min_traffic_share of their node's bytes.
    node_job = f"topk by (node) (1, group by (node, job) ({C.RANK_UP}))"
    speed_job = f"({C.NET_IF_SPEED} * on (node) group_left (job) {node_job})"
    nic_peer_low = f"{speed_job} < on (job, device) group_left () max by (job, device) ({speed_job})"
    nic_self_low = f"{C.NET_IF_SPEED} < on (node, device) group_left () max by (node, device) ({REC['nic_best_1d']})"
    nic_bytes = f"sum by (node, device) (rate({C.NET_IF_BYTES}[{rate_w}]))"
    nic_busy = (f"{nic_bytes} / on (node) group_left () (sum by (node) ({nic_bytes}) > 0)"
                f" >= {t['nic_min_traffic_share']:g}")
    # An xid series that appeared within the window, on an agent Prometheus already scraped then
    # (so a fresh Prometheus, or a first scrape, does not report an agent's old errors as new).
    xid_new = (f"((({C.GPU_XID_ERRORS} > 0) unless ({C.GPU_XID_ERRORS} offset {rate_w}))"
               f" and on (instance) (up{{job=\"{SCRAPE_JOB}\"}} offset {rate_w}))")
    throttled = f"max by (node, gpu) ({C.GPU_CLOCKS_EVENT}{{reason=~\"{'|'.join(THROTTLE_REASONS)}\"}})"
    # the alert reads the node group's record of the active reasons (a few series) instead of every
    # GPU's nine reason series; the value the triage reads stays the raw one (0 or 1 for every GPU)
    throttled_rec = f"max by (node, gpu) ({REC['throttled']}{{reason=~\"{'|'.join(THROTTLE_REASONS)}\"}})"
    return [
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
            **prose("nic-speed-low"),
            next_check="network retransmits and comm share", action=ACT_DRAIN,
            inhibits=(Inhibit(COMM, ("node",)),),
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
            **prose("disk-filling"),
            next_check="checkpoint failures", action=ACT_DRAIN,
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
            **prose("gpu-pcie-degraded"),
            next_check="straggler ratio of the ranks on that node",
            inhibits=(GPU_RANK,),
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
            **prose("gpu-xid"),
            next_check="rank down / stalled on that node", action=ACT_DRAIN,
            inhibits=(Inhibit(("RanksightGpuSawtooth", "RanksightRankStalled"), ("node",)), GPU_RANK),
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
            **prose("gpu-throttling"),
            next_check="straggler ratio of the rank on that GPU",
            inhibits=(GPU_RANK,),
        ),
        Entry(
            id="version-skew", alert="RanksightVersionSkew", kind="cause", order=0,
            title="Mixed torch, CUDA, NCCL or driver versions in one job", severity="warning",
            # The distinct builds a job's ranks report in their hello (torch, CUDA runtime, NCCL), and
            # the distinct drivers of the GPUs its ranks run on (the rank's GPU joined to the node's
            # gpu_info). One of either is a uniform job; collectives across mixed NCCL builds or
            # drivers can hang or crawl.
            expr=f"label_replace({VERSIONS} > 1, \"component\", \"torch, CUDA or NCCL\", \"\", \"\") or "
                 f"label_replace({DRIVERS} > 1, \"component\", \"GPU driver\", \"\", \"\")",
            for_=d["version_skew"], threshold=1, unit="count",
            indicator=f"max by (job) (label_replace({VERSIONS}, \"c\", \"builds\", \"\", \"\") or "
                      f"label_replace({DRIVERS}, \"c\", \"drivers\", \"\", \"\"))",
            op=">", scope=("job",),
            summary="The ranks of one job run different torch, CUDA, NCCL or GPU driver versions",
            description=f"job={{{{ $labels.job }}}}: its ranks report {VAL} different {{{{ $labels.component }}}} "
                        "versions (ranksight_rank_versions_info, ranksight_gpu_info by rank).",
            **prose("version-skew"),
            next_check="the images and driver versions of the job's nodes",
        ),
    ]


# RanksightVersionSkew: the distinct (torch, CUDA, NCCL) builds of a job's ranks, and the distinct
# drivers of its ranks' GPUs
VERSIONS = f"count by (job) (count by (job, torch, cuda, nccl) ({C.RANK_VERSIONS}))"
DRIVERS = (f"count by (job) (count by (job, driver) ({C.RANK_GPU_INFO} * on (node, gpu) group_left (driver) "
           f"max by (node, gpu, driver) ({C.GPU_INFO})))")


# RanksightLossDivergence: each rank's recent mean loss, read when an alert of the job is active
LOSS_BY_RANK = (f'{{{{ range $i, $s := query (printf "{REC["loss_short"]}{{job=%q}}" $labels.job) | sortByLabel "rank" }}}}'
                '{{ if $i }}, {{ end }}rank {{ $s.Labels.rank }} {{ printf "%.3g" $s.Value }}{{ end }}')


def _loss_signals(cfg: Mapping[str, Any]) -> List[Entry]:
    """The training loss (``ranksight.loss``): a NaN or infinity on a rank, a rank's loss jumping
    against its own recent past, and ranks of one job whose losses disagree."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    first = str(C.LOSS_FIRST_NONFINITE_STEP)
    return [
        Entry(
            id="loss-nonfinite", alert="RanksightLossNonFinite", kind="cause", order=0,
            title="Non-finite training loss", severity="critical",
            # the gauge is the step of the rank's first NaN or infinite loss in this process (0: none)
            expr=f"{first} > 0",
            for_=d["loss_nonfinite"], threshold=0, unit="count",
            indicator=first, op=">", scope=RANK_SCOPE,
            summary="A rank's training loss is NaN or infinite",
            description=f"{RANK_DESC} recorded a NaN or infinite training loss, first at step "
                        '{{ printf "%.0f" $value }}.',
            **prose("loss-nonfinite"),
            next_check="the inputs and the learning rate at that step; the last checkpoint before it",
            inhibits=(Inhibit(("RanksightLossSpike", "RanksightLossDivergence"), ("job",)),),
        ),
        Entry(
            id="loss-spike", alert="RanksightLossSpike", kind="cause", order=0,
            title="Training loss spike", severity="warning",
            # Window means, not single steps: one outlier batch among the hundreds of steps of the
            # short window moves its mean little, so a sustained doubling of the mean is already a
            # real jump (a per-step check such as 10x the max of the last 100 steps needs a far
            # higher ratio because it compares single values). A decreasing loss reads below 1.
            expr=f"{REC['loss_spike']} > {t['loss_spike_ratio']:g}",
            for_=d["loss_spike"], threshold=t["loss_spike_ratio"], unit="ratio",
            indicator=REC["loss_spike"], op=">", scope=RANK_SCOPE,
            summary="A rank's training loss jumped above its recent mean",
            description=f"{RANK_DESC}: its mean training loss over the last {w['loss_short']} is {VAL}x its mean "
                        f"over the {w['loss_long']} before.",
            **prose("loss-spike"),
            next_check="the learning-rate schedule and the data at the jump; the gradient norm",
        ),
        Entry(
            id="loss-divergence", alert="RanksightLossDivergence", kind="cause", order=0,
            title="Ranks disagree on the training loss", severity="warning",
            # highest / lowest rank mean over the short window: data shards of one distribution give
            # means within a few percent of each other over hundreds of steps
            expr=f"{REC['loss_spread']} > {t['loss_divergence_ratio']:g}",
            for_=d["loss_divergence"], threshold=t["loss_divergence_ratio"], unit="ratio",
            indicator=REC["loss_spread"], op=">", scope=("job",),
            summary="The ranks of a job report different training losses",
            description=f"job={{{{ $labels.job }}}}: the highest rank mean training loss over the last "
                        f"{w['loss_short']} is {VAL}x the lowest ({LOSS_BY_RANK}).",
            **prose("loss-divergence"),
            next_check="whether every rank holds the same weights (the rank_disagreement lint) and its own shard",
        ),
        Entry(
            id="loss-jump-after-resume", alert="RanksightLossJumpAfterResume", kind="cause", order=0,
            title="Training loss jump after a resume", severity="warning",
            # the rank's mean since its checkpoint restore over its mean before the restart
            # (records.py, _resume_judgement); judged for windows.loss_resume after the restore
            expr=f"{REC['loss_resume_jump']} > {t['loss_resume_jump_ratio']:g}",
            for_=d["loss_resume_jump"], threshold=t["loss_resume_jump_ratio"], unit="ratio",
            indicator=REC["loss_resume_jump"], op=">", scope=RANK_SCOPE,
            summary="A rank's training loss jumped after it resumed from a checkpoint",
            description=f"{RANK_DESC}: its mean training loss since it restored a checkpoint is {VAL}x its mean "
                        f"over the last {w['loss_short']} before the restart.",
            **prose("loss-jump-after-resume"),
            next_check="the rank's partial_resume lint line: optimizer, LR scheduler, sampler epoch, RNG, step",
            # the jump is the resume's: the spike alert on the same rank is its symptom
            inhibits=(Inhibit(("RanksightLossSpike",), ("job", "rank")),),
        ),
    ]


def _stack_health(cfg: Mapping[str, Any]) -> List[Entry]:
    """The monitoring's own health: an agent Prometheus cannot scrape, a collector down, dropped datagrams."""
    t, d = cfg["thresholds"], cfg["durations"]
    drop_ratio = (f"sum by (node) ({REC['ingest']}{{result!=\"ok\"}}) / "
                  f"(sum by (node) ({REC['ingest']}) > 0)")
    return [
        Entry(
            id="exporter-down", alert="RanksightExporterDown", kind="health", order=0,
            title="ranksight agent down", severity="warning",
            expr=f"up{{job=\"{SCRAPE_JOB}\"}} == 0",
            for_=d["exporter_down"], threshold=0.5, unit="bool",
            indicator=f"up{{job=\"{SCRAPE_JOB}\"}}", op="<", scope=("instance",),
            summary="Prometheus cannot scrape a ranksight agent",
            description="instance={{ $labels.instance }} has been unreachable.",
            **prose("exporter-down"),
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
            **prose("collector-down"),
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
            **prose("ingest-dropping"),
            next_check="the agent's log",
        ),
    ]


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
