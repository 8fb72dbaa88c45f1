"""The recording rules of the triage table: their expressions (``recording_rules(cfg)``), group by
group; their names (REC) and groups (RULE_GROUPS) are in names.py."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, List, Mapping, Optional, Tuple

from .. import catalog as C
from ..config import duration_seconds
from ..record import FIELDS
from . import efficiency as _efficiency
from . import goodput as _goodput
from . import memory as _memory
from . import pipeline as _pipeline
from .model import RDMA_TRAFFIC, THROTTLE_SHOWN, Recording
from .names import GROUP_INPUTS, RANK_BY, REC, RULE_GROUPS  # noqa: F401 (public here)

def recording_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    """Every recording rule, group by group (RULE_GROUPS order), in evaluation order within a group.

    Each raw per-rank counter is read once per evaluation (its rate is recorded: `dur`, ...);
    the shares, the busy time and the job aggregates are arithmetic on those records. At 8,192
    ranks that halves the rank group's cost against reading `rate(step_seconds_total)` five times
    (bench/RESULTS.md, "Scale"). Fleet panels read node- and job-level records instead of
    thousands of raw series."""
    w = cfg["windows"]["rate"]
    RATES, RANK, JOB, STATE, NODE, RANK_GPU, EFF, HIST, NODEC, SAMPLES, RDMA, NIC, RESUME = list(RULE_GROUPS)[:13]
    rates, rank = _rank_rules(w)
    job = _job_rules()
    state = _rank_state_rules(cfg)
    node, rank_gpu = _node_rules(w)
    hist, node_counters, samples, rdma, nic = _slow_rules(cfg)
    chain, job_state = _goodput.rank_group_rules(cfg)
    job += chain
    state += job_state
    out: List[Recording] = []
    for group, rules in ((RATES, rates), (RANK, rank), (JOB, job), (STATE, state), (NODE, node),
                         (RANK_GPU, rank_gpu), (EFF, _efficiency.recording_rules(_R) + _efficiency.run_rules(_R, cfg)), (HIST, hist),
                         (NODEC, node_counters), (SAMPLES, samples), (RDMA, rdma), (NIC, nic),
                         (RESUME, _resume_judgement(cfg))):
        out += [replace(r, group=group) for r in rules]
    return out + _goodput.goodput_rules(cfg) + _goodput.baseline_rules(cfg)


def _rate(m: Any, window: str) -> str:
    return f"rate({m}[{window}])"


def _window_increase_rate(m: Any, window: str) -> str:
    """The counter's increase over the window per second, from its values at both ends: a bursty
    counter (a checkpoint adds its whole duration in one scrape) reads the same on every engine,
    where ``rate`` differs by the burst when it falls between the window's first sample and the
    sample before it (Prometheus extrapolates from the samples inside the window, VictoriaMetrics
    starts at the sample before it). ``rate`` where the counter is younger than the window or was
    reset in it."""
    seconds = f"{duration_seconds(window):g}"
    return f"(({m} - {m} offset {window}) >= 0) / {seconds} or {_rate(m, window)}"


# the rank rates group's records of the raw step counters, in the group's order: the steps and the
# sums of the step-record fields the shares and the busy time read
_R = {k: REC[k] for k in ("dur", "steps", "data", "comm", "xcomm", "ckpt", "samples", "tokens")}
_FIELD = {f.key: f for f in FIELDS}


def _or_zero(rec: str) -> str:
    # A rank that never checkpointed (or has no exposed comm yet) must still get a busy time:
    # an absent counter counts as 0, with the rank's own labels (those of step_seconds_total).
    return f"({rec} or 0 * {_R['dur']})"


def _share(key: str) -> str:
    return f"{_R[key]} / ({_R['dur']} > 0)"


def _job_share(key: str) -> str:
    return f"sum by (job) ({_R[key]}) / (sum by (job) ({_R['dur']}) > 0)"


def _rank_rules(w: str) -> Tuple[List[Recording], List[Recording]]:
    """The rank rates group (each raw step counter's rate) and the rank group (shares, busy time and
    the straggler ratio, arithmetic on those rates)."""
    busy = REC["busy"]
    # a step-record field's sum (its metric in the declaration) is rated under the field's key
    rates = [Recording(_R[k], _rate(C.STEPS if k == "steps" else _FIELD[k].metric, w)) for k in _R]
    rank = [
        Recording(REC["data_share"], _share("data")),
        Recording(REC["comm_share"], _share("comm")),
        Recording(REC["xcomm_share"], _share("xcomm")),
        Recording(REC["step_mean"], f"{_R['dur']} / ({_R['steps']} > 0)"),
        # Busy time per step: the step minus the time the rank only waited (data, exposed comm,
        # checkpoint). Under synchronous data parallel all step times are equal, so the step itself
        # never blames a rank; the fast ranks show the straggler's extra work as exposed comm.
        Recording(
            busy,
            f"clamp_min({_R['dur']} - {_or_zero(_R['data'])} - {_or_zero(_R['xcomm'])}"
            f" - {_or_zero(_R['ckpt'])}, 0) / ({_R['steps']} > 0)",
        ),
        # The reference a rank is judged against: the median busy time of its peers. A median that
        # holds the straggler itself is diluted by it (of two ranks, the median is their mean: a rank
        # 1.25x slower than its peer would read 1.11x). The median of the ranks other than the
        # slowest is, for every rank in the upper half (the only ones that can be stragglers), the
        # median of that rank's peers, exactly, for 2 ranks or 2,000 (removing any one value above
        # the median leaves the same median): the faster rank of a pair, the middle of three.
        Recording(
            REC["busy_median"],
            f"quantile by (job) (0.5, {busy} unless topk by (job) (1, {busy}))",
        ),
        Recording(REC["straggler"], f"{busy} / on (job) group_left () ({REC['busy_median']} > 0)"),
    ]
    return rates, rank


def _job_rules() -> List[Recording]:
    """The job group: the job's steps and shares, aggregates of the rank rates."""
    job = [
        Recording(REC["job_steps"], f"avg by (job) ({_R['steps']})"),
        Recording(REC["job_data_share"], _job_share("data")),
        Recording(REC["job_comm_share"], _job_share("comm")),
        # The job's own communication cost: the comm share of its least-waiting rank (the last to arrive
        # at a collective waits for nobody: its collectives take only their transfer), less the largest
        # share any rank spends in its data loader or writing a checkpoint (its peers wait for that in
        # their collectives, the last to arrive included). A straggler explains only comm above it.
        Recording(REC["job_comm_min"],
                  f"clamp_min(min by (job) ({_share('comm')}) - on (job) "
                  f"max by (job) (({_or_zero(_R['data'])} + {_or_zero(_R['ckpt'])}) / ({_R['dur']} > 0)), 0)"),
        Recording(REC["job_xcomm_share"], _job_share("xcomm")),
    ]
    return job


