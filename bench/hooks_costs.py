"""What each hook costs the training thread on the bench's 2-rank gloo DDP step, timed in place.

    .venv/bin/python bench/hooks_costs.py [--steps 500]

Same step as ``ranksight bench hooks`` (64->512->512->8 MLP, batch 32, gloo, one thread per
rank). Each hook method of the Watcher (and DDPStats.poll) is wrapped with a perf_counter_ns
timer; the backward wrapper's own cost is its total minus the time inside the real
``torch.autograd.backward``. Printed per rank: the median (and minimum) microseconds per call
after 50 warm-up steps. Unlike an A/B of whole steps, this is not drowned by other load on a
shared 2-core box (a preempted call moves the median little), but it does not see indirect
costs (cache pollution). The timers add about 0.1-0.3 us per call. Also printed: the CPU time
per step of the hooks' background threads (ranksight-hb: records and heartbeats; ranksight-lints),
from /proc/self/task/*/schedstat over the same steps.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

from ranksight.console import error
from ranksight.common.plumbing import free_port

HOOKS = ("_fwd_pre", "_fwd_post", "_opt_pre", "_opt_post", "_bwd_done", "_step_end")


def _thread_cpu_ns() -> Dict[int, int]:
    """CPU time (ns, /proc/self/task/*/schedstat) of every thread of this process."""
    out: Dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def _worker() -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight
    from ranksight.hooks import comm as comm_mod
    from ranksight.hooks import watcher as watcher_mod
    from bench_hooks import QUIET

    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    steps = int(os.environ["RS_STEPS"])
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
    ddp = nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)) for _ in range(8)]
    pc = time.perf_counter_ns
    costs: Dict[str, List[int]] = {}

    def timed(name: str, f: Any) -> Any:
        acc = costs.setdefault(name, [])

        def g(*a: Any, **k: Any) -> Any:
            t = pc()
            try:
                return f(*a, **k)
            finally:
                acc.append(pc() - t)
        return g

    for name in HOOKS:
        setattr(watcher_mod.Watcher, name, timed(name, getattr(watcher_mod.Watcher, name)))
    if hasattr(comm_mod, "DDPStats"):
        comm_mod.DDPStats.poll = timed("DDPStats.poll", comm_mod.DDPStats.poll)
    loader = ranksight.watch(ddp, opt, [data[i % 8] for i in range(steps)], agent=os.environ["RS_AGENT"], config=QUIET)
    w = ranksight.hooks.current()
    wrapped = torch.autograd.backward
    inner: List[int] = []
    outer: List[int] = []
    orig = wrapped.__wrapped__

    def orig_t(*a: Any, **k: Any) -> Any:
        t = pc()
        try:
            return orig(*a, **k)
        finally:
            inner.append(pc() - t)

    bw = w._wrap_backward(orig_t)

    def outer_t(*a: Any, **k: Any) -> Any:
        t = pc()
        try:
            return bw(*a, **k)
        finally:
            outer.append(pc() - t)

    torch.autograd.backward = outer_t
    t_iter: List[int] = []
    it = iter(loader)
    cpu0 = _thread_cpu_ns()
    while True:
        t = pc()
        try:
            x, y = next(it)
        except StopIteration:
            break
        t_iter.append(pc() - t)
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    cpu1 = _thread_cpu_ns()
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    threads = {names[tid]: round((v - cpu0.get(tid, 0)) / steps / 1e3, 1) for tid, v in cpu1.items()
               if names.get(tid, "").startswith("ranksight-")}
    torch.autograd.backward = wrapped
    ds = w._ddp_stats
    info = {k: getattr(ds, k) for k in ("samples", "estimated", "resyncs") if hasattr(ds, k)} if ds is not None else {}
    ranksight.unwatch()
    costs["backward wrapper (incl. _bwd_done)"] = [o - i for o, i in zip(outer, inner)]
    costs["loader next() (incl. the loader)"] = t_iter
    res = {k: [round(statistics.median(v[50:]) / 1e3, 2), round(min(v[50:]) / 1e3, 2)] for k, v in costs.items() if len(v) > 50}
    print("COSTS " + json.dumps({"rank": rank, "costs": res, "ddp_stats": info, "threads": threads}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    a = p.parse_args()
    if a.steps <= 50:
        return error("--steps must be above 50")
    from bench_hooks import _Sink

    sink = _Sink()
    port = free_port()
    procs = []
    try:
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                       OMP_NUM_THREADS="1", RS_STEPS=str(a.steps), RS_AGENT=sink.url, RANKSIGHT_JOB="bench-costs")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [pr.communicate(timeout=600) for pr in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        sink.close()
    for pr, (o, e) in zip(procs, outs):
        if pr.returncode != 0:
            return error(f"a rank exited {pr.returncode}: {e.strip().splitlines()[-3:]}", 1)
        d = json.loads(next(l for l in o.splitlines() if l.startswith("COSTS "))[6:])
        print(f"rank {d['rank']}  (us per call: median, min; DDPStats {d['ddp_stats']})")
        for k, (md, mn) in d["costs"].items():
            print(f"  {k:38s} {md:8.2f} {mn:8.2f}")
        for k, v in d["threads"].items():
            print(f"  thread {k:31s} {v:8.1f} us CPU per step")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker()
    else:
        sys.exit(main())
