"""Discovery: what ``watch()`` finds by itself when the model, optimizer or loader is not given.

* **Optimizers**: PyTorch's global optimizer step hooks
  (``torch.optim.optimizer.register_optimizer_step_pre_hook``/``_post_hook``) fire for every
  ``torch.optim.Optimizer`` step, including those a framework wraps (Accelerate's
  ``AcceleratedOptimizer``, Lightning's ``LightningOptimizer`` and the Hugging Face Trainer
  call the inner optimizer). An optimizer stepping inside another's step (a wrapper that is
  itself an Optimizer) counts once. Several optimizers stepping in one iteration make one step:
  the step stays open after each optimizer step and the next iteration's first data fetch closes
  it (``Watcher._step_boundary``).
* **Data wait**: ``torch.utils.data.DataLoader.__iter__`` and ``_BaseDataLoaderIter.__next__``
  are patched (reversibly) while watched: time inside ``next()`` on the training thread with grad
  enabled is data wait, on every DataLoader iterator (a framework's prefetching wrapper shifts a
  fetch by one batch, never the sum); a fetch under ``torch.no_grad()``/``inference_mode`` (an
  evaluation loop) is not. The first DataLoader iterated becomes ``watcher.loader``.
* **Model**: global module forward hooks
  (``torch.nn.modules.module.register_module_forward_pre_hook``) watch the outermost module
  calls with grad enabled on the training thread until the first step ends. Then the model is
  the DDP/FSDP wrapper, else the outermost module, whose parameters the stepping optimizers hold
  (the one holding most of them). Its own forward hooks take over and the global hooks are
  removed (they cost a Python call per submodule call). Until then the outermost modules with
  trainable parameters are timed and counted as micro-batches.
* **DeepSpeed**: an outermost module that is a DeepSpeed engine (the Hugging Face Trainer, Accelerate
  and a plain loop under ``watch()`` call it) is adopted when its first training forward returns:
  the global optimizer step hooks are removed and the engine is watched as if given to ``watch()``
  (``deepspeed_engine.adopt``): a step is one model step, counted once.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Dict, List

import torch

from ranksight import catalog as C

from . import deepspeed_engine as _deepspeed
from .patch import Patcher, like
from .steppath import timed_next

log = logging.getLogger("ranksight.hooks")

GIVE_UP_STEPS = 3  # steps after which model discovery stops looking (and says so once)


def _wrappers() -> tuple:
    """The data-parallel wrapper classes that this torch has (the model is preferably one)."""
    out: List[type] = []
    try:
        from torch.nn.parallel import DistributedDataParallel

        out.append(DistributedDataParallel)
    except Exception:
        pass
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        out.append(FullyShardedDataParallel)
    except Exception:
        pass
    try:
        from torch.distributed.fsdp import FSDPModule  # FSDP2 (fully_shard)

        out.append(FSDPModule)
    except Exception:
        pass
    return tuple(out)


class Discovery:
    """The discovery of one watch. ``install()`` at ``watch()``; every handle and patch goes
    into the watcher's own lists, so ``close()`` removes them with the rest."""

    def __init__(self, w: Any, model: bool, optimizer: bool, loader: bool):
        self.w = w
        self.want_model, self.want_optimizer, self.want_loader = model, optimizer, loader
        self.optimizers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._opt_depth = 0
        self._outer: Any = None
        self._stack: List[bool] = []  # module calls in progress on the training thread: counted?
        self._roots: Dict[int, "weakref.ReferenceType[Any]"] = {}
        self._trainable: Dict[int, bool] = {}
        self._module_handles: List[Any] = []
        self._opt_handles: List[Any] = []
        self._steps_looking = 0
        self.model_found = False

    # ------------------------------------------------------------------ install
    def install(self, patcher: Patcher, handles: List[Any]) -> None:
        w = self.w
        if self.want_optimizer:
            try:
                from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

                self._opt_handles = [register_optimizer_step_pre_hook(self._opt_pre),
                                     register_optimizer_step_post_hook(self._opt_post)]
                handles.extend(self._opt_handles)
            except Exception as e:
                w._hook_error("optimizer discovery", e)
        if self.want_loader:
            try:
                from torch.utils.data import dataloader as dl

                base = dl._BaseDataLoaderIter
                patcher.set(base, "__next__", self._wrap_next(base.__next__))
                patcher.set(dl.DataLoader, "__iter__", self._wrap_iter(dl.DataLoader.__iter__))
            except Exception as e:
                w._hook_error("DataLoader discovery", e)
        if self.want_model:
            try:
                from torch.nn.modules import module as mm

                self._module_handles = [mm.register_module_forward_pre_hook(self._mod_pre),
                                        mm.register_module_forward_hook(self._mod_post, always_call=True)]
                handles.extend(self._module_handles)
            except Exception as e:
                w._hook_error("model discovery", e)

    # ------------------------------------------------------------------ optimizers
    def _opt_pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self._opt_depth and optimizer is self._outer:  # its last step raised (no post-hook): start over
            self._opt_depth = 0
        self._opt_depth += 1
        if self._opt_depth == 1:
            self._outer = optimizer
            try:
                self.optimizers.add(optimizer)
            except TypeError:
                pass
            w = self.w
            if w.optimizer is None:
                w.optimizer = optimizer
            w._opt_pre(optimizer, args, kwargs)

    def _opt_post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._opt_depth = max(0, self._opt_depth - 1)
        if self._opt_depth == 0:
            self._outer = None
            w = self.w
            w._opt_post(optimizer, args, kwargs)
            if self._module_handles:
                try:
                    self._choose_model()
                except Exception as e:
                    w._hook_error("model discovery", e)
                    self._stop_looking()

    # ------------------------------------------------------------------ data
    def _wrap_next(self, orig: Any) -> Any:
        w = self.w
        tid = w._main_tid

        grad = torch.is_grad_enabled

        def __next__(it: Any) -> Any:
            if not w._active or threading.get_ident() != tid or not grad():
                return orig(it)  # (under no_grad/inference_mode: an evaluation loop, no training data wait)
            return timed_next(w, orig, it)

        return like(__next__, orig, "__next__")

    def _wrap_iter(self, orig: Any) -> Any:
        w = self.w
        tid = w._main_tid

        def __iter__(loader: Any) -> Any:
            it = orig(loader)
            if w._active and threading.get_ident() == tid:
                try:
                    if w.loader is None:
                        w.loader = loader
                        self._lints_loader(loader)
                    if loader is w.loader:
                        w._epoch_start(loader)
                except Exception as e:
                    w._hook_error("DataLoader discovery", e)
            return it

        return like(__iter__, orig, "__iter__")

    # ------------------------------------------------------------------ model
    def _mod_pre(self, module: Any, args: Any) -> None:
        w = self.w
        if threading.get_ident() != w._main_tid:
            return None
        try:
            counted = False
            if not self._stack and w._active and torch.is_grad_enabled() and self._has_trainable(module):
                self._roots.setdefault(id(module), weakref.ref(module))
                counted = True
                w._fwd_pre(module, args)
            self._stack.append(counted)
        except Exception as e:
            w._hook_error("model discovery", e)
        return None

    def _mod_post(self, module: Any, args: Any, output: Any) -> None:
        w = self.w
        if threading.get_ident() != w._main_tid or not self._stack:
            return None
        try:
            if self._stack.pop():
                w._fwd_post(module, args, output)
                if self.want_optimizer and not self._stack and _deepspeed.is_engine(module):
                    _deepspeed.adopt(w, module)
        except Exception as e:
            w._hook_error("model discovery", e)
        return None

    def _has_trainable(self, module: Any) -> bool:
        k = id(module)
        v = self._trainable.get(k)
        if v is None:
            v = self._trainable[k] = any(p.requires_grad for p in module.parameters())
        return v

    def _choose_model(self) -> None:
        self._steps_looking += 1
        held = set()
        for opt in list(self.optimizers):
            for g in getattr(opt, "param_groups", ()):
                held.update(id(p) for p in g.get("params", ()))
        wrappers = _wrappers()
        best, best_key = None, (False, 0)
        for ref in self._roots.values():
            m = ref()
            if m is None:
                continue
            n = sum(1 for p in m.parameters() if id(p) in held)
            if n == 0:
                continue
            key = (isinstance(m, wrappers) if wrappers else False, n)
            if key > best_key:
                best, best_key = m, key
        if best is None:
            if self._steps_looking >= GIVE_UP_STEPS:
                log.warning("ranksight: watch() found no module whose parameters the optimizer holds in the first %d "
                            "steps; forward times and micro-batches are not recorded (pass the model to watch())",
                            GIVE_UP_STEPS)
                self._stop_looking()
            return
        self._stop_looking()
        self.model_found = True
        log.debug("ranksight: watch() found the model: %s", type(best).__name__)
        self.w._attach_model(best)
        self._lints_model()

    # ------------------------------------------------------------------ the lints (hooks/lints/)
    # The lints look at the loader and the model when watch() starts; with discovery they arrive
    # later, so the watch-time checks run when each is found.
    def _lints_loader(self, loader: Any) -> None:
        lints = getattr(self.w, "lints", None)
        if lints is None:
            return
        try:
            from .lints import loader_facts

            lints.facts = loader_facts(loader)
            for name, fn in ((C.LINT_IO_AMPLIFICATION, lints._static_io), (C.LINT_UNEVEN_LAST_BATCH, lints._static_uneven),
                             (C.LINT_RANK_DISAGREEMENT, lints._static_seed)):
                if lints.on(name):
                    fn()
        except Exception as e:
            self.w._hook_error("lints on the discovered loader", e)

    def _lints_model(self) -> None:
        """The first-step checks hook the model's forward (parameter digest); the global batch is
        counted from the step that just ended (its forwards are the accumulation steps)."""
        lints = getattr(self.w, "lints", None)
        if lints is None or getattr(lints, "_fwd_handle", None) is not None:
            return
        try:
            batch_pending = not lints._batch_done
            lints._install_forward_hook()
            if batch_pending and lints.on(C.LINT_GLOBAL_BATCH_LR) and lints.rank == 0:
                lints._batch_done = True
                lints._global_batch(max(1, self.w._micro))
        except Exception as e:
            self.w._hook_error("lints on the discovered model", e)

    def stop_optimizers(self) -> None:
        """Remove the global optimizer step hooks (a DeepSpeed engine's model steps take over)."""
        for h in self._opt_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._opt_handles = []
        self.want_optimizer = False

    def stop_model(self) -> None:
        """The model is known (a DeepSpeed engine): stop looking for it."""
        self._stop_looking()
        self.model_found = True

    def _stop_looking(self) -> None:
        for h in self._module_handles:
            try:
                h.remove()
            except Exception:
                pass
        self._module_handles = []
        self._roots.clear()
        self._trainable.clear()
        self._stack.clear()
