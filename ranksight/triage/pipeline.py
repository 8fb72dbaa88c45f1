"""Pipeline parallelism: each stage's bubble share and the straggler logic applied per stage. The
series exist only for ranks the hooks watch as a pipeline stage (hooks/pipeline.py); their
counters carry the stage index as the label ``stage``, so every record and alert below names it.

A stage's bubble share is the part of its schedule's step it does not compute: 1 - busy / step.
The schedule's own ideal for p stages and m micro-batches is (p-1)/(m+p-1) (v stages per rank,
interleaved: (p-1)/(v*m+p-1)); the agent exposes p and the micro-batch forwards per step (m, or
v*m) as gauges, from which the ideal is recorded per rank. A bubble far above that ideal is work
the schedule could do and does not: too few micro-batches, a stage that computes longer than the
others (everyone else waits for it), or slow P2P transfers.

The straggler among stages is judged as ``RanksightStraggler`` judges ranks: a stage's busy time
(its compute's share of wall time, equal steps on every stage of a job) over the median of its
peers' (the job's stages without the busiest one)."""
from __future__ import annotations

from typing import Any, List, Mapping

from .. import catalog as C
from .model import RANK_DESC, VAL, Entry, Inhibit, Recording
from .names import RANK_BY, REC, stepped_a_window
from .prose import prose

SCOPE = ("job", "node", "rank", "stage")
STAGE_DESC = RANK_DESC + " stage={{ $labels.stage }}"
# description templates: the stage's schedule ideal, its peers' median busy share
_IDEAL = f'{REC["pipe_ideal"]}{{job=%q,rank=%q}}'
_PEERS = f'{REC["pipe_busy_median"]}{{job=%q}}'


def _ratio(q: str, *args: str) -> str:
    return (f'{{{{ with query (printf "{q}" {" ".join(args)}) }}}}'
            '{{ with index . 0 }}{{ printf "%.2f" .Value }}{{ end }}{{ end }}')


def recording_rules(cfg: Mapping[str, Any]) -> List[Recording]:
    """The per-stage records (rank state group: they read their own raw series). The ideal is 0
    for a one-stage pipeline and is recorded only for ranks with a pipeline (``pipeline_stages > 0``)."""
    w = cfg["windows"]["rate"]
    busy, step = REC["pipe_busy"], REC["pipe_step"]
    stages = f"({C.PIPELINE_STAGES} > 0)"
    return [
        Recording(busy, f"rate({C.PIPELINE_BUSY}[{w}])"),
        Recording(step, f"rate({C.PIPELINE_STEP}[{w}])"),
        Recording(REC["pipe_bubble"], f"clamp_min(1 - {busy} / ({step} > 0), 0)"),
        Recording(REC["pipe_ideal"],
                  f"({stages} - 1) / on ({RANK_BY}) ({C.PIPELINE_MICROBATCHES} + on ({RANK_BY}) {stages} - 1 > 0)"),
        # the reference a stage is judged against: the median of the job's stages without the busiest
        # (RanksightStraggler's reasoning: for every stage in the upper half, its peers' median)
        Recording(REC["pipe_busy_median"], f"quantile by (job) (0.5, {busy} unless topk by (job) (1, {busy}))"),
        Recording(REC["pipe_straggler"], f"{busy} / on (job) group_left () ({REC['pipe_busy_median']} > 0)"),
    ]


def entries(cfg: Mapping[str, Any]) -> List[Entry]:
    """RanksightPipelineStraggler (a cause: it mutes the bubble it makes on the other stages) and
    RanksightPipelineBubble."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    busy, med = REC["pipe_busy"], REC["pipe_busy_median"]
    ratio, gap = t["pipeline_straggler_ratio"], t["pipeline_straggler_min_share"]
    excess = t["pipeline_bubble_excess"]
    over_ideal = f"{REC['pipe_bubble']} - on ({RANK_BY}) group_left () {REC['pipe_ideal']}"
    return [
        Entry(
            id="pipeline-straggler", alert="RanksightPipelineStraggler", kind="cause", order=0,
            title="Pipeline straggler stage", severity="warning",
            # the stage computes over the ratio times its peers' median, and the difference is a real
            # share of wall time (a 2 ms gap on 10 ms of compute is noise); judged only while the job
            # steps (a stalled rank's rates hold the steps from before the stall), and once the rank
            # has stepped for a whole rate window (names.stepped_a_window)
            expr=(f"(({REC['pipe_straggler']} > {ratio:g}) and on ({RANK_BY}, stage) "
                  f"({busy} - on (job) group_left () {med} > {gap:g}) and on ({RANK_BY}) "
                  f"{stepped_a_window(C.STEPS, w['rate'])}) unless on (job) ({C.RANK_STALLED} == 1)"),
            for_=d["pipeline_straggler"], threshold=ratio, unit="ratio",
            indicator=REC["pipe_straggler"], op=">", scope=SCOPE,
            summary="One pipeline stage computes over {:.0%} longer than its peers: the others wait for it".format(
                ratio - 1),
            description=(f"{STAGE_DESC} computes {VAL}x its peers' median (its busy share of wall time against "
                         f"{_ratio(_PEERS, '$labels.job')}): every other stage of its pipeline waits for it, "
                         "as bubble."),
            **prose("pipeline-straggler"),
            next_check="the stage's layers against the others' (rebalance), then its node as for a straggler rank",
            # the bubble of the stages waiting for it, and the generic straggler call on the same rank
            inhibits=(Inhibit(("RanksightPipelineBubble",), ("job",)),
                      Inhibit(("RanksightStraggler",), ("job", "node", "rank"))),
        ),
        Entry(
            id="pipeline-bubble", alert="RanksightPipelineBubble", kind="cause", order=0,
            title="Pipeline bubble share by stage", severity="warning",
            expr=f"{REC['pipe_bubble']} > on ({RANK_BY}) group_left () ({REC['pipe_ideal']} + {excess:g})",
            for_=d["pipeline_bubble"], threshold=excess, unit="ratio",
            indicator=over_ideal, op=">", scope=SCOPE,
            summary="A pipeline stage idles over {:.0%} of its step beyond the schedule's ideal bubble".format(excess),
            description=(f"{STAGE_DESC} does not compute for {VAL} of its pipeline step, against the schedule's "
                         f"ideal {_ratio(_IDEAL, '$labels.job', '$labels.rank')} ((p-1)/(m+p-1))."),
            **prose("pipeline-bubble"),
            next_check="micro-batches per step and the stages' busy time (a slow stage makes the others' bubble)",
        ),
    ]
