"""Goodput and step-time regression: the records and alerts that judge a job against its own
wall time and its own history. Part of the triage table: ``triage.recording_rules()`` and
``triage.table()`` add what this module returns; its record names and groups are rows of the
records table (names.py, ``triage.REC`` and ``triage.RULE_GROUPS``).

Goodput is an accounting identity. Each rank's wall time (``rank_wall_seconds_total``: since its
first process started, across restarts) splits into:

  productive       step time minus data wait, exposed comm and checkpoint time (busy time)
  data_wait        time in next() on the data loader
  exposed_comm     time blocked on collectives, not hidden behind compute
  checkpoint       checkpoint writes (the blocking part), the job's longest writer: the other ranks
                   wait for it in their next collective, so that much of their exposed comm is
                   checkpoint time
  startup          a rank's first process start to its first step (imports, restore, compile)
  wasted_progress  productive step time since the last successful checkpoint, lost at a disruption
  recovery         a process's death to its successor's first step
  stalled          alive, no progress
  other            the rest: wall minus all of the above (eval, logging, time before the first record)

The first four come from the rank's own counters, the next four from the agent
(``badput_seconds_total{category}``, exporter/goodput.py). A second the agent counts as wasted
progress or stalled that also lies in an in-step counter is reported in
``badput_overlap_seconds_total{category}`` and subtracted here, so no second counts twice. Every
category is clamped at 0 and the shares divide by the sum of the categories, so they sum to 1 by
construction. The seconds records read cumulative counters with instant selectors (no range): one
``avg by (job)`` per raw family, evaluated every ``durations.slow_rule_interval``. The ratios (each
category's share and the goodput) are a group of their own at the same interval that reads the
split's latest evaluation, at most one interval old: each share is exact as of that evaluation,
and on vmalert, which would inline a same-group read (alerts/engines.py), they do not recompute
the split's raw expressions.

Step-time regression: the job's step p50 (``job_p50``) averaged over ``windows.step_smooth`` (1 h),
against its baseline, the lowest such average within ``windows.step_baseline`` (7 d): the job's best
hour of the week. A jump fires an hour later; a creep of 30% over a week fires once it passes the
ratio (day 5); ±5% noise stays below it. The baseline group runs every
``durations.baseline_rule_interval`` (5 m) over one series per job, so it costs the same at 8 or
8,192 ranks (7 d at 5 m is 2,016 samples per job and record). It reads job records of the other
groups: a value one evaluation old is immaterial at an hour's average. The alert's ``cause`` label
names the step component (data wait, exposed comm, checkpoint, compute) whose seconds per step grew
the most against its own best hour; compute growth while the job's allocator retries rose to over twice
their best hour's is ``cuda_alloc_retries`` (fragmentation: every retry frees the cache and synchronizes).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, List, Mapping, Tuple

from .. import catalog as C
from .model import VAL, Entry, Inhibit, Recording
from .names import BASELINE_GROUP, CROSS_GROUP_READERS, GOODPUT_GROUP, GOODPUT_RATIO_GROUP, REC  # noqa: F401 (public here)

# Step components the regression alert can name (label `cause`), and the allocator cause.
COMPONENTS = ("dataloader_wait", "exposed_comm", "checkpoint", "compute")
ALLOC_CAUSE = "cuda_alloc_retries"

# Cause alerts that explain a low goodput or a slower step: each mutes RanksightGoodputLow and
# RanksightStepTimeRegression on the same job (a named cause is the page; the creep alert is for
# a slowdown nothing else explains).
GOODPUT_CAUSES = ("RanksightDataloaderBound", "RanksightCommBound", "RanksightTcpRetransmits",
                  "RanksightCheckpointSlow", "RanksightHeartbeatMissed", "RanksightRankDown",
                  "RanksightRankStalled", "RanksightStraggler", "RanksightCudaAllocRetries")
GOODPUT_LOW = "RanksightGoodputLow"
STEP_REGRESSION = "RanksightStepTimeRegression"


def _tag(expr: str, label: str, value: str) -> str:
    return f'label_replace({expr}, "{label}", "{value}", "", "")'


def rank_group_rules(cfg: Mapping[str, Any]) -> Tuple[List[Recording], List[Recording]]:
    """Job-level step components, appended to the job group (they read its records), and the job's
    allocator retries, appended to the rank state group (they read its retry record)."""
    R = REC
    mean = R["job_step_mean"]
    ckpt = f"(sum by (job) ({R['ckpt']}) or 0 * {mean}) / (sum by (job) ({R['steps']}) > 0)"
    parts = [
        _tag(f"{R['job_data_share']} * on (job) {mean}", "cause", "dataloader_wait"),
        _tag(f"{R['job_xcomm_share']} * on (job) {mean}", "cause", "exposed_comm"),
        _tag(ckpt, "cause", "checkpoint"),
        _tag(f"clamp_min({mean} * (1 - {R['job_data_share']} - {R['job_xcomm_share']}) - {ckpt}, 0)",
             "cause", "compute"),
    ]
    return [
        Recording(R["job_step_mean"], f"sum by (job) ({R['dur']}) / (sum by (job) ({R['steps']}) > 0)"),
        Recording(R["job_components"], " or ".join(parts)),
    ], [Recording(R["job_alloc_retries"], f"sum by (job) ({R['alloc_retries']})")]


def baseline_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    w = cfg["windows"]
    smooth, lookback = w["step_smooth"], w["step_baseline"]
    R = REC

    def growth(sel: str) -> str:
        return f"({R['components_avg']}{sel} - on (job, cause) {R['components_baseline']}{sel})"

    compute, other = '{cause="compute"}', '{cause!="compute"}'
    rising = f"({R['retries_avg']} > 0 and {R['retries_avg']} > 2 * {R['retries_baseline']})"
    rules = [
        Recording(R["p50_avg"], f"avg_over_time({R['job_p50']}[{smooth}])"),
        Recording(R["p50_baseline"], f"min_over_time({R['p50_avg']}[{lookback}])"),
        Recording(R["step_ratio"], f"{R['p50_avg']} / on (job) ({R['p50_baseline']} > 0)"),
        Recording(R["components_avg"], f"avg_over_time({R['job_components']}[{smooth}])"),
        Recording(R["components_baseline"], f"min_over_time({R['components_avg']}[{lookback}])"),
        Recording(R["retries_avg"], f"avg_over_time({R['job_alloc_retries']}[{smooth}])"),
        Recording(R["retries_baseline"], f"min_over_time({R['retries_avg']}[{lookback}])"),
        # compute that grew while the allocator retries rose is fragmentation, named as such
        Recording(R["regression_growth"],
                  f"label_replace({growth(compute)} and on (job) {rising}, "
                  f"\"cause\", \"{ALLOC_CAUSE}\", \"cause\", \"compute\")"
                  f" or {growth(other)} or ({growth(compute)} unless on (job) {rising})"),
    ]
    return [replace(r, group=BASELINE_GROUP) for r in rules]


def goodput_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    R = REC

    def avg(m: Any, sel: str = "") -> str:
        return f"avg by (job) ({m}{sel})"

    def cat(m: Any, c: str) -> str:
        return avg(m, f'{{category="{c}"}}')

    step, data, xcomm, ckpt = avg(C.STEP_SECONDS), avg(C.DATALOADER_WAIT), avg(C.EXPOSED_COMM_SECONDS), \
        avg(C.CHECKPOINT_SECONDS)
    overlap_all = f"sum by (job) (avg by (job, category) ({C.BADPUT_OVERLAP}))"
    badput_all = f"sum by (job) (avg by (job, category) ({C.BADPUT}))"
    # A checkpoint blocks the whole job for its longest writer's time: the other ranks wait for it
    # in their next collective (rank-0-only saves), which their counters show as exposed comm.
    ckpt_max = f"max by (job) ({C.CHECKPOINT_SECONDS})"
    split = {
        "productive": f"{step} - {data} - {xcomm} - {ckpt} - {cat(C.BADPUT_OVERLAP, 'productive')}",
        "data_wait": f"{data} - {cat(C.BADPUT_OVERLAP, 'data_wait')}",
        "exposed_comm": f"{xcomm} - {cat(C.BADPUT_OVERLAP, 'exposed_comm')} - ({ckpt_max} - {ckpt})",
        "checkpoint": ckpt_max,
        **{c: cat(C.BADPUT, c) for c in C.BADPUT_AGENT_CATEGORIES},
        "other": f"{avg(C.RANK_WALL)} - {step} + {overlap_all} - {badput_all}",
    }
    assert tuple(split) == C.GOODPUT_CATEGORIES
    bad = [_tag(f"clamp_min({expr}, 0)", "category", c) for c, expr in split.items() if c != "productive"]
    # the sum of the parts (= the wall time while no part is clamped)
    parts = f"sum by (job) ({R['goodput_split']})"
    # No goodput record is read with a range or a matcher other than `=`, so every one inlines into
    # raw PromQL (the scale benchmark backfills them that way).
    seconds = [
        Recording(R["productive"], f"clamp_min({split['productive']}, 0)"),
        Recording(R["badput"], " or ".join(bad)),
        Recording(R["goodput_split"], f"{_tag(R['productive'], 'category', 'productive')} or {R['badput']}"),
        Recording(R["wall"], parts),
    ]
    # The ratios read only the split's latest evaluation (one rule's result): numerator and
    # denominator are the same evaluation's, so the shares sum to 1 whenever the ratio group runs.
    ratios = [
        Recording(R["goodput_share"], f"{R['goodput_split']} / on (job) group_left () ({parts} > 0)"),
        Recording(R["goodput"], f"sum by (job) ({R['goodput_split']}{{category=\"productive\"}}) / ({parts} > 0)"),
    ]
    return [replace(r, group=GOODPUT_GROUP) for r in seconds] + [replace(r, group=GOODPUT_RATIO_GROUP) for r in ratios]


def entries(cfg: Mapping[str, Any]) -> List[Entry]:
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    R = REC
    ratio = t["step_regression_ratio"]
    # A creep is judged against history: only once the job has had a smoothed p50 for a whole
    # smoothing window (its first hour is all startup and warm-up, and a fault in it is a cause's page)
    over = f"(({R['step_ratio']} > {ratio:g}) and on (job) ({R['p50_avg']} offset {w['step_smooth']}))"
    floor = t["goodput_floor"]
    # a young job is all startup: judge it once its goodput has been recorded for goodput_min_wall
    low = f"({R['goodput']} < {floor:g}) and on (job) ({R['goodput']} offset {w['goodput_min_wall']})"
    worst = f"topk by (job) (1, {R['goodput_share']}{{category!=\"productive\"}})"
    J = ("job",)
    return [
        Entry(
            id="step-time-regression", alert=STEP_REGRESSION, kind="cause", order=0,
            title="Step time regression against the job's baseline", severity="warning",
            expr=f"({over} + on (job) group_left (cause) (0 * topk by (job) (1, {R['regression_growth']})))"
                 f" or ({over} unless on (job) {R['regression_growth']})",
            for_=d["step_regression"], threshold=ratio, unit="ratio",
            indicator=R["step_ratio"], op=">", scope=J,
            summary="The job's steps are over {:.0%} slower than its own baseline".format(ratio - 1),
            description=f"job={{{{ $labels.job }}}}: step p50 (smoothed) is {VAL}x its baseline, the best "
                        f"smoothed p50 of the lookback; the step component that grew most: {{{{ $labels.cause }}}}.",
            meaning="The job got slower than it was: its step p50, averaged over an hour, is above its best hour "
                    f"within {w['step_baseline']}. A slowdown that creeps in over days (fragmentation, a filling "
                    "cache, a degrading link) fires as well as a jump. The cause label names the step component "
                    "whose seconds per step grew the most: dataloader_wait, exposed_comm, checkpoint, compute, or "
                    "cuda_alloc_retries (compute grew while the allocator retries rose: fragmentation).",
            impact="Every step costs more GPU time than it did; at the same budget the run trains fewer tokens.",
            diagnosis="Follow the cause label: the dataloader wait, exposed comm or checkpoint rows of the triage "
                      "dashboard; for compute, the straggler ratio and GPU throttling; for cuda_alloc_retries, "
                      "reserved vs allocated memory. `ranksight report --baseline` compares two time ranges.",
            mitigation="Fix the grown component; for fragmentation PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. "
                       "After an intended change (new model or batch) the alert clears once the baseline window "
                       "has passed, or rename the job.",
            next_check="the triage row of the component named by the cause label",
        ),
        Entry(
            id="goodput-low", alert=GOODPUT_LOW, kind="cause", order=0,
            title="Goodput below the floor", severity="info",
            expr=f"({low}) + on (job) group_left (category) (0 * {worst})",
            for_=d["goodput_low"], threshold=floor, unit="ratio",
            indicator=R["goodput"], op="<", scope=J,
            summary="Less than {:.0%} of the job's wall time trained the model".format(floor),
            description=f"job={{{{ $labels.job }}}}: goodput {VAL} of its wall time since the first rank started; "
                        f"the largest badput: {{{{ $labels.category }}}}.",
            meaning="Of the wall time the job has run (from its first rank's start, across restarts), the "
                    "productive share is below the floor. The category label names the largest badput: data_wait, "
                    "exposed_comm, checkpoint, startup, wasted_progress, recovery, stalled or other.",
            impact="The GPUs are paid for but idle or redoing work for that share of the time.",
            diagnosis="The Goodput row of the triage dashboard stacks the categories over time; `ranksight report` "
                      "writes the breakdown and compares it with the job's earlier runs.",
            mitigation="Attack the largest category: loader workers (data_wait), overlap (exposed_comm), async "
                       "checkpoints (checkpoint), more frequent checkpoints (wasted_progress), faster restarts "
                       "(recovery, startup).",
            next_check="the Goodput row's breakdown, then the triage rows",
        ),
    ]


def with_goodput_inhibitions(table: List[Entry]) -> List[Entry]:
    """The cause alerts of GOODPUT_CAUSES also mute RanksightGoodputLow and
    RanksightStepTimeRegression on the same job."""
    mute = Inhibit((GOODPUT_LOW, STEP_REGRESSION), ("job",))
    return [replace(e, inhibits=e.inhibits + (mute,)) if e.alert in GOODPUT_CAUSES else e for e in table]
