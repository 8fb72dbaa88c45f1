"""Checkpoint restores: the hooks see a resume while watched.

A resume is the watched model's ``load_state_dict`` completing (its load post-hook, on the inner
module of a DDP or ``torch.compile`` wrapper, so a load through the wrapper or on the module both
count) after a ``torch.load`` (patched while watched, like ``torch.save``) returned a checkpoint
that holds more than weights: a step counter, optimizer or scheduler state, RNG state or a data
position (``lints.incomplete_checkpoint.checkpoint_anatomy`` reads it). Loading a bare
``state_dict`` (weights to fine-tune from) is not a resume. A restore the hooks cannot see is not
reported: one before ``watch()``, one through ``torch.distributed.checkpoint.load`` or
safetensors, or a checkpoint whose content is not a mapping.

A framework callback reports its own resume (``mark(step)``: the trainer's global step at the start
of training, past 0). At a resume the watcher keeps its wall time and the restored step (the
checkpoint's step counter, 0 when it has none), sent with every step record as ``"resumed"`` and ``"rstep"``
(``ranksight/record.py``), and calls its resume observers (``Watcher.add_resume_observer``) with
a ``Resume``. The optimizer's ``load_state_dict`` calls are counted (``ResumeWatch.opt_loads``).

Costs: the ``torch.load`` wrapper reads at most 256 keys of a returned mapping (two levels), on
the loading thread; the post-hooks run once per load. Nothing runs on the step path. Every body
catches its exceptions (a hook error); the user's load and its result pass unchanged.
"""
from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, FrozenSet, List, Mapping, Optional

from .copysafe import CopySafe
from .patch import Patcher, like

_STEP = re.compile(r"^(global_?step|step|steps|iteration|iter|num_updates|train_steps?|optimizer_steps?)$")
_EPOCH = re.compile(r"^(epoch|epochs|cur_epoch|current_epoch)$")


@dataclass(frozen=True)
class Loaded:
    """What the last ``torch.load`` of a checkpoint returned (a summary: no reference to it)."""
    t: float  # wall time of the load
    path: Optional[str]
    weights: bool
    parts: FrozenSet[str]  # the resume parts it holds (lints.incomplete_checkpoint's names)
    step: int  # its step counter (0: none)
    epoch: Optional[int]  # its epoch (None: none)
    opt_loads: int  # the watched optimizer's load_state_dict calls before it


@dataclass(frozen=True)
class Resume:
    """One restore of the watched model from a checkpoint."""
    at: float  # wall time
    step: int  # the restored step (0: the checkpoint names none)
    epoch: Optional[int]
    parts: FrozenSet[str] = field(default_factory=frozenset)
    path: Optional[str] = None
    opt_loads: int = 0  # the watched optimizer's load_state_dict calls before the checkpoint was read


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    try:
        import torch

        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_floating_point() and v.device.type == "cpu":
            return int(v.item())
    except Exception:
        return None
    return None


def counters(obj: Mapping) -> tuple:
    """(step, epoch) of a checkpoint mapping: its top-level (or one level down) step counter and
    epoch, as ints (0 and None when absent)."""
    step, epoch = 0, None
    inner = tuple(v for v in itertools.islice(obj.values(), 64) if isinstance(v, Mapping))
    for m in (obj,) + inner:
        for k, v in itertools.islice(m.items(), 256):
            key = str(k).lower()
            is_step, is_epoch = _STEP.match(key) is not None, _EPOCH.match(key) is not None
            if not (is_step or is_epoch):
                continue
            n = _int(v)
            if n is None or n < 0:
                continue
            if is_step and not step:
                step = n
            elif is_epoch and epoch is None:
                epoch = n
        if step and epoch is not None:
            break
    return step, epoch


