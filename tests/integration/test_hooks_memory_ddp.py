"""The CUDA memory peaks across real rank processes on CPU: 2-rank gloo DDP
(tests/hooks_workloads/ddp_worker.py) against a real node agent (``ranksight exporter``). The ranks
send protocol 5 by default; its peak fields arrive (0 without CUDA) beside the other allocator
gauges, every datagram is accepted and the steps are counted as before. A rank told to send
protocol 4 (an agent-older fleet's setting) is read alike, its peaks 0."""
from __future__ import annotations

import re
from typing import Dict, Optional

import pytest

pytest.importorskip("torch")

from ranksight import catalog as C  # noqa: E402

from hooks_workloads.harness import per_rank, run_ranks  # noqa: E402

STEPS = 16



def ingest(text: str) -> Dict[str, float]:
    """The agent's datagram counts by result."""
    return {res: float(v) for res, v in
            re.findall(r'^%s\{[^}]*result="(\w+)"[^}]*\} (\S+)$' % re.escape(C.INGEST_DATAGRAMS.name), text, re.M)}


@pytest.mark.slow
@pytest.mark.parametrize("protocol", [None, "4"])
def test_the_peak_fields_arrive_as_0_on_cpu_ranks(agent, protocol: Optional[str]):
    a = agent()
    env = {"RANKSIGHT__hooks__protocol": protocol} if protocol else None
    res = run_ranks("ddp_worker.py", ["--steps", str(STEPS)], 2, a.ingest, timeout=120, env=env)
    for r in res:
        assert r["rc"] == 0 and r["result"], r["err"][-3000:]
        assert r["result"]["stats"]["herr"] == 0
    text = a.metrics_text()
    assert per_rank(text, C.STEPS) == {0: STEPS, 1: STEPS}
    for m in (C.CUDA_ALLOCATED_PEAK, C.CUDA_RESERVED_PEAK, C.CUDA_ALLOCATED, C.CUDA_RESERVED):
        assert per_rank(text, m) == {0: 0.0, 1: 0.0}, m.name
    counts = ingest(text)
    assert counts.get("ok", 0) > 0 and sum(v for k, v in counts.items() if k != "ok") == 0, counts
