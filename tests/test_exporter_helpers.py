"""Helpers shared by the exporter tests (no tests here).

``parse(text)`` -> {(name, frozenset(labels)): value} from Prometheus text, parsed by
prometheus_client's own parser (independent of the agent's writer).
``in_process_agent(...)`` starts an Agent on free loopback ports and returns it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

from ranksight import protocol as P

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NE = FIXTURES / "node_exporter"
LOCAL = FIXTURES / "local"
TRACE = FIXTURES / "nvml" / "h200_nvml_trace.json"

Key = Tuple[str, FrozenSet[Tuple[str, str]]]


def parse(text: str) -> Dict[Key, float]:
    out: Dict[Key, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def series(samples: Dict[Key, float], name: str, **match: str) -> Dict[FrozenSet[Tuple[str, str]], float]:
    """The samples of one name whose labels include ``match``."""
    want = set(match.items())
    return {labels: v for (n, labels), v in samples.items() if n == name and want <= set(labels)}


def one(samples: Dict[Key, float], name: str, **match: str) -> float:
    got = series(samples, name, **match)
    assert len(got) == 1, f"{name}{match}: {len(got)} series: {got}"
    return next(iter(got.values()))


def render(agent) -> str:
    from ranksight.exporter.exposition import TextWriter

    return TextWriter().render(agent.collect_all()).decode()


def scrape(agent) -> Dict[Key, float]:
    return parse(render(agent))


def http_get(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def wait_for(pred: Callable[[], object], timeout: float, what: str, every: float = 0.1):
    """Poll until pred() is truthy; returns its value or fails with ``what``."""
    deadline = time.monotonic() + timeout
    last_exc: Optional[BaseException] = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except (OSError, AssertionError, KeyError) as e:  # agent not up yet, series not there yet
            last_exc = e
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last error: {last_exc})")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    s = socket.socket(socket.AF_INET, kind)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def ident(job: str = "job", rank: int = 0, ws: int = 2, pid: int = 1000, node: str = "host", lr: Optional[int] = None,
          ts: Optional[float] = None) -> dict:
    return dict(v=1, job=job, rank=rank, lr=rank if lr is None else lr, ws=ws, node=node, pid=pid,
                ts=time.time() if ts is None else ts)


def step(seq: int = 1, dur: float = 0.1, **kw) -> dict:
    rec = dict(t="step", seq=seq, dur=dur, data=0.01, fwd=0.02, bwd=0.03, opt=0.01, b2o=0.05, comm=0.02, xcomm=0.005,
               ckpt=0.0, micro=1)
    rec.update(kw)
    return rec


def hb(seq: int = 1, every: float = 1.0, step_: int = 0, phase: str = "forward", coll: float = -1.0,
       probe: float = 0.0, **kw) -> dict:
    rec = dict(t="hb", seq=seq, every=every, step=step_, phase=phase, coll=coll, probe=probe)
    rec.update(kw)
    return rec


def dgram(identity: dict, body: dict) -> bytes:
    return P.encode(dict(identity, **body))


class Proc:
    """A subprocess with its output in a file; stopped (its own pid only) by ``stop``."""

    def __init__(self, argv: List[str], log: Path, env: Optional[dict] = None):
        self.log = log
        self.f = open(log, "wb")
        e = dict(os.environ)
        e.update(env or {})
        self.p = subprocess.Popen(argv, stdout=self.f, stderr=subprocess.STDOUT, env=e, cwd=str(ROOT))

    def text(self) -> str:
        self.f.flush()
        return self.log.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.p.poll() is None:
            self.p.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.p.wait(timeout=timeout)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self.f.close()


def agent_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "ranksight", "exporter", *args]


def trace() -> dict:
    return json.loads(TRACE.read_text())
