"""How a fault-suite case's ranks compare over time: the straggler rule's inputs, second by second.

    .venv/bin/python bench/e2e_series.py CASE [--runs 5] [--out series.jsonl]

Runs the e2e case CASE (``tests/e2e/e2e_suite.py``: a real 2-rank gloo job, the agent, Prometheus
and Alertmanager with the test-profile rules) ``--runs`` times on one stack, each run under a job
name of its own, exactly as the suite watches it. After each run it reads from Prometheus, at 1 s
resolution from the run's start, each rank's straggler ratio, busy time per step, exposed and total
comm per step and step time, and appends them with the run's alert timeline to ``--out`` (JSON
lines). Printed per run and rank: the highest straggler ratio, how many seconds it sat over
``thresholds.straggler_ratio`` and when it was last there (seconds from the rank's first point),
and the highest ratio once the rank has stepped for a whole rate window (what
RanksightStraggler judges). It runs for minutes: keep the box otherwise quiet.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

import e2e_suite as S  # noqa: E402
from ranksight.config import duration_seconds  # noqa: E402
from ranksight.triage.names import REC  # noqa: E402

EXPRS = {
    "ratio": REC["straggler"],
    "busy": REC["busy"],
    "step": REC["step_mean"],
    "exposed_comm": f"{REC['xcomm']} / {REC['steps']}",
    "comm": f"{REC['comm']} / {REC['steps']}",
}


def run_once(suite: S.Suite, case: str, i: int) -> Dict[str, Any]:
    name = f"{case}-{i}"  # a job of its own: the last run's series and alerts stay apart
    S.CASES[name] = dataclasses.replace(S.CASES[case], name=name)
    t0 = time.time()
    suite._guard(name, suite._run_single_host)
    t1 = time.time()
    obs = suite.results[name]
    rec: Dict[str, Any] = {"run": i, "case": case, "job": obs.job, "timeline": obs.timeline, "error": obs.error,
                           "detect_s": obs.detect_s, "series": {}}
    assert suite.stack is not None
    for key, expr in EXPRS.items():
        rec["series"][key] = {m.get("rank", "?"): [(round(t - t0, 1), round(v, 5)) for t, v in pts]
                              for m, pts in suite.stack.prom.query_range(expr, t0, t1, 1.0) if m.get("job") == obs.job}
    return rec


def summary(rec: Dict[str, Any], limit: float, window_s: float) -> str:
    out: List[str] = []
    for rank, pts in sorted(rec["series"]["ratio"].items()):
        if not pts:
            continue
        first = pts[0][0]
        over = [t - first for t, v in pts if v > limit]
        settled: Optional[float] = max((v for t, v in pts if t - first >= window_s), default=None)
        out.append(f"rank {rank}: max {max(v for _, v in pts):.3f}, over {limit:g} for {len(over)} s"
                   f"{f' (last at +{max(over):.0f} s)' if over else ''}, max once a window of steps "
                   f"{'-' if settled is None else f'{settled:.3f}'}")
    alerts = ", ".join(rec["timeline"]) or "none"
    return f"run {rec['run']}: " + "; ".join(out) + f"\n    alerts: {alerts}"


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=sorted(n for n, c in S.CASES.items() if not c.two_hosts),
                   help="a single-host case of the fault suite")
    p.add_argument("--runs", type=int, default=5, help="runs of the case (default 5)")
    p.add_argument("--out", help="append each run's series here (JSON lines)")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error("--runs must be >= 1")
    with tempfile.TemporaryDirectory(prefix="rs-e2e-series-") as d:
        suite = S.Suite(Path(d)).start()
        cfg = suite.cfg
        limit = float(cfg["thresholds"]["straggler_ratio"])
        window_s = duration_seconds(cfg["windows"]["rate"])
        try:
            for i in range(a.runs):
                rec = run_once(suite, a.case, i)
                if a.out:
                    with open(a.out, "a") as f:
                        f.write(json.dumps(rec) + "\n")
                print(summary(rec, limit, window_s), flush=True)
        finally:
            suite.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
