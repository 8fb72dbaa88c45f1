"""Throughput and MFU: the efficiency group's recording rules and the two alerts over the job's MFU,
placed after the six triage signals. MFU says how much of the GPUs' peak the model's arithmetic
uses; the six signals say where the rest goes, so each page names the first of them that is firing
on the job."""
from __future__ import annotations

from typing import Any, List, Mapping, Sequence

from .. import catalog as C
from .model import VAL, Entry, Recording
from .names import RANK_BY, REC
from .prose import prose

SIGNAL_NAMES = {1: "dataloader wait", 2: "GPU waveform", 3: "comm share", 4: "retransmits", 5: "checkpoint",
                6: "heartbeats"}
WALK = ", ".join(f"{i}. {n}" for i, n in SIGNAL_NAMES.items())
JOB_DESC = "job={{ $labels.job }}"


def recording_rules(rates: Mapping[str, str]) -> List[Recording]:
    """The efficiency group (``rates``: the rank rates group's records by field key). A rank's model
    FLOP/s is its tokens rate times its FLOPs per token (hooks/flops.py), read only where both are
    above 0: a rank whose batches have no tokens, or that sends no FLOPs per token, has no FLOP/s and
    no MFU, never an MFU of 0. Its MFU divides by the peak of its GPU (ranksight_rank_gpu_info joined
    to ranksight_gpu_peak_flops): a rank on a GPU whose peak the agent does not know has none either.
    The job's MFU is the sum of its ranks' FLOP/s over the sum of their peaks, over the ranks that
    have an MFU: a sum of work over a sum of capacity, which with equal GPUs is the mean of the
    ranks' MFU."""
    tokens = rates["tokens"]
    peak = (f"max by (job, node, rank) (max by (job, node, rank, gpu) ({C.RANK_GPU_INFO}) * on (node, gpu) "
            f"group_left () max by (node, gpu) ({C.GPU_PEAK_FLOPS} > 0))")
    with_mfu = f"on (job, node, rank) {REC['mfu']}"
    return [
        Recording(REC["job_tokens"], f"sum by (job) ({tokens} > 0)"),
        Recording(REC["rank_flops"], f"({tokens} > 0) * on ({RANK_BY}) ({C.MODEL_FLOPS_PER_TOKEN} > 0)"),
        Recording(REC["job_flops"], f"sum by (job) ({REC['rank_flops']})"),
        Recording(REC["rank_peak"], peak),
        Recording(REC["mfu"], f"{REC['rank_flops']} / on (job, node, rank) group_left () {REC['rank_peak']}"),
        Recording(REC["job_mfu"], f"sum by (job) ({REC['rank_flops']} and {with_mfu}) / "
                                  f"sum by (job) ({REC['rank_peak']} and {with_mfu})"),
    ]


def run_rules(rates: Mapping[str, str], cfg: Mapping[str, Any]) -> List[Recording]:
    """The run's ETA and cost. A rank's steps left: the run's total (``ranksight_total_steps``,
    declared or the framework's) less the step its process resumed from and the steps it took since;
    over its step rate, the time left; the job's ETA is its slowest rank's (every rank must finish).
    GPU-hours count one device per rank: spent, each rank's wall time since its first process started
    (across restarts, ``ranksight_rank_wall_seconds_total``); to finish, the ranks up times the ETA.
    With ``cost.gpu_hour_price`` above 0 each is also recorded as a cost in ``cost.currency``."""
    price = float(cfg.get("cost", {}).get("gpu_hour_price", 0.0))
    left = (f"clamp_min({C.TOTAL_STEPS} - {C.RESUME_STEP} - {C.STEPS}, 0) and ({C.TOTAL_STEPS} > 0)")
    out = [
        Recording(REC["remaining_steps"], left),
        Recording(REC["eta"], f"max by (job) ({REC['remaining_steps']} / on ({RANK_BY}) ({rates['steps']} > 0))"),
        Recording(REC["gpu_hours"], f"sum by (job) ({C.RANK_WALL}) / 3600"),
        Recording(REC["gpu_hours_to_finish"], f"{REC['eta']} * on (job) count by (job) ({C.RANK_UP} == 1) / 3600"),
    ]
    if price > 0:
        out += [Recording(REC["cost_spent"], f"{REC['gpu_hours']} * {price:g}"),
                Recording(REC["cost_to_finish"], f"{REC['gpu_hours_to_finish']} * {price:g}")]
    return out


