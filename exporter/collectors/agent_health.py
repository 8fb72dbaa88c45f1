"""The agent's own health: per-collector up and duration, ingest counters, tracked ranks, the
requests to end a job's workers (every result from 0 where the endpoint is enabled, else only those
that came) and build info. Always on, so it is not one of the collectors enabled by name
(agent.collectors)."""
from __future__ import annotations

import platform
from typing import Callable, Dict, List, Optional, Tuple

from ranksight import __version__
from ranksight import catalog as C

from . import Family, family


class AgentHealthCollector:
    name = "agent_health"

    def __init__(self, node: str, runs: Callable[[], Dict[str, Tuple[bool, float]]],
                 ingest_counts: Optional[Callable[[], Dict[str, int]]] = None,
                 tracked: Optional[Callable[[], int]] = None,
                 end_counts: Optional[Callable[[], Dict[str, int]]] = None):
        self.node = node
        self.runs = runs
        self.ingest_counts = ingest_counts
        self.tracked = tracked
        self.end_counts = end_counts
        self.python = platform.python_version()

    def collect(self) -> List[Family]:
        node = [self.node]
        f_up, f_dur = family(C.COLLECTOR_UP), family(C.COLLECTOR_DURATION)
        for name, (up, dur) in sorted(self.runs().items()):
            f_up.add_metric(node + [name], 1.0 if up else 0.0)
            f_dur.add_metric(node + [name], dur)
        out = [f_up, f_dur]
        if self.ingest_counts is not None:
            f = family(C.INGEST_DATAGRAMS)
            for result, n in self.ingest_counts().items():
                f.add_metric(node + [result], n)
            out.append(f)
        if self.tracked is not None:
            f = family(C.TRACKED_RANKS)
            f.add_metric(node, self.tracked())
            out.append(f)
        ends = self.end_counts() if self.end_counts is not None else {}
        if ends:
            f = family(C.END_WORKERS_REQUESTS)
            for result, n in ends.items():
                f.add_metric(node + [result], n)
            out.append(f)
        f = family(C.BUILD_INFO)
        f.add_metric(node + [__version__, self.python], 1.0)
        out.append(f)
        return out
