"""The versions a rank reports in its hello (torch, CUDA runtime, NCCL) reach
ranksight_rank_versions_info, one series per rank; a value that is not a short version string
reads as "other", never as a label of arbitrary text."""
from __future__ import annotations

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ranks import RankSettings, RankTable, versions

from test_exporter_helpers import parse, series


def hello(rank: int, info: dict) -> dict:
    rec = {"v": P.VERSION, "t": "hello", "job": "j", "rank": rank, "lr": rank, "ws": 2, "node": "n", "pid": 10 + rank,
           "sess": 3, "ts": 1.7e9, "info": info, "dirs": {}, "pstart": 1.7e9 - 5, "gpu": ""}
    return P.decode(P.encode(rec))


def test_each_rank_exposes_the_versions_of_its_hello():
    table = RankTable(RankSettings())
    assert table.apply(hello(0, {"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.27.7"}), 1000.0) == "ok"
    assert table.apply(hello(1, {"torch": "2.11.0+cu130", "cuda": "13.0", "nccl": "2.21.5"}), 1000.0) == "ok"
    got = series(parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode()),
                 C.RANK_VERSIONS.name)
    nccl = sorted(dict(labels)["nccl"] for labels in got)
    assert nccl == ["2.21.5", "2.27.7"] and set(got.values()) == {1.0}


def test_odd_values_read_as_other():
    assert versions({"torch": "2.13.0+cpu", "cuda": "", "nccl": [2, 27]}) == ("2.13.0+cpu", "", "other")
    assert versions({"torch": 'x"} 1\nfake_metric 2', "cuda": "1" * 65}) == ("other", "other", "")
    assert versions({}) == ("", "", "")
