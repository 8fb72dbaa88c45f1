"""The uneven_last_batch lint: drop_last=False with an uneven last batch across ranks."""
from __future__ import annotations

from ranksight import catalog as C

from .core import register


@register(C.LINT_UNEVEN_LAST_BATCH)
class UnevenLastBatch:
    """uneven_last_batch: drop_last=False with an uneven last batch across ranks.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def _static_uneven(self) -> None:
        f = self.facts
        if self.world <= 1 or not f.is_dataloader or f.iterable or f.drop_last:
            return
        b, n, per = f.batch_size, f.dataset_len, f.per_rank
        if not b or n is None or per is None:
            return
        dp = f.dist_sampler.num_replicas if f.dist_sampler is not None else self.world
        last = per % b
        if last == 0:
            self.report(C.LINT_UNEVEN_LAST_BATCH, False)
            return
        msg = (f"drop_last=False and {per} samples per rank ({n} in the dataset, {dp} data-parallel "
               f"rank{'s' if dp != 1 else ''}) is not a multiple of "
               f"batch size {b}: every epoch ends with a partial step of {last} samples (a new shape: recompiles, "
               "memory spikes, BatchNorm on tiny batches)")
        ds = f.dist_sampler
        if ds is not None and not ds.drop_last and n % dp:
            msg += f"; DistributedSampler also repeats {dp - n % dp} samples to even out the ranks"
        elif ds is None:
            msg += "; without a DistributedSampler the ranks' last steps can differ"
        msg += f". Use drop_last=True or a dataset size that is a multiple of {dp}x{b}={dp * b}"
        self.report(C.LINT_UNEVEN_LAST_BATCH, True, msg)