def _rank_state_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    """The rank state group: records that read their own raw series and nothing else of the chain."""
    w = cfg["windows"]["rate"]
    ckpt_w = cfg["windows"].get("checkpoint_share", w)
    # Checkpoint seconds per wall second = the share of wall time saves blocked the steps (an async
    # save's background write is not in it), over a window longer than the checkpoint interval
    # (1 h): over the 5 min rate window, every blocking write longer than 15 s would read as a 5% share.
    state = [
        Recording(REC["ckpt_share"], _window_increase_rate(C.CHECKPOINT_SECONDS, ckpt_w)),
        # The job loses the largest rank's checkpoint share: the other ranks wait for it in their
        # next collective (rank-0-only saves), so the mean would understate it by the world size.
        Recording(REC["job_ckpt_share"], f"max by (job) ({REC['ckpt_share']})"),
        Recording(REC["b2o"], f"{_rate(C.BACKWARD_TO_OPTIMIZER.sum, w)} / ({_rate(C.BACKWARD_TO_OPTIMIZER.count, w)} > 0)"),
        # an event counter (one retry at a time): the same on every engine, as the checkpoint share
        Recording(REC["alloc_retries"], f"({_window_increase_rate(C.CUDA_ALLOC_RETRIES, w)}) * 60"),
        Recording(REC["ckpt_age"], f"time() - {C.LAST_CHECKPOINT}"),
        Recording(REC["ckpt_age_median"], f"quantile by (job) (0.5, {REC['ckpt_age']})"),
        Recording(REC["ranks_up"], f"sum by (job) ({C.RANK_UP})"),
        Recording(REC["ranks"], f"count by (job) ({C.RANK_UP})"),
    ]
    return state + _memory.recording_rules() + _loss_rules(cfg) + _pipeline.recording_rules(cfg)


