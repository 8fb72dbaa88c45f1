"""DeepSpeed on the GPU (one rank, NCCL world 1), the checks of tests/gpu/test_gpu_deepspeed.py:

    python bench/gpu/deepspeed_gpu.py engine --stage 2 --out r.json   # a plain engine loop, profiled
    python bench/gpu/deepspeed_gpu.py hf --stage 3 --out r.json       # the HF Trainer's deepspeed=

``engine``: the scenarios' bf16 ``TransformerEncoder`` (``gpu_workload.build``, batch 8 x 512) in a
DeepSpeed ZeRO engine (bf16, the client ``torch.optim.AdamW``), watched with
``ranksight.watch(engine, optimizer, loader)``; 3 warm-up steps, then 20 steps under
``torch.profiler`` with ``rs_fwd``/``rs_bwd``/``rs_opt`` ranges around ``engine(x)``,
``engine.backward(loss)`` and ``engine.step()``. The hooks' forward, backward (with its exposed
tail) and optimizer (the model step) are compared with the profiler's event span and kernel span
of each range, as ``scenarios.py`` does for DDP. A step with no GPU work (the engine's step hooks
run directly) closes the measured steps, after a synchronize, so their records hold every interval.

``hf``: a GPU-bound GPT-2 (``integrations.gpt2``) under the Trainer with ``RanksightCallback`` and
``deepspeed=`` a ZeRO config of ``--stage``, 12 steps of 2 micro-batches, the step records sent to
a validating receiver: the steps it counts against the Trainer's and DeepSpeed's.

DeepSpeed and the Trainer synchronize on their own (ZeRO's partition bookkeeping, the Trainer's
logging), so both cases run their measured steps under ``torch.cuda.set_sync_debug_mode("warn")``
and record every synchronization with its Python stack (``integrations.SyncRecorder``): one with a
ranksight frame on its stack is the hooks' (must be none).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gpu_trace as ktrace  # noqa: E402
import gpu_workload as W  # noqa: E402
from integrations import SyncRecorder, Tokens, gpt2  # noqa: E402
from scenarios import profiler_figures  # noqa: E402

WARM, STEPS, HF_STEPS, HF_ACCUM = 3, 20, 12, 2


def _world1() -> None:
    """One rank: torchrun's variables, so DeepSpeed and the Trainer take the process group."""
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(W.free_port()))


def _ds_config(stage: int, accum: int = 1, batch: Any = 8) -> Dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": accum,
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": True}, "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False}


def _flush(steps: Any) -> None:
    """A model step with no GPU work, for the hooks: the engine's step hooks run directly."""
    steps._run(steps._pre, "flush")
    steps._run(steps._post, "flush")


