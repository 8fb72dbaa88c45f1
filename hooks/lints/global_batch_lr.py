"""The global_batch_lr lint: the global batch changed since the job's last start but the learning rate did not."""
from __future__ import annotations

import logging
import math

import torch

from ranksight import catalog as C

from .core import register


@register(C.LINT_GLOBAL_BATCH_LR)
class GlobalBatchLr:
    """global_batch_lr: the global batch changed since the job's last start but the learning rate did not.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def _global_batch(self, micro: int) -> None:
        f = self.facts
        b = f.batch_size or self._first_rows
        dp = f.dist_sampler.num_replicas if f.dist_sampler is not None else self.world
        acc = max(1, micro)
        pp = int(getattr(self.w, "_pipe", (0, 0, 0))[1] or 0)
        if pp > 0:  # a pipeline stage (hooks/pipeline.py): the loader's batch is the step's, split by the schedule
            dp = dp if f.dist_sampler is not None else max(1, self.world // pp)
            acc = 1
        lrs = []
        opt = self.w.optimizer
        for i, g in enumerate(getattr(opt, "param_groups", [])[:8]):
            lr = g.get("lr")
            if isinstance(lr, torch.Tensor):
                lr = float(lr) if lr.device.type == "cpu" else None
            s = f"{lr:g}" if isinstance(lr, (int, float)) else "?"
            init = g.get("initial_lr")
            if isinstance(init, (int, float)) and isinstance(lr, (int, float)) and init != lr:
                s += f" (initial_lr {init:g})"
            lrs.append(s)
        groups = len(getattr(opt, "param_groups", []))
        lr_txt = ", ".join(lrs) + (f" (+{groups - 8} more groups)" if groups > 8 else "") if lrs else "no optimizer"
        if b:
            msg = (f"global batch {b * dp * acc} samples = {b} samples per rank x {dp} data-parallel ranks x {acc} "
                   f"accumulation step{'' if acc == 1 else 's'} (forwards per optimizer step); lr {lr_txt}")
        else:
            msg = (f"global batch unknown (per-rank batch size in samples not found) x {dp} ranks x {acc} accumulation; "
                   f"lr {lr_txt}")
        # Not an active lint: one info line here; the agent keeps each job's global batch and base LR
        # across restarts and raises the lint when the batch changed but the LR did not.
        if not self.on(C.LINT_GLOBAL_BATCH_LR):
            return
        with self._lock:
            self.evaluations[C.LINT_GLOBAL_BATCH_LR] = self.evaluations.get(C.LINT_GLOBAL_BATCH_LR, 0) + 1
        # information, not a problem: the line says "info", where an active lint's says "lint"
        self._line(logging.INFO, f"ranksight info global_batch_lr on rank {self.rank}: {msg}")
        groups0 = getattr(opt, "param_groups", [])[:1]
        base = None
        if groups0:
            g0 = groups0[0]
            base = g0.get("initial_lr", g0.get("lr"))
        extra = {}
        if b and isinstance(base, (int, float)) and not isinstance(base, bool) and math.isfinite(base) and base >= 0:
            extra = {"gbatch": int(b * dp * acc), "lrate": float(base)}
        self.w.send_lint(C.LINT_GLOBAL_BATCH_LR, False, msg, **extra)
