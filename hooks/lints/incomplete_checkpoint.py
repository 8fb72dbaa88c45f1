"""The incomplete_checkpoint lint: checkpoint lacks optimizer/scheduler/RNG/data/step state."""
from __future__ import annotations

import itertools
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, List, Mapping, Optional, Set

import torch

from ranksight import catalog as C

from ..checkpoint import size_of
from .core import ROUND_QUIET_SECONDS, register
from .facts import CPU_RNG_BYTES, _is_rng_bytes, looks_like_state_dict

OPTIMIZER = "optimizer state"


SCHEDULER = "LR scheduler state"


CPU_RNG = "CPU RNG state"


CUDA_RNG = "CUDA RNG state"


DATA_POS = "sampler/data position"


STEP = "step counter"


PARTS_ORDER = (OPTIMIZER, SCHEDULER, CPU_RNG, CUDA_RNG, DATA_POS, STEP)


_MODEL_KEY = re.compile(r"model|^(state_dict|module|net|network|weights|params|ema|encoder|decoder|policy)$")


_OPT_KEY = re.compile(r"optim")


_SCHED_KEY = re.compile(r"sched")


_RNG_KEY = re.compile(r"rng|random|generator|seed_state")


_CUDA_KEY = re.compile(r"cuda|gpu")


_DATA_KEY = re.compile(r"sampler|data_?loader|loader|data_?state|dataset_?state|consumed|samples?_?seen|tokens?_?seen"
                       r"|seen_?(samples|tokens)|data_?pos|batch_?idx|epoch|data_?iter")


_STEP_KEY = re.compile(r"(^|_)(global_?step|steps?|iteration|iters?|num_updates|updates?|num_steps|train_steps?"
                       r"|optimizer_steps?|opt_steps?)$")


@dataclass


class CkptAnatomy:
    weights: bool = False
    parts: Set[str] = field(default_factory=set)
    opaque: bool = False  # holds objects whose content cannot be seen (DCP Stateful wrappers)


def _opt_state(v: Any) -> bool:
    return isinstance(v, torch.optim.Optimizer) or (isinstance(v, Mapping) and "state" in v and "param_groups" in v)


def _sched_state(v: Any) -> bool:
    from torch.optim.lr_scheduler import LRScheduler

    return isinstance(v, LRScheduler) or (isinstance(v, Mapping) and "last_epoch" in v
                                          and ("base_lrs" in v or "_last_lr" in v))


def checkpoint_anatomy(obj: Any) -> Optional[CkptAnatomy]:
    """What a saved object holds: model weights and which resume parts. None: not a checkpoint
    this lint understands (a tensor, a list, a plain value)."""
    a = CkptAnatomy()
    if isinstance(obj, torch.nn.Module):
        a.weights = True
        return a
    if not isinstance(obj, Mapping):
        return None
    if _opt_state(obj):  # a file per part: optimizer.pt
        a.parts.add(OPTIMIZER)
        return a
    if _sched_state(obj):
        a.parts.add(SCHEDULER)
        return a
    if looks_like_state_dict(obj):
        a.weights = True  # a bare model state_dict
        return a
    _scan(obj, "", 0, a)
    return a


def _scan(m: Mapping, path: str, depth: int, a: CkptAnatomy) -> None:
    for k, v in itertools.islice(m.items(), 256):
        key = str(k).lower()
        full = f"{path}/{key}" if path else key
        if isinstance(v, torch.nn.Module):
            a.weights = True
            continue
        structured = isinstance(v, (Mapping, list, tuple)) or hasattr(v, "state_dict")  # not a number or a tensor
        if _opt_state(v) or (_OPT_KEY.search(key) and structured and v):
            a.parts.add(OPTIMIZER)
            continue
        if _sched_state(v) or (_SCHED_KEY.search(key) and structured and v):
            a.parts.add(SCHEDULER)
            continue
        if _is_rng_bytes(v) or (isinstance(v, (list, tuple)) and v and all(_is_rng_bytes(x) for x in v[:64])) \
                or isinstance(v, torch.Generator):
            _rng(full, v, a)
            continue
        if looks_like_state_dict(v):
            if _MODEL_KEY.search(key) or depth == 0:
                a.weights = True
            continue
        if isinstance(v, Mapping):
            if _MODEL_KEY.search(key) and v and all(looks_like_state_dict(x) for x in itertools.islice(v.values(), 16)):
                a.weights = True  # {"model": {"encoder": sd, "decoder": sd}}
                continue
            if _DATA_KEY.search(key) and v:
                a.parts.add(DATA_POS)
            if depth < 2:
                _scan(v, full, depth + 1, a)
            continue
        if _DATA_KEY.search(key) and v is not None:
            a.parts.add(DATA_POS)
            continue
        if _STEP_KEY.search(key) and (isinstance(v, (int, float)) and not isinstance(v, bool)
                                      or (isinstance(v, torch.Tensor) and v.numel() == 1)):
            a.parts.add(STEP)
            continue
        name = type(v).__name__
        if "Loader" in name or "Sampler" in name:
            a.parts.add(DATA_POS)
        elif hasattr(v, "state_dict") and hasattr(v, "load_state_dict"):
            a.opaque = True  # a DCP Stateful: its state_dict() is only called by the save itself


