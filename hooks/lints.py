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
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch

from ranksight import config as rs_config
from ranksight import protocol, triage

from .checkpoint import size_of

log = logging.getLogger("ranksight.hooks.lints")

LINT_IDS: Tuple[str, ...] = tuple(triage.LINTS)
TICK_SECONDS = 0.5
RESEND_SECONDS = 30.0
PEER_TIMEOUT = 600.0  # give up a cross-rank comparison when a peer has not published by then
MEMORY_FIRST_SECONDS = 1.0  # first workers' memory reading after the workers appear
MEMORY_FAST_CHECKS = 5
MEMORY_SECONDS = 10.0
DISK_SECONDS = 60.0
NUMA_SECONDS = 300.0
ROUND_QUIET_SECONDS = 5.0  # a checkpoint round ends at the next optimizer step or after this
BUCKETS = 256
PARAM_RTOL = 1e-6
DIGEST_ELEMS = 1024
DIGEST_LEAVES = 16
CPU_RNG_BYTES = 5056  # torch.get_rng_state().numel() (MT19937)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_INSTANCES = itertools.count()  # watch() number in this process: keeps store keys of a second watch() apart


# ------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class LintSettings:
    enabled: Mapping[str, bool]
    workers_host_mem_share: float
    min_free_bytes: float

    def on(self, lint: str) -> bool:
        return bool(self.enabled.get(lint, True))


def load_settings(config: Any = None) -> LintSettings:
    """The ``lints`` switches and the two lint thresholds, from the same config the watcher used
    (a path, a dict with sections, or None: ``RANKSIGHT_CONFIG`` and ``RANKSIGHT__lints__*``).
    A bad value never stops training: one log line and the default."""
    d = rs_config.defaults()
    if isinstance(config, Mapping):
        lints = dict(d["lints"])
        lints.update(config.get("lints") or {})
        thr = dict(d["thresholds"])
        thr.update(config.get("thresholds") or {})
    else:
        try:
            cfg = rs_config.load(config)
            lints, thr = dict(cfg["lints"]), dict(cfg["thresholds"])
        except Exception as e:  # the watcher already logged a bad config
            log.debug("ranksight: lints use the built-in defaults (%s)", e)
            lints, thr = d["lints"], d["thresholds"]

    def checked(section: str, key: str, value: Any) -> Any:
        try:
            return rs_config.validate(section, key, value)
        except rs_config.ConfigError as e:
            log.warning("ranksight: %s; using the default %r", e, d[section][key])
            return d[section][key]

    enabled = {k: bool(checked("lints", k, lints.get(k, True))) for k in d["lints"]}
    return LintSettings(enabled=enabled,
                        workers_host_mem_share=float(checked("thresholds", "lint_workers_host_mem_share",
                                                             thr.get("lint_workers_host_mem_share"))),
                        min_free_bytes=float(checked("thresholds", "lint_min_free_bytes", thr.get("lint_min_free_bytes"))))


# ------------------------------------------------------------------------------ small helpers
def _gb(n: float) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.1f} MB"
    return f"{n / 1e3:.1f} kB"


def cpulist(s: str) -> Set[int]:
    """'0-3,8,10-11' -> {0,1,2,3,8,10,11}"""
    out: Set[int] = set()
    for part in s.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        else:
            out.add(int(part))
    return out


def ranges(cpus: Iterable[int]) -> str:
    """{0,1,2,3,8} -> '0-3,8'"""
    s = sorted(cpus)
    out: List[str] = []
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and s[j + 1] == s[j] + 1:
            j += 1
        out.append(str(s[i]) if i == j else f"{s[i]}-{s[j]}")
        i = j + 1
    return ",".join(out)


def sysfs_bus_id(bus_id: str) -> str:
    """NVML '00000000:18:00.0' or '0000:18:00.0' -> sysfs '0000:18:00.0' (lower case)."""
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 3:
        parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def _is_tensor_like(v: Any) -> bool:
    return isinstance(v, torch.Tensor) or type(v).__name__ in ("ShardedTensor", "DTensor")


def looks_like_state_dict(m: Any) -> bool:
    """A mapping whose values are mostly tensors (a module's state_dict)."""
    if not isinstance(m, Mapping) or not m:
        return False
    n = t = 0
    for v in itertools.islice(m.values(), 64):
        n += 1
        t += _is_tensor_like(v) and not _is_rng_bytes(v)  # uint8 vectors are RNG states, not weights
    return t >= 1 and 2 * t >= n


# ------------------------------------------------------------------------------ batch digest
class _Unhashable(Exception):
    pass


