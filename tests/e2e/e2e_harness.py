"""Real processes for the end-to-end suite and the triage test: Prometheus and
Alertmanager (Debian binaries) with the test-profile rules and 1 s intervals,
node agents (`ranksight exporter`), and 2-rank gloo DDP jobs (examples/train_ddp.py).

Every process starts in its own session and is killed with its process group on
stop; stop() is idempotent and runs from fixture finalizers, so nothing is left
behind when a test fails.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ranksight import config
from ranksight.common.plumbing import GiveUp, Proc, free_port, wait_for
from ranksight.tools.stack import AgentProcess, LocalStack

log = logging.getLogger("tests.e2e")

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
TRAIN = REPO / "examples" / "train_ddp.py"


def run(argv: Sequence[str], log_path: Path, env: Optional[Mapping[str, str]] = None) -> Proc:
    """argv run from the checkout in its own session, output to log_path (plumbing.Proc). It gets
    SIGKILL if the thread that started it dies, so a killed test run leaves no agents or ranks; its
    stop() signals its process group (DataLoader workers, torch helpers)."""
    return Proc(list(argv), log_path, env, cwd=REPO, deathsig=signal.SIGKILL, group=True).start()


# ------------------------------------------------------------------ Prometheus + Alertmanager
ENGINE = os.environ.get("RANKSIGHT_E2E_ENGINE", "prometheus")  # or victoriametrics
# What the VictoriaMetrics layout adds to a detection: every hop through the store (the raw samples,
# then each record a later group reads: rank rates -> rank records -> job records -> the alert) waits
# up to vmagent's or vmalert's 1 s remote-write flush and the store's 1 s latency offset on top of
# the reading group's 1 s evaluation, about 2 s a hop more than Prometheus' in-memory reads; four hops.
DETECT_EXTRA_S = 8.0 if ENGINE == "victoriametrics" else 0.0


def start_stack(workdir: Path, cfg: Mapping[str, Any], targets: Sequence[str] = ()) -> LocalStack:
    """ranksight's LocalStack (deploy/prometheus.yml rendered, generated rules of ``cfg``),
    scraping and evaluating every second. With RANKSIGHT_E2E_ENGINE=victoriametrics: the
    VictoriaMetrics layout instead (two vmagent shards, the store, vmalert, the same Alertmanager;
    ranksight.tools.vmstack), which answers the same calls (prom, prom_url, am, set_targets)."""
    if ENGINE == "victoriametrics":
        from ranksight.tools.vmstack import VMStack
        return VMStack(workdir, targets=list(targets), shards=2, cfg=cfg, scrape_interval="1s").start()  # type: ignore[return-value]
    return LocalStack(workdir, targets=list(targets), cfg=cfg, scrape_interval="1s").start()


def wait_scraped(stack: LocalStack, target: str, timeout: float = 20.0) -> None:
    wait_for(lambda: stack.prom.value(f'up{{instance="{target}"}}') == 1.0, timeout, f"Prometheus scraping {target}")


def firing(stack: LocalStack, **match: str) -> List[Dict[str, str]]:
    """Firing ALERTS series (their labels) in Prometheus, matching the given labels."""
    sel = ",".join(['alertstate="firing"'] + [f"{k}={json.dumps(v)}" for k, v in match.items()])
    return [s["metric"] for s in stack.prom.query(f"ALERTS{{{sel}}}")]


def am_find(stack: LocalStack, alertname: str, **match: str) -> List[Dict[str, Any]]:
    """Alerts Alertmanager holds (active or inhibited) with that name and labels."""
    return [a for a in stack.am.alerts() if a["labels"].get("alertname") == alertname
            and all(a["labels"].get(k) == v for k, v in match.items())]


# ------------------------------------------------------------------ node agent
CPU_COLLECTORS = "network,disk,ranks"  # no NVML / RDMA on a CPU machine


def host_agent(workdir: Path, name: str, env: Optional[Mapping[str, str]] = None) -> AgentProcess:
    """An agent in the root namespace: ranksight's AgentProcess (loopback, free ports)."""
    return AgentProcess(workdir / name, collectors=CPU_COLLECTORS, env=env, name=name).start()