def _rng(path: str, v: Any, a: CkptAnatomy) -> None:
    if isinstance(v, torch.Generator):
        a.parts.add(CUDA_RNG if v.device.type == "cuda" else CPU_RNG)
        return
    if _CUDA_KEY.search(path):
        a.parts.add(CUDA_RNG)
    elif isinstance(v, torch.Tensor) and (v.numel() == CPU_RNG_BYTES or _RNG_KEY.search(path) or "cpu" in path
                                          or "torch" in path):
        a.parts.add(CPU_RNG)


@register(C.LINT_INCOMPLETE_CHECKPOINT)
class IncompleteCheckpoint:
    """incomplete_checkpoint: checkpoint lacks optimizer/scheduler/RNG/data/step state.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def on_checkpoint(self, src: str, obj: Any, path: Optional[str]) -> None:
        want_anatomy = self.on(C.LINT_INCOMPLETE_CHECKPOINT)
        if not want_anatomy and not self.on(C.LINT_DISK_HEADROOM):
            return
        anatomy = checkpoint_anatomy(obj) if (want_anatomy and obj is not None) else None
        with self._lock:
            self._ckpt_events.append((self.w._seq, time.monotonic(), src, path, anatomy))


    def _checkpoint_rounds(self, now: float) -> None:
        with self._lock:
            events, self._ckpt_events = self._ckpt_events, []
        for seq, t, src, path, anatomy in events:
            r = self._round
            if r is not None and r["seq"] != seq:
                self._end_round()
                r = None
            if r is None:
                r = self._round = {"seq": seq, "t": t, "parts": set(), "weights": False, "opaque": False,
                                   "saves": [], "paths": []}
            r["t"] = t
            r["saves"].append((src, path))
            if path:
                r["paths"].append(path)
                self._ckpt_paths[os.path.abspath(path)] = now
            if anatomy is not None:
                r["weights"] |= anatomy.weights
                r["opaque"] |= anatomy.opaque
                r["parts"] |= anatomy.parts
        r = self._round
        if r is not None and (self.w._seq != r["seq"] or now - r["t"] >= ROUND_QUIET_SECONDS):
            self._end_round()


    def _required(self) -> List[str]:
        req = [CPU_RNG, DATA_POS, STEP]
        opt = self.w.optimizer
        if opt is not None:
            req.append(OPTIMIZER)
            if getattr(getattr(opt, "step", None), "_wrapped_by_lr_sched", False) or any(
                    "initial_lr" in g for g in getattr(opt, "param_groups", [])):
                req.append(SCHEDULER)
        try:
            if self.w._tl is not None or (torch.cuda.is_available() and torch.cuda.is_initialized()):
                req.append(CUDA_RNG)
        except Exception:
            pass
        return [p for p in PARTS_ORDER if p in req]


    def _end_round(self) -> None:
        r, self._round = self._round, None
        if r is None:
            return
        self._last_round_paths = list(dict.fromkeys(r["paths"]))
        self._measure_checkpoints()
        self._next_disk = 0.0  # check headroom with the new size
        if not self.on(C.LINT_INCOMPLETE_CHECKPOINT) or not r["weights"] or r["opaque"]:
            return
        missing = [p for p in self._required() if p not in r["parts"]]
        where = ", ".join(f"{p or '?'} ({s})" for s, p in r["saves"][:3]) + (" ..." if len(r["saves"]) > 3 else "")
        if missing:
            self.report(C.LINT_INCOMPLETE_CHECKPOINT, True,
                        f"checkpoint after step {r['seq']} ({where}) holds model weights but lacks: {', '.join(missing)}; "
                        "a resume from it restarts those from scratch (the loss jump after a resume)",
                        key=tuple(missing))
        else:
            self.report(C.LINT_INCOMPLETE_CHECKPOINT, False)


    def _measure_checkpoints(self) -> None:
        total = sum(size_of(p) for p in self._last_round_paths)
        if total > self._largest_ckpt:
            self._largest_ckpt = total