def _loss_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    """The training loss (ranksight.loss): a rank's mean loss is its loss sum's rate over its
    readings' rate. The spike compares the short window with the long window just before it
    (``offset``), so that the spike itself is not in its reference."""
    short, long = cfg["windows"]["loss_short"], cfg["windows"]["loss_long"]
    before = f"[{long}] offset {short}"
    full = f"({REC['loss_short']} and on ({RANK_BY}) ({C.LOSS_READINGS} offset {short}))"
    return [
        Recording(REC["loss_short"], f"{_rate(C.LOSS_SUM, short)} / ({_rate(C.LOSS_READINGS, short)} > 0)"),
        Recording(REC["loss_before"], f"rate({C.LOSS_SUM}{before}) / (rate({C.LOSS_READINGS}{before}) > 0)"),
        Recording(REC["loss_spike"], f"{REC['loss_short']} / ({REC['loss_before']} > 0)"),
        # only ranks whose loss series already existed a window ago: every rank's mean is then over the
        # same span of time. A rank whose series began inside the window has its mean over a shorter,
        # later span, and early in a run, while the loss falls fast, that alone reads as a spread
        Recording(REC["loss_spread"], f"max by (job) ({full}) / (min by (job) ({full}) > 0)"),
    ] + _resume_state(cfg)


# how far back a held record reads its own last value: a few evaluation intervals, so that a late
# or skipped evaluation, or a store that shows the ruler's writes a little late, keeps the value
HELD_READ = "5m"


def recent_resume(cfg: Mapping[str, Any]) -> str:
    """The ranks whose process restored a checkpoint within ``windows.loss_resume``."""
    hold = duration_seconds(cfg["windows"]["loss_resume"])
    return f"(time() - {C.LAST_RESUME} < {hold:g})"  # a rank without a restore reports 0: never recent


def _resume_state(cfg: Mapping[str, Any]) -> List[Recording]:
    """The loss after a checkpoint restore against the loss before the restart: the steady loss the
    judgement (``_resume_judgement``, a group of its own) compares with. The process before the
    restart is gone, but its loss series go on under the same labels in the store, and the new
    process's hooks report the restore (``ranksight_last_resume_timestamp_seconds``, with its first
    step record). "Before": the rank's short-window mean, recorded as ``loss_steady`` only while no
    restore is recent; ``loss_last_steady`` holds its last value (the mean of the last steps before
    the restart: the restore stops the steady series at the evaluation its marker arrives).

    A rank that comes back on the same node within the agent's ``rank_ttl_seconds`` continues its
    counters there (the agent carries them across processes), so the series' sum over readings
    would be the mean of the whole run. The loss sum and readings of the last evaluation without a
    recent restore are therefore held too (``loss_steady_sum``, ``loss_steady_readings``, per node),
    for the judgement to subtract.

    Held, not looked up: each held record is its current value or, without one, its own previous
    value (its last sample within ``HELD_READ``), kept while ``loss_steady_seen`` (the time of the
    rank's last evaluation with a steady mean, itself held) is within
    ``windows.loss_resume_lookback``: matched on every label, so a series whose labels changed (a
    new ``instance``) is forgotten on time even while its successor is seen. An evaluation reads ``HELD_READ`` of each held record, about 20
    samples a rank at a 15 s interval; a ``last_over_time`` over the whole lookback read 720 over 3 h,
    three times an evaluation. The held values live only in the store's recent samples: a ruler
    stopped for longer than ``HELD_READ`` loses them, and a rank restored before its steady series
    are seen again then has no "before"."""
    steady = f"unless on (job, rank) {recent_resume(cfg)}"
    seen = REC["loss_steady_seen"]
    lookback = duration_seconds(cfg["windows"]["loss_resume_lookback"])

    def last(record: str) -> str:  # a held record's own value from an earlier evaluation
        return f"last_over_time({record}[{HELD_READ}])"

    def held(record: str, current: str) -> Recording:  # the current value, else its own last one
        return Recording(REC[record], f"{current} or ({last(REC[record])} and {seen})")

    return [
        Recording(REC["loss_steady"], f"{REC['loss_short']} {steady}"),
        Recording(seen, f"(time() + 0 * {REC['loss_steady']}) or ({last(seen)} > time() - {lookback:g})"),
        held("loss_last_steady", REC["loss_steady"]),
        held("loss_steady_sum", f"({C.LOSS_SUM} {steady})"),
        held("loss_steady_readings", f"({C.LOSS_READINGS} {steady})"),
    ]