def run_engine(stage: int, trace_dir: Path) -> Dict[str, Any]:
    import torch
    import deepspeed
    from torch.profiler import ProfilerActivity, profile, record_function as rf

    import ranksight
    from ranksight import hooks as rs_hooks

    _world1()
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    deepspeed.init_distributed(dist_backend="nccl")
    spec = W.ModelSpec(batch=8)
    model, opt, x = W.build(spec, dev)
    engine, zopt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=_ds_config(stage, batch=spec.batch))
    result: Dict[str, Any] = {"case": "engine", "stage": stage, "versions": W.versions(), "spec": W.spec_dict(spec),
                              "deepspeed": deepspeed.__version__, "steps": STEPS, "warmup": WARM}
    rec = W.Receiver()
    loader = ranksight.watch(engine, zopt, W.batches(x, max(STEPS, WARM)), agent=rec.url, config=W.QUIET_HOOKS)
    w = rs_hooks.current()

    def step(xb: Any, ranges: bool) -> None:
        with (rf("rs_fwd") if ranges else W._null()):
            out = engine(xb)
        loss = out.float().square().mean()
        with (rf("rs_bwd") if ranges else W._null()):
            engine.backward(loss)
        with (rf("rs_opt") if ranges else W._null()):
            engine.step()

    for i, xb in enumerate(loader):
        step(xb, False)
        if i + 1 == WARM:
            break
    torch.cuda.synchronize()
    time.sleep(0.5)
    _flush(w.optimizer)
    seq_f1 = WARM + 1
    sync = SyncRecorder()
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    prof.__enter__()
    errors: List[str] = []
    sync.start()
    try:
        for i, xb in enumerate(loader):
            step(xb, True)
            if i + 1 == STEPS:
                break
    except Exception:
        errors.append(traceback.format_exc(limit=20))
    finally:
        sync.stop()
    prof.__exit__(None, None, None)
    torch.cuda.synchronize()
    time.sleep(0.5)
    _flush(w.optimizer)
    seq_f2 = seq_f1 + STEPS + 1
    got = rec.wait_step(seq_f2, timeout=10)
    stats = w.stats()
    ranksight.unwatch()
    time.sleep(0.2)
    recs = rec.steps()
    rec.close()
    hooks = W.sum_fields(recs, seq_f1 + 1, seq_f2)
    trace_dir.mkdir(parents=True, exist_ok=True)
    tpath = trace_dir / f"deepspeed_zero{stage}.trace.json"
    prof.export_chrome_trace(str(tpath))
    pf = profiler_figures(ktrace.Trace.load(tpath))
    tpath.unlink()
    cmp = {"fwd": (hooks["fwd"], pf["fwd"]), "bwd_plus_tail": (hooks["bwd"] + hooks["xcomm"], pf["bwd"]),
           "opt": (hooks["opt"], pf["opt"]), "fwd_event": (hooks["fwd"], pf["fwd_event_span"]),
           "bwd_plus_tail_event": (hooks["bwd"] + hooks["xcomm"], pf["bwd_event_span"]),
           "opt_event": (hooks["opt"], pf["opt_event_span"])}
    result.update(errors=errors, records_complete=got, stats_end=stats, hooks=hooks, profiler=pf,
                  engine_steps=engine.global_steps, invalid_datagrams=rec.invalid[:5],
                  hook_errors=max((r.get("herr", 0) for r in recs), default=0),
                  syncs=len(sync.syncs), ranksight_syncs=[s for s in sync.syncs if s["ours"]][:5],
                  sync_sample=sync.syncs[:3],
                  compare={k: {"hooks_s": a, "profiler_s": b, "rel_diff": ktrace.rel_diff(a, b)}
                           for k, (a, b) in cmp.items()})
    engine.destroy()
    W.destroy_pg()
    return result


def run_hf(stage: int, out_dir: str) -> Dict[str, Any]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ranksight.integrations.transformers import RanksightCallback

    _world1()
    rec = W.Receiver()
    os.environ["RANKSIGHT_AGENT"] = rec.url
    sync = SyncRecorder()

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == WARM:
                sync.start()

    cb = RanksightCallback(config=W.QUIET_HOOKS)
    stats: Dict[str, Any] = {}
    orig_end = cb.on_train_end

    def on_train_end(*a: Any, **k: Any) -> None:  # the stats just before the callback unwatches
        w = cb.watcher
        if w is not None:
            stats.update(w.stats(), optimizer=type(w.optimizer).__name__, model=type(w.model).__name__)
        sync.stop()
        orig_end(*a, **k)

    cb.on_train_end = on_train_end  # type: ignore[assignment]
    args = TrainingArguments(output_dir=out_dir, max_steps=HF_STEPS, per_device_train_batch_size=4,
                             gradient_accumulation_steps=HF_ACCUM, bf16=True, logging_steps=5, report_to="none",
                             save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
                             deepspeed=_ds_config(stage, "auto", "auto"))
    tr = Trainer(model=gpt2(), args=args, train_dataset=Tokens(HF_STEPS * HF_ACCUM * 4), callbacks=[Probe(), cb])
    try:
        tr.train()
    finally:
        sync.stop()
    torch.cuda.synchronize()
    time.sleep(0.3)
    steps = rec.steps()
    engine = tr.model_wrapped
    res = {"case": "hf", "stage": stage, "global_step": tr.state.global_step, "stats": stats,
           "engine": type(engine).__name__, "engine_steps": getattr(engine, "global_steps", None),
           "step_records": len(steps), "micro": sum(r.get("micro", 0) for r in steps),
           "invalid_datagrams": rec.invalid[:5], "syncs": len(sync.syncs),
           "ranksight_syncs": [s for s in sync.syncs if s["ours"]][:5], "sync_sample": sync.syncs[:3]}
    rec.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=("engine", "hf"))
    ap.add_argument("--stage", type=int, choices=(1, 2, 3), default=2)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    out_dir = tempfile.mkdtemp(prefix=f"rs-ds-{a.case}-")
    try:
        res = run_engine(a.stage, Path(out_dir)) if a.case == "engine" else run_hf(a.stage, out_dir)
    except Exception:
        res = {"crashed": traceback.format_exc()}
    W.write_json(a.out, res)
    if "crashed" in res:
        print(res["crashed"], file=sys.stderr)
    sys.exit(0 if "crashed" not in res else 1)


if __name__ == "__main__":
    main()
