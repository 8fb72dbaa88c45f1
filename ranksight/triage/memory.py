"""CUDA memory: the recording rules and the two alerts over the ranks' allocator peaks
(``ranksight_cuda_memory_*_peak_bytes``, hooks/memory.py). A rank whose peak stands above its
peers' (rank 0 with extra logging, checkpoint or evaluation work, or a larger batch) is the rank
that runs out of memory first; a rank whose peak reserved memory nears its GPU's total is about to.
"""
from __future__ import annotations

from typing import Any, List, Mapping

from .. import catalog as C
from .model import RANK_DESC, VAL, Entry, Recording, with_gpu
from .names import RANK_BY, REC
from .prose import prose

RANK_SCOPE = ("job", "node", "rank")
# the ranks with a peak: CPU ranks (no CUDA) send 0 and take no part
PEAK = f"({C.CUDA_ALLOCATED_PEAK} > 0)"
# each rank's GPU's total memory (NVML), by the rank's labels: the rank's GPU (ranksight_rank_gpu_info)
# joined to the node's GPU series
GPU_TOTAL = (f"max by (job, node, rank) (max by (job, node, rank, gpu) ({C.RANK_GPU_INFO}) * on (node, gpu) "
             f"group_left () max by (node, gpu) ({C.GPU_MEMORY_TOTAL} > 0))")


def recording_rules() -> List[Recording]:
    """The memory records (the rank state group: they read raw series only).

    The reference a rank's peak is judged against is its peers' median: the median of the job's
    ranks without the highest one, which for every rank in the upper half (the only ones that can
    stand out) is exactly the median of that rank's peers, for 2 ranks or 2,000 (the straggler's
    reference, records.py). A job of one rank has no peers and no ratio. The share of the GPU is
    the rank's peak reserved bytes (what the caching allocator held of the GPU at its worst) over
    its GPU's total; a rank whose GPU the agent does not know (no NVML) has none."""
    return [
        Recording(REC["mem_peers"], f"quantile by (job) (0.5, {PEAK} unless topk by (job) (1, {PEAK}))"),
        Recording(REC["mem_imbalance"], f"{PEAK} / on (job) group_left () ({REC['mem_peers']} > 0)"),
        Recording(REC["mem_gpu_share"],
                  f"({C.CUDA_RESERVED_PEAK} > 0) / on (job, node, rank) group_left () {GPU_TOTAL}"),
    ]


def _bytes(q: str, *args: str) -> str:
    """Description template: the value of ``q`` (printf format over ``args``) in bytes, humanized."""
    return (f'{{{{ with query (printf "{q}" {" ".join(args)}) }}}}'
            '{{ with index . 0 }}{{ humanize1024 .Value }}B{{ end }}{{ end }}')


# the rank's peak and its peers' median, read when the alert's annotations are rendered (few instances)
_PEAK_OF = f'{C.CUDA_ALLOCATED_PEAK}{{job=%q,rank=%q}}'
_PEERS_OF = f'{REC["mem_peers"]}{{job=%q}}'
_RESERVED_OF = f'{C.CUDA_RESERVED_PEAK}{{job=%q,rank=%q}}'


def entries(cfg: Mapping[str, Any]) -> List[Entry]:
    """RanksightMemoryImbalance and RanksightMemoryNearOom."""
    t, d = cfg["thresholds"], cfg["durations"]
    ratio, least, near = t["memory_imbalance_ratio"], t["memory_imbalance_min_bytes"], t["memory_near_oom_ratio"]
    above = f"({C.CUDA_ALLOCATED_PEAK} - on (job) group_left () {REC['mem_peers']})"
    job_rank = "$labels.job $labels.rank"
    return [
        Entry(
            id="memory-imbalance", alert="RanksightMemoryImbalance", kind="cause", order=0,
            title="One rank's peak GPU memory above its peers'", severity="warning",
            # Over the ratio and over its peers by a real amount: on a small model a few hundred MiB
            # more on rank 0 (its logging buffers) is a large ratio and no risk.
            expr=f"({REC['mem_imbalance']} > {ratio:g}) and on ({RANK_BY}) ({above} > {least:g})",
            for_=d["memory_imbalance"], threshold=ratio, unit="ratio",
            indicator=REC["mem_imbalance"], op=">", scope=RANK_SCOPE,
            summary="One rank's peak GPU memory is over {:.0%} above its peers': it runs out of memory first".format(
                ratio - 1),
            description=f"{RANK_DESC} peaks at {VAL}x its peers' median peak of allocated CUDA memory ("
                        + _bytes(_PEAK_OF, job_rank) + " against " + _bytes(_PEERS_OF, "$labels.job")
                        + "): work only this rank does (rank-0 logging, metrics, checkpoint or evaluation) or "
                          "larger batches on it.",
            **prose("memory-imbalance"),
            next_check="the rank's peak against its GPU's total (RanksightMemoryNearOom), and what only it runs",
        ),
        Entry(
            id="memory-near-oom", alert="RanksightMemoryNearOom", kind="cause", order=0,
            title="A rank's GPU memory near full", severity="warning",
            expr=with_gpu(f"{REC['mem_gpu_share']} > {near:g}"),
            for_=d["memory_near_oom"], threshold=near, unit="ratio", joined=("gpu",),
            indicator=REC["mem_gpu_share"], op=">", scope=RANK_SCOPE,
            summary="A rank's peak reserved CUDA memory is over {:.0%} of its GPU: it is close to an out-of-memory "
                    "error".format(near),
            description=f"{RANK_DESC}: the CUDA caching allocator's peak reserved memory ("
                        + _bytes(_RESERVED_OF, job_rank) + f") is {VAL} of its GPU's total memory.",
            **prose("memory-near-oom"),
            next_check="whether one rank stands above its peers (RanksightMemoryImbalance)",
        ),
    ]