def _resume_judgement(cfg: Mapping[str, Any]) -> List[Recording]:
    """The loss since a restore against the steady loss before it (``_resume_state``, read from
    rank_state's latest evaluation). Before and after are matched on (job, rank): a restarted rank
    may come back on another node.

    "After": the mean of every step since the restore, sum over readings: the counters less their
    held steady values on the rank's node. Where the node has no such values (the rank came back on
    another node, whose series start from 0) or the counters are below them (the agent forgot the
    rank or restarted: its counters start from 0 too), the series' own counters are the steps since;
    a new process that, within ``windows.loss_resume``, passes the readings its forgotten predecessor
    made is judged on the difference. ``loss_resume_min_readings`` applies to the readings since the
    restore."""
    recent = recent_resume(cfg)
    least = f"{cfg['thresholds']['loss_resume_min_readings']:g}"
    node = "on (job, node, rank) group_left ()"

    def base(record: str) -> str:  # a steady counter's last value on the rank's node
        return f"max by (job, node, rank) ({REC[record]})"

    since_base = (f"(({C.LOSS_SUM} - {node} {base('loss_steady_sum')}) / "
                  f"(({C.LOSS_READINGS} - {node} {base('loss_steady_readings')}) >= {least}))")
    own = (f"(({C.LOSS_SUM} / ({C.LOSS_READINGS} >= {least})) unless on (job, node, rank) "
           f"({C.LOSS_READINGS} >= {node} {base('loss_steady_readings')}))")
    return [
        Recording(REC["loss_pre_resume"],
                  f"max by (job, rank) ({REC['loss_last_steady']}) and on (job, rank) {recent}"),
        Recording(REC["loss_post_resume"], f"({since_base} or {own}) and {recent}"),
        Recording(REC["loss_resume_jump"],
                  f"{REC['loss_post_resume']} / on (job, rank) group_left () ({REC['loss_pre_resume']} > 0)"),
    ]


def _node_rules(w: str) -> Tuple[List[Recording], List[Recording]]:
    """The node group (retransmits, GPU utilization and swings, ingest, disk, throttling) and the rank
    GPU group (each rank's GPU series with the rank's labels)."""
    node = [
        Recording(REC["retrans"], f"{_rate(C.NET_TCP_RETRANS, w)} / ({_rate(C.NET_TCP_SENT, w)} > 0)"),
        Recording(REC["gpu_util"], _rate(C.GPU_BUSY_SECONDS, w)),
        Recording(REC["gpu_swings"], f"{_rate(C.GPU_SWINGS, w)} * 60"),
        Recording(REC["node_gpu_util"], f"avg by (node) ({REC['gpu_util']})"),
        Recording(REC["ingest"], f"sum by (node, result) ({_rate(C.INGEST_DATAGRAMS, w)})"),
        Recording(REC["disk_free"], f"{C.DISK_FREE} / ({C.DISK_TOTAL} > 0)"),
        # filter before aggregating: only the reasons that are active become series
        Recording(REC["throttled"],
                  f'max by (node, gpu, reason) ({C.GPU_CLOCKS_EVENT}{{reason=~"{"|".join(THROTTLE_SHOWN)}"}} == 1)'),
    ]
    # Each rank's GPU series, with the rank's labels (job, node, rank, gpu): one join per evaluation
    # here instead of one per query step in every per-rank GPU panel (at 8,192 GPUs a panel joining
    # the raw series over an hour took 6 s). A GPU that two ranks share appears under both.
    info = f"max by (job, node, rank, gpu) ({C.RANK_GPU_INFO})"

    def on_rank(gpu_expr: str) -> str:
        return f"{info} * on (node, gpu) group_left () ({gpu_expr})"

    rank_gpu = [
        Recording(REC["rank_gpu_util"], on_rank(REC["gpu_util"])),
        Recording(REC["rank_gpu_min"], on_rank(f'max by (node, gpu) ({C.GPU_UTILIZATION}{{stat="min"}})')),
        Recording(REC["rank_gpu_max"], on_rank(f'max by (node, gpu) ({C.GPU_UTILIZATION}{{stat="max"}})')),
    ]
    return node, rank_gpu


