"""What the Prometheus and the VictoriaMetrics runs share: the measured window's plan, the node
slices their workers take, the ``--partial`` writer, the run's directory, a percentile and the
process-tree kill."""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .server import BenchError

log = logging.getLogger(__name__)


def kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (our own workers and the promtool they run)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        kids = []
    for k in kids:
        kill_tree(k)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass


def percentile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(xs)
    if not s:
        return float("nan")
    k = max(0, min(len(s) - 1, math.ceil(q / 100.0 * len(s)) - 1))
    return s[k]


def plan_window(now: float, hours: float, step: int, lead: int, future: int) -> Tuple[int, int, str]:
    """(t0, samples, block duration for promtool): the measured hour ends `future` seconds
    from now (so the live rule evaluation still has data), the data starts `lead` earlier
    (rate windows), and the whole window sits in one aligned promtool block, so promtool
    reads its input twice, not three times."""
    length = int(hours * 3600) + lead
    for block_h in (2, 6, 18, 54):
        bd = block_h * 3600
        for shift in range(0, future // 5 + 1, step):
            t1 = (int(now) + future - shift) // step * step
            t0 = t1 - length
            if t0 // bd == t1 // bd:
                return t0, length // step + 1, f"{block_h}h"
    t1 = (int(now) + future) // step * step
    return t1 - length, length // step + 1, "2h"


def write_partial(path: Optional[str], result: Dict[str, Any], before: str) -> None:
    """``--partial``: the result so far, written at each phase, so a run cut at its time limit keeps
    what it measured (``partial_before`` names the phase that had not finished)."""
    if not path:
        return
    try:
        Path(path).write_text(json.dumps(dict(result, partial_before=before), indent=1))
    except OSError as e:
        log.warning("scale: --partial %s: %s", path, e.strerror or e)


def node_slices(nodes: int, parts: int) -> List[List[int]]:
    """Nodes 0..nodes-1 in ``parts`` contiguous slices of near-equal size."""
    return [list(range(i * nodes // parts, (i + 1) * nodes // parts)) for i in range(parts)]


def work_dir(keep: Optional[str], reuse: Optional[str], workdir: Optional[str], prefix: str) -> Path:
    """The run's directory: ``--reuse``'s as it is, ``--keep``'s (new or empty, made here), or a
    fresh temporary one under ``workdir`` (the caller removes it when neither was given)."""
    if reuse:
        return Path(reuse)
    if not keep:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=workdir))
    base = Path(keep)
    if base.exists() and any(base.iterdir()):
        raise BenchError(f"--keep {base}: directory exists and is not empty")
    base.mkdir(parents=True, exist_ok=True)
    return base
