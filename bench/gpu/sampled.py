"""Sampled GPU timing against every-step timing on the real GPU.

    python bench/gpu/sampled.py [--steps 96] [--rounds 2] [--out sampled.json]

``hooks.gpu_timing_every: 16`` times one step in 16 on average with CUDA events and gives every
step the shares of the GPU span over the timed steps of the last 30 s (their sums over the sum of
their spans) times its own host duration; ``0`` (the default) does the same with the gap chosen
from the events' measured cost (``hooks.gpu_timing_budget``). This runs the same loop watched
the three ways, interleaved (every step, sampled, auto, auto, sampled, every step, ...), on the GPU
workloads of ``gpu_workload.py``, DDP on an NCCL world of 1 (so the gradient all-reduce and its
exposed tail are there), under ``torch.cuda.set_sync_debug_mode("error")``, and reports per
phase the share of step time each way (sum of the phase over the sum of the step durations of the
measured records) and the CUDA events recorded per step. The dashboards and the rules read these
shares (rates of the phase counters over the step-time counter), so they are what must agree.

Workloads: the default step (batch 8, host and GPU about even), the GPU-bound one (batch 64) and
the host-bound tiny model.
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_workload as W  # noqa: E402

PHASES = ("fwd", "bwd", "opt", "xcomm", "comm")
ARMS = {"every": 1, "sampled": 16, "auto": 0}  # hooks.gpu_timing_every (0: the default, the gap from the cost)


def _config(every: int) -> Dict[str, Any]:
    return dict(W.QUIET_HOOKS, hooks=dict(W.QUIET_HOOKS["hooks"], gpu_timing_every=every))


def one_run(torch: Any, model: Any, opt: Any, x: Any, every: int, steps: int, warm: int) -> Dict[str, Any]:
    import ranksight
    from ranksight import hooks as rs_hooks

    rec = W.Receiver()
    loader = ranksight.watch(model, opt, W.batches(x, warm + steps), agent=rec.url, config=_config(every))
    w = rs_hooks.current()
    tl = w._tl if w is not None else None
    marked = [0]
    if tl is not None:
        mark = tl.mark

        def counting(own: bool = False) -> Any:
            ev = mark(own)
            marked[0] += ev is not None
            return ev

        tl.mark = counting
    timed = _watch_timed_steps(tl) if tl is not None and every != 1 else None
    errors: List[str] = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for xb in loader:
            W.train_step(model, opt, xb)
    except Exception:
        errors.append(traceback.format_exc(limit=12))
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    time.sleep(0.3)
    W.flush_step(opt)  # (every-step timing: the last steps' intervals land in this record)
    rec.wait_step(warm + steps + 1, timeout=10)
    stats = w.stats() if w is not None else {}
    ranksight.unwatch()
    time.sleep(0.2)
    recs = rec.steps()
    rec.close()
    s = W.sum_fields(recs, warm + 1, warm + steps + 1, fields=("dur",) + PHASES)
    out = {"shares": {k: s[k] / s["dur"] for k in PHASES if s["dur"] > 0}, "dur_s": s["dur"],
           "records": s["records"], "events_per_step": marked[0] / (warm + steps + 1),
           "every": stats.get("gpu_every"), "herr": stats.get("herr", 0), "sync_debug_errors": errors}
    # per step, in ms: every step's own phases (from its record), or each timed step's raw GPU
    # phases with its GPU span and its host duration (what the sampled shares are made of)
    if timed is None:
        sel = [r for r in recs if warm + 1 <= r["seq"] <= warm + steps + 1]
        out["per_step_ms"] = {k: W.median([r.get(k, 0.0) * 1e3 for r in sel]) for k in ("dur",) + PHASES}
    else:
        out["timed_steps"] = timed[1:]  # (the first is the warm-up's)
        out["per_timed_step_ms"] = {k: W.median([t[k] for t in timed[1:]]) for k in ("host", "span") + PHASES}
    return out


def _watch_timed_steps(tl: Any) -> List[Dict[str, float]]:
    """Sampled timing: each timed step's resolved GPU seconds by kind (its phases and its span) and
    its host duration, in ms, as they resolve (wraps the timeline's resolve and step_end)."""
    from ranksight.hooks.timing import SPAN

    out: List[Dict[str, float]] = []
    acc: Dict[str, float] = {}
    hosts: List[float] = []
    last = [None]
    resolve, step_end = tl.resolve, tl.step_end

    def watched_resolve(add: Any, limit: int = 1 << 30) -> int:
        if type(add) is not dict:  # (the watch's close drains with a callable)
            return resolve(add, limit)
        mine = {k: 0.0 for k in add}
        n = resolve(mine, limit)
        for k, v in mine.items():
            add[k] += v
            acc[k] = acc.get(k, 0.0) + v * 1e3
        if mine.get(SPAN, 0.0) > 0:
            row = {k: acc.get(k, 0.0) for k in PHASES}
            row["span"] = acc.get(SPAN, 0.0)
            row["host"] = hosts.pop(0) if hosts else float("nan")
            out.append(row)
            acc.clear()
        return n

    def watched_step_end(t: float) -> None:
        if tl.on and last[0] is not None:
            hosts.append((t - last[0]) * 1e3)
        last[0] = t
        step_end(t)

    tl.resolve, tl.step_end = watched_resolve, watched_step_end
    return out


def workload(torch: Any, name: str, spec: Any, dev: Any, steps: int, warm: int, rounds: int) -> Dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, opt, x = W.build(spec, dev)
    model = DDP(model, device_ids=[0])
    for _ in range(3):
        W.train_step(model, opt, x)
    torch.cuda.synchronize()
    runs: Dict[str, List[Dict[str, Any]]] = {a: [] for a in ARMS}
    for r in range(rounds):
        order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
        for arm in order:
            runs[arm].append(one_run(torch, model, opt, x, ARMS[arm], steps, warm))
    out: Dict[str, Any] = {"spec": W.spec_dict(spec), "steps": steps, "rounds": rounds, "runs": runs}
    for arm, rs in runs.items():
        out[arm] = {k: W.median([r["shares"].get(k, 0.0) for r in rs]) for k in PHASES}
        out[arm]["events_per_step"] = W.median([r["events_per_step"] for r in rs])
        out[arm]["step_ms"] = W.median([r["dur_s"] / max(1, r["records"]) for r in rs]) * 1e3
    out["every"]["per_step_ms"] = {k: W.median([r["per_step_ms"][k] for r in runs["every"]])
                                   for k in runs["every"][0]["per_step_ms"]}
    out["sampled"]["per_timed_step_ms"] = {k: W.median([r["per_timed_step_ms"][k] for r in runs["sampled"]])
                                           for k in runs["sampled"][0]["per_timed_step_ms"]}
    out["errors"] = [e for rs in runs.values() for r in rs for e in r["sync_debug_errors"]]
    out["herr"] = max(r["herr"] for rs in runs.values() for r in rs)
    out["auto"]["every"] = W.median([r["every"] or 0 for r in runs["auto"]])  # the gap it chose, at the end
    W.log(f"sampled: {name}: every/sampled/auto " + ", ".join(
        f"{k} {out['every'][k]:.3f}/{out['sampled'][k]:.3f}/{out['auto'][k]:.3f}" for k in PHASES)
        + f"; events/step {out['every']['events_per_step']:.2f}/{out['sampled']['events_per_step']:.2f}/"
          f"{out['auto']['events_per_step']:.2f} (auto's gap {out['auto']['every']})")
    e, t = out["every"]["per_step_ms"], out["sampled"]["per_timed_step_ms"]
    W.log(f"sampled: {name}: ms per step, every step / a timed step: host {e['dur']:.2f}/{t['host']:.2f} "
          f"(its GPU span {t['span']:.2f}), " + ", ".join(f"{k} {e[k]:.2f}/{t[k]:.2f}" for k in PHASES))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=96, help="measured steps per run (default 96: 6 timed at 1 in 16)")
    p.add_argument("--warm", type=int, default=8, help="steps before the measured ones in each run")
    p.add_argument("--rounds", type=int, default=2, help="runs of each arm, interleaved")
    p.add_argument("--out", help="write the result JSON here")
    a = p.parse_args(argv)
    if not W.cuda_available():
        print("bench/gpu/sampled.py: CUDA is not available on this machine; skipped")
        return 0
    import torch

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    W.init_nccl_world1(dev)
    out: Dict[str, Any] = {"versions": W.versions(), "phases": PHASES}
    try:
        for name, spec in (("default", W.ModelSpec()), ("gpu_bound", W.ModelSpec(batch=W.GPU_BOUND_BATCH)),
                           ("host_bound_tiny", W.ModelSpec.tiny())):
            out[name] = workload(torch, name, spec, dev, a.steps, a.warm, a.rounds)
            W.write_json(a.out, out)
    finally:
        W.destroy_pg()
    W.write_json(a.out, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
