"""The order in which `ranksight triage` names one cause's places (Walk.check): the places whose
alert fired (what Alertmanager paged) first, then the worst value. Prometheus is a stand-in that
answers the check's two queries (the indicator's worst and the condition) by expression; the real
path runs in tests/integration/test_triage_cli.py and the e2e suite."""
from __future__ import annotations

from typing import Dict, List, Optional

from ranksight import config, triage
from ranksight.common.plumbing import Sample
from ranksight.tools.triage_cli import Walk


def _entry(alert: str):
    return next(e for e in triage.table(config.load(None, "test")) if e.alert == alert)


class Answers:
    """samples(expr): the indicator's samples for a query on the indicator, the condition's for the
    condition (Walk.check wraps both in *_over_time)."""

    def __init__(self, e, values: Dict[str, float]):
        self.e = e
        self.rows = [Sample(dict(job="j", node="n", rank=r), v) for r, v in values.items()]

    def samples(self, expr: str, at: Optional[float] = None) -> List[Sample]:
        if self.e.expr in expr:
            return [s for s in self.rows if s.value > self.e.threshold]
        assert self.e.indicator in expr, expr
        return list(self.rows)


def _ranks(values: Dict[str, float], paged: List[str]) -> List[str]:
    e = _entry("RanksightCommBound")
    w = Walk(Answers(e, values), {}, job="j", since=None)
    firing = {e.alert: [dict(alertname=e.alert, job="j", node="n", rank=r) for r in paged]}
    return [f.labels["rank"] for f in w.check(e, firing).findings]


def test_the_paged_place_comes_before_a_worse_one_still_inside_its_for():
    assert _ranks({"0": 0.45, "1": 0.60, "2": 0.10}, paged=["0"]) == ["0", "1"]


def test_with_nothing_paged_the_worst_value_comes_first():
    assert _ranks({"0": 0.45, "1": 0.60, "2": 0.10}, paged=[]) == ["1", "0"]
    assert _ranks({"0": 0.45, "1": 0.60, "2": 0.50}, paged=["0", "2"]) == ["2", "0", "1"]
