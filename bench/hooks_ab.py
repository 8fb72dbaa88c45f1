"""The hooks' host time per step, two commits of this checkout side by side, interleaved.

    .venv/bin/python bench/hooks_ab.py BASE [NEW] [--rounds 6] [--steps 1000] [--pairs 4]

Each commit's files (``git archive``) are made importable as ``ranksight`` from a folder of their
own (the layout ``pyproject.toml`` maps: ``ranksight.hooks`` -> ``hooks/`` ...); NEW defaults to the
work tree as it is (uncommitted changes included). Each round runs one process per commit, in
alternating order (ABBA), and each process measures with the benchmark of this checkout
(``bench/bench_hooks.py``, the same code for both): the per-method tables (CPU timing and the
stand-in CUDA timeline, ``--steps`` steps each) and ``--pairs`` interleaved A/B pairs of the trivial
step, watched against plain. Printed: per row the median over rounds of its p50 microseconds per
step (the median call's time x calls per step; a shared box's preemptions move it little), both
commits and their ratio; the totals; the trivial step's added CPU and training-thread time.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List

ROOT = Path(__file__).resolve().parents[1]
SUBPACKAGES = ("hooks", "exporter", "dashboards", "alerts")

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import bench_hooks as B
import hooks_methods as M
steps, pairs = int(sys.argv[2]), int(sys.argv[3])
sink = B._Sink()
try:
    tables = [M.table(steps, sink.url, B._quiet(False), tl) for tl in ("none", "stand-in")]
    triv = B._trivial(pairs, 300, sink.url)
finally:
    sink.close()
import ranksight.hooks as h
print("AB " + json.dumps({"file": h.__file__, "tables": tables, "cpu_added_us": triv["cpu_added_us"],
                          "main_added_us": triv["main_added_us"], "plain_us": triv["plain_us"]}))
"""


def overlay(commit: str, dest: Path) -> Path:
    """The commit's files under dest/tree and a PYTHONPATH root under dest/ov that imports them as
    ``ranksight`` (commit "" : the work tree as it is)."""
    tree, ov = dest / "tree", dest / "ov"
    tree.mkdir(parents=True)
    if commit:
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(tree)], input=arch.stdout, check=True)
    else:
        for name in ("ranksight",) + SUBPACKAGES:
            shutil.copytree(ROOT / name, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
    (ov / "ranksight").mkdir(parents=True)
    for f in (tree / "ranksight").iterdir():
        (ov / "ranksight" / f.name).symlink_to(f)
    for sub in SUBPACKAGES:
        (ov / "ranksight" / sub).symlink_to(tree / sub)
    return ov


def run_arm(ov: Path, steps: int, pairs: int) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ov), RANKSIGHT_JOB="bench-hooks-ab")
    r = subprocess.run([sys.executable, "-c", _CHILD, str(ROOT / "bench"), str(steps), str(pairs)],
                       capture_output=True, text=True, env=env, timeout=900, cwd=tempfile.gettempdir())
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("AB ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"the measuring process exited {r.returncode}: {r.stderr.strip().splitlines()[-3:]}")
    out = json.loads(line[3:])
    if not out["file"].startswith(str(ov)):
        raise RuntimeError(f"ranksight.hooks came from {out['file']}, not from {ov}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("base", help="the commit to compare against")
    p.add_argument("new", nargs="?", default="", help="the other commit (default: the work tree as it is)")
    p.add_argument("--rounds", type=int, default=6, help="rounds, one process per commit each (default 6)")
    p.add_argument("--steps", type=int, default=1000, help="steps of each per-method run (default 1000)")
    p.add_argument("--pairs", type=int, default=4, help="trivial-step A/B pairs per process (default 4)")
    p.add_argument("--json", help="write every round's figures here")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hooks-ab-"))
    try:
        arms = {"base": overlay(a.base, tmp / "base"), "new": overlay(a.new, tmp / "new")}
        res: Dict[str, List[Dict[str, Any]]] = {"base": [], "new": []}
        load = []
        for i in range(a.rounds):
            for arm in (("base", "new") if i % 2 == 0 else ("new", "base")):
                res[arm].append(run_arm(arms[arm], a.steps, a.pairs))
            load.append(os.getloadavg()[0])
            print(f"round {i + 1}/{a.rounds} done, load average {load[-1]:.1f}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"base": a.base, "new": a.new or "work tree", "rounds": res, "load": load}))
    med = statistics.median
    print(f"base {a.base}, new {a.new or 'the work tree'}: medians of {a.rounds} interleaved rounds; load average "
          f"{min(load):.1f}-{max(load):.1f} (a shared 2-core box)")
    for t, title in enumerate(("CPU timing", "stand-in CUDA timeline")):
        print(f"\n{title}: us per step (p50), {a.steps} steps a run")
        print(f"  {'method':28s} {'base':>8s} {'new':>8s} {'new/base':>8s}")
        names: List[str] = []
        for arm in ("base", "new"):
            for r in res[arm][0]["tables"][t]["rows"]:
                if r["method"] not in names:
                    names.append(r["method"])

        def row(arm: str, name: str) -> float:
            vals = [next((r["us_per_step_p50"] for r in x["tables"][t]["rows"] if r["method"] == name), 0.0)
                    for x in res[arm]]
            return med(vals)

        for name in names:
            b, n = row("base", name), row("new", name)
            print(f"  {name:28s} {b:8.2f} {n:8.2f} {n / b if b else float('nan'):8.2f}")
        tb = med(x["tables"][t]["total_us_per_step_p50"] for x in res["base"])
        tn = med(x["tables"][t]["total_us_per_step_p50"] for x in res["new"])
        print(f"  {'total':28s} {tb:8.2f} {tn:8.2f} {tn / tb:8.2f}")
    for key, what in (("cpu_added_us", "process CPU"), ("main_added_us", "training-thread CPU")):
        b, n = med(x[key] for x in res["base"]), med(x[key] for x in res["new"])
        print(f"trivial step, {what} added per step (median over rounds of {a.pairs}-pair medians): "
              f"base {b:.1f} us, new {n:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
