"""DeepSpeed: ``ranksight.watch(engine, optimizer, loader)`` with a ``deepspeed.DeepSpeedEngine``.

In a DeepSpeed loop the user calls ``engine(batch)``, ``engine.backward(loss)`` and ``engine.step()``
on every micro-batch; the engine applies the optimizer only at the gradient accumulation boundary
(``engine._take_model_step``, where ``engine.global_steps`` advances). The optimizer ``deepspeed.
initialize`` returns is a ZeRO wrapper, not a ``torch.optim.Optimizer``: it has no step hooks. So a
DeepSpeed engine is watched through the engine itself (nothing here imports deepspeed; the engine is
recognised by its class name). ``watcher.start`` (under ``watch``) attaches an engine given as the
model; ``watch()`` given no optimizer adopts one at its first training forward (``adopt``):

* a step is one model step: ``EngineSteps`` stands in for the optimizer given to the Watcher. Its
  pre-hooks run when ``engine._take_model_step`` starts, its post-hooks (which close the step)
  when ``engine.step()`` returns after a model step, or when ``_take_model_step`` returns where
  no ``engine.step()`` surrounds it (a pipeline engine's ``train_batch``, whose micro-batches are
  not counted: it calls its module, not the engine). Optimizer time is the model step. Attribute
  reads (``param_groups``, ...) go to ``engine.optimizer``;
* micro-batches: the engine is the model, so its forward hooks count the forwards with grad enabled;
* backward: ``engine.backward`` as a whole (``loss.backward()`` and DeepSpeed's epilogue, where
  ZeRO reduces the gradients at the boundary) is the backward phase, timed by the Watcher's
  backward wrapper; a ``loss.backward()`` the user calls directly is timed as in any loop;
* communication: ``deepspeed.comm`` calls ``torch.distributed``, whose wrapped collectives
  (``comm.py``) see its all-reduces and broadcasts, except the all-gather and reduce-scatter
  functions DeepSpeed's backend binds when it starts (ZeRO's parameter all-gathers and gradient
  reduce-scatters). Those two bound functions are wrapped the same way here;
* checkpoint: ``engine.save_checkpoint`` is one checkpoint write ("timer" source); its nested
  ``torch.save`` calls are not counted again. Its bytes are the files this rank wrote in the
  checkpoint's tag folder (its ZeRO shards, and on rank 0 the files without a rank number).

Every patch goes through the Watcher's Patcher (``close()`` restores them); DeepSpeed's own timers,
which synchronize the device, are neither used nor needed.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, List, Optional

from .patch import like

log = logging.getLogger("ranksight.hooks")

ENGINE_CLASSES = frozenset(("DeepSpeedEngine",))  # a subclass (PipelineEngine, ...) counts too
# patched on the engine instance (train_batch: a PipelineEngine's, see attach)
ENGINE_METHODS = ("_take_model_step", "step", "backward", "save_checkpoint", "train_batch")
# the functions DeepSpeed's TorchBackend binds at start, and the collective each one is
BOUND_COLLECTIVES = (("all_gather_function", "all_gather_into_tensor"),
                     ("reduce_scatter_function", "reduce_scatter_tensor"))


def is_engine(obj: Any) -> bool:
    """``obj`` is a DeepSpeed engine (by class name, so deepspeed need not be importable)."""
    try:
        return any(c.__name__ in ENGINE_CLASSES for c in type(obj).__mro__) and callable(
            getattr(obj, "step", None)) and hasattr(obj, "global_steps")
    except Exception:
        return False


class _Handle:
    def __init__(self, hooks: List[Callable], fn: Callable):
        self._hooks = hooks
        self._fn = fn

    def remove(self) -> None:
        try:
            self._hooks.remove(self._fn)
        except ValueError:
            pass


class EngineSteps:
    """The engine's model steps, with the optimizer step-hook interface the Watcher registers on
    (``register_step_pre_hook``/``register_step_post_hook``, each called as ``fn(self, (), {})``).
    Other attributes are read from ``engine.optimizer``."""

    def __init__(self, engine: Any, on_error: Optional[Callable[[str, BaseException], None]] = None):
        self.__dict__.update(_engine=engine, _pre=[], _post=[], _in_step=False, _stepped=False,
                             on_error=on_error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_engine"].optimizer, name)

    def __repr__(self) -> str:
        return f"EngineSteps({type(self._engine.optimizer).__name__})"

    def register_step_pre_hook(self, fn: Callable) -> _Handle:
        self._pre.append(fn)
        return _Handle(self._pre, fn)

    def register_step_post_hook(self, fn: Callable) -> _Handle:
        self._post.append(fn)
        return _Handle(self._post, fn)

    def _run(self, hooks: List[Callable], where: str) -> None:
        for fn in list(hooks):  # the Watcher's hooks catch their own errors; this guards any other
            try:
                fn(self, (), {})
            except Exception as e:
                if self.on_error is not None:
                    self.on_error(where, e)

    def wrap_step(self, orig: Callable) -> Callable:
        """``engine.step``: closes the step when a model step ran inside it."""
        s = self

        def step(*args: Any, **kwargs: Any) -> Any:
            if s._in_step:  # re-entered: the outer call closes the step
                return orig(*args, **kwargs)
            s.__dict__.update(_in_step=True, _stepped=False)
            try:
                return orig(*args, **kwargs)
            finally:
                stepped = s._stepped
                s.__dict__.update(_in_step=False, _stepped=False)
                if stepped:
                    s._run(s._post, "DeepSpeed step end")

        return like(step, orig, "step")

    def wrap_take_model_step(self, orig: Callable) -> Callable:
        """``engine._take_model_step``: the optimizer update of one model step."""
        s = self

        def take_model_step(*args: Any, **kwargs: Any) -> Any:
            s._run(s._pre, "DeepSpeed model step start")
            try:
                return orig(*args, **kwargs)
            finally:
                if s._in_step:
                    s.__dict__["_stepped"] = True
                else:
                    s._run(s._post, "DeepSpeed model step end")

        return like(take_model_step, orig, "_take_model_step")


def _rank_bytes(engine: Any, folder: str) -> int:
    """Bytes of the files this rank wrote in a DeepSpeed checkpoint's tag folder: names carrying
    its data-parallel rank (``zero_pp_rank_<r>_...``), and on global rank 0 the names carrying none."""
    dp = 0
    try:
        import torch.distributed as dist

        grp = getattr(getattr(engine, "optimizer", None), "dp_process_group", None)
        if dist.is_available() and dist.is_initialized():
            dp = dist.get_rank(group=grp) if grp is not None else dist.get_rank()
    except Exception:
        dp = 0
    total = 0
    mine = f"zero_pp_rank_{dp}_"
    rank0 = int(getattr(engine, "global_rank", 0) or 0) == 0
    try:
        for root, _, files in os.walk(folder):
            for n in files:
                if mine in n or (rank0 and "zero_pp_rank_" not in n):
                    try:
                        total += os.stat(os.path.join(root, n)).st_size
                    except OSError:
                        pass
    except OSError:
        return 0
    return total


def wrap_save_checkpoint(w: Any, engine: Any, orig: Callable) -> Callable:
    """``engine.save_checkpoint(save_dir, tag=None, ...)`` recorded as one checkpoint write."""

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        rec = w.ckpt if w._active else None
        if rec is None:
            return orig(*args, **kwargs)
        folder = None
        try:
            save_dir = kwargs.get("save_dir", args[0] if args else None)
            tag = kwargs.get("tag", args[1] if len(args) > 1 else None)
            if tag is None:
                tag = f"global_step{engine.global_steps}"  # DeepSpeed's default tag
            folder = os.path.join(os.fspath(save_dir), str(tag)) if save_dir is not None else None
        except Exception as e:
            w._hook_error("DeepSpeed checkpoint path", e)
        tok = rec.begin("timer", None, folder)
        ok = False
        try:
            out = orig(*args, **kwargs)
            ok = True
            return out
        finally:
            try:
                rec.end(tok, ok, _rank_bytes(engine, folder) if ok and folder and tok is not None else 0)
            except Exception as e:
                w._hook_error("DeepSpeed checkpoint", e)

    return like(save_checkpoint, orig, "save_checkpoint")


def _unshadow(engine: Any, names: List[str]) -> None:
    """After ``close()`` restored the patches (the Patcher sets an instance attribute back to the
    bound method it read): drop those instance attributes, so the class's methods show again."""
    d = getattr(engine, "__dict__", {})
    for n in names:
        v = d.get(n)
        if v is not None and getattr(v, "__self__", None) is engine and \
                getattr(v, "__func__", None) is getattr(type(engine), n, None):
            del d[n]


