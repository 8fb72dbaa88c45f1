"""The framework integrations on a GPU: sync checks and overhead (run on the GPU machine).

    python bench/gpu/integrations.py sync_hf --out r.json         # HF Trainer + RanksightCallback
    python bench/gpu/integrations.py sync_lightning --out r.json  # Lightning + RanksightCallback
    python bench/gpu/integrations.py overhead_hf --out r.json [--pairs 20 --steps 60]
    python bench/gpu/integrations.py overhead_lightning --out r.json
    python bench/gpu/integrations.py overhead_hf --out r.json --device cpu   # smoke run, tiny sizes

``sync_*``: a GPU-bound GPT-2 (8 layers, 1024 wide, bf16, batch 8 x 512) trained by the framework,
once with the callback and once without, in one process. After 3 warm-up steps
``torch.cuda.set_sync_debug_mode("warn")`` is on and every synchronization warning is recorded
with its Python stack; a sync whose stack passes through ranksight's own files is ours. The
framework's own syncs (logging, grad-norm) are in both runs: the result lists both counts and
every sync from a ranksight frame (``ranksight_syncs``: must be empty).

``overhead_*``: the framework's overhead with ``RanksightCallback`` against the same run without
it, on a GPU-bound step: a stack of ``--layers`` square ``--width`` linear layers (bf16 autocast,
fused AdamW) on ``--rows`` rows per step (default 8 x 4096 on 16384 rows: 13 TFLOP per step,
20-30 ms on an H200 by its FLOPs; each run prints the measured step time). The loader yields a small (rows, 64) float block per step, pinned
and copied without blocking (the HF Trainer's ``accelerator_config={"non_blocking": True}``;
Lightning's own transfer), and the model never reads a value back, so no step waits on the host
(no NaN filter, no grad-norm clip, no logging): the host runs ahead and the GPU stays busy. One
run of each arm counts the framework's syncs per step under sync debug mode (recorded).
``--pairs`` interleaved pairs (plain, watched; the order alternates) of ``--steps`` steps each,
after one untimed run of each arm; each run is timed from the end of step 5 to the end of its last
step with one ``torch.cuda.synchronize()`` at each end. The watched runs send to a real
``ranksight exporter`` subprocess (``--agent off``: nowhere). Prints and records the median
ratio (watched / plain), its IQR and min/max, the ratio of the median step times, and each arm's
median step time.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from gpu_workload import write_json  # noqa: E402

WARM = 3  # steps before sync debug mode is switched on


def _our_dirs() -> tuple:
    """The folders of ranksight's hooks and integrations (wherever the package is installed)."""
    import ranksight.hooks
    import ranksight.integrations

    return tuple(os.path.dirname(os.path.realpath(m.__file__)) + os.sep for m in (ranksight.hooks, ranksight.integrations))


def _lib_dirs() -> tuple:
    """torch's folder and the standard library's: frames that only pass a sync through."""
    import sysconfig

    import torch

    return tuple(os.path.realpath(d) + os.sep for d in (os.path.dirname(torch.__file__),
                                                         sysconfig.get_paths()["stdlib"]))


def _ours(stack: List[traceback.FrameSummary], dirs: Optional[tuple] = None, libs: Optional[tuple] = None) -> bool:
    """The sync is ranksight's: the innermost frame of the stack (outermost first) that is not
    torch's or the standard library's is in ranksight's hooks or integrations. A framework's own
    sync (DeepSpeed's overflow check and gradient norm, a Trainer's logging) has the framework's
    frame there, even when it runs inside a call the hooks wrap (the engine's step, the backward)."""
    dirs = _our_dirs() if dirs is None else dirs
    libs = _lib_dirs() if libs is None else libs
    for f in reversed(stack):
        path = os.path.realpath(f.filename)
        if path.startswith(dirs):
            return True
        if not path.startswith(libs):
            return False
    return False