def _slow_rules(cfg: Mapping[str, Any]) -> Tuple[List[Recording], ...]:
    """The groups at the slow and baseline intervals: step histograms, interface counters, GPU
    utilization samples, RDMA ports, and each NIC's best speed."""
    w = cfg["windows"]["rate"]
    # compat: aggregate by (le) and never select on a `le` value; 3.x writes le="1.0" where 2.x
    # wrote "1", and histogram_quantile merges buckets of equal bound across the two spellings.
    hist = [
        Recording(REC["job_buckets"], f"sum by (job, le) ({_rate(C.STEP_DURATION.bucket, w)})"),
        Recording(REC["job_p50"], f"histogram_quantile(0.5, {REC['job_buckets']})"),
        Recording(REC["job_p99"], f"histogram_quantile(0.99, {REC['job_buckets']})"),
    ]
    rdma_errors = f'{C.RDMA_PORT_COUNTER}{{counter!~"{RDMA_TRAFFIC}"}}'
    rdma_packets = f'{C.RDMA_PORT_COUNTER}{{counter=~"port_(rcv|xmit)_packets"}}'
    rdma = [
        Recording(REC["rdma_errors"], f"sum by (node, counter) ({_rate(rdma_errors, w)})"),
        Recording(REC["rdma_packets"], f"sum by (node, counter) ({_rate(rdma_packets, w)})"),
    ]
    # The day's best speed of each NIC in two steps, every `durations.baseline_rule_interval`: the
    # best over each interval (its window is the interval, so none is skipped), then the best of a
    # day of those (288 samples a series at 5 minutes, where reading the raw gauge over a day on every
    # alert evaluation reads 5,760). A speed that drops is compared with it at once; one that rises
    # shows in it within an interval.
    nic_w = cfg["durations"]["baseline_rule_interval"]
    nic = [
        Recording(REC["nic_best"], f"max_over_time({C.NET_IF_SPEED}[{nic_w}])"),
        Recording(REC["nic_best_1d"], f"max_over_time({REC['nic_best']}[1d])"),
    ]
    samples = [Recording(REC["util_samples"], f"sum by (node, le) ({_rate(C.GPU_UTILIZATION_SAMPLES.bucket, w)})")]
    node_counters = [
        Recording(REC["if_errors"], f"sum by (node, direction) ({_rate(C.NET_IF_ERRORS, w)})"),
        Recording(REC["if_drops"], f"sum by (node, direction) ({_rate(C.NET_IF_DROPS, w)})"),
        Recording(REC["if_bytes"], f"sum by (node, direction) ({_rate(C.NET_IF_BYTES, w)})"),
    ]
    return hist, node_counters, samples, rdma, nic


def recording_groups(cfg: Mapping[str, Any]) -> List[Tuple[str, Optional[str], List[Recording]]]:
    """(group name, interval or None, rules) in RULE_GROUPS order."""
    rules = recording_rules(cfg)
    return [(g, cfg["durations"][key] if key else None, [r for r in rules if r.group == g])
            for g, key in RULE_GROUPS.items()]
