"""Setup lints: setup mistakes that slow or spoil training, caught at ``watch()``
time or within the first epoch, before they cost a day.

Each lint logs one line on the rank where it applies (when it turns on, not per step), is sent
to the agent as a "lint" datagram (``active`` true/false plus a message; the agent exposes
``ranksight_lint_active{lint}``) and can be turned off with ``lints.<id>: false`` in the config.
A lint that was checked and found fine sends ``active: false`` (the agent exposes
``lint_active 1`` only while a lint is active: a lint found fine, or never checked, has no
series). States are re-sent every
``RESEND_SECONDS`` so that a lost datagram or a restarted agent catch up.

When each check runs and what it costs
--------------------------------------
``attach(watcher)`` (called by ``watch()``, main thread, microseconds: attribute reads only)
  io_amplification   structural: a DataLoader under world size > 1 whose sampler does not shard
                     by rank (no ``DistributedSampler``, or one with ``num_replicas == 1``, or
                     one whose ``rank`` is not this rank's). ``num_replicas`` below the world
                     size is accepted: that is data parallel x model parallel. A ``Subset`` of
                     about 1/world of its base dataset counts as pre-sharded. When the structure
                     does not tell (an ``IterableDataset``, a custom sampler or loader), the first
                     batch decides (below).
  uneven_last_batch  ``drop_last=False`` and the per-rank sample count (``len(sampler)``) not a
                     multiple of the batch size: the last step of every epoch is a partial batch
                     (a new shape: recompiles, BatchNorm on 1 sample, per-sample loss skew; with
                     a custom per-rank split the ranks' last steps differ).
  rank_disagreement  the ``DistributedSampler`` seed and shuffle flag are published for the
                     cross-rank comparison (below).

first batch of the first epoch (main thread, once: ~0.3 ms per tensor, CPU tensors only)
  A digest of the batch (shapes, dtypes and up to 1024 evenly strided elements of each tensor).
  io_amplification fires when EVERY rank got the same first batch (ranks that share a batch
  legitimately, e.g. tensor-parallel peers, do not make all ranks equal). A batch with CUDA
  tensors is not digested (that would need a device sync): the check is skipped.

first training forward (main thread, once; on CUDA only kernel launches and an async copy)
  rank_disagreement  L1 and L2 norms of every parameter (``torch._foreach_norm``), folded into
                     256 buckets, compared with rank 0's (rank 0 with rank 1) with a relative
                     tolerance of 1e-6. On CUDA the norms are copied to pinned memory with
                     ``non_blocking=True`` and read on the lints thread once a CUDA event has
                     completed: no device synchronization.
                     What it can catch: DDP broadcasts parameters from rank 0 when it is
                     constructed, so a DDP model only disagrees if something changed parameters
                     on some ranks afterwards (a checkpoint loaded on rank 0 only after the wrap,
                     a per-rank re-initialisation, ``init_sync=False``), or a manual data-parallel
                     setup (no DDP) initialised with different seeds. Parameters only: DDP
                     re-broadcasts buffers every forward. Sharded parameters (DTensor, FSDP flat
                     parameters) are not checked; ranks whose parameter names/shapes differ
                     (pipeline stages) are not compared. Tensor parallelism with plain tensors
                     of equal shapes (not DTensor) is indistinguishable from disagreement: turn
                     the lint off there. Norms do not see permutations or sign flips.
first forward after the first optimizer step (main thread, once)
  global_batch_lr    rank 0 logs one info line: per-rank batch x data-parallel ranks x
                     accumulation (forwards with grad per optimizer step) and the LR of each
                     param group (``initial_lr`` too when a scheduler changed it).

every iteration over the loader (epoch boundary; ``add_epoch_observer``)
  sampler_epoch      a shuffling ``DistributedSampler`` whose ``epoch`` did not change since the
                     previous iteration: every epoch has the same order.

every object saved through the watched ``torch.save`` / ``atomic_save`` / ``checkpoint_timer(obj=)``
/ ``dcp.save`` (``add_checkpoint_observer``; the saving thread only inspects dict keys)
  incomplete_checkpoint  saves between two optimizer steps form one checkpoint (a trainer that
                     writes model, optimizer and RNG to separate files is complete). If it holds
                     model weights but lacks optimizer state, LR scheduler state (when a scheduler
                     is attached to the optimizer), the CPU RNG state, the CUDA RNG state (when
                     CUDA is in use), a sampler/data position or a step counter, the warning lists
                     exactly which. Objects whose content cannot be seen without calling them
                     (DCP ``Stateful`` wrappers) are not judged.

every restore of the watched model from a checkpoint (``add_resume_observer``, ``hooks/resume.py``)
  partial_resume     the first optimizer step after the restore (a step pre- and post-hook registered
                     at the restore, removed after that step): the optimizer's state empty before
                     the step and not after it (a stateful optimizer that was not restored), an LR
                     scheduler built on the optimizer (found once with ``gc.get_referrers``, ~30 ms)
                     still at ``last_epoch`` 0 after a resume from a step past 0; the first
                     iteration over the loader after it: a ``DistributedSampler`` whose epoch is 0
                     after a resume past the first epoch (the checkpoint's epoch, or its step past
                     one loader length). One message per part, active while any part is.

lints thread ("ranksight-lints", every 0.5 s; never on the step path or the heartbeat thread)
  cross-rank comparisons through the c10d store of the default process group: a key per rank
  (``store.set``/``store.add``), peers' keys read only after a non-blocking ``store.check``.
  This is not a collective: nothing enters the process group's collective stream, so it cannot
  contend with or reorder the job's collectives, and a rank that never calls ``watch()`` (or
  dies) cannot hang the others: the comparison is dropped after ``PEER_TIMEOUT``. Store errors
  (the job tearing down) drop the comparison quietly.
  dataloader_workers_rss  once a second for the first 5 s after workers appear, then every
                     ``MEMORY_SECONDS``: the USS (private memory) of this rank's
                     DataLoader worker processes (their pids from the live loader iterator). USS,
                     not RSS: a forked worker's RSS counts the parent's copy-on-write pages that
                     are shared by every worker, so a sum of RSS over workers can exceed the host's
                     memory while little is really used; the private pages are the workers' cost
                     and are exactly what grows when workers touch the dataset's Python objects.
                     The node total is EXACT, not estimated: each rank adds its change to a
                     per-node counter in the store, so ranks with different loaders are summed
                     as they are (local world size x own value would be wrong whenever ranks
                     differ, e.g. rank 0 also evaluating). The lint fires on every rank with
                     workers when that node total exceeds ``thresholds.lint_workers_host_mem_share``
                     of the host memory (or of the cgroup's limit, if lower). During the first
                     checks a rank waits until every local rank (LOCAL_WORLD_SIZE) has published,
                     so the finding states the node's sum, not a partial one. Without a store
                     (no process group) it falls back to LOCAL_WORLD_SIZE x own and says so.
                     The step records' ``wrss`` (the metric) is the watcher's RSS of the children.
  disk_headroom      at start, after each checkpoint and every ``DISK_SECONDS``: free space of
                     the tmp, log (``hooks.log_dir``) and checkpoint directories (``hooks.checkpoint_dir``
                     and those checkpoints were saved into) below 2 x the largest checkpoint seen,
                     or below ``thresholds.lint_min_free_bytes`` before the first. tmp/log/the
                     configured checkpoint dir are checked on local rank 0 only (one report per
                     node); a rank that saves checks the directories it saved into.
  numa_binding       at start and every ``NUMA_SECONDS``: the GPU's NUMA node from
                     ``<sysfs>/bus/pci/devices/<bus id>/numa_node`` (bus id from the CUDA device
                     properties), its CPUs from ``<sysfs>/devices/system/node/node<N>/cpulist``;
                     fires when the process's CPU affinity holds none of them. No GPU in use,
                     no NUMA information (-1) or missing sysfs files: quiet.

Layout: ``core.py`` (settings, store exchange, reporting, the lints thread), ``facts.py`` (what
the lints read from the user's objects) and one module per lint, each a mixin registered by its
id (``core.register``); ``Lints`` combines every registered lint.
"""
from __future__ import annotations

