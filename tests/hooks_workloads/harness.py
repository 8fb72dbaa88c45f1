"""Test plumbing for the hooks tests: a UDP receiver that validates every datagram, and a
launcher for N real rank processes on a free gloo rendezvous port."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

from ranksight.tools.receiver import DETAIL_ENV, Receiver, with_detail  # noqa: F401  (re-exported for the hooks tests)
from ranksight.common.plumbing import free_port  # noqa: F401  (re-exported for the hooks and lints tests)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def rank_env(agent: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT")}
    env.update(OMP_NUM_THREADS="1", RANKSIGHT_AGENT=agent, RANKSIGHT_JOB="hooks-test",
               RANKSIGHT__hooks__table_every_steps="0", RANKSIGHT__hooks__table_every_seconds="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))
    env.update(DETAIL_ENV)  # the tests read each step's phase times
    env.update(extra or {})
    return env


def run_ranks(script: str, args: Sequence[str], world: int, agent: str, timeout: float = 60.0,
              env: Optional[Dict[str, str]] = None) -> List[Dict[str, Any]]:
    """Run ``world`` rank processes of a workload script; returns [{rc, out, err, result}] by rank."""
    port = free_port()
    procs = []
    for r in range(world):
        e = rank_env(agent, env)
        if world > 1 or "--wrap" in args:
            e.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script), *args], env=e,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        return collect(procs, timeout)
    finally:
        reap(procs)


def collect(procs: Sequence[subprocess.Popen], timeout: float) -> List[Dict[str, Any]]:
    """Wait for every rank (all are killed at the deadline); per rank: rc, stdout, stderr and the
    JSON of its last "RESULT " line."""
    out = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            so, se = p.communicate()
            se += "\n[killed: timeout]"
        res = None
        for line in so.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
        out.append({"rc": p.returncode, "out": so, "err": se, "result": res})
    return out


def reap(procs: Sequence[subprocess.Popen]) -> None:
    """No leftovers."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def per_rank(text: str, metric: Any, job: str = "hooks-test", extra: str = "") -> Dict[int, float]:
    """``metric``'s (a catalog Metric) value of each rank of ``job`` on a metrics page, from the
    series whose labels also hold ``extra`` (e.g. 'lint="partial_resume"')."""
    out = {}
    for labels, v in re.findall(r"^%s\{([^}]*)\} (\S+)$" % re.escape(metric.name), text, re.M):
        if f'job="{job}"' in labels and extra in labels:
            out[int(re.search(r'rank="(\d+)"', labels).group(1))] = float(v)
    return out