def _firing(signal: Entry) -> str:
    """PromQL format (one %q: the job) of ``signal``'s firing alerts on the job: by its job label,
    or, for a node or GPU signal, on a node where the job has a rank."""
    alerts = f'ALERTS{{alertstate="firing",alertname="{signal.alert}"'
    if "job" in signal.scope + signal.joined:
        return alerts + ",job=%q}"
    return alerts + f"}} and on (node) group by (node) ({C.RANK_UP}{{job=%q}})"


def first_signal(signals: Sequence[Entry]) -> str:
    """Description template: the first of the six signals, in triage order, with an alert firing on
    the job (Prometheus' ALERTS series, read when the annotation is rendered: a signal counts once it
    has crossed its threshold for its own `for:`), else the walk to run by hand."""
    ordered = sorted((e for e in signals if e.order), key=lambda e: e.order)
    none = ("no triage signal is firing on the job: run `ranksight triage --prometheus <prometheus-url> --job {{ $labels.job }}` "
            f"and look past the six ({WALK}) at the model itself (kernel efficiency, batch size, "
            "FLOPs per token)")
    out = none
    for e in reversed(ordered):
        found = (f"the first abnormal triage signal is {e.order}. {SIGNAL_NAMES[e.order]} ({e.alert} firing); "
                 "`ranksight triage --prometheus <prometheus-url> --job {{ $labels.job }}` walks the rest")
        out = f"{{{{ with query (printf `{_firing(e)}` $labels.job) }}}}{found}{{{{ else }}}}{out}{{{{ end }}}}"
    return out


def entries(cfg: Mapping[str, Any], signals: Sequence[Entry]) -> List[Entry]:
    """RanksightMfuLow and RanksightMfuDrop (``signals``: the six triage signals' entries)."""
    t, d, w = cfg["thresholds"], cfg["durations"], cfg["windows"]
    mfu = REC["job_mfu"]
    why = first_signal(signals)
    ago = w["mfu_drop_offset"]
    drop = t["mfu_drop_ratio"]
    return [
        Entry(
            id="mfu-low", alert="RanksightMfuLow", kind="symptom", order=0,
            title="Model FLOPs utilization", severity="warning",
            expr=f"{mfu} < {t['mfu_low']:g}",
            for_=d["mfu_low"], threshold=t["mfu_low"], unit="ratio",
            indicator=mfu, op="<", scope=("job",),
            summary="The job uses under {:.0%} of its GPUs' peak FLOP/s (MFU)".format(t["mfu_low"]),
            description=f"{JOB_DESC}: MFU {VAL}, in the under {t['mfu_low']:.0%} band; {why}.",
            **prose("mfu-low"),
            next_check="the six triage signals in order",
        ),
        Entry(
            id="mfu-drop", alert="RanksightMfuDrop", kind="symptom", order=0,
            title="MFU drop against the job's own past", severity="warning",
            expr=f"{mfu} < {drop:g} * ({mfu} offset {ago})",
            for_=d["mfu_drop"], threshold=drop, unit="ratio",
            indicator=f"{mfu} / ({mfu} offset {ago})", op="<", scope=("job",),
            summary="The job's MFU fell under {:.0%} of its own recent value".format(drop),
            description=f"{JOB_DESC}: MFU {VAL}, under {drop:.0%} of its value windows.mfu_drop_offset ago; {why}.",
            **prose("mfu-drop"),
            next_check="the six triage signals in order",
        ),
    ]
