"""Plumbing for tests/integration/test_lints.py: a UDP receiver that decodes every datagram with
ranksight.protocol.decode, and a launcher for real 2-rank gloo jobs on a free port."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from ranksight.tools.receiver import DETAIL_ENV, Receiver

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hooks_workloads.harness import collect, free_port, reap  # noqa: E402  (one rank launcher for both suites)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "lint_worker.py")


@dataclass
class Job:
    """One finished 2-rank job: per-rank exit code, stderr, RESULT, and its lint datagrams."""
    args: List[str]
    ranks: List[Dict[str, Any]]
    records: List[Dict[str, Any]]
    invalid: List[str]
    seconds: float
    env: Dict[str, str] = field(default_factory=dict)

    def lints(self, lint: str, rank: Optional[int] = None) -> List[Dict[str, Any]]:
        return [r for r in self.records if r["t"] == "lint" and r["lint"] == lint
                and (rank is None or r["rank"] == rank)]

    def last(self, lint: str, rank: int) -> Optional[Dict[str, Any]]:
        got = self.lints(lint, rank)
        return got[-1] if got else None

    def lines(self, lint: str, rank: int) -> List[str]:
        tags = (f"ranksight lint {lint} on rank {rank}:", f"ranksight info {lint} on rank {rank}:")
        return [ln for ln in self.ranks[rank]["err"].splitlines() if any(t in ln for t in tags)]

    def describe(self) -> str:
        out = [f"args {self.args} env {self.env} ({self.seconds:.1f} s)"]
        for r in self.ranks:
            out.append(f"--- rank rc={r['rc']} result={r['result']}\n{r['err'][-3000:]}")
        out.append("lint datagrams: " + json.dumps([(r["rank"], r["lint"], r["active"]) for r in self.records
                                                     if r["t"] == "lint"]))
        return "\n".join(out)


def run_job(args: Sequence[str], world: int = 2, env: Optional[Dict[str, str]] = None,
            timeout: float = 60.0, forward: Optional[int] = None) -> Job:
    """Run ``world`` ranks of lint_worker.py with gloo on a free port, sending to a fresh receiver
    (which passes the datagrams on to an agent's ingest port ``forward``, if given)."""
    # every valid datagram but "bye" goes on to the real agent ("bye" would make it forget the rank)
    rx = Receiver(("127.0.0.1", forward), forward_bye=False) if forward else Receiver()
    port = free_port()
    t0 = time.monotonic()
    procs = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT")}
    base.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", RANKSIGHT_AGENT=rx.url, RANKSIGHT_JOB="lints-test",
                RANKSIGHT__hooks__table_every_steps="0", RANKSIGHT__hooks__table_every_seconds="0",
                PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p), **DETAIL_ENV)
    base.update(env or {})
    try:
        for r in range(world):
            e = dict(base, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(world),
                     MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            procs.append(subprocess.Popen([sys.executable, WORKER, *args], env=e, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        ranks = collect(procs, timeout)
        time.sleep(0.2)  # the last datagrams of "bye"
    finally:
        reap(procs)
        rx.close()
    return Job(list(args), ranks, list(rx.records), list(rx.invalid), time.monotonic() - t0, dict(env or {}))
