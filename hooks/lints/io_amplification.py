"""The io_amplification lint: every rank reads the whole dataset (no DistributedSampler)."""
from __future__ import annotations

from typing import Any

from ranksight import catalog as C

from .facts import batch_digest, batch_rows
from .core import register


@register(C.LINT_IO_AMPLIFICATION)
class IoAmplification:
    """io_amplification: every rank reads the whole dataset (no DistributedSampler).

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def _static_io(self) -> None:
        f = self.facts
        if self.world <= 1 or self.w.loader is None:
            return
        if f.is_dataloader and not f.iterable:
            ds = f.dist_sampler
            if ds is not None:
                if ds.num_replicas <= 1:
                    self.report(C.LINT_IO_AMPLIFICATION, True,
                                f"DistributedSampler(num_replicas={ds.num_replicas}) under world size {self.world}: every "
                                f"rank reads the whole dataset ({f.dataset_len} samples); use "
                                "DistributedSampler(dataset) (it takes num_replicas and rank from the process group)")
                elif ds.rank != self.rank and ds.num_replicas == self.world:
                    self.report(C.LINT_IO_AMPLIFICATION, True,
                                f"DistributedSampler(rank={ds.rank}) on rank {self.rank}: this rank reads another "
                                "rank's shard (ranks read the same samples, others are never read); pass rank=dist.get_rank()")
                else:
                    self.report(C.LINT_IO_AMPLIFICATION, False)
                return
            if f.shards is not None:
                count = f.shards[0]
                self.report(C.LINT_IO_AMPLIFICATION, count <= 1,
                            f"the sampler shards by rank into {count} shard under world size {self.world}: every rank "
                            "reads the whole dataset" if count <= 1 else "")
                return
            from torch.utils.data import RandomSampler, SequentialSampler

            if isinstance(f.sampler, (RandomSampler, SequentialSampler)):
                if f.subset_of is not None and f.dataset_len is not None \
                        and f.dataset_len * self.world <= f.subset_of + self.world:
                    self.report(C.LINT_IO_AMPLIFICATION, False)  # a per-rank Subset: pre-sharded
                    return
                kind = type(f.sampler).__name__
                self.report(C.LINT_IO_AMPLIFICATION, True,
                            f"DataLoader with a {kind} (no DistributedSampler) under world size {self.world}: every rank "
                            f"reads all {f.dataset_len} samples each epoch ({self.world}x the storage and decode work); "
                            "use DataLoader(..., sampler=DistributedSampler(dataset)) and call set_epoch() each epoch")
                return
        # an IterableDataset, a custom sampler or a custom loader: the first batch decides
        self._want_first_batch = True


    def _first_batch(self, batch: Any) -> None:
        try:
            self._first_rows = batch_rows(batch)
            if self._want_first_batch and self.on(C.LINT_IO_AMPLIFICATION):
                self._want_first_batch = False
                d = batch_digest(batch)
                if d is not None:
                    self._count_equal("first_batch", d, self._first_batch_result)
        except Exception as e:
            self._error("first batch", e)


    def _first_batch_result(self, same: int, total: int) -> None:
        if same >= total > 1:
            what = "IterableDataset" if self.facts.iterable else "loader"
            self.report(C.LINT_IO_AMPLIFICATION, True,
                        f"all {total} ranks got the same first batch from the {what}: every rank reads the same data; "
                        "shard by rank (the process group's rank/world size and torch.utils.data.get_worker_info() "
                        "in __iter__, or a DistributedSampler for map-style datasets)", key="first_batch")
        else:
            self.report(C.LINT_IO_AMPLIFICATION, False)