def attach(w: Any, engine: Any, steps: EngineSteps, pipe: bool = False) -> None:
    """Patch ``engine`` (its instance attributes: ``step``, ``_take_model_step``, ``backward``,
    ``save_checkpoint``; ``train_batch`` when ``pipe``, a PipelineEngine whose stage
    ``pipeline.attach_deepspeed`` timed) and DeepSpeed's bound collectives through ``w``'s Patcher."""
    steps.__dict__["on_error"] = w._hook_error
    p = w._patcher
    own = [n for n in ENGINE_METHODS if n not in getattr(engine, "__dict__", {})]
    w.add_close_callback(lambda: _unshadow(engine, own))
    if getattr(engine, "_take_model_step", None) is None:
        log.warning("ranksight: this DeepSpeed engine has no _take_model_step; no step records")
    else:
        p.set(engine, "_take_model_step", steps.wrap_take_model_step(engine._take_model_step))
        p.set(engine, "step", steps.wrap_step(engine.step))
        if pipe:  # a PipelineEngine: train_batch closes the step when it returns, as engine.step() does
            p.set(engine, "train_batch", steps.wrap_step(engine.train_batch))
    if callable(getattr(engine, "backward", None)):
        p.set(engine, "backward", w._wrap_backward(engine.backward))
    if callable(getattr(engine, "save_checkpoint", None)):
        p.set(engine, "save_checkpoint", wrap_save_checkpoint(w, engine, engine.save_checkpoint))
    try:
        import sys

        ds_comm = sys.modules.get("deepspeed.comm.comm")
        cdb = getattr(ds_comm, "cdb", None)
        for attr, name in BOUND_COLLECTIVES:
            fn = getattr(cdb, attr, None)
            if callable(fn):
                p.set(cdb, attr, w.comm.wrap_collective(name, fn))
    except Exception as e:
        w._hook_error("DeepSpeed communication setup", e)