class SyncRecorder:
    """Records every CUDA sync warning (sync debug mode "warn") with its Python stack."""

    def __init__(self) -> None:
        self.syncs: List[Dict[str, Any]] = []
        self._orig = warnings.showwarning
        self.on = False

    def start(self) -> None:
        import torch

        warnings.simplefilter("always")
        warnings.showwarning = self._show
        torch.cuda.set_sync_debug_mode("warn")
        self.on = True

    def stop(self) -> None:
        import torch

        if self.on:
            torch.cuda.set_sync_debug_mode(0)
            warnings.showwarning = self._orig
            self.on = False

    def _show(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "synchroniz" not in str(message):
            return self._orig(message, category, filename, lineno, file, line)
        st = traceback.extract_stack()[:-1]
        self.syncs.append({"ours": _ours(st), "msg": str(message)[:200],
                           "stack": [f"{f.filename}:{f.lineno} {f.name}" for f in st[-14:]]})


def gpt2(layers: int = 8, width: int = 1024) -> Any:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=8192, n_positions=512, n_embd=width, n_layer=layers, n_head=width // 64)
    return GPT2LMHeadModel(cfg).cuda()


class Tokens:
    def __init__(self, n: int, seq: int = 512, vocab: int = 8192):
        import torch

        self.x = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


# ---------------------------------------------------------------------------------------- HF
def run_hf(steps: int, watched: bool, rec: Optional[SyncRecorder], timer: Optional[Dict[str, float]],
           out_dir: str) -> Dict[str, Any]:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ranksight.integrations.transformers import RanksightCallback

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == WARM and rec is not None:
                rec.start()
            if timer is not None and state.global_step in (5, steps):
                torch.cuda.synchronize()
                timer[str(state.global_step)] = time.perf_counter()

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=8, bf16=True,
                             logging_steps=10, report_to="none", save_strategy="no", disable_tqdm=True,
                             dataloader_num_workers=2, dataloader_pin_memory=True)
    cbs: List[Any] = [Probe()]
    cb = RanksightCallback() if watched else None
    if cb is not None:
        cbs.append(cb)
    tr = Trainer(model=gpt2(), args=args, train_dataset=Tokens(steps * 8), callbacks=cbs)
    stats: Dict[str, Any] = {}
    orig_end = cb.on_train_end if cb is not None else None
    if cb is not None:
        def on_train_end(*a: Any, **k: Any) -> None:  # the stats just before the callback unwatches
            w = cb.watcher
            if w is not None:
                stats.update(w.stats())
            orig_end(*a, **k)  # type: ignore[misc]
        cb.on_train_end = on_train_end  # type: ignore[assignment]
    try:
        tr.train()
    finally:
        if rec is not None:
            rec.stop()
    return {"global_step": tr.state.global_step, "stats": stats}


# ---------------------------------------------------------------------------------------- Lightning
def run_lightning(steps: int, watched: bool, rec: Optional[SyncRecorder], timer: Optional[Dict[str, float]],
                  out_dir: str) -> Dict[str, Any]:
    import lightning as L
    import torch

    from ranksight.integrations.lightning import RanksightCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.m = gpt2()

        def training_step(self, batch: Dict[str, Any], i: int) -> Any:
            return self.m(**batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4, fused=True)

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step == WARM and rec is not None and not rec.on:
                rec.start()
            if timer is not None and trainer.global_step in (5, steps) and str(trainer.global_step) not in timer:
                torch.cuda.synchronize()
                timer[str(trainer.global_step)] = time.perf_counter()

    loader = torch.utils.data.DataLoader(Tokens(steps * 8), batch_size=8, num_workers=2, pin_memory=True)
    return _fit_lightning(Module(), loader, steps, Probe(), RanksightCallback() if watched else None, rec, out_dir)


def _fit_lightning(module: Any, loader: Any, steps: int, probe: Any, cb: Any, rec: Optional[SyncRecorder],
                   out_dir: str, cuda: bool = True) -> Dict[str, Any]:
    """Fit ``module`` with the benchmark's Trainer (one device, bf16 on CUDA; no logger, progress
    bar, checkpointing, sanity steps or summary); the global step and, watched, the watcher's stats."""
    import lightning as L

    stats: Dict[str, Any] = {}

    class Stats(L.Callback):
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if cb is not None and cb.watcher is not None:
                stats.update(cb.watcher.stats())

    tr = L.Trainer(accelerator="gpu" if cuda else "cpu", devices=1, precision="bf16-mixed" if cuda else "32-true",
                   max_steps=steps, callbacks=[probe, Stats()] + ([cb] if cb is not None else []), logger=False,
                   enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                   default_root_dir=out_dir, enable_model_summary=False)
    try:
        tr.fit(module, loader)
    finally:
        if rec is not None:
            rec.stop()
    return {"global_step": tr.global_step, "stats": stats}


