"""The partial_resume lint: a checkpoint restore left the optimizer, LR scheduler or sampler epoch fresh."""
from __future__ import annotations

import gc
from typing import Any, List, Optional

from ranksight import catalog as C

from ..resume import Resume
from .core import register

OPT_PART, SCHED_PART, SAMPLER_PART = "optimizer", "scheduler", "sampler"


def _has_scheduler(opt: Any) -> bool:
    """An LR scheduler was built on ``opt``: it wraps ``opt.step`` and sets ``initial_lr``."""
    return bool(getattr(getattr(opt, "step", None), "_wrapped_by_lr_sched", False)) or any(
        "initial_lr" in g for g in getattr(opt, "param_groups", ()))


def schedulers_of(opt: Any) -> List[Any]:
    """The LR schedulers built on ``opt`` (they hold it; the optimizer holds none of them): one
    ``gc.get_referrers`` walk, about 30 ms in a process of 300,000 objects, once per resume and only
    when ``opt`` shows a scheduler."""
    if not _has_scheduler(opt):
        return []
    from torch.optim.lr_scheduler import LRScheduler

    return [r for r in gc.get_referrers(opt) if isinstance(r, LRScheduler) and getattr(r, "optimizer", None) is opt]


@register(C.LINT_PARTIAL_RESUME)
class PartialResume:
    """partial_resume: the watched model was restored from a checkpoint (``hooks/resume.py``) but
    the optimizer state, the LR scheduler or the sampler epoch starts from scratch.

    Judged once per resume, after every restore the user makes (they all come before training
    continues): at the first optimizer step after it, the optimizer state (empty before the step,
    not empty after it: a stateful optimizer that was not restored; an optimizer without state, SGD
    without momentum, is never flagged) and the schedulers built on the optimizer (``last_epoch``
    still 0 after a resume from a step past 0); at the first iteration over the loader after it,
    the ``DistributedSampler``'s epoch (still 0 after a resume past the first epoch: the checkpoint's
    epoch, or its step past one loader length). The step's pre- and post-hooks are registered at the
    resume and removed after that step: the step path runs nothing of this lint otherwise.

    A mixin of ``Lints``; when it runs is in the ``ranksight.hooks.lints`` docstring."""

    _resume: Optional[Resume] = None
    _resume_handles: Optional[List[Any]] = None
    _resume_before = -1
    _resume_scheds: Optional[List[Any]] = None
    _resume_epoch_wanted = False

    def on_resume(self, r: Resume) -> None:
        """A checkpoint restore of the watched model (the loading thread: the main thread)."""
        if not self.on(C.LINT_PARTIAL_RESUME):
            return
        self._resume = r
        self._resume_unhook()
        opt = self.w.optimizer
        if opt is not None and hasattr(opt, "register_step_pre_hook"):
            self._resume_handles = [opt.register_step_pre_hook(self._resume_pre),
                                    opt.register_step_post_hook(self._resume_post)]
        if self.facts.dist_sampler is not None:
            if not self._resume_epoch_wanted:
                self.w.add_epoch_observer(self._resume_on_epoch)
            self._resume_epoch_wanted = True

    def _resume_unhook(self) -> None:
        hs, self._resume_handles = self._resume_handles, None
        for h in hs or ():
            h.remove()

    def _resume_pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._resume_before = len(opt.state)
            self._resume_scheds = schedulers_of(opt)
        except Exception as e:
            self._resume_unhook()
            self._error(C.LINT_PARTIAL_RESUME, e)

    def _resume_post(self, opt: Any, args: Any, kwargs: Any) -> None:
        try:
            self._resume_unhook()
            r = self._resume
            if r is None:
                return
            after = len(opt.state)
            where = f"the restore of {r.path or 'a checkpoint'}" + (f" at step {r.step}" if r.step else "")
            msg = None
            if self._resume_before == 0 and after > 0:
                if self.w.resumes.opt_loads > r.opt_loads:
                    held = "optimizer.load_state_dict() was called but the state it loaded is empty"
                elif "optimizer state" in r.parts:
                    held = "the checkpoint holds optimizer state that was not loaded"
                else:
                    held = "the checkpoint holds no optimizer state"
                msg = (f"{where} restored the model but not the optimizer ({type(opt).__name__} started with empty "
                       f"state: {held}); its moments restart from zero, a loss jump after the resume")
            with self._lock:  # both parts, then one report (one log line)
                self._parts.setdefault(C.LINT_PARTIAL_RESUME, {})[OPT_PART] = msg
            fresh = [s for s in self._resume_scheds or () if getattr(s, "last_epoch", None) == 0]
            smsg = None
            if fresh and r.step > 0:
                smsg = (f"{where}: the LR scheduler ({type(fresh[0]).__name__}) is at step 0 (last_epoch 0): its "
                        "state was not restored, so warmup and the schedule start over; call "
                        "scheduler.load_state_dict(...)")
            self.report_part(C.LINT_PARTIAL_RESUME, SCHED_PART, smsg)
            self._resume_scheds = None
        except Exception as e:
            self._error(C.LINT_PARTIAL_RESUME, e)

    def _resume_on_epoch(self, loader: Any) -> None:
        """The first iteration over the loader after a resume: the sampler's epoch."""
        try:
            r, ds = self._resume, self.facts.dist_sampler
            if not self._resume_epoch_wanted or r is None or ds is None:
                return
            self._resume_epoch_wanted = False
            epoch = r.epoch
            if epoch is None and r.step:
                try:
                    n = len(loader)
                except TypeError:
                    n = 0
                epoch = r.step // n if n else None  # every step reads one batch or more
            msg = None
            if epoch and getattr(ds, "epoch", None) == 0:
                msg = (f"the DistributedSampler's epoch is 0 at the first epoch after resuming at epoch {epoch}: "
                       "set_epoch() was not called with the restored epoch, so the resumed run replays epoch 0's "
                       "order; call loader.sampler.set_epoch(epoch) before each epoch")
            self.report_part(C.LINT_PARTIAL_RESUME, SAMPLER_PART, msg)
        except Exception as e:
            self._error(C.LINT_PARTIAL_RESUME, e)
