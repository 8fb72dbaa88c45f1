"""The framework integrations on a GPU: sync checks and overhead (run on the GPU machine).

    python bench/gpu/integrations.py sync_hf --out r.json         # HF Trainer + RanksightCallback
    python bench/gpu/integrations.py sync_lightning --out r.json  # Lightning + RanksightCallback
    python bench/gpu/integrations.py overhead_hf --out r.json [--pairs 8 --steps 40]
    python bench/gpu/integrations.py overhead_lightning --out r.json

``sync_*``: a GPU-bound GPT-2 (8 layers, 1024 wide, bf16, batch 8 x 512) trained by the framework,
once with the callback and once without, in one process. After 3 warm-up steps
``torch.cuda.set_sync_debug_mode("warn")`` is on and every synchronization warning is recorded
with its Python stack; a sync whose stack passes through ranksight's own files is ours. The
framework's own syncs (logging, grad-norm) are in both runs: the result lists both counts and
every sync from a ranksight frame (``ranksight_syncs``: must be empty).

``overhead_*``: interleaved pairs (plain, watched; the order alternates) of ``--steps`` steps each,
timed from the end of step 5 to the end of the last step with one ``torch.cuda.synchronize()`` at
each end (outside the measured steps' hooks); prints and records the median ratio and its IQR.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
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


def _ours(stack: List[traceback.FrameSummary]) -> bool:
    dirs = _our_dirs()
    return any(os.path.realpath(f.filename).startswith(dirs) for f in stack)


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

    cb = RanksightCallback() if watched else None
    stats: Dict[str, Any] = {}

    class Stats(L.Callback):
        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if cb is not None and cb.watcher is not None:
                stats.update(cb.watcher.stats())

    cbs: List[Any] = [Probe(), Stats()] + ([cb] if cb is not None else [])
    loader = torch.utils.data.DataLoader(Tokens(steps * 8), batch_size=8, num_workers=2, pin_memory=True)
    tr = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_steps=steps, callbacks=cbs,
                   logger=False, enable_progress_bar=False, enable_checkpointing=False, num_sanity_val_steps=0,
                   default_root_dir=out_dir, enable_model_summary=False)
    try:
        tr.fit(Module(), loader)
    finally:
        if rec is not None:
            rec.stop()
    return {"global_step": tr.global_step, "stats": stats}


RUNNERS = {"hf": run_hf, "lightning": run_lightning}


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


def overhead_case(fw: str, steps: int, pairs: int, out_dir: str) -> Dict[str, Any]:
    ratios, rows = [], []
    for i in range(pairs):
        t: Dict[str, float] = {}
        for watched in ((False, True) if i % 2 == 0 else (True, False)):
            timer: Dict[str, float] = {}
            RUNNERS[fw](steps, watched, None, timer, out_dir)
            t["watched" if watched else "plain"] = (timer[str(steps)] - timer["5"]) / (steps - 5)
        ratios.append(t["watched"] / t["plain"])
        rows.append(t)
        print(f"pair {i}: plain {t['plain'] * 1e3:.2f} ms/step, watched {t['watched'] * 1e3:.2f} ms/step, "
              f"ratio {ratios[-1]:.4f}", flush=True)
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    res = {"pairs": rows, "ratios": ratios, "median_ratio": statistics.median(ratios), "iqr": [q[0], q[2]],
           "steps": steps}
    print(f"{fw}: median ratio {res['median_ratio']:.4f} (IQR {q[0]:.4f}-{q[2]:.4f}) over {pairs} interleaved pairs")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=["sync_hf", "sync_lightning", "overhead_hf", "overhead_lightning"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=0, help="steps per run (default 12 for sync, 40 for overhead)")
    ap.add_argument("--pairs", type=int, default=6)
    a = ap.parse_args()
    import tempfile

    kind, fw = a.case.split("_", 1)
    out_dir = tempfile.mkdtemp(prefix=f"rs-{a.case}-")
    os.environ.setdefault("RANKSIGHT_AGENT", "off")
    try:
        if kind == "sync":
            res = sync_case(fw, a.steps or 12, out_dir)
        else:
            res = overhead_case(fw, a.steps or 40, a.pairs, out_dir)
    except Exception:
        res = {"crashed": traceback.format_exc()}
    write_json(a.out, res)
    sys.exit(0 if "crashed" not in res else 1)


if __name__ == "__main__":
    main()
