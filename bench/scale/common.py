"""What the Prometheus and the VictoriaMetrics runs share: the measured window's plan, the node
slices their workers take, the ``--partial`` writer, the run's directory, a percentile, the
process-tree kill, and each rule's cost alone (``--rule-costs``) with its report lines."""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import statistics
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml

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


def rule_costs(timer: Any, rules_text: str, at: float, repeat: int) -> Dict[str, Any]:
    """Each rule's expression as one instant query at ``at`` (the data's last evaluation time),
    ``repeat`` times (the median), one rule at a time, through ``timer.timed_query``: what each rule
    costs the store alone, on the data and the backfilled records, so a slow group's cost can be read
    rule by rule (a live evaluation only sees the records' history since it started). Per group: the
    rules' sum and the largest."""
    groups = []
    for g in yaml.safe_load(rules_text)["groups"]:
        rows = []
        for r in g["rules"]:
            times, info = [], {}
            for _ in range(repeat):
                dt, info = timer.timed_query(r["expr"], at)
                times.append(dt)
            rows.append({"rule": r.get("record") or r.get("alert"), "seconds": round(statistics.median(times), 4),
                         "series": info.get("series"), "error": info.get("error"), "expr_chars": len(r["expr"])})
        groups.append({"name": g["name"], "rules": rows, "sum_seconds": round(sum(x["seconds"] for x in rows), 4),
                       "max_seconds": max((x["seconds"] for x in rows), default=0.0)})
    return {"at": at, "repeat": repeat, "groups": groups}


def rule_cost_lines(r: Mapping[str, Any]) -> List[str]:
    """The report's lines for ``rule_costs``: the eight costliest groups, each with its three costliest rules."""
    rc = r.get("rule_costs")
    if not rc:
        return []
    lines = [f"rule costs, each rule alone (median of {rc['repeat']}): group sum / largest, s; its costliest rules"]
    for g in sorted(rc["groups"], key=lambda g: -g["sum_seconds"])[:8]:
        top = sorted(g["rules"], key=lambda x: -x["seconds"])[:3]
        lines.append(f"  {g['name']:40s} {g['sum_seconds']:7.3f} / {g['max_seconds']:6.3f}   "
                     + ", ".join(f"{x['rule']} {x['seconds']:.3f}" for x in top))
    return lines
