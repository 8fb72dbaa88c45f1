"""The CUDA memory entries of the triage table (ranksight/triage/memory.py): their thresholds come
from the config, they alert per rank, their runbooks name the causes of the rank-0-only OOM, and
the dashboards draw them."""
from __future__ import annotations

import json

from ranksight import config, triage
from ranksight.triage.prose import prose

from test_exporter_helpers import ROOT


def entries(cfg):
    return {e.alert: e for e in triage.table(cfg)}


def test_thresholds_and_durations_come_from_the_config():
    cfg = config.load(None, "default", env={"RANKSIGHT__thresholds__memory_imbalance_ratio": "1.5",
                                            "RANKSIGHT__thresholds__memory_near_oom_ratio": "0.8",
                                            "RANKSIGHT__durations__memory_near_oom": "7m"})
    got = entries(cfg)
    imb, near = got["RanksightMemoryImbalance"], got["RanksightMemoryNearOom"]
    assert "> 1.5)" in imb.expr and imb.threshold == 1.5
    assert "> 0.8)" in near.expr and near.threshold == 0.8 and near.for_ == "7m"
    assert imb.group == near.group == "ranksight.alerts.rank"
    assert imb.scope == near.scope == ("job", "node", "rank") and near.joined == ("gpu",)
    default = entries(config.load(None, "default", env={}))
    assert default["RanksightMemoryImbalance"].threshold == 1.25


def test_the_imbalance_runbook_lists_the_causes_of_a_rank0_only_oom():
    text = " ".join(prose("memory-imbalance").values())
    for cause in ("Uneven batches", "`drop_last=False`", "Rank-0-only logging or metrics",
                  "Rank-0-only checkpoint work", "Rank-0-only evaluation"):
        assert cause in text, cause
    assert (ROOT / "alerts" / "runbooks" / "memory-imbalance.md").exists()
    assert (ROOT / "alerts" / "runbooks" / "memory-near-oom.md").exists()


def test_the_dashboards_draw_the_peaks_the_imbalance_and_the_gpu_share():
    def exprs(board):
        d = json.loads((ROOT / "dashboards" / f"ranksight-{board}.json").read_text())
        return {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in d["panels"]}

    ranks, node = exprs("ranks"), exprs("node")
    assert "ranksight_cuda_memory_allocated_peak_bytes" in ranks["Peak CUDA memory by rank"]
    assert triage.REC["mem_imbalance"] in ranks["Memory imbalance by rank (peak / peers' median)"]
    assert triage.REC["mem_gpu_share"] in node["Peak reserved share of each rank's GPU"]
