"""`ranksight report` pieces that need no Prometheus: time parsing, the dashboards' panels as the
report reads them, muting by the triage table's inhibitions, the comparison's flags, and bad usage
(one line, exit 2). The report on a real run is in test_goodput_truth.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from ranksight import config
from ranksight.report import cli, make, panels

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cfg():
    return config.load(None, "default", env={})


def test_times():
    now = 1_800_000_000.0
    assert cli.parse_time("now", now) == now
    assert cli.parse_time("now-1h30m", now) == now - 5400
    assert cli.parse_time("1700000000", now) == 1_700_000_000
    assert cli.parse_time("2026-01-01T00:00:00Z", now) == cli.parse_time("2026-01-01T00:00:00", now)
    with pytest.raises(make.ReportError):
        cli.parse_time("yesterday", now)
    with pytest.raises(make.ReportError):
        cli._range("now-1h", now)
    with pytest.raises(make.ReportError):
        cli._range("now..now-1h", now)


def test_panels_come_from_the_dashboards(cfg):
    boards = panels.load_boards(cfg)
    tri = panels.panels(boards["triage"], "triage")
    rows = list(dict.fromkeys(p.row for p in tri))
    assert rows[:2] == ["Goodput", "Overview"] and rows[2].startswith("1. ")
    split = panels.find(tri, "Where the wall time went")
    assert split.stacked and split.unit == "s" and split.targets[0].legend == "{{category}}"
    assert "$job" in split.targets[0].expr  # substituted per report, as Grafana does
    gp = panels.find(tri, "Goodput")
    assert gp.type == "stat" and gp.unit == "percentunit" and gp.thresholds[1][0] == cfg["thresholds"]["goodput_floor"]
    assert panels.legend("{{job}} rank {{rank}}", {"job": "j", "rank": "3"}) == "j rank 3"
    ranks = panels.panels(boards["ranks"], "ranks")
    assert panels.find(ranks, "Step time by rank").type == "heatmap"
    table = panels.find(ranks, "Per-rank step breakdown")  # Grafana's merge: one row per rank, named columns
    assert table.columns["Value #A"] == ("step mean", "s") and "instance" in table.hidden


def test_muted_symptoms_follow_the_inhibitions(cfg):
    f = make.Fired
    fired = make.mute([
        f("RanksightCommBound", {"job": "a", "rank": "1", "node": "n"}, 10, 50),
        f("RanksightDataloaderBound", {"job": "a", "rank": "0", "node": "n"}, 5, 40),
        f("RanksightCommBound", {"job": "b", "rank": "1", "node": "m"}, 10, 50),  # another job: not muted
        f("RanksightGoodputLow", {"job": "a", "category": "data_wait"}, 60, 70),  # after the cause ended
    ], cfg)
    assert [x.alert for x in fired][0] == "RanksightDataloaderBound"  # triage order
    by = {(x.alert, x.labels["job"]): x.muted_by for x in fired}
    assert by[("RanksightCommBound", "a")] == ["RanksightDataloaderBound"]
    assert by[("RanksightCommBound", "b")] == [] and by[("RanksightGoodputLow", "a")] == []
    v = make.verdict("a", make.Summary(make.Run(0, 100), goodput=0.5), fired, [], None)
    assert v.startswith("VERDICT: job a: goodput 50%") and "RanksightDataloaderBound" in v


def test_comparison_flags_what_moved(cfg):
    run = make.Run(0, 100)
    base = make.Summary(run, step_p50=1.0, goodput=0.95, shares={"productive": 0.95, "data_wait": 0.01}, restarts=0)
    now = make.Summary(run, step_p50=1.3, goodput=0.7, shares={"productive": 0.7, "data_wait": 0.2, "recovery": 0.05},
                       seconds={"recovery": 30.0}, restarts=1)
    flags = {f.what for f in make.compare(now, base, cfg)}
    assert flags == {"step p50", "goodput", "data_wait share", "recovery share", "restarts"}
    assert make.compare(base, base, cfg) == []


@pytest.mark.parametrize("args", [
    ["--prometheus", "http://127.0.0.1:9", "--job", "x"],  # nothing listens there
    ["--prometheus", "localhost:9090", "--job", "x"],
    ["--prometheus", "http://127.0.0.1:9", "--job", "x", "--baseline", "now-1h"],
    ["--prometheus", "http://127.0.0.1:9", "--job", "x", "--from", "now", "--to", "now-1h"],
    ["--prometheus", "http://127.0.0.1:9", "--job", "x", "--lookback", "week"],
    ["--prometheus", "http://127.0.0.1:9", "--job", "x", "--dashboard", "nope"],
    ["--job", "x"],
])
def test_bad_usage_and_unreachable_prometheus_are_one_line_exit_2(args):
    r = subprocess.run([sys.executable, "-m", "ranksight", "report", *args], capture_output=True, text=True,
                       timeout=60, cwd=str(ROOT))
    msg = (r.stdout + r.stderr).strip()
    assert r.returncode == 2, msg
    assert "Traceback" not in msg and len(msg.splitlines()) == 1, msg


def test_summary_shows_the_eta_gpu_hours_and_the_cost_at_a_price():
    from ranksight.report import write

    run = make.Run(0, 100)
    priced = make.Summary(run, eta=5400.0, gpu_hours=12.5, gpu_hours_to_finish=3.0, cost_spent=31.25,
                          cost_to_finish=7.5, currency="USD")
    rows = dict(map(tuple, write._summary_rows(priced)))
    assert rows["ETA at the end"] == "90.0 min" and rows["GPU-hours spent"] == "12.50"
    assert rows["GPU-hours to finish"] == "3.00"
    assert rows["cost spent (USD)"] == "31.25" and rows["cost to finish (USD)"] == "7.50"
    assert write._duration(2 * 86400) == "48.0 h"
    plain = dict(map(tuple, write._summary_rows(make.Summary(run))))
    assert plain["ETA at the end"] == "- (no total steps)" and not [k for k in plain if k.startswith("cost")]


def test_cost_records_and_panels_only_at_a_price():
    from ranksight import triage
    from ranksight.dashboards.generate import render

    names = {r.record: r.expr for r in triage.recording_rules(config.load(None, "default", env={}))}
    assert triage.REC["eta"] in names and triage.REC["cost_spent"] not in names
    priced_cfg = config.load(None, "default", env={"RANKSIGHT__cost__gpu_hour_price": "2.5",
                                                      "RANKSIGHT__cost__currency": "EUR"})
    priced = {r.record: r.expr for r in triage.recording_rules(priced_cfg)}
    assert priced[triage.REC["cost_spent"]] == f"{triage.REC['gpu_hours']} * 2.5"
    assert priced[triage.REC["cost_to_finish"]] == f"{triage.REC['gpu_hours_to_finish']} * 2.5"
    board = render(priced_cfg)["ranksight-triage.json"]
    titles = {p["title"]: p for p in board["panels"]}
    assert titles["Cost spent (EUR)"]["fieldConfig"]["defaults"]["unit"] == "currencyEUR"
    assert "ETA" in titles and "Cost to finish (EUR)" in titles
