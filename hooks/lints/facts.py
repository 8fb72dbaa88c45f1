"""What the lints read from the user's objects: loader facts, batch digests, sizes."""
from __future__ import annotations

import hashlib
import itertools
import struct
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Tuple

import torch

DIGEST_ELEMS = 1024
DIGEST_LEAVES = 16
CPU_RNG_BYTES = 5056  # torch.get_rng_state().numel() (MT19937)


def _is_rng_bytes(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dtype == torch.uint8 and v.dim() == 1


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
