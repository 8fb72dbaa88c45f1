"""The setup lints of the triage table: one info alert per lint id (`ranksight_lint_active{lint}`),
their prose from prose/lint.md."""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from .. import catalog as C
from .model import RANK_DESC, Entry
from .prose import PROSE_DIR, prose

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
    "partial_resume": ("PartialResume", "a checkpoint restore left the optimizer, LR scheduler or sampler epoch fresh"),
}


def lint_entries(cfg: Mapping[str, Any]) -> List[Entry]:
    """One entry per lint of LINTS."""
    d = cfg["durations"]
    R = ("job", "node", "rank")
    entries: List[Entry] = []
    for lint, (camel, what) in LINTS.items():
        stem = f"lint-{lint.replace('_', '-')}"
        entries.append(Entry(
            id=stem, alert=f"RanksightLint{camel}", kind="lint", order=0,
            title=f"Setup lint: {lint}", severity="info",
            expr=f"{C.LINT_ACTIVE}{{lint=\"{lint}\"}} == 1",
            for_=d["lint"], threshold=0.5, unit="bool",
            indicator=f"{C.LINT_ACTIVE}{{lint=\"{lint}\"}}", op=">", scope=R,
            summary=f"Setup lint: {what}",
            description=f"{RANK_DESC}: {what}.",
            # a lint with its own runbook prose (prose/lint-<id>.md) uses it; the others share prose/lint.md
            **prose(stem if (PROSE_DIR / f"{stem}.md").exists() else "lint", what=what, lint=lint),
            next_check="the rank's log line",
        ))
    return entries
