"""Where the hooks' cost on a 2-rank gloo DDP step goes: one suspect toggled at a time.

    .venv/bin/python bench/hooks_suspects.py [--rounds 7] [--steps 60] [--variants plain,full,...]

Same step as ``ranksight bench hooks`` (64->512->512->8 MLP, batch 32, one thread per rank,
gloo). Every variant runs once per round, in a rotated order (interleaved), each run on its own
DDP instance after untimed warm-up steps. Reported per variant: the median over rounds of the
process CPU time per rank-step (both ranks averaged) and of the training thread's CPU time, and
their difference to "plain" (another DDP instance, never watched). CPU time, not wall time: the
box is shared, and CPU time does not count the time another process holds a core.

Variants (each is "full" with ONE thing removed, unless said otherwise):
  plain           no watch
  plain_rate1     no watch, but DDP's runtime-stats sample rate set to 1 (what the old DDPStats did)
  full            ranksight.watch as shipped
  no_ddpstats     without DDP's reducer timer (no comm time for gloo DDP)
  no_bwd_wrap     torch.autograd.backward not wrapped
  no_fwd_hooks    the watcher's forward pre/post hooks removed
  no_thread       the watcher's background thread stopped (records pile up in the queue)
  no_lints        every lint off (their thread and forward hook too)
  no_comm_patches the torch.distributed collectives and Work.wait not wrapped
All variants run on ONE DDP instance (gloo: the hooks register no comm hook; two instances of the
same model differed by up to 150 us of CPU per step by themselves on this box).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

VARIANTS = ("plain", "plain_rate1", "full", "no_ddpstats", "no_bwd_wrap", "no_fwd_hooks", "no_thread", "no_lints",
            "no_comm_patches")


def _worker() -> None:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight
    from ranksight import config as rs_config

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    rounds, steps = int(os.environ["RS_ROUNDS"]), int(os.environ["RS_STEPS"])
    variants = os.environ["RS_VARIANTS"].split(",")
    url = os.environ["RS_AGENT"]
    quiet = {"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}
    nolint = {"hooks": dict(quiet["hooks"]), "lints": {k: False for k in rs_config.SCHEMA["lints"]}}
    dist.init_process_group("gloo", rank=rank, world_size=ws)

    def make() -> Any:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
        ddp = nn.parallel.DistributedDataParallel(m)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)

    shared = make()  # one DDP instance for every variant: on gloo the hooks register no comm hook, and
    models = {v: shared for v in variants}  # separate instances differ by +-150 us/step by themselves
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(32, 64, generator=g), torch.randn(32, 8, generator=g)) for _ in range(8)]
    warm = 10
    batches = [data[i % len(data)] for i in range(steps + warm)]

    def loop(model: Any, opt: Any, loader: Any) -> Dict[str, float]:
        it = iter(loader)
        for _ in range(warm):
            x, y = next(it)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        for x, y in it:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return {"cpu": (time.process_time() - c0) / steps, "main": (time.thread_time() - m0) / steps,
                "wall": (time.perf_counter() - t0) / steps}

    def run(v: str) -> Dict[str, float]:
        model, opt = models[v]
        if v.startswith("plain"):
            if v == "plain_rate1":
                model._set_ddp_runtime_logging_sample_rate(1)
            try:
                return loop(model, opt, batches)
            finally:
                if v == "plain_rate1":
                    model._set_ddp_runtime_logging_sample_rate(100)
        loader = ranksight.watch(model, opt, batches, agent=url, config=nolint if v == "no_lints" else quiet)
        w = ranksight.hooks.current()
        assert w is not None
        if v == "no_ddpstats" and w._ddp_stats is not None:
            w._ddp_stats.close()
            w._ddp_stats = None
        elif v == "no_bwd_wrap":
            torch.autograd.backward = torch.autograd.backward.__wrapped__
        elif v == "no_fwd_hooks":
            for h in w._handles[:2]:
                h.remove()
        elif v == "no_thread":
            w._stop.set()
            w._thread.join()
        elif v == "no_comm_patches":  # torch.distributed collectives and Work.wait unwrapped
            for obj, name, old, new, had in list(w._patcher._patches):
                if obj is dist or name == "wait":
                    setattr(obj, name, old)
        try:
            return loop(model, opt, loader)
        finally:
            ranksight.unwatch()

    for v in variants:  # warm-up (DDP rebuilds buckets on its second iteration)
        run(v)
    out: Dict[str, List[Dict[str, float]]] = {v: [] for v in variants}
    for i in range(rounds):
        order = variants[i % len(variants):] + variants[:i % len(variants)]
        for v in order:
            out[v].append(run(v))
    dist.barrier()
    dist.destroy_process_group()
    print("SUSPECTS " + json.dumps({"rank": rank, "runs": out}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    variants = a.variants.split(",")
    bad = [v for v in variants if v not in VARIANTS]
    if bad or a.rounds < 1 or a.steps < 1:
        print(f"error: unknown variants {bad} (choose from {', '.join(VARIANTS)})" if bad else "error: --rounds/--steps >= 1")
        return 2
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from ranksight.hooks.bench import _Sink

    sink = _Sink()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    try:
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1", RS_ROUNDS=str(a.rounds), RS_STEPS=str(a.steps),
                       RS_VARIANTS=",".join(variants), RS_AGENT=sink.url, RANKSIGHT_JOB="bench-suspects")
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=1800) for p in procs]
    finally:
        for pr in procs:
            if pr.poll() is None:
                pr.kill()
                pr.wait()
        sink.close()
    res = []
    for pr, (o, e) in zip(procs, outs):
        if pr.returncode != 0:
            print(f"error: a rank exited {pr.returncode}: {e.strip().splitlines()[-3:]}")
            return 1
        res.append(json.loads(next(l for l in o.splitlines() if l.startswith("SUSPECTS "))[9:])["runs"])
    med = statistics.median
    table: Dict[str, Dict[str, float]] = {}
    for v in variants:
        cpu = [(a_["cpu"] + b_["cpu"]) / 2 for a_, b_ in zip(res[0][v], res[1][v])]
        main_ = [(a_["main"] + b_["main"]) / 2 for a_, b_ in zip(res[0][v], res[1][v])]
        wall = [a_["wall"] for a_ in res[0][v]]
        table[v] = {"cpu_us": 1e6 * med(cpu), "main_us": 1e6 * med(main_), "wall_ms": 1e3 * med(wall)}
        if "plain" in variants:
            pc = [(a_["cpu"] + b_["cpu"]) / 2 for a_, b_ in zip(res[0]["plain"], res[1]["plain"])]
            pm = [(a_["main"] + b_["main"]) / 2 for a_, b_ in zip(res[0]["plain"], res[1]["plain"])]
            pw = [a_["wall"] for a_ in res[0]["plain"]]
            table[v]["cpu_added_us"] = 1e6 * med(x - y for x, y in zip(cpu, pc))
            table[v]["main_added_us"] = 1e6 * med(x - y for x, y in zip(main_, pm))
            table[v]["wall_ratio"] = med(x / y for x, y in zip(wall, pw))
    out = {"rounds": a.rounds, "steps": a.steps, "load_average": [round(x, 2) for x in os.getloadavg()],
           "variants": {v: {k: round(x, 4 if k == "wall_ratio" else 1) for k, x in d.items()} for v, d in table.items()}}
    if a.json:
        print(json.dumps(out))
    else:
        print(f"{'variant':14s} {'cpu us/rank-step':>17s} {'added':>8s} {'main thr':>9s} {'added':>8s} {'wall ms':>8s} {'wall ratio':>10s}")
        for v, d in table.items():
            print(f"{v:14s} {d['cpu_us']:17.1f} {d.get('cpu_added_us', 0):8.1f} {d['main_us']:9.1f} "
                  f"{d.get('main_added_us', 0):8.1f} {d['wall_ms']:8.3f} {d.get('wall_ratio', 1):10.4f}")
        print(f"(median of {a.rounds} interleaved rounds x {a.steps} steps; load average {out['load_average']})")
    return 0


if __name__ == "__main__":
    if "--worker" in sys.argv:
        _worker()
    else:
        sys.exit(main())
