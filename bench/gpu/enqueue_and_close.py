"""Two GPU-timing rules of the hooks, checked on a real GPU (tests/gpu/test_gpu_enqueue_and_close.py).

    python bench/gpu/enqueue_and_close.py CASE --out result.json [--smoke]

Cases (each in its own process, one-rank NCCL group on cuda:0):

  enqueue_async  a host-bound step: after backward, an ``all_reduce(async_op=True)`` + ``wait()``
                 whose enqueue takes ENQUEUE seconds of host time (a wrapper that sleeps before
                 the real call) while the GPU idles. The start event is recorded after the call
                 returned, so comm must not contain that enqueue (ENQUEUE per step if it did).
  enqueue_sync   the same with a synchronous ``all_reduce``: the call itself is the wait, its start
                 event comes before the call, so comm contains the enqueue (unchanged).
  enqueue_ddp    DDP (our comm hook) whose bucket all-reduces take ENQUEUE to enqueue
                 (``ProcessGroup.allreduce`` wrapped while measuring): same rule as enqueue_async.
  close          a GPU-bound step (4 x Linear 4096, batch 2048, fp32) for 12 steps without any
                 synchronization, then ``unwatch()`` at once: the GPU is still several steps behind.
                 ``close()`` must wait for the pending intervals (bounded, ``query()`` only, under
                 sync debug mode "error") and send them: the records' fwd/bwd/opt sums must match
                 the script's own CUDA events around the same calls (the last steps' GPU times
                 are sent).

The enqueue cases measure 6 steps between two synchronize + *flush steps* (``optimizer.step()``
without gradients: its record takes every interval still pending), as bench/gpu/scenarios.py does.

``--smoke`` runs the same code on this CPU machine (gloo, and a stand-in for CUDA events behind
the hooks' CudaTimeline: an idle GPU for the enqueue cases, a GPU busy until 0.1 s after the loop
for close) to check the script itself; the numbers only mean something on a GPU.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_workload as W  # noqa: E402

CASES = ("enqueue_async", "enqueue_sync", "enqueue_ddp", "close")
ENQUEUE = 0.02  # seconds of host time per slow enqueue
MEASURED = 6


class _StandInGPU:
    """--smoke only: CUDA events stand-in (see tests/integration/test_hooks.py): reached when recorded, unless busy."""

    def __init__(self) -> None:
        self.busy = False
        self.cuda = self

    def current_stream(self, device: Any = None) -> None:
        return None

    def Event(self, enable_timing: bool = True) -> "_StandInEvent":  # noqa: N802
        return _StandInEvent(self)


class _StandInEvent:
    def __init__(self, gpu: _StandInGPU) -> None:
        self.gpu, self.t = gpu, None

    def record(self, stream: Any = None) -> None:
        self.t = time.perf_counter()

    def query(self) -> bool:
        return not self.gpu.busy and self.t is not None

    def elapsed_time(self, end: "_StandInEvent") -> float:
        return (end.t - self.t) * 1e3


def _standin(w: Any) -> _StandInGPU:
    from ranksight.hooks.timing import CudaTimeline

    gpu = _StandInGPU()
    tl = CudaTimeline(gpu, "stand-in", 256)
    w._tl = w.comm.timeline = tl
    w.comm.comm_events = True
    w._read_cuda_memory = lambda: None
    return gpu


def run(case: str, smoke: bool) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight
    from ranksight.tools.receiver import Receiver

    if smoke:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{W.free_port()}", rank=0, world_size=1)
        sync: Callable[[], None] = lambda: None  # noqa: E731
        debug: Callable[[Any], None] = lambda mode: None  # noqa: E731
    else:
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        W.init_nccl_world1(dev)
        sync = torch.cuda.synchronize
        debug = torch.cuda.set_sync_debug_mode
    torch.manual_seed(0)
    out: Dict[str, Any] = {"case": case, "smoke": smoke, "versions": W.versions(), "enqueue_s": ENQUEUE}
    rx = Receiver()
    try:
        if case == "close":
            out.update(_close(torch, nn, ranksight, rx, dev, smoke, sync, debug))
        else:
            out.update(_enqueue(case, torch, dist, nn, ranksight, rx, dev, smoke, sync))
        out["invalid_datagrams"] = rx.invalid[:5]
    finally:
        rx.close()
        W.destroy_pg()
    return out


def _enqueue(case: str, torch: Any, dist: Any, nn: Any, ranksight: Any, rx: Any, dev: Any, smoke: bool,
             sync: Callable[[], None]) -> Dict[str, Any]:
    model: Any = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).to(dev)
    if case == "enqueue_ddp":
        model = nn.parallel.DistributedDataParallel(model, device_ids=None if smoke else [0])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, 1024, device=dev)
    t = torch.ones(1 << 16, device=dev)
    slow = [False]
    real_all_reduce = dist.all_reduce
    pg_cls = dist.ProcessGroup
    real_pg_allreduce = pg_cls.allreduce

    def all_reduce(*a: Any, **k: Any) -> Any:  # wrapped by the hooks at watch(): what they time
        if slow[0]:
            time.sleep(ENQUEUE)
        return real_all_reduce(*a, **k)

    def pg_allreduce(self: Any, *a: Any, **k: Any) -> Any:  # what our DDP comm hook calls
        if slow[0]:
            time.sleep(ENQUEUE)
        return real_pg_allreduce(self, *a, **k)

    if case == "enqueue_ddp":
        pg_cls.allreduce = pg_allreduce
    else:
        dist.all_reduce = all_reduce
    try:
        loader = ranksight.watch(model, opt, [x] * (3 + MEASURED), agent=rx.url, config=W.QUIET_HOOKS)
        w = ranksight.hooks.current()
        if smoke:
            _standin(w)
        it = iter(loader)

        def step() -> None:
            xb = next(it)
            model(xb).square().mean().backward()
            if case == "enqueue_async":
                dist.all_reduce(t, async_op=True).wait()
            elif case == "enqueue_sync":
                dist.all_reduce(t)
            opt.step()
            opt.zero_grad(set_to_none=True)

        def flush() -> None:
            sync()
            opt.step()  # no gradients: no GPU work; its record takes every interval still pending

        for _ in range(3):
            step()
        flush()
        first = w.stats()["steps"] + 1
        slow[0] = True
        for _ in range(MEASURED):
            step()
        slow[0] = False
        flush()
        last = w.stats()["steps"]
        stats = w.stats()
        ranksight.unwatch()
    finally:
        dist.all_reduce = real_all_reduce
        pg_cls.allreduce = real_pg_allreduce
    rx.wait_for(lambda: rx.of("bye"), 5.0)
    recs = [s for s in rx.of("step") if first <= s["seq"] <= last]
    return {"stats": stats, "records": len(recs), "window": [first, last],
            "comm_per_step": sum(s["comm"] for s in recs) / MEASURED,
            "xcomm_per_step": sum(s["xcomm"] for s in recs) / MEASURED,
            "dur_per_step": sum(s["dur"] for s in recs[:-1]) / MEASURED}


def _close(torch: Any, nn: Any, ranksight: Any, rx: Any, dev: Any, smoke: bool, sync: Callable[[], None],
           debug: Callable[[Any], None]) -> Dict[str, Any]:
    steps = 12
    width, batch = (4096, 2048) if not smoke else (64, 16)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(4)]).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    x = torch.randn(batch, width, device=dev)
    for _ in range(2):  # warm-up, unwatched (cuBLAS set-up), then an idle GPU
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    loader = ranksight.watch(model, opt, [x] * steps, agent=rx.url, config=W.QUIET_HOOKS)
    w = ranksight.hooks.current()
    gpu = _standin(w) if smoke else None
    own: Dict[str, List[Any]] = {"fwd": [], "bwd": [], "opt": []}

    def ev() -> Any:
        if smoke:
            e = _StandInEvent(gpu)  # type: ignore[arg-type]
        else:
            e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    if gpu is not None:
        gpu.busy = True
    errors: List[str] = []
    debug("error")
    try:
        for xb in loader:
            a = ev()
            y = model(xb)
            b = ev()
            loss = y.square().mean()
            c = ev()
            loss.backward()
            d = ev()
            opt.step()
            e = ev()
            opt.zero_grad(set_to_none=True)
            own["fwd"].append((a, b))
            own["bwd"].append((c, d))
            own["opt"].append((d, e))
        pending_before = w._tl.pending
        if gpu is not None:
            threading.Timer(0.1, lambda: setattr(gpu, "busy", False)).start()
        t0 = time.perf_counter()
        ranksight.unwatch()  # no synchronize before: the GPU is still working on the last steps
        close_s = time.perf_counter() - t0
    except Exception:
        errors.append(traceback.format_exc())
        pending_before, close_s = -1, -1.0
    finally:
        debug(0)
    sync()
    rx.wait_for(lambda: rx.of("bye"), 5.0)
    recs = rx.of("step")
    hooks = {k: sum(s[k] for s in recs) for k in ("fwd", "bwd", "opt")}
    ref = {k: sum(s.elapsed_time(e) for s, e in v) / 1e3 for k, v in own.items()}
    return {"steps": steps, "records": len(recs), "seqs": [s["seq"] for s in recs][-3:],
            "pending_before_close": pending_before, "pending_after_close": w._tl.pending,
            "gpu_unsent": w.gpu_unsent, "close_seconds": close_s, "close_gpu_wait_s": w.gpu_wait_s,
            "hdrop": w._tl.dropped, "qdrop": w.qdrop, "send_errors": w.stats()["send_errors"],
            "hook_errors": w.herr,
            "hooks": hooks, "reference": ref, "sync_debug_errors": errors,
            "rel_diff": {k: abs(hooks[k] - ref[k]) / ref[k] if ref[k] > 0 else None for k in ref}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("case", choices=CASES)
    p.add_argument("--out", required=True)
    p.add_argument("--smoke", action="store_true", help="CPU: gloo and a stand-in for CUDA events")
    a = p.parse_args()
    try:
        res = run(a.case, a.smoke)
    except Exception:
        res = {"case": a.case, "crashed": traceback.format_exc()}
    Path(a.out).write_text(json.dumps(res, indent=1, default=str) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k not in ("versions", "stats")}, default=str))
    return 0 if "crashed" not in res else 1


if __name__ == "__main__":
    sys.exit(main())