class Agent:
    """`ranksight exporter` run through a command prefix (``ip netns exec ...`` for a host of
    tests/e2e/e2e_netns.py) and listening on a given address, which AgentProcess does not do."""

    def __init__(self, workdir: Path, name: str, argv_prefix: Sequence[str] = (), listen_host: str = "127.0.0.1",
                 scrape_host: str = "127.0.0.1", env: Optional[Mapping[str, str]] = None,
                 collectors: str = CPU_COLLECTORS) -> None:
        self.dir = workdir
        self.name = name
        self.port = free_port()
        self.ingest_port = free_port()
        self.ingest = f"udp://127.0.0.1:{self.ingest_port}"
        self.listen = f"{listen_host}:{self.port}"
        self.target = f"{scrape_host}:{self.port}"
        e = dict(os.environ)
        e.update({
            "RANKSIGHT__agent__listen": self.listen,
            "RANKSIGHT__agent__ingest": self.ingest,
            "RANKSIGHT__agent__collectors": collectors,
        })
        e.update(env or {})
        self.proc = run([*argv_prefix, PYTHON, "-m", "ranksight", "exporter"], self.dir / f"agent-{name}.log", e)

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://{self.target}/metrics", timeout=3) as r:
            return r.read().decode()

    def wait_ready(self, timeout: float = 20.0) -> "Agent":
        def ready() -> bool:
            if not self.proc.alive():
                raise GiveUp(f"agent {self.name} exited:\n{self.proc.tail()}")
            try:
                return "ranksight_build_info" in self.metrics()
            except (urllib.error.URLError, OSError):
                return False
        wait_for(ready, timeout, f"agent {self.name} serving /metrics")
        return self

    def stop(self) -> None:
        self.proc.stop(3.0)


# ------------------------------------------------------------------ training job
@dataclass
class Job:
    """A gloo DDP run of examples/train_ddp.py (2 ranks unless ``world`` says otherwise), one process
    per rank (env:// rendezvous, no torchrun: no launcher process on a 2-core machine)."""

    name: str
    workdir: Path
    args: Sequence[str] = ()
    agent_ingest: Sequence[str] = ("udp://127.0.0.1:9946",)  # per rank (one per host in the netns case)
    master_addr: str = "127.0.0.1"
    argv_prefix: Sequence[Sequence[str]] = ()  # per rank: e.g. `ip netns exec ...`; none: ()
    local_ranks: Sequence[int] = ()  # (0, 0) when each rank is on its own host; none: 0..world-1
    env: Mapping[str, str] = field(default_factory=dict)  # every rank
    rank_env: Sequence[Mapping[str, str]] = ()  # per rank; none: {}
    world: int = 2
    train: Path = TRAIN
    procs: List[Proc] = field(default_factory=list)
    launched: float = 0.0  # monotonic

    def start(self) -> "Job":
        port = free_port()
        ckdir = self.workdir / f"ckpt-{self.name}"
        self.launched = time.monotonic()
        for rank in range(self.world):
            e = dict(os.environ)
            e.update({
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(port), "RANK": str(rank),
                "WORLD_SIZE": str(self.world),
                "LOCAL_RANK": str(self.local_ranks[rank] if self.local_ranks else rank),
                "RANKSIGHT_JOB": self.name,
                "RANKSIGHT_AGENT": self.agent_ingest[rank % len(self.agent_ingest)],
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
            })
            e.update(self.env)
            e.update(self.rank_env[rank] if self.rank_env else {})
            argv = [*(self.argv_prefix[rank] if self.argv_prefix else ()), PYTHON, str(self.train), "--checkpoint-dir", str(ckdir),
                    "--log-every", "0", *self.args]
            self.procs.append(run(argv, self.workdir / f"job-{self.name}-rank{rank}.log", e))
        return self

    def logs(self, n: int = 1500) -> str:
        return "\n".join(f"--- {self.name} rank {i} ({p.log_file}) ---\n{p.tail(n)}" for i, p in enumerate(self.procs))

    def stop(self) -> None:
        for p in self.procs:
            p.stop(grace=1.0)


def triage_cli(prom_url: str, *args: str, timeout: float = 60.0,
               env: Optional[Mapping[str, str]] = None) -> subprocess.CompletedProcess:
    """`ranksight triage` as the on-call engineer runs it (a real subprocess); ``env``: extra
    RANKSIGHT__section__key settings, those the rules were generated with."""
    return subprocess.run([PYTHON, "-m", "ranksight", "triage", "--prometheus", prom_url, *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=None if env is None else {**os.environ, **env})


def cfg_test_profile(env: Optional[Mapping[str, str]] = None) -> config.Config:
    """The test profile, with ``env``'s RANKSIGHT__section__key settings on top."""
    return config.load(profile="test", env=dict(env or {}))