def batch_digest(batch: Any) -> Optional[str]:
    """A cheap digest of a batch: structure, shapes, dtypes and up to DIGEST_ELEMS evenly strided
    elements per tensor (the first DIGEST_LEAVES leaves). None when a tensor is not on the CPU."""
    h = hashlib.blake2b(digest_size=16)
    leaves = [0]

    def visit(x: Any, depth: int) -> None:
        if leaves[0] >= DIGEST_LEAVES:
            return
        if isinstance(x, torch.Tensor):
            leaves[0] += 1
            if x.device.type != "cpu" or x.layout != torch.strided:
                raise _Unhashable()
            h.update(f"T{x.dtype}{tuple(x.shape)}".encode())
            flat = x.detach().reshape(-1)
            n = flat.numel()
            if n:
                s = flat[:: max(1, n // DIGEST_ELEMS)][:DIGEST_ELEMS]
                if s.is_complex():
                    s = torch.view_as_real(s).reshape(-1)
                vals = s.to(torch.float64).tolist() if s.is_floating_point() else s.to(torch.int64).tolist()
                h.update(struct.pack(f"<{len(vals)}{'d' if s.is_floating_point() else 'q'}", *vals))
            return
        if isinstance(x, (str, bytes, int, float, bool)) or x is None:
            leaves[0] += 1
            h.update(repr(x)[:4096].encode("utf-8", "replace"))
            return
        if depth >= 4:
            h.update(type(x).__name__.encode())
            return
        if isinstance(x, Mapping):
            h.update(b"{")
            for k in sorted(x, key=repr)[:64]:
                h.update(repr(k).encode("utf-8", "replace"))
                visit(x[k], depth + 1)
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for y in x[:64]:
                visit(y, depth + 1)
            h.update(b"]")
        elif hasattr(x, "tobytes") and hasattr(x, "shape"):  # numpy arrays
            leaves[0] += 1
            h.update(repr((getattr(x, "dtype", ""), tuple(x.shape))).encode())
            h.update(x.reshape(-1)[:: max(1, x.size // DIGEST_ELEMS)][:DIGEST_ELEMS].tobytes())
        elif hasattr(x, "__dataclass_fields__"):
            for k in x.__dataclass_fields__:
                visit(getattr(x, k, None), depth + 1)
        else:
            h.update(type(x).__name__.encode())

    try:
        visit(batch, 0)
    except _Unhashable:
        return None
    return h.hexdigest()


def batch_rows(batch: Any) -> Optional[int]:
    """Leading dimension of the first tensor in a batch (its per-rank batch size)."""
    stack = [batch]
    while stack:
        x = stack.pop(0)
        if isinstance(x, torch.Tensor):
            return int(x.shape[0]) if x.dim() else None
        if isinstance(x, Mapping):
            stack.extend(list(x.values())[:16])
        elif isinstance(x, (list, tuple)):
            stack.extend(list(x)[:16])
    return None


# ------------------------------------------------------------------------------ loader facts
_SHARD_ATTRS = (("num_replicas", "rank"), ("world_size", "rank"), ("num_processes", "process_index"),
                ("num_shards", "shard_id"), ("dp_world_size", "dp_rank"), ("data_parallel_size", "data_parallel_rank"))


@dataclass
class LoaderFacts:
    is_dataloader: bool = False
    iterable: bool = False
    dataset_len: Optional[int] = None
    batch_size: Optional[int] = None
    drop_last: bool = False
    sampler: Any = None  # the sampler that orders the samples (inside a BatchSampler if any)
    dist_sampler: Any = None  # a torch DistributedSampler, if that is the sampler
    shards: Optional[Tuple[int, int]] = None  # (count, index) from a shard-aware custom sampler
    per_rank: Optional[int] = None  # samples per rank per epoch (len(sampler))
    subset_of: Optional[int] = None  # len of the base dataset when the dataset is a Subset
    num_workers: int = 0


def loader_facts(loader: Any) -> LoaderFacts:
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, IterableDataset, Subset

    f = LoaderFacts()
    if not isinstance(loader, DataLoader):
        return f
    f.is_dataloader = True
    ds = loader.dataset
    f.iterable = isinstance(ds, IterableDataset)
    f.num_workers = int(loader.num_workers or 0)
    f.drop_last = bool(loader.drop_last)
    f.batch_size = loader.batch_size
    bs = loader.batch_sampler
    sampler = loader.sampler
    custom_batches = bs is not None and not isinstance(bs, BatchSampler) and not hasattr(bs, "sampler")
    if bs is not None and not isinstance(bs, BatchSampler):
        sampler = getattr(bs, "sampler", bs)  # a custom batch sampler
        f.batch_size = getattr(bs, "batch_size", None)
        f.drop_last = bool(getattr(bs, "drop_last", False))
    elif isinstance(bs, BatchSampler):
        inner = getattr(bs, "batch_sampler", None)  # a sharding wrapper (Accelerate's BatchSamplerShard)
        sampler = getattr(bs, "sampler", None) or getattr(inner, "sampler", None) or loader.sampler
        f.batch_size = getattr(bs, "batch_size", getattr(inner, "batch_size", None))
        f.drop_last = bool(getattr(bs, "drop_last", getattr(inner, "drop_last", False)))
    f.sampler = sampler
    if isinstance(sampler, DistributedSampler):
        f.dist_sampler = sampler
    else:
        for holder in (sampler, bs):
            for count, index in _SHARD_ATTRS:
                c, i = getattr(holder, count, None), getattr(holder, index, None)
                if isinstance(c, int) and isinstance(i, int):
                    f.shards = (c, i)
                    break
            if f.shards:
                break
    if not f.iterable:
        try:
            f.dataset_len = len(ds)
        except Exception:
            f.dataset_len = None
        try:  # a custom batch sampler without .sampler has a length in batches, not samples
            f.per_rank = len(sampler) if sampler is not None and not custom_batches else None
        except Exception:
            f.per_rank = None
        if isinstance(ds, Subset):
            try:
                f.subset_of = len(ds.dataset)
            except Exception:
                pass
    return f


# ------------------------------------------------------------------------------ checkpoint anatomy
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


def _is_rng_bytes(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1


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


# ------------------------------------------------------------------------------ cross-rank exchange
class StoreGone(Exception):
    """The c10d store failed (the job is tearing down): the comparison is dropped quietly."""


class PeerExchange:
    """Publish/compare small values across ranks through the default process group's c10d store.

    Never blocks on a missing key (``check`` first, then ``get``); every call runs on the lints
    thread. Keys: ``ranksight/lints/<restart>/<watch no>/<name>/...``."""

    def __init__(self, restart: int, instance: int):
        self.prefix = f"ranksight/lints/{restart}/{instance}"

    @staticmethod
    def store() -> Any:
        """The default group's store, looked up per use: holding it would keep a destroyed process
        group's store (and rank 0's server thread) alive until interpreter exit."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return dist.distributed_c10d._get_default_store()
        except Exception as e:  # a process group without a store (or a torch without this helper)
            log.debug("ranksight: no c10d store for the lints' cross-rank checks: %s", e)
        return None

    def key(self, *parts: Any) -> str:
        return "/".join([self.prefix, *map(str, parts)])

    def _op(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except Exception as e:  # DistStoreError, RuntimeError, OSError: a store going away
            raise StoreGone(str(e)) from e

    def set(self, key: str, value: bytes) -> None:
        s = self.store()
        self._op(lambda: s.set(key, value))

    def ready(self, key: str) -> bool:
        s = self.store()
        return bool(self._op(lambda: s.check([key])))

    def get(self, key: str) -> bytes:
        s = self.store()
        return self._op(lambda: s.get(key))

    def add(self, key: str, n: int) -> int:
        s = self.store()
        return int(self._op(lambda: s.add(key, n)))


@dataclass
class _Task:
    """One pending cross-rank comparison, advanced by ``poll()`` on the lints thread."""
    name: str
    poll: Callable[[], bool]  # True when done
    deadline: float


# ------------------------------------------------------------------------------ the lints
class _FirstBatch:
    """Iterator wrapper for the first epoch: hands the first batch to ``cb`` (errors counted),
    then only forwards. The user's exceptions (StopIteration included) pass unchanged."""

    __slots__ = ("_it", "_cb")

    def __init__(self, it: Any, cb: Callable[[Any], None]):
        self._it = it
        self._cb: Optional[Callable[[Any], None]] = cb

    def __iter__(self) -> "_FirstBatch":
        return self

    def __next__(self) -> Any:
        b = next(self._it)
        cb = self._cb
        if cb is not None:
            self._cb = None
            cb(b)
        return b


class Lints:
    """The setup lints of one watch. Entry points: ``start()`` (at ``watch()``), ``on_epoch(loader)``,
    ``on_iter(it)`` (the loader's iterator of each epoch), ``on_checkpoint(src, obj, path)``, the
    model's forward pre-hook, and the lints thread's ``tick()``. ``check_numa(...)`` can be called
    with a fake sysfs root and bus id (tests)."""

    def __init__(self, watcher: Any, settings: LintSettings, *, sysfs: str = "/sys",
                 disk_usage: Callable[[str], Any] = shutil.disk_usage):
        self.w = watcher
        self.settings = settings
        self.sysfs = sysfs
        self.disk_usage = disk_usage
        self.instance = next(_INSTANCES)
        self._lock = threading.Lock()
        self._states: Dict[str, List[Any]] = {}  # lint -> [active, msg, key]
        self._parts: Dict[str, Dict[str, Optional[str]]] = {}  # lint -> part -> message (None: fine)
        self._stop = threading.Event()
        self._tick_lock = threading.Lock()  # tick() on the lints thread vs close()
        self._thread: Optional[threading.Thread] = None
        self._tasks: List[_Task] = []
        self._inbox: List[Callable[[], None]] = []  # work handed from the main thread to the lints thread
        self._ex = PeerExchange(watcher.identity.restart, self.instance)
        self.facts = loader_facts(watcher.loader) if watcher.loader is not None else LoaderFacts()
        # epoch / iterator
        self._epochs = 0
        self._last_epoch: Optional[int] = None
        self._iter_ref: Optional[weakref.ReferenceType] = None
        self._want_first_batch = False
        self._first_rows: Optional[int] = None
        # forward hook
        self._fwd_handle: Any = None
        self._fwd_count = 0
        self._digest_done = False
        self._batch_done = False
        # checkpoints
        self._ckpt_events: List[Tuple[int, float, str, Optional[str], Optional[CkptAnatomy]]] = []
        self._round: Optional[Dict[str, Any]] = None
        self._ckpt_paths: Dict[str, float] = {}  # path -> last time seen
        self._largest_ckpt = 0
        self._last_round_paths: List[str] = []
        # periodic
        now = time.monotonic()
        self._next_resend = now + RESEND_SECONDS
        self._next_disk = now
        self._next_numa = now
        self._next_mem: Optional[float] = None
        self._node_contrib = 0  # bytes this rank added to the node's workers' counter
        self._mem_checks = 0
        self._joined = False
        self.evaluations: Dict[str, int] = {}  # lint -> times checked (tests wait on this)

    # ------------------------------------------------------------------ identity
    @property
    def rank(self) -> int:
        return self.w.identity.rank

    @property
    def world(self) -> int:
        return self.w.identity.world_size

    def on(self, lint: str) -> bool:
        return self.settings.on(lint)

    # ------------------------------------------------------------------ reporting
    def report(self, lint: str, active: bool, msg: str = "", key: Any = None, info: bool = False) -> None:
        """Record a lint's state; log and send on a change (or a new ``key`` while active)."""
        if not self.on(lint):
            return
        line = f"ranksight lint {lint} on rank {self.rank}: {msg}"  # the log line keeps the whole message
        msg = msg[: protocol.MAX_MSG]
        with self._lock:
            self.evaluations[lint] = self.evaluations.get(lint, 0) + 1
            prev = self._states.get(lint)
            changed = prev is None or prev[0] != active or (active and prev[2] != key)
            self._states[lint] = [active, msg, key]
        if not changed:
            return
        if active:
            if info:
                self._line(logging.INFO, line)
            else:
                self._line(logging.WARNING, f"{line} (lints.{lint}: false turns this off)")
        elif prev is not None and prev[0]:
            self._line(logging.INFO, f"ranksight lint {lint} on rank {self.rank} cleared")
        self.w.send_lint(lint, active, msg)

    @staticmethod
    def _line(level: int, line: str) -> None:
        if logging.getLogger().hasHandlers() or log.hasHandlers():
            log.log(level, line)
        else:  # nothing configured: the line must still be seen (lastResort drops INFO)
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def report_part(self, lint: str, part: str, msg: Optional[str], info: bool = False) -> None:
        """A lint made of several checks (``part``): active while any part has a message."""
        with self._lock:
            parts = self._parts.setdefault(lint, {})
            parts[part] = msg
            active = {k: v for k, v in parts.items() if v}
        if active:
            self.report(lint, True, "; ".join(active.values()), key=tuple(sorted(active)), info=info)
        else:
            self.report(lint, False)

    def state(self, lint: str) -> Optional[Tuple[bool, str]]:
        with self._lock:
            s = self._states.get(lint)
        return (s[0], s[1]) if s else None

    def idle(self) -> bool:
        """No cross-rank comparison, queued work or checkpoint round pending."""
        return not self._tasks and not self._inbox and self._round is None and not self._ckpt_events

    def _error(self, where: str, e: BaseException) -> None:
        self.w._hook_error(f"lint {where}", e)

    # ------------------------------------------------------------------ start (watch() time, main thread)
    def start(self) -> None:
        for name, fn in (("io_amplification", self._static_io), ("uneven_last_batch", self._static_uneven),
                         ("rank_disagreement", self._static_seed)):
            if self.on(name):
                try:
                    fn()
                except Exception as e:
                    self._error(name, e)
        try:
            self._install_forward_hook()
        except Exception as e:
            self._error("forward hook", e)
        self._thread = threading.Thread(target=self._run, name="ranksight-lints", daemon=True)
        self._thread.start()

    def _static_io(self) -> None:
        f = self.facts
        if self.world <= 1 or self.w.loader is None:
            return
        if f.is_dataloader and not f.iterable:
            ds = f.dist_sampler
            if ds is not None:
                if ds.num_replicas <= 1:
                    self.report("io_amplification", True,
                                f"DistributedSampler(num_replicas={ds.num_replicas}) under world size {self.world}: every "
                                f"rank reads the whole dataset ({f.dataset_len} samples); use "
                                "DistributedSampler(dataset) (it takes num_replicas and rank from the process group)")
                elif ds.rank != self.rank and ds.num_replicas == self.world:
                    self.report("io_amplification", True,
                                f"DistributedSampler(rank={ds.rank}) on rank {self.rank}: this rank reads another "
                                "rank's shard (ranks read the same samples, others are never read); pass rank=dist.get_rank()")
                else:
                    self.report("io_amplification", False)
                return
            if f.shards is not None:
                count = f.shards[0]
                self.report("io_amplification", count <= 1,
                            f"the sampler shards by rank into {count} shard under world size {self.world}: every rank "
                            "reads the whole dataset" if count <= 1 else "")
                return
            from torch.utils.data import RandomSampler, SequentialSampler

            if isinstance(f.sampler, (RandomSampler, SequentialSampler)):
                if f.subset_of is not None and f.dataset_len is not None \
                        and f.dataset_len * self.world <= f.subset_of + self.world:
                    self.report("io_amplification", False)  # a per-rank Subset: pre-sharded
                    return
                kind = type(f.sampler).__name__
                self.report("io_amplification", True,
                            f"DataLoader with a {kind} (no DistributedSampler) under world size {self.world}: every rank "
                            f"reads all {f.dataset_len} samples each epoch ({self.world}x the storage and decode work); "
                            "use DataLoader(..., sampler=DistributedSampler(dataset)) and call set_epoch() each epoch")
                return
        # an IterableDataset, a custom sampler or a custom loader: the first batch decides
        self._want_first_batch = True

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
            self.report("uneven_last_batch", False)
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
        self.report("uneven_last_batch", True, msg)

    def _static_seed(self) -> None:
        ds = self.facts.dist_sampler
        if self.world <= 1 or ds is None:
            return
        own = f"{int(getattr(ds, 'seed', 0))}:{bool(getattr(ds, 'shuffle', True))}".encode()
        self._compare_with_peer("seed", own, self._seed_result)

    def _seed_result(self, own: bytes, peer: bytes, peer_rank: int) -> None:
        if own == peer:
            self.report_part("rank_disagreement", "seed", None)
            return
        s1, sh1 = own.decode().split(":")
        s2, sh2 = peer.decode().split(":")
        what = f"seed {s1} vs {s2}" if s1 != s2 else f"shuffle {sh1} vs {sh2}"
        self.report_part("rank_disagreement", "seed",
                         f"DistributedSampler {what} on rank {self.rank} vs rank {peer_rank}: the ranks' shards overlap "
                         "and miss samples; give every rank the same seed (DistributedSampler(dataset, seed=S))")

    # ------------------------------------------------------------------ epoch and iterator
    def on_epoch(self, loader: Any) -> None:
        """Every iteration over the watched loader starts here (before its first batch)."""
        self._epochs += 1
        ds = self.facts.dist_sampler
        if ds is None or not self.on("sampler_epoch") or not getattr(ds, "shuffle", False):
            return
        epoch = getattr(ds, "epoch", None)
        if self._epochs >= 2 and epoch is not None:
            if epoch == self._last_epoch:
                self.report("sampler_epoch", True,
                            f"DistributedSampler epoch is still {epoch} at the start of iteration {self._epochs} over "
                            "the loader: set_epoch() was not called, so every epoch shuffles into the same order; call "
                            "loader.sampler.set_epoch(epoch) before each epoch", key="stale")
            else:
                self.report("sampler_epoch", False)
        self._last_epoch = epoch

    def on_iter(self, it: Any) -> Any:
        """The loader's iterator of an epoch: remember it (worker pids) and, in the first epoch,
        look at the first batch when needed. Never raises."""
        try:
            try:
                self._iter_ref = weakref.ref(it)
            except TypeError:
                self._iter_ref = None
            if self._epochs <= 1 and (self._want_first_batch or self.facts.batch_size is None):
                return _FirstBatch(it, self._first_batch)
        except Exception as e:
            self._error("loader iterator", e)
        return it

    def _first_batch(self, batch: Any) -> None:
        try:
            self._first_rows = batch_rows(batch)
            if self._want_first_batch and self.on("io_amplification"):
                self._want_first_batch = False
                d = batch_digest(batch)
                if d is not None:
                    self._count_equal("first_batch", d, self._first_batch_result)
        except Exception as e:
            self._error("first batch", e)

    def _first_batch_result(self, same: int, total: int) -> None:
        if same >= total > 1:
            what = "IterableDataset" if self.facts.iterable else "loader"
            self.report("io_amplification", True,
                        f"all {total} ranks got the same first batch from the {what}: every rank reads the same data; "
                        "shard by rank (the process group's rank/world size and torch.utils.data.get_worker_info() "
                        "in __iter__, or a DistributedSampler for map-style datasets)", key="first_batch")
        else:
            self.report("io_amplification", False)

    # ------------------------------------------------------------------ forward hook (main thread)
    def _install_forward_hook(self) -> None:
        m = self.w.model
        if m is None or not hasattr(m, "register_forward_pre_hook"):
            return
        need_digest = self.world > 1 and self.on("rank_disagreement")
        need_batch = self.on("global_batch_lr") and self.rank == 0
        self._digest_done = not need_digest
        self._batch_done = not need_batch
        if need_digest or need_batch:
            self._fwd_handle = m.register_forward_pre_hook(self._fwd_pre)

    def _fwd_pre(self, module: Any, args: Any) -> None:
        if not torch.is_grad_enabled():
            return None
        try:
            if not self.w._active:
                self._remove_fwd()
                return None
            if not self._digest_done:
                self._digest_done = True
                self._param_digest(module)
            if not self._batch_done:
                if self.w._seq >= 1:
                    self._batch_done = True
                    self._global_batch(self._fwd_count)
                else:
                    self._fwd_count += 1
            if self._digest_done and self._batch_done:
                self._remove_fwd()
        except Exception as e:
            self._digest_done = self._batch_done = True
            self._remove_fwd()
            self._error("forward pre-hook", e)
        return None

    def _remove_fwd(self) -> None:
        h, self._fwd_handle = self._fwd_handle, None
        if h is not None:
            h.remove()  # safe inside the hook: Module._call_impl iterates over a copy of its hooks

    # ------------------------------------------------------------------ parameter digest
    def _param_digest(self, model: Any) -> None:
        named = [(n, p) for n, p in model.named_parameters()]
        if not named:
            return
        if any(type(p).__name__ in ("DTensor", "FlatParameter") or hasattr(p, "_local_tensor") for _, p in named):
            log.debug("ranksight: sharded parameters: rank_disagreement does not compare them")
            return
        sig = hashlib.blake2b(digest_size=16)
        for n, p in named:
            sig.update(f"{n}:{tuple(p.shape)}:{p.dtype};".encode())
        names = [n for n, _ in named]
        groups: Dict[Tuple[Any, Any], List[int]] = {}
        for i, (_, p) in enumerate(named):
            groups.setdefault((p.device, p.dtype), []).append(i)
        order: List[int] = []
        pieces: List[Any] = []  # (host tensor, event or None)
        with torch.no_grad():
            for (dev, dtype), idx in groups.items():
                ts = [named[i][1].detach() for i in idx]
                kw = {"dtype": torch.float32} if dtype in _LOW_PRECISION else {}
                try:
                    l1 = torch._foreach_norm(ts, 1, **kw)
                    l2 = torch._foreach_norm(ts, 2, **kw)
                except Exception:  # an older torch or an odd dtype: one kernel per tensor
                    l1 = [torch.linalg.vector_norm(t, 1, **kw) for t in ts]
                    l2 = [torch.linalg.vector_norm(t, 2, **kw) for t in ts]
                vec = torch.stack([torch.stack(list(l1)), torch.stack(list(l2))]).to(torch.float64)
                order.extend(idx)
                if vec.device.type == "cuda":
                    host = torch.empty(vec.shape, dtype=torch.float64, pin_memory=True)
                    host.copy_(vec, non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(torch.cuda.current_stream(vec.device))
                    pieces.append((host, ev, vec))
                else:
                    pieces.append((vec.cpu(), None, None))
        self._inbox.append(lambda: self._param_publish(sig.hexdigest(), names, order, pieces))

    def _param_publish(self, sig: str, names: List[str], order: List[int], pieces: List[Any]) -> None:
        """Lints thread: once the norms are on the host, publish and compare them."""

        def ready() -> bool:
            return all(ev is None or ev.query() for _, ev, _ in pieces)

        def publish() -> bool:
            if not ready():
                return False
            l1 = [0.0] * len(order)
            l2 = [0.0] * len(order)
            pos = 0
            for host, _, _ in pieces:
                a, b = host.tolist()
                for j in range(len(a)):
                    l1[order[pos + j]] = a[j]
                    l2[order[pos + j]] = b[j]
                pos += len(a)
            nb = min(BUCKETS, len(l1))
            b1 = [0.0] * nb
            b2 = [0.0] * nb
            for i in range(len(l1)):
                b1[i % nb] += l1[i]
                b2[i % nb] += l2[i] * l2[i]
            value = sig.encode() + b"|" + struct.pack(f"<{2 * nb}d", *b1, *b2)
            self._compare_with_peer("params", value,
                                    lambda own, peer, pr: self._param_result(own, peer, pr, names, nb))
            return True

        self._tasks.append(_Task("params-ready", publish, time.monotonic() + PEER_TIMEOUT))

    def _param_result(self, own: bytes, peer: bytes, peer_rank: int, names: List[str], nb: int) -> None:
        sig_a, _, va = own.partition(b"|")
        sig_b, _, vb = peer.partition(b"|")
        if sig_a != sig_b or len(va) != len(vb):
            log.debug("ranksight: rank %d and rank %d hold different parameter sets: not compared", self.rank, peer_rank)
            return
        a = struct.unpack(f"<{2 * nb}d", va)
        b = struct.unpack(f"<{2 * nb}d", vb)
        for i in range(2 * nb):
            if abs(a[i] - b[i]) > PARAM_RTOL * max(abs(a[i]), abs(b[i])) + 1e-30:
                k = i % nb
                which = "L1" if i < nb else "L2"
                va_, vb_ = (a[i], b[i]) if i < nb else (math.sqrt(a[i]), math.sqrt(b[i]))
                ddp = type(self.w.model).__name__ == "DistributedDataParallel"
                why = ("DDP broadcast them from rank 0 at construction, so something changed them on some ranks "
                       "afterwards (a checkpoint loaded on one rank, a per-rank re-init)" if ddp else
                       "the model is not DDP-wrapped: initialise with the same seed or broadcast from rank 0 "
                       "(if it is tensor-parallel on purpose, turn this lint off)")
                self.report_part("rank_disagreement", "params",
                                 f"parameters differ between rank {self.rank} and rank {peer_rank} at the first training "
                                 f"step, e.g. {names[k]!r} ({which} norm {va_:.6g} vs {vb_:.6g}): {why}")
                return
        self.report_part("rank_disagreement", "params", None)

    # ------------------------------------------------------------------ global batch and LR
    def _global_batch(self, micro: int) -> None:
        f = self.facts
        b = f.batch_size or self._first_rows
        dp = f.dist_sampler.num_replicas if f.dist_sampler is not None else self.world
        acc = max(1, micro)
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
        if not self.on("global_batch_lr"):
            return
        with self._lock:
            self.evaluations["global_batch_lr"] = self.evaluations.get("global_batch_lr", 0) + 1
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
        self.w.send_lint("global_batch_lr", False, msg, **extra)

    # ------------------------------------------------------------------ checkpoints (saving thread)
    def on_checkpoint(self, src: str, obj: Any, path: Optional[str]) -> None:
        want_anatomy = self.on("incomplete_checkpoint")
        if not want_anatomy and not self.on("disk_headroom"):
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
        if not self.on("incomplete_checkpoint") or not r["weights"] or r["opaque"]:
            return
        missing = [p for p in self._required() if p not in r["parts"]]
        where = ", ".join(f"{p or '?'} ({s})" for s, p in r["saves"][:3]) + (" ..." if len(r["saves"]) > 3 else "")
        if missing:
            self.report("incomplete_checkpoint", True,
                        f"checkpoint after step {r['seq']} ({where}) holds model weights but lacks: {', '.join(missing)}; "
                        "a resume from it restarts those from scratch (the loss jump after a resume)",
                        key=tuple(missing))
        else:
            self.report("incomplete_checkpoint", False)

    def _measure_checkpoints(self) -> None:
        total = sum(size_of(p) for p in self._last_round_paths)
        if total > self._largest_ckpt:
            self._largest_ckpt = total

    # ------------------------------------------------------------------ cross-rank building blocks
    def _compare_with_peer(self, name: str, own: bytes, result: Callable[[bytes, bytes, int], None]) -> None:
        """Publish ``own``; when the peer (rank 0, or rank 1 for rank 0) has published, call
        ``result(own, peer_value, peer_rank)`` on the lints thread."""
        if self.world <= 1:
            return
        peer = 1 if self.rank == 0 else 0
        st = {"published": False}

        def poll() -> bool:
            if self._ex.store() is None:
                return False
            if not st["published"]:
                self._ex.set(self._ex.key(name, self.rank), own)
                st["published"] = True
            k = self._ex.key(name, peer)
            if not self._ex.ready(k):
                return False
            result(own, self._ex.get(k), peer)
            return True

        self._add_task(name, poll)

    def _count_equal(self, name: str, value: str, result: Callable[[int, int], None]) -> None:
        """Count the ranks that publish the same ``value``; ``result(same, world)`` once all have."""
        if self.world <= 1:
            return
        st = {"published": False}
        total = self.world

        def poll() -> bool:
            if self._ex.store() is None:
                return False
            done_key = self._ex.key(name, "n")
            if not st["published"]:
                self._ex.add(self._ex.key(name, "v", value), 1)
                self._ex.add(done_key, 1)
                st["published"] = True
            if self._ex.add(done_key, 0) < total:
                return False
            result(self._ex.add(self._ex.key(name, "v", value), 0), total)
            return True

        self._add_task(name, poll)

    def _add_task(self, name: str, poll: Callable[[], bool]) -> None:
        self._inbox.append(lambda: self._tasks.append(_Task(name, poll, time.monotonic() + PEER_TIMEOUT)))

    # ------------------------------------------------------------------ lints thread
    def _run(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            if self.w._closed:
                break
            with self._tick_lock:
                try:
                    self.tick(time.monotonic())
                except Exception as e:
                    self._error("thread", e)
        try:
            self._leave_node()
        except Exception as e:
            self._error("thread exit", e)

    def close(self) -> None:
        """The watch ends (``Watcher.close``, usually on the main thread): judge a checkpoint round
        still open (the final save of a run; its lint record still goes out with the watcher's
        final flush), remove the forward hook, stop the thread (waiting for it at most a second more)."""
        self._stop.set()
        if self._tick_lock.acquire(timeout=1.0):
            try:
                if self.on("incomplete_checkpoint") and (self._ckpt_events or self._round is not None):
                    self._checkpoint_rounds(time.monotonic())
                    self._end_round()
            except Exception as e:
                self._error("close", e)
            finally:
                self._tick_lock.release()
        try:
            self._remove_fwd()
        except Exception as e:
            self._error("close", e)
        t = getattr(self, "_thread", None)
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=1.0)  # it wakes every TICK_SECONDS and sees the stop: the watch leaves no thread

    def tick(self, now: float) -> None:
        while self._inbox:
            try:
                self._inbox.pop(0)()
            except Exception as e:
                self._error("queued work", e)
        for t in list(self._tasks):
            try:
                done = t.poll()
            except StoreGone as e:
                log.debug("ranksight: lint comparison %s dropped: %s", t.name, e)
                done = True
            except Exception as e:
                self._error(f"comparison {t.name}", e)
                done = True
            if done or now > t.deadline:
                self._tasks.remove(t)
        if self._ckpt_events or self._round is not None:
            self._checkpoint_rounds(now)
        if now >= self._next_numa:
            self._next_numa = now + NUMA_SECONDS
            if self.on("numa_binding"):
                try:
                    self.check_numa()
                except Exception as e:
                    self._error("numa_binding", e)
        if now >= self._next_disk:
            self._next_disk = now + DISK_SECONDS
            if self.on("disk_headroom"):
                try:
                    self.check_disk()
                except Exception as e:
                    self._error("disk_headroom", e)
        if self.on("dataloader_workers_rss"):
            self._memory_tick(now)
        if not self._batch_done and self._fwd_handle is None and self.w._seq >= 1:
            self._batch_done = True  # no model to hook: no accumulation count
            if self.on("global_batch_lr") and self.rank == 0:
                self._global_batch(1)
        if now >= self._next_resend:
            self._next_resend = now + RESEND_SECONDS
            with self._lock:
                states = [(k, v[0], v[1]) for k, v in self._states.items()]
            for k, active, msg in states:
                self.w.send_lint(k, active, msg)

    # ------------------------------------------------------------------ numa_binding
    def gpu_bus_id(self) -> Optional[str]:
        tl = getattr(self.w, "_tl", None)
        dev = getattr(tl, "device", None)
        if dev is None:
            if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
                return None  # no GPU in use: never initialise CUDA here
            dev = torch.device("cuda", torch.cuda.current_device())
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"

    def check_numa(self, sysfs: Optional[str] = None, bus_id: Optional[str] = None,
                   affinity: Optional[Set[int]] = None) -> None:
        bus = bus_id if bus_id is not None else self.gpu_bus_id()
        if not bus:
            return
        root = sysfs if sysfs is not None else self.sysfs
        bus = sysfs_bus_id(bus)
        try:
            with open(os.path.join(root, "bus/pci/devices", bus, "numa_node")) as fh:
                node = int(fh.read().strip())
            if node < 0:
                self.report("numa_binding", False)  # no NUMA information: one node
                return
            with open(os.path.join(root, f"devices/system/node/node{node}/cpulist")) as fh:
                cpus = cpulist(fh.read())
        except (OSError, ValueError) as e:
            log.debug("ranksight: numa_binding: cannot read sysfs for %s: %s", bus, e)
            return
        aff = affinity if affinity is not None else os.sched_getaffinity(os.getpid())
        if cpus and not (aff & cpus):
            self.report("numa_binding", True,
                        f"CPU affinity {ranges(aff)} excludes every CPU of NUMA node {node} ({ranges(cpus)}) where this "
                        f"rank's GPU {bus} is attached: host<->GPU copies and the DataLoader workers cross the socket "
                        f"link; bind to node {node} (numactl --cpunodebind={node} --membind={node}, or torchrun "
                        "--numa-binding=node)", key=(node, ranges(aff)))
        else:
            self.report("numa_binding", False)

    # ------------------------------------------------------------------ disk_headroom
    def _dirs(self) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        s = self.w.settings
        if self.w.identity.local_rank == 0:
            out.append(("tmp", tempfile.gettempdir()))
            if s.log_dir:
                out.append(("log", s.log_dir))
            if s.checkpoint_dir:
                out.append(("checkpoint", s.checkpoint_dir))
        for p in list(self._ckpt_paths):
            d = p if os.path.isdir(p) else os.path.dirname(p)
            out.append(("checkpoint", d))
        return out

    def _free(self, path: str) -> Optional[int]:
        p = os.path.abspath(path)
        while not os.path.exists(p):  # a directory not created yet: its parent's filesystem
            parent = os.path.dirname(p)
            if parent == p:
                return None
            p = parent
        try:
            return int(self.disk_usage(p).free)
        except OSError:
            return None

    def check_disk(self) -> None:
        self._measure_checkpoints()
        dirs = self._dirs()
        if not dirs:
            return
        largest = self._largest_ckpt
        need = 2 * largest if largest > 0 else self.settings.min_free_bytes
        low: List[str] = []
        seen: Set[Tuple[str, str]] = set()
        for kind, d in dirs:
            if (kind, d) in seen:
                continue
            seen.add((kind, d))
            free = self._free(d)
            if free is not None and free < need:
                low.append(f"{kind} {d} has {_gb(free)} free")
        if low:
            rule = (f"2 x the largest checkpoint ({_gb(largest)})" if largest > 0 else
                    f"thresholds.lint_min_free_bytes before the first checkpoint")
            self.report("disk_headroom", True,
                        f"less free space than {rule} = {_gb(need)}: {'; '.join(low)}; the next checkpoint or log "
                        "write can fail (or leave a truncated checkpoint)", key=tuple(sorted(x.split(" has ")[0] for x in low)))
        else:
            self.report("disk_headroom", False)

    # ------------------------------------------------------------------ dataloader_workers_rss
    def worker_pids(self) -> List[int]:
        it = self._iter_ref() if self._iter_ref is not None else None
        workers = getattr(it, "_workers", None) if it is not None else None
        if not workers:
            return []
        return [int(p.pid) for p in workers if getattr(p, "pid", None)]

    def _memory_tick(self, now: float) -> None:
        pids = self.worker_pids()
        if not pids:
            self._next_mem = None
            if self._node_contrib:
                try:
                    self._leave_node()
                except Exception as e:
                    self._error("dataloader_workers_rss", e)
            return
        if self._next_mem is None:
            self._mem_checks = 0
            self._next_mem = now + MEMORY_FIRST_SECONDS
            return
        if now < self._next_mem:
            return
        # the first MEMORY_FAST_CHECKS a second apart (workers start, the node's sum settles once
        # every rank has published), then every MEMORY_SECONDS
        self._mem_checks += 1
        self._next_mem = now + (MEMORY_FIRST_SECONDS if self._mem_checks < MEMORY_FAST_CHECKS else MEMORY_SECONDS)
        try:
            self.check_workers_memory(pids)
        except StoreGone as e:
            log.debug("ranksight: workers' memory: store gone: %s", e)
        except Exception as e:
            self._error("dataloader_workers_rss", e)

    @staticmethod
    def _memory_budget(sysfs: str = "/sys") -> Tuple[int, str]:
        import psutil

        total = int(psutil.virtual_memory().total)
        what = "host memory"
        try:  # cgroup v2 (then v1) limit of this process, when lower than the host's memory
            with open("/proc/self/cgroup") as fh:
                lines = fh.read().splitlines()
            for line in lines:
                hid, ctrl, path = line.split(":", 2)
                if hid == "0":
                    p = os.path.join(sysfs, "fs/cgroup", path.lstrip("/"), "memory.max")
                elif "memory" in ctrl.split(","):
                    p = os.path.join(sysfs, "fs/cgroup/memory", path.lstrip("/"), "memory.limit_in_bytes")
                else:
                    continue
                try:
                    with open(p) as fh:
                        v = fh.read().strip()
                except OSError:
                    continue
                if v.isdigit() and 0 < int(v) < total:
                    total, what = int(v), "the cgroup's memory limit"
        except (OSError, ValueError):
            pass
        return total, what

    def check_workers_memory(self, pids: Sequence[int]) -> None:
        import psutil

        uss = rss = 0
        alive = 0
        for pid in pids:
            try:
                mi = psutil.Process(pid).memory_full_info()
            except (psutil.Error, OSError):
                continue
            alive += 1
            uss += int(getattr(mi, "uss", 0))
            rss += int(mi.rss)
        if not alive:
            return
        budget, what = self._memory_budget(self.sysfs)
        limit = self.settings.workers_host_mem_share * budget
        node_total, how, settled = self._node_total(uss, budget)
        share = node_total / budget if budget else 0.0
        if not settled and self._mem_checks < MEMORY_FAST_CHECKS:
            return  # the node's other ranks have not published yet: report the node's sum once they have
        if node_total > limit:
            self.report("dataloader_workers_rss", True,
                        f"DataLoader workers on node {self.w.identity.node} hold {_gb(node_total)} of private memory "
                        f"({how}; this rank's {alive} workers: {_gb(uss)} private, {_gb(rss)} RSS) = {share:.0%} of "
                        f"{what} {_gb(budget)}, above thresholds.lint_workers_host_mem_share "
                        f"{self.settings.workers_host_mem_share:.0%}: lower num_workers/prefetch_factor, or keep samples "
                        "in numpy/torch arrays instead of Python lists/dicts (workers copy the pages they touch)",
                        key="over")
        elif node_total < 0.9 * limit or self.state("dataloader_workers_rss") is None:
            self.report("dataloader_workers_rss", False)

    def _node_total(self, own: int, budget: int) -> Tuple[int, str, bool]:
        """The node's total private memory of all ranks' workers: exact through the store (each
        rank adds its change to a per-node counter), else LOCAL_WORLD_SIZE x own. The flag says
        whether the sum is settled: every local rank (LOCAL_WORLD_SIZE, when set) has published."""
        lws = 1
        try:
            lws = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        except ValueError:
            pass
        if self.world > 1 and self._ex.store() is not None:
            key = self._ex.key("wmem", self.w.identity.node)
            delta = own - self._node_contrib
            total = self._ex.add(key, delta)
            self._node_contrib = own
            n = self._ex.add(self._ex.key("wmem-ranks", self.w.identity.node), 0 if self._joined else 1)
            self._joined = True
            return max(total, own), f"summed over the {n} rank(s) of this node that ran workers", n >= lws
        if lws == 1:
            return own, "this rank only", True
        return own * lws, f"estimated as {lws} local ranks x this rank's (no process group store)", True

    def _leave_node(self) -> None:
        """Take this rank's workers out of the node's counter when the watch ends."""
        if self._node_contrib and self._ex.store() is not None:
            try:
                self._ex.add(self._ex.key("wmem", self.w.identity.node), -self._node_contrib)
                self._node_contrib = 0
            except StoreGone:
                pass


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
    if hasattr(watcher, "add_close_callback"):
        watcher.add_close_callback(lints.close)
    lints.start()
    return lints
