"""Test plumbing for the hooks tests: a UDP receiver that validates every datagram, and a
launcher for N real rank processes on a free gloo rendezvous port."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Sequence

from ranksight import protocol

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Receiver:
    """Binds a free UDP port on loopback; every datagram must pass protocol.decode."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.records: List[Dict[str, Any]] = []
        self.invalid: List[str] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    @property
    def url(self) -> str:
        return f"udp://127.0.0.1:{self.port}"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                self.records.append(protocol.decode(data))
            except protocol.ProtocolError as e:
                self.invalid.append(f"{e.result}: {e} in {data[:300]!r}")

    def of(self, t: str, rank: Optional[int] = None) -> List[Dict[str, Any]]:
        return [r for r in self.records if r["t"] == t and (rank is None or r["rank"] == rank)]

    def wait_for(self, pred, timeout: float = 5.0) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if pred():
                return True
            time.sleep(0.02)
        return pred()

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)
        self.sock.close()


def rank_env(agent: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSIGHT")}
    env.update(OMP_NUM_THREADS="1", RANKSIGHT_AGENT=agent, RANKSIGHT_JOB="hooks-test",
               RANKSIGHT__hooks__table_every_steps="0", RANKSIGHT__hooks__table_every_seconds="0",
               PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p))
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
    out = []
    deadline = time.time() + timeout
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.time()))
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
    for p in procs:  # no leftovers
        if p.poll() is None:
            p.kill()
            p.wait()
    return out
