"""remote_write beyond one Prometheus (deploy/prometheus-remote-write.yml): the example merges into
deploy/prometheus.yml and passes promtool, and a real Prometheus scraping a real agent streams the
rules' inputs (every raw ranksight_* series the rules read that the agent serves, and up of the
agents), the recorded series and nothing else to a second real Prometheus started with
--web.enable-remote-write-receiver."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Set

import pytest
import yaml

from ranksight import catalog, config, protocol, triage
from ranksight.common import servers
from ranksight.common.plumbing import PrometheusAPI, Proc, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "prometheus-remote-write.yml"
CLUSTER = "test-shard"
_INPUT = re.compile(r"(?<![\w:])(ranksight_[a-z0-9_]+)")


def merged_config(base: Dict[str, Any], url: str, cluster: str) -> Dict[str, Any]:
    """base (a Prometheus config) with the example's external label and remote_write, sent to url."""
    example = yaml.safe_load(EXAMPLE.read_text())
    out = dict(base)
    out["global"] = {**base.get("global", {}), "external_labels": {**example["global"]["external_labels"],
                                                                   "cluster": cluster}}
    out["remote_write"] = [{**rw, "url": url} for rw in example["remote_write"]]
    return out


def rule_inputs(cfg) -> Set[str]:
    exprs = [r.expr for r in triage.recording_rules(cfg)] + [e.expr for e in triage.table(cfg)]
    return {m for e in exprs for m in _INPUT.findall(e)}


