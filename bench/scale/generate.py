#!/usr/bin/env python3
"""Write the scale benchmark's OpenMetrics text without running Prometheus.

    .venv/bin/python bench/scale/generate.py --nodes 1024 --hours 1 --out /dev/shm/ranksight.om
    promtool tsdb create-blocks-from openmetrics /dev/shm/ranksight.om ./data

The series are the ones `ranksight bench scale` backfills (bench/scale/): every
rank, GPU and node family the agent exposes, one job of nodes x ranks-per-node ranks,
a few stragglers and one dataloader-bound node, one sample per --step. The last sample
is at --end (default: now). Prints series, samples and bytes written.
"""
from __future__ import annotations

import argparse
import sys
import time

from ranksight.console import error
from ranksight.tools.bench import load

scale = load("scale")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=scale._pos_int, default=1024)
    p.add_argument("--gpus", type=scale._pos_int, default=8)
    p.add_argument("--ranks-per-node", type=scale._pos_int, default=8)
    p.add_argument("--hours", type=scale._hours, default=1.0, help="hours (1) or a duration (10m)")
    p.add_argument("--step", type=scale._duration_arg, default=15)
    p.add_argument("--design", choices=scale.DESIGNS, default="as-is")
    p.add_argument("--end", type=int, default=None, help="unix time of the last sample (default: now)")
    p.add_argument("--out", required=True, help="output file")
    a = p.parse_args(argv)
    if a.ranks_per_node > a.gpus:
        p.error("--ranks-per-node cannot exceed --gpus")
    end = (a.end if a.end is not None else int(time.time())) // a.step * a.step
    samples = int(a.hours * 3600) // a.step + 1
    dl = a.nodes // 2 if a.nodes > 1 else 0
    scn = scale.Scenario(nodes=a.nodes, shape=scale.shape_for(a.design, a.gpus, a.ranks_per_node),
                         t0=end - (samples - 1) * a.step, samples=samples, step=a.step,
                         stragglers=tuple(r for r in scale.default_stragglers(a.nodes, a.ranks_per_node)
                                          if r // a.ranks_per_node != dl),
                         dataloader_node=dl)
    t0 = time.monotonic()
    try:
        with open(a.out, "w", buffering=1 << 22) as f:
            c = scale.Generator(scn).write(f, range(a.nodes))
    except OSError as e:
        return error(f"generate.py: cannot write {a.out}: {e.strerror or e}")
    dt = time.monotonic() - t0
    print(f"{c.series} series, {c.samples} samples, {c.bytes} bytes in {dt:.1f} s "
          f"({dt / max(c.samples, 1) * 1e9:.0f} ns/sample) -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
