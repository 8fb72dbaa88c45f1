"""Helpers shared by the exporter tests (no tests here).

``parse(text)`` -> {(name, frozenset(labels)): value} from Prometheus text, parsed by
prometheus_client's own parser (independent of the agent's writer).
``started(argv, log, env)`` -> a running ``plumbing.Proc`` (the one process handle).
"""
from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Tuple

from prometheus_client.parser import text_string_to_metric_families

from ranksight import protocol as P
from ranksight.common.plumbing import Proc, free_port, wait_for  # noqa: F401 - shared by the exporter tests

ROOT = Path(__file__).resolve().parents[2]
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


def started(argv: List[str], log: Path, env: Optional[dict] = None) -> Proc:
    """argv run from the checkout with its output in a fresh ``log`` and ``env`` on top of this
    process's environment; ``stop()`` signals its own pid only."""
    return Proc(argv, log, {**os.environ, **(env or {})}, cwd=ROOT, fresh_log=True).start()


def agent_cmd(*args: str) -> List[str]:
    return [sys.executable, "-m", "ranksight", "exporter", *args]


def trace() -> dict:
    return json.loads(TRACE.read_text())
