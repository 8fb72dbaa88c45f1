"""The generated rules on both engines: the same series, scraped live (timestamps honored, so both
stores hold the same samples) by a real Prometheus and by two real vmagent shards writing to a real
VictoriaMetrics store, evaluated live by Prometheus and by vmalert (``ranksight rules --engine
victoriametrics``); every recorded series of the rule file must exist on both with the same labels
and agree, and the same alerts must be active.

The series are the scale benchmark's model (bench/scale/live.py) for 2 nodes x 2 ranks with a
straggler, made steady (constant step times) with one checkpoint write 100 s before the comparison.

Bounds (docs/SCALING.md, "VictoriaMetrics"):
- 1% for every record;
- records whose value is ``time()`` less a series (checkpoint age) are compared as value less their
  own evaluation time: the engines evaluate at different moments;
- the goodput ratios, which read the goodput group's latest evaluation, up to one slow interval
  (10 s under the test profile) old on either engine: every goodput category of this data grows
  at a steady rate over the job's whole wall time (about 15,600 s a rank) or stays constant, so
  an interval moves a share by about 10/15,600 (0.07%) of itself, inside the 1% (measured: 0.05%);
- the regression growth, a difference of two nearly equal averages (the step components' recent
  average less their baseline), within the bound of those averages: its error relative to the
  largest step component;
- records that read ``rate``/``increase`` (directly or through the records they read): the engines
  agree on a counter of constant rate but where Prometheus' newest sample in the window is more
  than 1.1 sample intervals before the evaluation, it extrapolates half an interval instead of up
  to the window's end, so it reads low by at most (g - s/2) / w, g the newest sample's age (at most
  the sample interval s plus the scrape interval plus a scrape's lateness), w the rate window.
  VictoriaMetrics divides by the samples' own span. Here s = 2 s, the scrape interval 1 s, a
  scrape up to 1 s late on a loaded machine, w = 30 s: 1% + 3/30. That holds for a counter of
  constant rate. A histogram bucket's counter rises in bursts (a GPU's samples land in one bucket
  while its utilization stays there), so the edge span can hold more than its share: each bucket
  series gets 1% + 3/30 times its peak local rate (over two samples) within the window over its
  mean rate there, measured on Prometheus.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Dict, Set, Tuple

import pytest
import yaml

from ranksight import config, triage
from ranksight.common import servers
from ranksight.common.plumbing import PrometheusAPI
from ranksight.tools.bench import load
from ranksight.tools.stack import LocalStack
from ranksight.tools.vmstack import RULES_DIR, VMStack

scale = load("scale")
from bench.scale.live import LiveSeries, steady_generator  # noqa: E402 (after load puts bench/ on the path)

STEP, SCRAPE, LATE, RATE_WINDOW = 2, 1, 1, 30
COMPARE_AFTER = 135.0  # seconds of data: the rate window, the step smoothing and baseline windows, the checkpoint share's
CHECKPOINT_AT = 30  # seconds after the first sample: inside the 2 m checkpoint share window at the comparison
REL = 0.01
RATE_BOUND = REL + (STEP / 2 + SCRAPE + LATE) / RATE_WINDOW


def _vm_binaries() -> None:
    try:
        for name in ("victoria-metrics", "vmagent", "vmalert"):
            servers.find_binary(name)
    except servers.MissingBinary as e:
        pytest.skip(f"the VictoriaMetrics side needs its binaries: {e}")


def _derived(rules: Dict[str, str], pattern: str) -> Set[str]:
    """Records whose expression matches ``pattern`` or reads such a record."""
    out = {r for r, e in rules.items() if re.search(pattern, e)}
    while True:
        more = {r for r, e in rules.items() if r not in out
                and any(re.search(rf"(?<![\w:]){re.escape(d)}(?![\w:])", e) for d in out)}
        if not more:
            return out
        out |= more


def _burst(api, expr: str) -> Dict[Tuple[Tuple[str, str], ...], float]:
    """A histogram-bucket rate record (``expr`` over ``[RATE_WINDOW s]``): per series, its peak local
    rate (over two steps) within the window over its mean rate. A bucket's increments come in bursts
    (a GPU's samples land in one bucket while its utilization stays there), so the edge spans whose
    timing the engines place differently can carry up to this many times a steady counter's share."""
    local = expr.replace(f"[{RATE_WINDOW}s]", f"[{2 * STEP}s]")
    return {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(s["value"][1])
            for s in api.query(f"max_over_time(({local})[{RATE_WINDOW}s:{STEP}s]) / ({expr})")}


def _series(api, record: str) -> Dict[Tuple[Tuple[str, str], ...], Tuple[float, float]]:
    """label set -> (value, sample time) of the record's newest samples."""
    values = {tuple(sorted((k, v) for k, v in s["metric"].items() if k != "__name__")): float(s["value"][1])
              for s in api.query(record)}
    stamps = {tuple(sorted(s["metric"].items())): float(s["value"][1]) for s in api.query(f"timestamp({record})")}
    return {k: (v, stamps.get(k, float("nan"))) for k, v in values.items()}


@pytest.mark.slow
def test_rules_agree_on_prometheus_and_victoriametrics(tmp_path: Path) -> None:
    _vm_binaries()
    t0 = int(time.time()) // STEP * STEP + STEP
    samples = int(COMPARE_AFTER + 120) // STEP
    scn = scale.Scenario(nodes=2, shape=scale.Shape(gpus=2, ranks_per_node=2), t0=t0, samples=samples, step=STEP,
                         stragglers=(1,), dataloader_node=-1)
    gen = steady_generator(scn, checkpoints=[t0 + CHECKPOINT_AT], last_checkpoint=t0 - 100)
    cfg = config.load(None, "test")
    cfg["windows"].update({"rate": f"{RATE_WINDOW}s", "checkpoint_share": "2m", "step_smooth": "30s",
                           "step_baseline": "30s"})
    honor = {"honor_timestamps": True}
    with LiveSeries(scn, gen) as targets:
        prom = LocalStack(tmp_path / "prom", targets, cfg=cfg, scrape_interval=f"{SCRAPE}s", evaluation_interval="5s",
                          scrape_options=honor)
        vm = VMStack(tmp_path / "vm", targets, shards=2, cfg=cfg, scrape_interval=f"{SCRAPE}s",
                     evaluation_interval="5s", scrape_options=honor, dedup="1ms")
        with prom, vm:
            time.sleep(max(0.0, t0 + COMPARE_AFTER - time.time()))
            prom_rules = yaml.safe_load((prom.run_dir / "rules" / "ranksight-rules.yml").read_text())
            vm_rules = yaml.safe_load((vm.run_dir / RULES_DIR / "ranksight-rules.yml").read_text())
            exprs = {r["record"]: r["expr"] for g in vm_rules["groups"] for r in g["rules"] if "record" in r}
            records = [r["record"] for g in prom_rules["groups"] for r in g["rules"] if "record" in r]
            assert set(records) == set(exprs)
            rate_based = _derived(exprs, r"(?<![\w:])(rate|increase|irate)\(")
            time_based = _derived(exprs, r"time\(\)")
            # the two vmagent shards split the two nodes' targets between them, each target on one shard
            scraped = [t["labels"]["instance"] for s in vm.servers() if s.name.startswith("vmagent")
                       for t in PrometheusAPI(s.url).targets()]
            assert sorted(scraped) == sorted(targets), scraped
            p_alerts = {a["labels"]["alertname"] for a in prom.prom.alerts()}
            v_alerts = {a["labels"]["alertname"] for a in vm.vmalert.alerts()}
            components = [v for v, _ in _series(prom.prom, "job:ranksight_step_component_seconds:avg").values()]
            # a held record's timestamp is read against its lookback: the engines' evaluation times
            # differ by up to an interval, which is small next to it
            magnitude = {"job:ranksight_step_regression_growth:seconds": max(map(abs, components)),
                         triage.REC["loss_steady_seen"]: config.duration_seconds(cfg["windows"]["loss_resume_lookback"])}
            report, bad = [], []
            for record in records:
                p, v = _series(prom.prom, record), _series(vm.store, record)
                if set(p) != set(v):
                    bad.append(f"{record}: label sets differ: only Prometheus {sorted(set(p) - set(v))[:2]}, "
                               f"only VictoriaMetrics {sorted(set(v) - set(p))[:2]}")
                    continue
                bound = RATE_BOUND if record in rate_based else REL
                burst = _burst(prom.prom, exprs[record]) if record.endswith("_bucket:rate") else {}
                assert burst or not record.endswith("_bucket:rate") or not p, f"{record}: no burst figures"
                worst, over = 0.0, 0.0
                for k, (pv, pt) in p.items():
                    vv, vt = v[k]
                    if record in time_based:
                        pv, vv = pv - pt, vv - vt
                    size = magnitude.get(record) or max(abs(pv), abs(vv), 1e-9)
                    diff = abs(pv - vv) / size if pv != vv else 0.0
                    mine = REL + (bound - REL) * max(1.0, burst.get(k, 1.0))
                    worst, over = max(worst, diff), max(over, diff - mine)
                spread = f", bursts up to {max(burst.values()):.2f}x" if burst else ""
                report.append(f"{record} {len(p)} series, worst {worst:.4f} (bound {bound:.3f}{spread})")
                if over > 0:
                    bad.append(report[-1])
    assert len(records) > 60 and not bad, "\n".join(bad + ["--"] + report)
    assert p_alerts == v_alerts, (sorted(p_alerts), sorted(v_alerts))
    assert "RanksightStraggler" in p_alerts and "RanksightCheckpointSlow" in p_alerts, sorted(p_alerts)


@pytest.mark.slow
def test_stack_cli_starts_and_stops_the_victoriametrics_layout(tmp_path: Path) -> None:
    import subprocess
    import sys

    from ranksight.common.plumbing import free_port

    _vm_binaries()
    run_dir = tmp_path / "stack"
    ports = [str(free_port()) for _ in range(3)]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ranksight", "stack", *args, "--run-dir", str(run_dir)],
                              capture_output=True, text=True, timeout=120)

    up = cli("up", "--engine", "victoriametrics", "--shards", "3", "--profile", "test", "--targets", "127.0.0.1:9",
             "--store-port", ports[0], "--vmalert-port", ports[1], "--alertmanager-port", ports[2])
    try:
        assert up.returncode == 0, up.stderr
        assert f"victoria-metrics http://127.0.0.1:{ports[0]}" in up.stdout and "3 shards" in up.stdout
        status = cli("status")
        assert status.returncode == 0, status.stdout
        assert sum("running" in ln for ln in status.stdout.splitlines()) == 6  # store, vmalert, 3 shards, Alertmanager
        rules = PrometheusAPI(f"http://127.0.0.1:{ports[0]}").rules()  # through the store, from vmalert
        assert {g["name"] for g in rules} >= {"ranksight.recording.baseline", "ranksight.alerts.job"}
        again = cli("up", "--engine", "victoriametrics")
        assert again.returncode == 0 and "already running" in again.stdout
    finally:
        down = cli("down")
    assert down.returncode == 0 and "stopped" in down.stdout, down.stderr
    assert cli("status").returncode == 3
