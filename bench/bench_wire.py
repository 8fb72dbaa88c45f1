#!/usr/bin/env python3
"""Bytes on the wire of a "steps" datagram, per protocol version: ``python3 bench/bench_wire.py [--json]``.

A rank plays 1,000 steps (its totals have the digits of a running job), then a record of
``--steps`` steps (25: a 100 steps/s rank's background tick) is made by the hooks' encoder
(ranksight/record.py, as bench/exporter_load.py's Player makes it) for each version the hooks
can send: 2, 3, 4 (the default: 3 and the step's samples, tokens, FLOPs per token and loss) and
3 and 4 with step detail (hooks.step_detail). Step durations carry
six significant digits, the phases their usual shares of them, as measured values do. Prints each
datagram's bytes, how many steps one datagram holds and the median microseconds the hooks'
background thread takes to make it (lists, totals, text; interleave runs to compare: the box is
shared).
Torch-free.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from exporter_load import PHASE_SHARE, Player  # noqa: E402
from ranksight import protocol as P  # noqa: E402
from ranksight import record  # noqa: E402

IDENT = dict(job="train-llm-70b", rank=1023, lr=7, ws=1024, node="gpu-node-0127", pid=123456, sess=1234567890)


ARMS = (("v2", (2, True)), ("v3", (3, False)), ("v3+detail", (3, True)), ("v4", (4, False)), ("v4+detail", (4, True)),
        ("v5", (5, False)), ("v5+detail", (5, True)))


def measure(steps: int, rounds: int = 21, reps: int = 200) -> Dict[str, Dict[str, float]]:
    out: Dict[str, Dict[str, float]] = {}
    players, batches = {}, {}
    for name, key in ARMS:
        rng = random.Random(7)
        pl = players[name] = Player(IDENT, P.SENDER_LAYOUTS[key])
        for _ in range(40):
            pl.steps([0.01 * rng.uniform(0.9, 1.1) for _ in range(25)], 1.7e9)
        data = pl.steps([0.01 * rng.uniform(0.9, 1.1) for _ in range(steps)], 1.7e9)
        out[name] = {"bytes": len(data), "steps": P.decode(data)["n"], "steps_per_datagram": pl.fill}
        batches[name] = [record.ALL.step_tuple(pl.seq + i, 0.0, dict({k: f * d for k, f in PHASE_SHARE}, micro=1))
                         for i, d in enumerate([0.01 * rng.uniform(0.9, 1.1) for _ in range(steps)], 1)]
    # the background thread's cost of one record (its lists, its steps added to the totals, its
    # text): rounds of ``reps`` records, the arms interleaved, in a rotating order
    times: Dict[str, List[float]] = {name: [] for name, _ in ARMS}
    for r in range(rounds):
        for name, _ in ARMS[r % 3:] + ARMS[:r % 3]:
            pl, batch = players[name], batches[name]
            t0 = time.perf_counter()
            for _ in range(reps):
                pl.record(batch, 1.7e9)
            times[name].append((time.perf_counter() - t0) / reps * 1e6)
    for name, _ in ARMS:
        out[name]["encode_us"] = round(statistics.median(times[name]), 1)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=25, help="steps in the record (default 25)")
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    res = measure(a.steps)
    if a.json:
        print(json.dumps(res))
        return 0
    base = res["v2"]["bytes"]
    for name, r in res.items():
        print(f"{name:10s} {r['bytes']:5d} bytes for {r['steps']} steps ({r['bytes'] / base:.2f} of v2); "
              f"{r['steps_per_datagram']} steps fit one datagram; {r['encode_us']} us to make it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