RUNNERS = {"hf": run_hf, "lightning": run_lightning}


# ------------------------------------------------------------------------------ GPU-bound overhead step
class Spec:
    """The overhead step's sizes: full on CUDA, tiny (a smoke run) on CPU."""

    def __init__(self, device: str, width: int, layers: int, rows: int, items: int) -> None:
        self.device, self.width, self.layers, self.rows, self.items = device, width, layers, rows, items
        self.cuda = device == "cuda"

    @property
    def rows_per_item(self) -> int:
        return max(1, self.rows // self.items)

    def as_dict(self) -> Dict[str, Any]:
        return {"device": self.device, "width": self.width, "layers": self.layers, "rows": self.rows,
                "items_per_step": self.items}


def blocks(spec: Spec) -> Any:
    """``layers`` square linear layers with ReLU after a 64 -> width projection; forward(x) returns
    {"loss": mean square of the output} (a tensor: nothing is read back)."""
    import torch
    from torch import nn

    class Blocks(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            mods: List[nn.Module] = [nn.Linear(64, spec.width)]
            for _ in range(spec.layers):
                mods += [nn.ReLU(), nn.Linear(spec.width, spec.width)]
            self.net = nn.Sequential(*mods)

        def forward(self, x: Any, **_: Any) -> Dict[str, Any]:
            return {"loss": self.net(x.flatten(0, -2)).float().pow(2).mean()}

    torch.manual_seed(0)
    with torch.device(spec.device):
        return Blocks()


class Rows:
    """Items of (rows_per_item, 64) floats; ``items`` of them make one step's batch."""

    def __init__(self, n: int, rows: int) -> None:
        import torch

        self.x = torch.randn(8, rows, 64, generator=torch.Generator().manual_seed(0))
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Dict[str, Any]:
        return {"x": self.x[i % len(self.x)]}


def _timer_mark(spec: Spec, timer: Optional[Dict[str, float]], step: int, steps: int) -> None:
    if timer is not None and step in (5, steps) and str(step) not in timer:
        if spec.cuda:
            import torch

            torch.cuda.synchronize()
        timer[str(step)] = time.perf_counter()


def bench_hf(spec: Spec, steps: int, watched: bool, rec: Optional[SyncRecorder], timer: Optional[Dict[str, float]],
             out_dir: str) -> Dict[str, Any]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from ranksight.integrations.transformers import RanksightCallback

    class Probe(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == WARM and rec is not None and not rec.on:
                rec.start()
            _timer_mark(spec, timer, state.global_step, steps)

    args = TrainingArguments(output_dir=out_dir, max_steps=steps, per_device_train_batch_size=spec.items,
                             bf16=spec.cuda, use_cpu=not spec.cuda, logging_steps=10 * steps, report_to="none",
                             save_strategy="no", disable_tqdm=True, logging_nan_inf_filter=False, max_grad_norm=0.0,
                             optim="adamw_torch_fused" if spec.cuda else "adamw_torch",
                             dataloader_num_workers=2, dataloader_pin_memory=spec.cuda,
                             accelerator_config={"non_blocking": spec.cuda})
    cb = RanksightCallback() if watched else None
    stats: Dict[str, Any] = {}

    class Stats(TrainerCallback):  # before the ranksight callback's own on_train_end (it unwatches)
        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if cb is not None and cb.watcher is not None:
                stats.update(cb.watcher.stats())

    tr = Trainer(model=blocks(spec), args=args, train_dataset=Rows(steps * spec.items, spec.rows_per_item),
                 callbacks=[Probe(), Stats()] + ([cb] if cb is not None else []))
    try:
        tr.train()
    finally:
        if rec is not None:
            rec.stop()
    return {"global_step": tr.state.global_step, "stats": stats}


def bench_lightning(spec: Spec, steps: int, watched: bool, rec: Optional[SyncRecorder],
                    timer: Optional[Dict[str, float]], out_dir: str) -> Dict[str, Any]:
    import lightning as L
    import torch

    from ranksight.integrations.lightning import RanksightCallback

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.m = blocks(spec)

        def training_step(self, batch: Dict[str, Any], i: int) -> Any:
            return self.m(**batch)["loss"]

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-4, fused=spec.cuda)

    class Probe(L.Callback):
        def on_train_batch_end(self, trainer: Any, *a: Any) -> None:
            if trainer.global_step == WARM and rec is not None and not rec.on:
                rec.start()
            _timer_mark(spec, timer, trainer.global_step, steps)

    loader = torch.utils.data.DataLoader(Rows(steps * spec.items, spec.rows_per_item), batch_size=spec.items,
                                         num_workers=2, pin_memory=spec.cuda)
    return _fit_lightning(Module(), loader, steps, Probe(), RanksightCallback() if watched else None, rec, out_dir,
                          cuda=spec.cuda)


BENCH = {"hf": bench_hf, "lightning": bench_lightning}


def sync_case(fw: str, steps: int, out_dir: str) -> Dict[str, Any]:
    res: Dict[str, Any] = {}
    for watched in (True, False):
        rec = SyncRecorder()
        r = RUNNERS[fw](steps, watched, rec, None, out_dir)
        ours = [s for s in rec.syncs if s["ours"]]
        res["watched" if watched else "plain"] = {"global_step": r["global_step"], "stats": r["stats"],
                                                  "syncs": len(rec.syncs), "ranksight_syncs": ours[:5],
                                                  "sample": rec.syncs[:3]}
    res["ranksight_syncs"] = res["watched"]["ranksight_syncs"]
    return res


def _spread(xs: List[float]) -> Dict[str, float]:
    q = statistics.quantiles(xs, n=4, method="inclusive") if len(xs) >= 2 else [xs[0]] * 3
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2], "min": min(xs), "max": max(xs)}