class ResumeWatch:
    """The watcher's view of checkpoint restores: ``install(patcher)`` patches ``torch.load``,
    ``attach_model``/``attach_optimizer`` register the load post-hooks (handles appended to the
    list given). ``last`` is the last ``Resume`` (None: none in this watch)."""

    def __init__(self, on_error: Callable[[str, BaseException], None]):
        self._on_error = on_error
        self.active = True
        self.observers: List[Callable[[Resume], None]] = []
        self.loaded: Optional[Loaded] = None
        self.last: Optional[Resume] = None
        self.opt_loads = 0
        self.resumes = 0
        self._lock = threading.Lock()
        self._model_ids: set = set()

    # ------------------------------------------------------------------ torch.load
    def install(self, patcher: Patcher) -> None:
        import torch

        orig = torch.load
        if getattr(orig, "__ranksight__", False):
            orig = orig.__wrapped__  # type: ignore[attr-defined]
        rw = self

        def load(*args: Any, **kwargs: Any) -> Any:
            obj = orig(*args, **kwargs)
            if rw.active and isinstance(obj, Mapping):
                rw.on_load(obj, args[0] if args else kwargs.get("f"))
            return obj

        load.__ranksight__ = True  # type: ignore[attr-defined]
        wrapped = like(load, orig, "load")
        patcher.set(torch, "load", wrapped)
        ser = getattr(torch, "serialization", None)
        if ser is not None and getattr(ser, "load", None) is orig:
            patcher.set(ser, "load", wrapped)

    def on_load(self, obj: Mapping, f: Any) -> None:
        """A mapping came back from ``torch.load``: keep a summary if it is a checkpoint."""
        try:
            from .checkpoint import path_of
            from .lints.incomplete_checkpoint import checkpoint_anatomy

            a = checkpoint_anatomy(obj)
            if a is None or not (a.weights or a.parts):
                return
            step, epoch = counters(obj)
            self.loaded = Loaded(time.time(), path_of(f), a.weights, frozenset(a.parts), step, epoch, self.opt_loads)
        except Exception as e:
            self._on_error("torch.load observer", e)

    # ------------------------------------------------------------------ load post-hooks
    def attach_model(self, model: Any, handles: List[Any]) -> None:
        inner = getattr(model, "_orig_mod", model)
        inner = getattr(inner, "module", inner) if type(inner).__name__ in (
            "DistributedDataParallel", "DataParallel") else inner
        if id(inner) in self._model_ids or not hasattr(inner, "register_load_state_dict_post_hook"):
            return
        self._model_ids.add(id(inner))
        handles.append(inner.register_load_state_dict_post_hook(CopySafe(self._model_loaded)))

    def attach_optimizer(self, opt: Any, handles: List[Any]) -> None:
        if hasattr(opt, "register_load_state_dict_post_hook"):
            handles.append(opt.register_load_state_dict_post_hook(CopySafe(self._opt_loaded)))

    def mark(self, step: int) -> None:
        """A resume the hooks did not see but a framework reports (its trainer starts at ``step`` > 0,
        restored from its own checkpoint): the step records carry it like a restore the hooks saw,
        so the loss jump after it is judged. The resume observers are not called: the framework
        restored its own objects, which the lints do not see. A restore already seen wins."""
        with self._lock:
            if self.last is None and step > 0:
                self.last = Resume(time.time(), int(step), None)
                self.resumes += 1

    def _opt_loaded(self, opt: Any) -> None:
        self.opt_loads += 1

    def _model_loaded(self, module: Any, incompatible: Any) -> None:
        if not self.active:
            return None
        try:
            ld = self.loaded
            if ld is None or not ld.parts:  # weights only (or nothing seen): an initialization, not a resume
                return None
            r = Resume(time.time(), ld.step, ld.epoch, ld.parts, ld.path, ld.opt_loads)
            with self._lock:
                self.last = r
                self.resumes += 1
        except Exception as e:
            self._on_error("load_state_dict post-hook", e)
            return None
        for fn in list(self.observers):
            try:
                fn(r)
            except Exception as e:
                self._on_error(f"resume observer {getattr(fn, '__name__', fn)}", e)
        return None
