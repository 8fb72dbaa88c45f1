"""The sampler_epoch lint: DistributedSampler.set_epoch() is never called: every epoch has the same order."""
from __future__ import annotations

from typing import Any

from ranksight import catalog as C

from .core import register


@register(C.LINT_SAMPLER_EPOCH)
class SamplerEpoch:
    """sampler_epoch: DistributedSampler.set_epoch() is never called: every epoch has the same order.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def on_epoch(self, loader: Any) -> None:
        """Every iteration over the watched loader starts here (before its first batch)."""
        self._epochs += 1
        ds = self.facts.dist_sampler
        if ds is None or not self.on(C.LINT_SAMPLER_EPOCH) or not getattr(ds, "shuffle", False):
            return
        epoch = getattr(ds, "epoch", None)
        if self._epochs >= 2 and epoch is not None:
            if epoch == self._last_epoch:
                self.report(C.LINT_SAMPLER_EPOCH, True,
                            f"DistributedSampler epoch is still {epoch} at the start of iteration {self._epochs} over "
                            "the loader: set_epoch() was not called, so every epoch shuffles into the same order; call "
                            "loader.sampler.set_epoch(epoch) before each epoch", key="stale")
            else:
                self.report(C.LINT_SAMPLER_EPOCH, False)
        self._last_epoch = epoch
