#!/usr/bin/env python3
"""The agent's CPU under the exporter benchmark's steady load, A/B between a git revision and the
working tree: interleaved runs (A B, then B A, ...), the median of each side, the median of the
pair ratios (B / A) and their spread.

Both sides run the same load and the same benchmark script (this checkout's
bench/bench_exporter.py: 8 stand-in GPUs, 8 ranks at 100 steps/s as the hooks send them, a scrape
every 15 s); only the agent's code differs. Side A is ``--base`` (default HEAD) exported with
``git archive``; side B is the working tree. Each side's packages are laid out as the installed
package maps them (ranksight/ with dashboards/, alerts/, exporter/ and hooks/ inside) and put first on
the agent process's PYTHONPATH (bench_exporter.py's RANKSIGHT_BENCH_AGENT_PYTHONPATH).

    python3 bench/agent_ab.py [--base REV] [--pairs 5] [--cpu-seconds 20] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

from ranksight.console import fail

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "bench_exporter.py"


def overlay(tree: Path, dest: Path) -> Path:
    """``dest`` with ranksight/ laid out as pyproject.toml's package-dir maps ``tree``."""
    pkg = dest / "ranksight"
    pkg.mkdir(parents=True)
    for f in (tree / "ranksight").iterdir():
        if f.name != "__pycache__" and not f.name.endswith(".egg-info"):
            (pkg / f.name).symlink_to(f)
    for sub in ("dashboards", "alerts", "exporter", "hooks"):
        (pkg / sub).symlink_to(tree / sub)
    return dest


def one(path: Path, cpu_seconds: float) -> Dict:
    # the agent process alone runs the side's code; the load and the benchmark are this checkout's
    env = dict(os.environ, RANKSIGHT_BENCH_AGENT_PYTHONPATH=str(path), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, str(BENCH), "--json", "--scrapes", "5", "--rates", "", "--overload-rate", "0",
                          "--cpu-seconds", str(cpu_seconds)], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        fail(f"agent_ab: the benchmark failed: {out.stderr.strip().splitlines()[-1:]}", 1)
    r = json.loads(out.stdout)
    ing = r["cpu_window"]["ingest"]
    if set(ing) != {"ok"}:
        fail(f"agent_ab: the agent did not accept the load: {ing}", 1)
    return {"cpu": r["agent_cpu_percent"], "rss": r["agent_rss_mb"]}


def main(argv: List[str] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="HEAD", help="git revision of side A (default HEAD)")
    p.add_argument("--pairs", type=int, default=5, help="A/B pairs (default 5)")
    p.add_argument("--cpu-seconds", type=float, default=20.0, help="CPU window of each run (default 20)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    if a.pairs < 1 or a.cpu_seconds <= 0:
        p.error("--pairs and --cpu-seconds must be positive")
    with tempfile.TemporaryDirectory(prefix="ranksight-ab-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        try:
            arch = subprocess.run(["git", "-C", str(ROOT), "archive", a.base], capture_output=True, check=True).stdout
        except subprocess.CalledProcessError as e:
            fail(f"agent_ab: cannot export {a.base!r}: {e.stderr.decode().strip()}", 1)
        subprocess.run(["tar", "-x", "-C", str(base)], input=arch, check=True)
        sides = {"A": overlay(base, Path(tmp) / "ov-a"), "B": overlay(ROOT, Path(tmp) / "ov-b")}
        runs: Dict[str, List[Dict]] = {"A": [], "B": []}
        for i in range(a.pairs):
            for s in ("AB" if i % 2 == 0 else "BA"):
                runs[s].append(one(sides[s], a.cpu_seconds))
                print(f"pair {i + 1} {s}: CPU {runs[s][-1]['cpu']:.3f}%", file=sys.stderr, flush=True)
    ca = [r["cpu"] for r in runs["A"]]
    cb = [r["cpu"] for r in runs["B"]]
    ratios = sorted(b / x for x, b in zip(ca, cb))
    res = {"base": a.base, "pairs": a.pairs, "cpu_seconds": a.cpu_seconds,
           "cpu_percent": {"A": statistics.median(ca), "B": statistics.median(cb), "A_runs": ca, "B_runs": cb},
           "rss_mb": {"A": statistics.median(r["rss"] for r in runs["A"]), "B": statistics.median(r["rss"] for r in runs["B"])},
           "ratio_B_over_A": {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        c, r = res["cpu_percent"], res["ratio_B_over_A"]
        print(f"agent CPU, {a.pairs} interleaved pairs of {a.cpu_seconds:g} s: A ({a.base}) {c['A']:.3f}%  "
              f"B (working tree) {c['B']:.3f}%  ratio B/A median {r['median']:.3f} (pairs {r['min']:.3f}..{r['max']:.3f})")
        print(f"RSS A {res['rss_mb']['A']:.1f} MB  B {res['rss_mb']['B']:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
