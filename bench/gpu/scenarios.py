"""One GPU scenario per process: the hooks on a real bf16 transformer step, checked against
``torch.profiler`` and ``torch.cuda.set_sync_debug_mode("error")``.

    python bench/gpu/scenarios.py NAME [--steps N] [--out result.json] [--trace-dir DIR]

Scenarios (each in a fresh process: NCCL reads its environment at process-group creation,
and the sync debug mode is process-wide):

  nccl_ws1        one process, NCCL group of world size 1, plain model; after backward an
                  explicit synchronous all_reduce and an async all_gather_into_tensor + wait
                  (the hooks' wrapped collectives and Work.wait)
  ddp_ws1         DistributedDataParallel, world size 1 (the hooks' DDP comm hook)
  comm_fr         DDP ws1 + large out-of-place collectives, one after the other (an async
                  all_gather_into_tensor waited for, then a synchronous reduce_scatter_tensor),
                  TORCH_NCCL_ENABLE_TIMING=1 and
                  TORCH_NCCL_TRACE_BUFFER_SIZE=2000: collective time from the Flight Recorder
  comm_events     the same workload without the Flight Recorder: collective time from the
                  hooks' CUDA events (launch -> completion callback)
  fr_timing_only  as comm_fr but only TORCH_NCCL_ENABLE_TIMING=1 (no buffer size set)
  fr_position     where a blocked rank waits, from the Flight Recorder (its own procedure, below)

fr_position: NCCL world size 1, TORCH_NCCL_TRACE_BUFFER_SIZE=2000, a small model, hooks with
stack_after_seconds=1. A few steps, each with an all_reduce through torch.distributed and three
through the ProcessGroup object itself (C++ collectives the hooks' Python wrappers never see, as
DDP's are). Then the rank blocks, right after its last step (the sleep is calibrated before the
steps): the GPU sleeps ``HANG_SECONDS`` (``torch.cuda._sleep``), an async all_reduce is enqueued
behind it (NCCL's stream waits for the compute stream: enqueued, not completed) and the main
thread waits in ``torch.cuda.synchronize()``. The hooks must send
the main thread's stack with the collective it waits in (``cw``) as the Flight Recorder gives it:
op all_reduce, group default_pg, and the Flight Recorder's own sequence number of that
collective, which counts the C++ collectives too (the wrappers' count does not). The result
holds the stack records, the raw pending entry of the recorder's dump and what the wrappers'
own tracker would have said. ``--cpu-smoke``: the control flow on gloo, a host sleep instead.

Procedure (every scenario): watch() before the first step (as a user would), W warm-up steps
(DDP synchronizes once while it rebuilds its buckets in the 2nd step), a device synchronize and
a *flush step* (``optimizer.step()`` with no gradients: no GPU work, so its record takes every
interval still pending), then the profiler starts, sync debug mode "error" is set, N measured
steps run, the mode is reset, the profiler stops, a synchronize and a second flush step close
the window. The hooks' sums over the records of the N steps plus the second flush step are
exactly the intervals of the N steps; the profiler's are the GPU spans of the
``rs_fwd``/``rs_bwd``/``rs_comm``/``rs_opt`` ranges of the same N steps (``gpu_trace``).

Prints one JSON line (the summary) and writes the full result with ``--out``.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_trace as ktrace  # noqa: E402
import gpu_workload as W  # noqa: E402

SCENARIOS = ("nccl_ws1", "ddp_ws1", "comm_fr", "comm_events", "fr_timing_only", "fr_position")
HANG_SECONDS = 6.0
FR_ENV = ("TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")


def set_env(name: str) -> None:
    for k in FR_ENV:
        os.environ.pop(k, None)
    if name == "comm_fr":
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    elif name == "fr_timing_only":
        os.environ["TORCH_NCCL_ENABLE_TIMING"] = "1"
    elif name == "fr_position":
        os.environ["TORCH_NCCL_TRACE_BUFFER_SIZE"] = "2000"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def fr_window(dump: Optional[Dict[str, Any]], t0_ns: int, t1_ns: int) -> Dict[str, Any]:
    if dump is None:
        return {"available": False}
    entries = dump.get("entries", [])
    sel = [e for e in entries if t0_ns <= int(e.get("time_created_ns") or 0) <= t1_ns]
    durs = [e["duration_ms"] / 1e3 for e in sel if e.get("duration_ms") is not None]
    names: Dict[str, int] = {}
    sums: Dict[str, float] = {}
    for e in sel:
        n = e.get("profiling_name", "?")
        names[n] = names.get(n, 0) + 1
        if e.get("duration_ms") is not None:
            sums[n] = sums.get(n, 0.0) + e["duration_ms"] / 1e3
    return {"available": True, "entries_total": len(entries), "entries_window": len(sel),
            "with_duration": len(durs), "sum_s": sum(durs), "by_name": names, "sum_s_by_name": sums,
            "states": sorted({str(e.get("state")) for e in sel})}


def profiler_figures(trace: "ktrace.Trace") -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, rng in (("fwd", "rs_fwd"), ("bwd", "rs_bwd"), ("comm_range", "rs_comm"), ("opt", "rs_opt")):
        total, n = trace.span_total(rng)
        out[key] = total
        out[key + "_ranges"] = n
        out[key + "_event_span"] = trace.event_span_total(rng)
        out[key + "_busy"] = sum(trace.busy(r) for r in trace.ranges_named(rng))
    # the compute stream: where most forward work runs
    fwd_ops = [o for r in trace.ranges_named("rs_fwd") for o in trace.ops_launched_in(r.start, r.end)]
    streams: Dict[int, int] = {}
    for o in fwd_ops:
        streams[o.stream] = streams.get(o.stream, 0) + 1
    compute = max(streams, key=streams.get) if streams else -1
    rs = [r for name in ("rs_fwd", "rs_bwd", "rs_comm", "rs_opt") for r in trace.ranges_named(name)]
    if rs:
        lo, hi = min(r.start for r in rs), max(r.end for r in rs)
        ops = trace.ops_launched_in(lo, hi)
        side = ktrace.merge((o.start, o.end) for o in ops if o.stream != compute)
        out["collective_gpu_s"] = ktrace.union_length(side) / 1e6  # union of work on non-compute streams
        ov = trace.comm_overlap(min(o.start for o in ops) if ops else None, max(o.end for o in ops) if ops else None)
        out["hta_comm_s"] = ov.comm_s
        out["hta_exposed_s"] = ov.exposed_s
        out["hta_overlap_ratio"] = ov.overlap_ratio
        out["nccl_kernels"] = ov.comm_kernels
        out["side_stream_ops"] = sum(1 for o in ops if o.stream != compute)
        names: Dict[str, int] = {}
        for o in ops:
            if o.stream != compute:
                k = o.name[:60]
                names[k] = names.get(k, 0) + 1
        out["side_stream_op_names"] = names
    out["compute_stream"] = compute
    return out


def trimmed_trace(path: Path, dest: Path, keep_ranges: int = 2) -> None:
    """A small copy of the profiler trace (GPU activities, their launches, the rs_* ranges) of the
    first ``keep_ranges`` measured steps: the CPU tests check ``gpu_trace`` on it."""
    data = json.loads(path.read_text())
    ev = data["traceEvents"]
    fwd = sorted((e for e in ev if e.get("cat") == ktrace.RANGE_CAT and e.get("name") == "rs_fwd"),
                 key=lambda e: e["ts"])
    if len(fwd) <= keep_ranges:
        return
    t_end = fwd[keep_ranges]["ts"]
    t_start = fwd[0]["ts"]
    keep_cats = set(ktrace.GPU_CATS) | set(ktrace.LAUNCH_CATS) | {ktrace.RANGE_CAT}
    launch_ok = set()
    out = []
    for e in ev:
        cat = e.get("cat")
        if cat in ktrace.LAUNCH_CATS or cat == ktrace.RANGE_CAT:
            if t_start <= e.get("ts", 0) < t_end:
                if cat in ktrace.LAUNCH_CATS:
                    launch_ok.add((e.get("args") or {}).get("correlation"))
                out.append({k: e[k] for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args") if k in e})
    for e in ev:
        if e.get("cat") in ktrace.GPU_CATS and (e.get("args") or {}).get("correlation") in launch_ok:
            a = e.get("args") or {}
            out.append({"ph": "X", "cat": e["cat"], "name": e["name"], "pid": e.get("pid"), "tid": e.get("tid"),
                        "ts": e["ts"], "dur": e.get("dur", 0),
                        "args": {k: a[k] for k in ("stream", "correlation", "device") if k in a}})
    for e in out:
        if e["cat"] in ktrace.LAUNCH_CATS:
            e["args"] = {"correlation": (e.get("args") or {}).get("correlation")}
        elif e["cat"] == ktrace.RANGE_CAT:
            e["args"] = {}
    assert all(e.get("cat") in keep_cats for e in out)
    with gzip.open(dest, "wt") as f:
        json.dump({"traceEvents": out, "note": "trimmed torch.profiler trace, H200, ranksight bench/gpu/scenarios.py"}, f)


def _device(torch: Any, dist: Any, smoke: bool, batch: int) -> Tuple[Any, Any, Callable[[], Any], Callable[[Any], Any], int, int]:
    """The device, its one-rank process group, the model spec, its synchronize and sync-debug-mode
    setter, and the element counts of the small and big collectives."""
    if smoke:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{W.free_port()}", rank=0, world_size=1)
        spec = W.ModelSpec.tiny()
        sync = lambda: None  # noqa: E731
        debug = lambda mode: None  # noqa: E731
        big_n = small_n = 1 << 12
    else:
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        W.init_nccl_world1(dev)
        spec = W.ModelSpec(batch=batch)
        sync = torch.cuda.synchronize
        debug = torch.cuda.set_sync_debug_mode
        small_n, big_n = 16 << 20, 128 << 20  # bf16: 32 MiB, 256 MiB
    return dev, spec, sync, debug, small_n, big_n


def _between(name: str, torch: Any, dist: Any, dev: Any, small_n: int, big_n: int) -> Optional[Callable[[], None]]:
    """The collectives a scenario runs between backward and the optimizer step (None: only DDP's own)."""
    if name == "nccl_ws1":
        buf = torch.randn(small_n, device=dev, dtype=torch.bfloat16)
        ag_out = torch.empty_like(buf)

        def between() -> None:
            dist.all_reduce(buf)  # synchronous: exposed time
            work = dist.all_gather_into_tensor(ag_out, buf, async_op=True)
            work.wait()
        return between
    if name != "ddp_ws1":
        big = torch.randn(big_n, device=dev, dtype=torch.bfloat16)
        big_out = torch.empty_like(big)
        rs_out = torch.empty_like(big)

        def between() -> None:
            # The gather completes before the reduce-scatter starts. A synchronous collective runs
            # on the current stream (torch >= 2.7), an async one on NCCL's: issued back to back they
            # overlap on the GPU, the Flight Recorder's durations count the overlap twice while the
            # hooks' union counts it once (measured on an H100: 0.557 against 0.387 ms a step).
            work = dist.all_gather_into_tensor(big_out, big, async_op=True)
            work.wait()
            dist.reduce_scatter_tensor(rs_out, big)
        return between
    return None


def _compare(name: str, batch: int, trace_dir: Path, prof: Any, hooks: Dict[str, float]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The profiler's figures from its exported trace, and each hooks figure against the profiler's."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    tpath = trace_dir / f"{name}_b{batch}.trace.json"
    prof.export_chrome_trace(str(tpath))
    tr = ktrace.Trace.load(tpath)
    pf = profiler_figures(tr)
    if name == "ddp_ws1" and batch == 8:
        trimmed_trace(tpath, trace_dir / "h200_ddp_ws1_2steps.trace.json.gz")
    tpath.unlink()  # big; the trimmed copy is kept
    h = hooks
    cmp = {  # kernel spans: first GPU activity start .. last end of each range
        "fwd": (h["fwd"], pf["fwd"]),
        "opt": (h["opt"], pf["opt"]),
        "bwd": (h["bwd"], pf["bwd"]),
        "bwd_plus_tail": (h["bwd"] + h["xcomm"], pf["bwd"]),
        "comm_vs_collective_gpu": (h["comm"], pf.get("collective_gpu_s", 0.0)),
        # event spans: what an event pair around each range sees (includes the device waiting for the host)
        "fwd_event": (h["fwd"], pf["fwd_event_span"]),
        "opt_event": (h["opt"], pf["opt_event_span"]),
        "bwd_plus_tail_event": (h["bwd"] + h["xcomm"], pf["bwd_event_span"]),
    }
    return pf, {k: {"hooks_s": a, "profiler_s": b, "rel_diff": ktrace.rel_diff(a, b)} for k, (a, b) in cmp.items()}


def run(name: str, steps: int, warmup: int, trace_dir: Path, smoke: bool = False, batch: int = 8) -> Dict[str, Any]:
    """``smoke``: the same control flow on CPU with gloo and a tiny model (no CUDA events, no NCCL,
    no sync debug mode): a check of this script, not of the GPU paths."""
    set_env(name)
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import ranksight
    from ranksight import hooks as rs_hooks

    fr_mode = name in ("comm_fr", "fr_timing_only") and not smoke
    dev, spec, sync, debug, small_n, big_n = _device(torch, dist, smoke, batch)
    model, opt, x = W.build(spec, dev)
    result: Dict[str, Any] = {"scenario": name, "batch": batch, "versions": W.versions(), "spec": W.spec_dict(spec),
                              "params": W.n_params(model), "steps": steps, "warmup": warmup}
    if name != "nccl_ws1":
        model = DDP(model, device_ids=None if smoke else [0])
    between = _between(name, torch, dist, dev, small_n, big_n)

    rec = W.Receiver()
    loader = ranksight.watch(model, opt, W.batches(x, max(steps, warmup)), agent=rec.url, config=W.QUIET_HOOKS)
    w = rs_hooks.current()
    result["watch_stats_start"] = w.stats() if w is not None else None
    # Before each flush step: the heartbeat thread reads the Flight Recorder, and the flush step's
    # duration (time since the previous step ended) exceeds anything still pending, so the hooks'
    # carry-over (per-record values are capped at the record's duration) lands in it. The hooks
    # read the full recorder dump at most once a second (FlightRecorder.poll_timed), so with it
    # the settle is longer than that.
    settle = 1.6 if fr_mode else 0.5

    for i, xb in enumerate(loader):
        W.train_step(model, opt, xb, between=between)
        if i + 1 == warmup:
            break
    sync()
    time.sleep(settle)
    W.flush_step(opt)
    seq_f1 = warmup + 1
    t0_ns = time.time_ns()

    from torch.profiler import ProfilerActivity, profile

    prof = profile(activities=[ProfilerActivity.CPU] if smoke else [ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    errors: List[str] = []
    t_meas0 = time.perf_counter()
    debug("error")
    try:
        for i, xb in enumerate(loader):
            W.train_step(model, opt, xb, ranges=True, between=between)
            if i + 1 == steps:
                break
    except Exception:
        errors.append(traceback.format_exc(limit=20))
    finally:
        debug(0)
    t_host = time.perf_counter() - t_meas0
    prof.__exit__(None, None, None)
    sync()
    t1_ns = time.time_ns()
    time.sleep(settle)
    W.flush_step(opt)
    seq_f2 = seq_f1 + steps + 1
    got = rec.wait_step(seq_f2, timeout=10)
    stats = w.stats() if w is not None else None
    dump = W.fr_dump() if dist.is_initialized() else None
    ranksight.unwatch()
    time.sleep(0.2)
    recs = rec.steps()
    rec.close()

    hooks = W.sum_fields(recs, seq_f1 + 1, seq_f2)
    result.update(sync_debug_errors=errors, host_seconds_measured=t_host, records_complete=got,
                  stats_end=stats, invalid_datagrams=rec.invalid[:5], hooks=hooks,
                  hook_errors=max((r.get("herr", 0) for r in recs), default=0),
                  hdrop=max((r.get("hdrop", 0) for r in recs), default=0),
                  seqs=[r["seq"] for r in recs][-3:], flight_recorder=fr_window(dump, t0_ns, t1_ns))

    result["profiler"], result["compare"] = _compare(name, batch, trace_dir, prof, hooks)
    W.destroy_pg()
    return result


def _pending(dump: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The dump's collectives enqueued and not completed (per its pg_status), as plain fields."""
    if not dump:
        return []
    status = dump.get("pg_status") or {}
    out = []
    for e in dump.get("entries", []):
        st = status.get(str(e.get("pg_id"))) or {}
        done, enq = int(st.get("last_completed_collective", -1)), int(st.get("last_enqueued_collective", -1))
        seq = e.get("collective_seq_id")
        if isinstance(seq, int) and done < seq <= enq:
            out.append({"profiling_name": e.get("profiling_name"), "collective_seq_id": seq, "state": e.get("state"),
                        "process_group": list(e.get("process_group") or ()), "pg_id": e.get("pg_id")})
    return out


def run_fr_position(smoke: bool = False) -> Dict[str, Any]:
    set_env("fr_position")
    import threading

    import torch
    import torch.distributed as dist

    import ranksight
    from ranksight import hooks as rs_hooks
    from ranksight.hooks.comm import FlightRecorder

    if smoke:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{W.free_port()}", rank=0, world_size=1)
    else:
        dev = torch.device("cuda", 0)
        torch.cuda.set_device(dev)
        W.init_nccl_world1(dev)
    backend = dist.get_backend()
    model, opt, x = W.build(W.ModelSpec.tiny(), dev)
    buf = torch.ones(1 << 16, device=dev)
    pg = dist.distributed_c10d._get_default_group()

    def between() -> None:
        dist.all_reduce(buf)  # through torch.distributed: the hooks' wrappers see it
        for _ in range(3):  # the ProcessGroup's own method: a C++ collective, like DDP's bucket all-reduces
            pg.allreduce([buf]).wait()

    # Calibrated before the steps: the hooks count the rank idle from its last step, so any time
    # between that step and the blocked all_reduce would come off the collective's age in the first
    # stack (sent once the rank is idle stack_after_seconds).
    cycles = 0 if smoke else _sleep_cycles(torch, HANG_SECONDS)
    rec = W.Receiver()
    cfg = {"hooks": dict(W.QUIET_HOOKS["hooks"], stack_after_seconds=1.0, stack_every_seconds=1.0)}
    loader = ranksight.watch(model, opt, W.batches(x, 5), agent=rec.url, config=cfg)
    w = rs_hooks.current()
    for xb in loader:
        W.train_step(model, opt, xb, between=between)
    if not smoke:
        torch.cuda.synchronize()  # the steps' work is done: the blocked all_reduce is the one open entry
    seen: Dict[str, Any] = {}

    def look() -> None:  # mid-hang, off the main thread: what the recorder and the wrappers say
        try:
            seen["fr_waiting"] = FlightRecorder(backend).waiting()
            c10d = torch._C._distributed_c10d
            dump = getattr(c10d, "_dump_nccl_trace" if backend == "nccl" else "_dump_fr_trace", None)
            raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=False) if dump else b""
            doc = pickle.loads(raw) if raw else {}
            seen["pending"] = _pending(doc)
            seen["pg_status"] = doc.get("pg_status")
            seen["wrappers_waiting"] = w.comm.waiting(time.monotonic()) if w is not None else None
        except Exception:
            seen["look_error"] = traceback.format_exc(limit=5)

    t = threading.Timer(HANG_SECONDS / 2, look)
    t.start()
    t0 = time.monotonic()
    if smoke:
        time.sleep(HANG_SECONDS)  # no GPU: the main thread just waits
    else:
        torch.cuda._sleep(cycles)  # the GPU is busy; the all_reduce below waits behind it
        work = dist.all_reduce(buf, async_op=True)
        torch.cuda.synchronize()  # the main thread blocks here  (the stack's "where")
        work.wait()
    hang = time.monotonic() - t0
    t.join()
    time.sleep(0.3)
    stats = w.stats() if w is not None else None
    fr_used = w is not None and getattr(w, "_fr_status", None) is not None
    ranksight.unwatch()
    time.sleep(0.2)
    stacks = rec.of("stack")
    rec.close()
    W.destroy_pg()
    return {"scenario": "fr_position", "versions": W.versions(), "backend": backend, "smoke": smoke,
            "hang_seconds": hang, "fr_status_reader": fr_used, "stats_end": stats, "invalid_datagrams": rec.invalid[:5],
            "stacks": [{k: r.get(k) for k in ("where", "idle", "phase", "cw", "frames")} for r in stacks],
            "with_frames": [r.get("cw") for r in stacks if r.get("frames")], **seen}


def _sleep_cycles(torch: Any, seconds: float) -> int:
    """GPU clock cycles that ``torch.cuda._sleep`` spins for ``seconds`` (measured here). The first
    ``_sleep`` of a process also loads its kernel and finds the GPU at idle clocks: timed, it reads
    slow and the sleep that follows falls short (3.1 s for 6 s on an H100). So one untimed sleep
    first, then the faster of two timed ones."""
    n = 50_000_000
    torch.cuda._sleep(n // 10)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        torch.cuda._sleep(n)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return int(n / max(1e-6, best) * seconds)


def summary(r: Dict[str, Any]) -> Dict[str, Any]:
    s = {"scenario": r.get("scenario"), "batch": r.get("batch"), "errors": len(r.get("sync_debug_errors", [])),
         "herr": r.get("hook_errors"), "hdrop": r.get("hdrop")}
    for k, v in (r.get("compare") or {}).items():
        s[k] = f"hooks {v['hooks_s'] * 1e3:.2f} ms vs profiler {v['profiler_s'] * 1e3:.2f} ms ({v['rel_diff']:.1%})"
    fr = r.get("flight_recorder") or {}
    if fr.get("available"):
        s["flight_recorder"] = f"{fr['entries_window']} entries, {fr['sum_s'] * 1e3:.2f} ms"
    return s


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", choices=SCENARIOS)
    p.add_argument("--steps", type=int, default=20, help="measured steps (default 20)")
    p.add_argument("--batch", type=int, default=8,
                   help="sequences of 512 tokens per step (default 8: a 21 ms step, host-bound on an H200; "
                        f"{W.GPU_BOUND_BATCH} makes it GPU-bound)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up steps before the sync debug mode (default 3)")
    p.add_argument("--out", help="write the full result JSON here")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run the same control flow on CPU (gloo, tiny model): checks this script, not the GPU")
    p.add_argument("--trace-dir", default="/tmp/ranksight-gpu-traces", help="where profiler traces go")
    a = p.parse_args(argv)
    if a.steps < 1 or a.warmup < 3:
        p.error("--steps must be >= 1 and --warmup >= 3 (DDP synchronizes in its 2nd step)")
    if not W.cuda_available() and not a.cpu_smoke:
        r = {"scenario": a.name, "skipped": "CUDA is not available on this machine"}
        W.write_json(a.out, r)
        print(json.dumps(r))
        return 0
    try:
        if a.name == "fr_position":
            r = run_fr_position(smoke=a.cpu_smoke)
        else:
            r = run(a.name, a.steps, a.warmup, Path(a.trace_dir), smoke=a.cpu_smoke, batch=a.batch)
    except Exception:
        r = {"scenario": a.name, "crashed": traceback.format_exc(limit=30)}
        W.write_json(a.out, r)
        print(json.dumps({"scenario": a.name, "crashed": r["crashed"].strip().splitlines()[-1]}))
        sys.stderr.write(r["crashed"])
        return 1
    W.write_json(a.out, r)
    print(json.dumps(summary(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