def overhead_case(fw: str, spec: Spec, steps: int, pairs: int, out_dir: str) -> Dict[str, Any]:
    run = BENCH[fw]
    began = time.monotonic()
    res: Dict[str, Any] = {"spec": spec.as_dict(), "steps": steps, "timed_steps": steps - 5, "pairs_n": pairs}
    # one untimed run of each arm (CUDA, cuBLAS and the frameworks warm up); on CUDA it also counts
    # the framework's syncs per step after WARM steps: no step may wait on the host
    for watched in (False, True):
        rec = SyncRecorder() if spec.cuda else None
        r = run(spec, steps, watched, rec, None, out_dir)
        arm = "watched" if watched else "plain"
        res[f"warmup_{arm}"] = {"global_step": r["global_step"], "stats_steps": r["stats"].get("steps"),
                                "syncs": None if rec is None else len(rec.syncs),
                                "syncs_per_step": None if rec is None else len(rec.syncs) / max(1, steps - WARM),
                                "ranksight_syncs": None if rec is None else [x for x in rec.syncs if x["ours"]][:3],
                                "sync_sample": None if rec is None else rec.syncs[:3]}
        print(f"{fw} warm-up {arm}: {r['global_step']} steps"
              + ("" if rec is None else f", {len(rec.syncs)} syncs after step {WARM} ({len(rec.syncs) / max(1, steps - WARM):.2f}/step)")
              + (f", ranksight saw {r['stats'].get('steps')} steps" if watched else ""), flush=True)
    ratios: List[float] = []
    rows: List[Dict[str, float]] = []
    for i in range(pairs):
        t: Dict[str, float] = {}
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            timer: Dict[str, float] = {}
            r = run(spec, steps, watched, None, timer, out_dir)
            if r["global_step"] != steps or set(timer) != {"5", str(steps)}:
                raise RuntimeError(f"run stopped at step {r['global_step']} of {steps} (timer {timer})")
            t["watched" if watched else "plain"] = (timer[str(steps)] - timer["5"]) / (steps - 5)
            if watched:
                t["watched_steps_seen"] = float(r["stats"].get("steps", -1))
        ratios.append(t["watched"] / t["plain"])
        rows.append(t)
        print(f"pair {i:2d} ({'plain first' if i % 2 == 0 else 'watched first'}): plain {t['plain'] * 1e3:7.2f} ms/step, "
              f"watched {t['watched'] * 1e3:7.2f} ms/step, ratio {ratios[-1]:.4f}", flush=True)
    sp = _spread(ratios)
    plain = statistics.median(r["plain"] for r in rows)
    watched = statistics.median(r["watched"] for r in rows)
    res.update({"pairs": rows, "ratios": ratios, "median_ratio": sp["median"], "iqr": [sp["q1"], sp["q3"]],
                "min_ratio": sp["min"], "max_ratio": sp["max"], "ratio_of_medians": watched / plain,
                "plain_ms_median": plain * 1e3, "watched_ms_median": watched * 1e3,
                "plain_ms_spread": {k: v * 1e3 for k, v in _spread([r["plain"] for r in rows]).items()},
                "elapsed_s": time.monotonic() - began})
    print(f"{fw}: plain {plain * 1e3:.2f} ms/step, watched {watched * 1e3:.2f} ms/step (medians); ratio watched/plain "
          f"median {sp['median']:.4f}, IQR {sp['q1']:.4f}-{sp['q3']:.4f}, min {sp['min']:.4f}, max {sp['max']:.4f}, "
          f"ratio of medians {watched / plain:.4f}, over {pairs} interleaved pairs of {steps - 5} timed steps "
          f"({res['elapsed_s']:.0f} s)")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["sync_hf", "sync_lightning", "overhead_hf", "overhead_lightning"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0,
                    help="steps per run (default 12 for sync; overhead: 60 on CUDA, 8 on CPU; at least 7)")
    ap.add_argument("--pairs", type=int, default=0, help="overhead: interleaved pairs (default 20 on CUDA, 2 on CPU)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="overhead: cpu is a smoke run with tiny sizes (no figures)")
    ap.add_argument("--width", type=int, default=0, help="overhead: layer width (default 4096 on CUDA, 64 on CPU)")
    ap.add_argument("--layers", type=int, default=0, help="overhead: square layers (default 8 on CUDA, 2 on CPU)")
    ap.add_argument("--rows", type=int, default=0, help="overhead: rows per step (default 16384 on CUDA, 16 on CPU)")
    ap.add_argument("--agent", choices=("real", "off"), default="real",
                    help="overhead: the watched runs send to a real `ranksight exporter` (default) or nowhere")
    a = ap.parse_args()
    kind, fw = a.case.split("_", 1)
    cpu = a.device == "cpu"
    steps = a.steps or (12 if kind == "sync" else 8 if cpu else 60)
    if kind == "overhead" and steps < 7 or min(a.steps, a.pairs, a.width, a.layers, a.rows) < 0:
        ap.error("--steps must be at least 7 for overhead; sizes and --pairs must be positive")
    if kind == "sync" and cpu:
        ap.error("the sync cases need CUDA (sync debug mode)")
    out_dir = tempfile.mkdtemp(prefix=f"rs-{a.case}-")
    agent = None
    if kind == "overhead" and a.agent == "real":
        from pathlib import Path

        from ranksight.tools.stack import AgentProcess

        agent = AgentProcess(Path(out_dir), collectors="ranks" if cpu else "gpu,ranks", name="agent").start(timeout=60)
        os.environ["RANKSIGHT_AGENT"] = agent.ingest
    os.environ.setdefault("RANKSIGHT_AGENT", "off")
    try:
        if kind == "sync":
            res = sync_case(fw, steps, out_dir)
        else:
            spec = Spec(a.device, a.width or (64 if cpu else 4096), a.layers or (2 if cpu else 8),
                        a.rows or (16 if cpu else 16384), 2 if cpu else 8)
            res = overhead_case(fw, spec, steps, a.pairs or (2 if cpu else 20), out_dir)
            res["agent"] = a.agent
            res["command"] = " ".join(sys.argv)
    except Exception:
        res = {"crashed": traceback.format_exc()}
    finally:
        if agent is not None:
            agent.stop()
    write_json(a.out, res)
    if "crashed" in res:
        print(res["crashed"], file=sys.stderr)
    sys.exit(0 if "crashed" not in res else 1)


if __name__ == "__main__":
    main()