def test_example_merges_into_the_deploy_config_and_passes_promtool(tmp_path):
    promtool = servers.find_binary("promtool")
    base = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(merged_config(base, "http://central:9090/api/v1/write", "a")))
    r = subprocess.run([promtool, "check", "config", "--syntax-only", str(path)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    (rw,) = yaml.safe_load(EXAMPLE.read_text())["remote_write"]
    keep = re.compile(rw["write_relabel_configs"][0]["regex"])
    cfg = config.load(None, "default", env={})
    assert all(keep.fullmatch(f"{n};whatever") for n in rule_inputs(cfg))
    assert all(keep.fullmatch(f"{r.record};x") for r in triage.recording_rules(cfg))
    assert keep.fullmatch(f"up;{triage.SCRAPE_JOB}") and not keep.fullmatch("up;node")
    assert not keep.fullmatch("scrape_duration_seconds;ranksight-agent")


class _Ranks(threading.Thread):
    """Two ranks of one job sending step records and heartbeats to the agent, as the hooks do."""

    def __init__(self, port: int):
        super().__init__(daemon=True)
        self.dst = ("127.0.0.1", port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.halt = threading.Event()

    def _send(self, rank: int, rec: Dict[str, Any]) -> None:
        base = {"v": protocol.VERSION, "job": "rw-job", "rank": rank, "lr": rank, "ws": 2, "node": "n1",
                "pid": 50000 + rank, "ts": time.time()}
        self.sock.sendto(protocol.encode({**base, **rec}), self.dst)

    def run(self) -> None:
        seq = 0
        for r in (0, 1):
            self._send(r, {"t": "ckpt", "dur": 0.5, "bytes": 1 << 20, "ok": True, "src": "torch.save"})
        while not self.halt.is_set():
            seq += 1
            for r in (0, 1):
                self._send(r, {"t": "step", "seq": seq, "dur": 0.1, "data": 0.01, "fwd": 0.02, "bwd": 0.04,
                               "opt": 0.01, "b2o": 0.05, "comm": 0.03, "xcomm": 0.01, "micro": 1})
                if seq % 10 == 1:
                    self._send(r, {"t": "hb", "seq": seq // 10 + 1, "every": 1.0, "step": seq, "phase": "forward",
                                   "coll": -1.0, "probe": 0.01})
            self.halt.wait(0.1)

    def stop(self) -> None:
        self.halt.set()
        self.join(5)
        self.sock.close()


def _counts(prom: PrometheusAPI, selector: str) -> Dict[str, float]:
    return {r["metric"]["__name__"]: float(r["value"][1]) for r in prom.query(f"count by (__name__) ({selector})")}


@pytest.mark.slow
def test_rules_inputs_arrive_at_a_remote_write_receiver(local_stack, tmp_path):
    # the receiver: a second Prometheus that scrapes nothing
    (tmp_path / "receiver.yml").write_text("global:\n  scrape_interval: 1m\n")
    receiver = servers.prometheus(tmp_path / "receiver.yml", tmp_path / "receiver-data", tmp_path / "receiver.log",
                                  flags=["--web.enable-remote-write-receiver"])
    # the agent with two stand-in GPUs serving recorded H200 traces (no NVML on CI machines)
    aport, uport = free_port(), free_port(udp=True)
    agent = Proc([sys.executable, str(ROOT / "bench" / "bench_exporter.py"), "_serve", "--listen",
                  f"127.0.0.1:{aport}", "--ingest", f"udp://127.0.0.1:{uport}", "--gpus", "2"], tmp_path / "agent.log")
    ranks = _Ranks(uport)
    s = None
    try:
        receiver.launch(20.0)
        agent.start()
        central = PrometheusAPI(receiver.url)
        assert wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{aport}/metrics", timeout=2), 20), \
            agent.log_file.read_text()[-2000:]
        ranks.start()
        s = local_stack(targets=[f"127.0.0.1:{aport}"])
        conf = s.run_dir / "prometheus.yml"
        conf.write_text(yaml.safe_dump(merged_config(yaml.safe_load(conf.read_text()),
                                                     f"{central.url}/api/v1/write", CLUSTER)))
        with urllib.request.urlopen(urllib.request.Request(f"{s.prom_url}/-/reload", data=b"", method="POST"),
                                    timeout=10):
            pass

        cfg = config.load(None, "test", env={})
        inputs = rule_inputs(cfg)
        core = {catalog.STEPS.name, catalog.HEARTBEAT_MISSES.name, catalog.RANK_UP.name,
                catalog.GPU_BUSY_SECONDS.name, catalog.NET_TCP_RETRANS.name}
        assert core <= inputs

        def source() -> Dict[str, float]:
            got = {n: c for n, c in _counts(s.prom, '{__name__=~"ranksight_.+"}').items() if n in inputs}
            return got if core <= set(got) else {}

        def records(p: PrometheusAPI, extra: str = "") -> Dict[str, float]:
            return _counts(p, f'{{__name__=~"[a-z]+:ranksight_.+"{extra}}}')

        src = wait_until(source, 30)
        everything = sorted(_counts(s.prom, '{__name__=~"ranksight_.+"}'))
        assert src, f"the source Prometheus lacks some of {sorted(core)}: it has {everything}"
        assert wait_until(lambda: records(s.prom), 30), "no recording rule produced a series"

        def arrived() -> bool:
            got = _counts(central, f'{{__name__=~"ranksight_.+",cluster="{CLUSTER}"}}')
            return all(got.get(n) == c for n, c in source().items()) and \
                set(records(s.prom)) <= set(records(central, f',cluster="{CLUSTER}"'))

        ok = wait_until(arrived, 30, 0.5)
        got = _counts(central, f'{{__name__=~"ranksight_.+",cluster="{CLUSTER}"}}')
        assert ok, {n: (c, got.get(n)) for n, c in source().items() if got.get(n) != c}
        assert central.value(f'up{{job="{triage.SCRAPE_JOB}",cluster="{CLUSTER}"}}') == 1.0
        # the filter: what the rules neither read nor record stays in the shard
        assert s.prom.query(f'scrape_duration_seconds{{job="{triage.SCRAPE_JOB}"}}')
        assert not central.query("scrape_duration_seconds")
        assert not central.query(f'{{__name__=~"ranksight_.+",cluster!="{CLUSTER}"}}')
    finally:
        if s is not None:
            s.stop()  # before the receiver, or it waits for its remote_write queue to drain
        ranks.stop() if ranks.is_alive() else ranks.sock.close()
        agent.stop()
        receiver.stop()
