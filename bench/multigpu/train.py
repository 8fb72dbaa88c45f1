"""One rank of the multi-GPU runs (started by torchrun, NCCL, one process per GPU).

    torchrun --nproc-per-node N bench/multigpu/train.py TASK [options]

The step is the one of tests/gpu (``bench/gpu/gpu_workload.py``: 8-layer 1024-wide bf16
TransformerEncoder, AdamW), wrapped in DDP or FSDP2 (``fully_shard`` per layer and at the root).

Tasks
  comm      3 warm-up steps, a synchronize, a settle and a flush step (no GPU work: it takes every
            pending interval), then N steps under torch.profiler with record_function ranges, a
            synchronize, a settle and a second flush step. Each rank writes its hooks' sums over the
            N steps (+ flush) and the profiler's figures (``gpu_trace``: collective kernel union and
            HTA's exposed communication) to ``--out-dir/rank{R}.json``.
  run       trains for ``--seconds`` with the hooks sending to ``--agent`` (a real agent);
            ``--straggler-rank R`` sleeps ``--straggler-frac`` of its step inside the step;
            ``--hang-rank R --hang-step K`` stops rank R inside step K (after forward) for good,
            the others then block in NCCL. ``--item-every`` reads the loss every K steps (a loop
            that logs its loss).
  overhead  two copies of the model (same weights, each with its own DDP/FSDP2 and optimizer):
            phases of ``--steps`` steps alternate plain (copy A, never watched) and instrumented
            (copy B, watched for that phase), ``--reps`` pairs, all ranks in lockstep; rank 0 writes
            the per-phase step times.

Every rank keeps NCCL_NVLS_ENABLE=0 (NVLink multicast off), as the machines require.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))

import gpu_trace as ktrace  # noqa: E402
import gpu_workload as W  # noqa: E402

os.environ["NCCL_NVLS_ENABLE"] = "0"


def Forwarder(agent: Optional[str]) -> W.Receiver:
    """The rank's own receiver (for the per-rank sums) that forwards every datagram to the agent."""
    if agent and agent.startswith("udp://"):
        host, port = agent[len("udp://"):].rsplit(":", 1)
        return W.Receiver(forward=(host, int(port)))
    return W.Receiver()


SMOKE = os.environ.get("RANKSIGHT_MG_SMOKE") == "1"  # CPU + gloo + tiny model: checks these scripts only


