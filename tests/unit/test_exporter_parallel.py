"""How a rank's model is parallelized, from its hello (strategy, ZeRO stage), reaches
ranksight_rank_parallel_info, one series per rank; a later hello replaces it (the hooks send the
hello again once discovery finds the model); a value outside the catalog's reads as "other"; a
hello without a strategy (an older sender, a model not found yet) leaves no series."""
from __future__ import annotations

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ranks import RankSettings, RankTable, parallel

from test_exporter_helpers import parse, series


def hello(rank: int, info: dict) -> dict:
    rec = {"v": P.VERSION, "t": "hello", "job": "j", "rank": rank, "lr": rank, "ws": 2, "node": "n", "pid": 10 + rank,
           "sess": 3, "ts": 1.7e9, "info": info, "dirs": {}, "pstart": 1.7e9 - 5, "gpu": ""}
    return P.decode(P.encode(rec))


def exposed(table: RankTable) -> dict:
    got = series(parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode()),
                 C.RANK_PARALLEL.name)
    assert set(got.values()) <= {1.0}
    return {dict(labels)["rank"]: (dict(labels)["strategy"], dict(labels)["zero_stage"]) for labels in got}


def test_each_rank_exposes_the_strategy_of_its_latest_hello():
    table = RankTable(RankSettings())
    assert table.apply(hello(0, {"torch": "2.13.0", "strategy": "deepspeed", "zero_stage": "3"}), 1000.0) == "ok"
    assert table.apply(hello(1, {"torch": "2.13.0"}), 1000.0) == "ok"  # model not known yet
    assert exposed(table) == {"0": ("deepspeed", "3")}
    assert table.apply(hello(1, {"torch": "2.13.0", "strategy": "ddp", "zero_stage": ""}), 1001.0) == "ok"
    assert exposed(table) == {"0": ("deepspeed", "3"), "1": ("ddp", "")}


def test_odd_values_read_as_other():
    assert parallel({"strategy": "fsdp", "zero_stage": ""}) == ("fsdp", "")
    assert parallel({"strategy": "megatron", "zero_stage": "4"}) == ("other", "other")
    assert parallel({"strategy": 'x"} 1\nfake 2', "zero_stage": [3]}) == ("other", "other")
    assert parallel({"strategy": "pipeline"}) == ("pipeline", "")
    assert parallel({}) is None
    assert set(C.PARALLEL_STRATEGIES) == {"none", "ddp", "fsdp", "deepspeed", "pipeline"}