def attach_engine(w: Any, engine: Any, steps: EngineSteps) -> None:
    """``attach``, after ``pipeline.attach_deepspeed`` for a PipelineEngine (first: its train_batch
    wrapper sits inside the step's). Errors are hook errors: training goes on."""
    from . import pipeline

    pipe = False
    if pipeline.is_deepspeed_pipe(engine):
        try:
            pipe = pipeline.attach_deepspeed(w, engine) is not None
        except Exception as e:
            w._hook_error("DeepSpeed pipeline setup", e)
    try:
        attach(w, engine, steps, pipe)
    except Exception as e:
        w._hook_error("DeepSpeed setup", e)


def adopt(w: Any, engine: Any) -> None:
    """Discovery saw ``engine``'s first training forward (``watch()`` given no optimizer, as the
    framework callbacks start it): from here the engine's model steps are the steps, its forward
    the model's, as if it had been given to ``watch()``. The global optimizer step hooks that
    counted the optimizer inside the engine are removed first, so no step is counted twice."""
    disc = w.discovery
    if disc is not None:
        disc.stop_optimizers()
        disc.stop_model()
    steps = EngineSteps(engine)
    w.optimizer = steps
    w._defer_steps = False
    if w._pending_t is not None:  # a step an optimizer found before left open ends now
        w._close_pending(w._pending_t)
    w._handles.append(steps.register_step_pre_hook(w._opt_pre))
    w._handles.append(steps.register_step_post_hook(w._opt_post))
    w._attach_model(engine)
    attach_engine(w, engine, steps)