def wrap(model: Any, mode: str, device: Any) -> Any:
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=None if device.type == "cpu" else [device.index])
    from torch.distributed.fsdp import fully_shard

    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def build(mode: str, batch: int, device: Any, seed: int = 0):
    import torch

    spec = W.ModelSpec.tiny() if SMOKE else W.ModelSpec(batch=batch)
    model, _, x = W.build(spec, device, seed=seed)
    model = wrap(model, mode, device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return spec, model, opt, x


def task_comm(a: argparse.Namespace, rank: int, device: Any) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    import ranksight
    from ranksight import hooks as rs_hooks

    spec, model, opt, x = build(a.mode, a.batch, device)
    rec = Forwarder(None)
    loader = ranksight.watch(model, opt, W.batches(x, max(a.steps, a.warmup)), agent=rec.url, config=W.QUIET_HOOKS)
    w = rs_hooks.current()
    for i, xb in enumerate(loader):
        W.train_step(model, opt, xb)
        if i + 1 == a.warmup:
            break
    torch.cuda.synchronize()
    dist.barrier()
    time.sleep(0.5)
    W.flush_step(opt)
    seq_f1 = a.warmup + 1
    t0_ns = time.time_ns()
    prof = profile(activities=[ProfilerActivity.CPU] if SMOKE else [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    t_host = time.perf_counter()
    for i, xb in enumerate(loader):
        W.train_step(model, opt, xb, ranges=True)
        if i + 1 == a.steps:
            break
    t_host = time.perf_counter() - t_host
    prof.__exit__(None, None, None)
    torch.cuda.synchronize()
    t1_ns = time.time_ns()
    time.sleep(0.5)
    W.flush_step(opt)
    seq_f2 = seq_f1 + a.steps + 1
    ok = rec.wait_step(seq_f2)
    stats = w.stats() if w is not None else None
    dump = W.fr_dump()
    ranksight.unwatch()
    time.sleep(0.2)
    recs = rec.steps()
    rec.close()
    hooks = W.sum_fields(recs, seq_f1 + 1, seq_f2)
    tdir = Path(a.out_dir) / "traces"
    tdir.mkdir(parents=True, exist_ok=True)
    tpath = tdir / f"{a.tag}_rank{rank}.trace.json"
    prof.export_chrome_trace(str(tpath))
    tr = ktrace.Trace.load(tpath)
    rs = [r for n in ("rs_fwd", "rs_bwd", "rs_opt") for r in tr.ranges_named(n)]
    lo = min(r.start for r in rs)
    hi = max(r.end for r in rs)
    ops = tr.ops_launched_in(lo, hi)
    ov = tr.comm_overlap(min((o.start for o in ops), default=None), max((o.end for o in ops), default=None))
    if not a.keep_traces:
        tpath.unlink()
    fr = None
    if dump is not None:
        sel = [e for e in dump.get("entries", []) if t0_ns <= int(e.get("time_created_ns") or 0) <= t1_ns]
        durs = [e["duration_ms"] / 1e3 for e in sel if e.get("duration_ms") is not None]
        fr = {"entries": len(sel), "with_duration": len(durs), "sum_s": sum(durs)}
    return {"task": "comm", "tag": a.tag, "rank": rank, "mode": a.mode, "batch": a.batch, "steps": a.steps,
            "records_complete": ok, "stats": stats, "hooks": hooks, "host_seconds": t_host,
            "profiler": {"comm_s": ov.comm_s, "exposed_s": ov.exposed_s, "overlap_s": ov.overlap_s,
                         "overlap_ratio": ov.overlap_ratio, "comm_kernels": ov.comm_kernels,
                         "fwd_span_s": tr.span_total("rs_fwd")[0], "bwd_span_s": tr.span_total("rs_bwd")[0],
                         "opt_span_s": tr.span_total("rs_opt")[0]},
            "flight_recorder": fr, "herr": max((r.get("herr", 0) for r in recs), default=0)}


def task_run(a: argparse.Namespace, rank: int, device: Any) -> Dict[str, Any]:
    import torch

    import ranksight

    spec, model, opt, x = build(a.mode, a.batch, device)
    for _ in range(3):  # unwatched warm-up; also the reference step time for the straggler's sleep
        W.train_step(model, opt, x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(5):
        W.train_step(model, opt, x)
    torch.cuda.synchronize()
    step_ref = (time.perf_counter() - t) / 5
    rec = Forwarder(a.agent)
    n = int(a.seconds / max(step_ref, 1e-3)) + 10
    loader = ranksight.watch(model, opt, W.batches(x, n), agent=rec.url,
                             config=W.with_detail({"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}))
    straggler = rank == a.straggler_rank
    t_end = time.monotonic() + a.seconds
    step = 0
    hang_at = None
    for xb in loader:
        step += 1
        if straggler:
            time.sleep(a.straggler_frac * step_ref)
        out = model(xb)
        if rank == a.hang_rank and step == a.hang_step:
            hang_at = time.time()
            Path(a.out_dir, f"hang_rank{rank}.json").write_text(json.dumps({"rank": rank, "step": step, "at": hang_at}))
            time.sleep(10 ** 6)  # stops inside the step for good; the launcher kills the job
        loss = out.float().square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if a.item_every and step % a.item_every == 0:
            loss.item()
        if time.monotonic() > t_end:
            break
    torch.cuda.synchronize()
    ranksight.unwatch()
    time.sleep(0.2)
    rec.close()
    steps = rec.steps()
    return {"task": "run", "tag": a.tag, "rank": rank, "steps": step, "step_ref_s": step_ref,
            "records": len(steps), "straggler": straggler,
            "sums": W.sum_fields(steps, 1, 10 ** 9, ("dur", "data", "xcomm", "comm", "ckpt", "fwd", "bwd", "opt"))}


def task_overhead(a: argparse.Namespace, rank: int, device: Any) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    import ranksight

    _, plain, popt, x = build(a.mode, a.batch, device, seed=0)
    _, inst, iopt, _ = build(a.mode, a.batch, device, seed=0)
    for m, o in ((plain, popt), (inst, iopt)):
        for _ in range(3):
            W.train_step(m, o, x)
    times: Dict[str, List[float]] = {"plain": [], "instrumented": []}
    for rep in range(a.reps):
        order = ("plain", "instrumented") if rep % 2 == 0 else ("instrumented", "plain")
        for which in order:
            data = W.batches(x, a.steps + a.warmup)
            if which == "instrumented":
                loader = ranksight.watch(inst, iopt, data, agent=a.agent or "off")
                m, o = inst, iopt
            else:
                loader, m, o = data, plain, popt
            time.sleep(a.settle)
            torch.cuda.synchronize()
            dist.barrier()
            t0 = 0.0
            for i, xb in enumerate(loader):
                if i == a.warmup:
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                W.train_step(m, o, xb)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / a.steps
            if which == "instrumented":
                ranksight.unwatch()
            times[which].append(dt)
    ratios = [b / p for p, b in zip(times["plain"], times["instrumented"])]
    return {"task": "overhead", "tag": a.tag, "rank": rank, "mode": a.mode, "batch": a.batch,
            "world": dist.get_world_size(), "reps": a.reps, "steps": a.steps,
            "plain_ms_median": W.median(times["plain"]) * 1e3,
            "instrumented_ms_median": W.median(times["instrumented"]) * 1e3,
            "ratio_median_of_pairs": W.median(ratios), "ratio_p25": W.quantile(ratios, 0.25),
            "ratio_p75": W.quantile(ratios, 0.75), "ratios": ratios}


def _cpu_cuda_shims(torch: Any) -> None:
    """Smoke mode only: the tasks' device synchronizations become no-ops on CPU."""
    torch.cuda.synchronize = lambda *a, **k: None


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=("comm", "run", "overhead"))
    p.add_argument("--mode", choices=("ddp", "fsdp2"), default="ddp")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--settle", type=float, default=0.8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--agent", default="")
    p.add_argument("--straggler-rank", type=int, default=-1)
    p.add_argument("--straggler-frac", type=float, default=0.2)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=50)
    p.add_argument("--item-every", type=int, default=0)
    p.add_argument("--tag", default="run")
    p.add_argument("--keep-traces", action="store_true")
    p.add_argument("--out-dir", required=True)
    a = p.parse_args(argv)
    import torch
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if SMOKE:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=180))
        _cpu_cuda_shims(torch)
    else:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device, timeout=timedelta(seconds=180))
    Path(a.out_dir).mkdir(parents=True, exist_ok=True)
    out = Path(a.out_dir) / f"{a.tag}_rank{rank}.json"
    try:
        r = {"comm": task_comm, "run": task_run, "overhead": task_overhead}[a.task](a, rank, device)
        r["versions"] = W.versions() if rank == 0 else None
        r["world"] = dist.get_world_size()
        out.write_text(json.dumps(r, indent=1, default=str))
        rc = 0
    except Exception:
        out.write_text(json.dumps({"task": a.task, "tag": a.tag, "rank": rank, "crashed": traceback.format_exc()}))
        traceback.print_exc()
        rc = 1
    try:
        dist.destroy_process_group()
    except Exception:
        pass
    return rc


if __name__ == "__main__":
    sys.exit(main())