from typing import Any, Optional

from . import (dataloader_workers_rss, disk_headroom, global_batch_lr, incomplete_checkpoint,  # noqa: F401 (register)
               io_amplification, numa_binding, partial_resume, rank_disagreement, sampler_epoch,
               uneven_last_batch)
from .core import (BUCKETS, DISK_SECONDS, LINT_IDS,  # noqa: F401
                   MEMORY_FAST_CHECKS, MEMORY_FIRST_SECONDS, MEMORY_SECONDS, NUMA_SECONDS, PARAM_RTOL, PEER_TIMEOUT,
                   REGISTRY, RESEND_SECONDS, ROUND_QUIET_SECONDS, TICK_SECONDS, LintSettings, LintsCore, PeerExchange,
                   StoreGone, load_settings, log, register)
from .facts import (CPU_RNG_BYTES, DIGEST_ELEMS, DIGEST_LEAVES, LoaderFacts, batch_digest,  # noqa: F401
                    batch_rows, loader_facts, looks_like_state_dict)
from .incomplete_checkpoint import (CPU_RNG, CUDA_RNG, DATA_POS, OPTIMIZER, PARTS_ORDER, SCHEDULER,  # noqa: F401
                                    STEP, CkptAnatomy, checkpoint_anatomy)
from .numa_binding import cpulist, ranges, sysfs_bus_id  # noqa: F401

missing = [k for k in LINT_IDS if k not in REGISTRY]
if missing:  # every id of the catalog has its module
    raise ImportError(f"ranksight.hooks.lints: no module registers {missing}")


class Lints(*(REGISTRY[k] for k in LINT_IDS), LintsCore):  # type: ignore[misc]
    """The setup lints of one watch: every registered lint on the shared core. Entry points:
    ``start()`` (at ``watch()``), ``on_epoch(loader)``, ``on_iter(it)`` (the loader's iterator of
    each epoch), ``on_checkpoint(src, obj, path)``, ``on_resume(resume)``, the model's forward pre-hook, and the lints
    thread's ``tick()``. ``check_numa(...)`` can be called with a fake sysfs root and bus id (tests)."""


# ------------------------------------------------------------------------------ attach


def attach(watcher: Any, **kw: Any) -> Optional[Lints]:
    """Called by ``watch()``: read the config, run the watch-time checks and start the lints
    thread. Returns the ``Lints`` (also ``watcher.lints``), or None when every lint is off."""
    settings = load_settings(getattr(watcher, "config_source", None))
    if not any(settings.enabled.values()):
        return None
    lints = Lints(watcher, settings, **kw)
    watcher.lints = lints
    watcher.lint_iter = lints.on_iter
    watcher.add_epoch_observer(lints.on_epoch)
    watcher.add_checkpoint_observer(lints.on_checkpoint)
    if hasattr(watcher, "add_resume_observer"):
        watcher.add_resume_observer(lints.on_resume)
    if hasattr(watcher, "add_close_callback"):
        watcher.add_close_callback(lints.close)
    lints.start()
    return lints
