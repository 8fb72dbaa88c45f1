"""The work in a batch, read from its shape on the host: the samples (its first dimension) and the
tokens (samples times the tokens per sample). Nothing here touches device memory or synchronizes:
a tensor's ``shape`` and ``dtype`` are host-side attributes. Torch-free (duck typing), so the
hooks' fast tests run without torch.

Where the counts come from, in this order:

- the batch's lead tensor: the batch itself, a mapping's ``input_ids`` (Hugging Face) or its first
  tensor value, a tuple's or list's first tensor (one level of nesting looked into); its first
  dimension is the batch's samples;
- the tokens per sample: ``hooks.tokens_per_sample`` when it is set (a vision model: 1, or its
  patches per image); otherwise the second dimension of the batch's token tensor: ``input_ids``,
  else the first integer tensor of two or more dimensions (token ids, or per-token labels); a
  batch with none has 0 tokens (unknown), and the rules then read no throughput for the rank.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

TOKEN_KEYS = ("input_ids", "labels")  # a mapping's token tensors, in the order they are looked for


_TENSOR_TYPES: Dict[type, bool] = {}  # type -> its instances have a tuple shape and a dtype (looked up once a type)
_INTEGER: Dict[Any, bool] = {}  # dtype -> an integer dtype (token ids), looked up once a dtype


def _is_tensor(x: Any) -> bool:
    t = type(x)
    known = _TENSOR_TYPES.get(t)
    if known is None:
        shape = getattr(x, "shape", None)
        known = _TENSOR_TYPES[t] = isinstance(shape, tuple) and hasattr(x, "dtype")
    return known


def _tensors(batch: Any) -> Tuple[Any, ...]:
    """The batch's tensors, in order, one level into a tuple, list or mapping."""
    if _is_tensor(batch):
        return (batch,)
    if isinstance(batch, dict) or (hasattr(batch, "keys") and hasattr(batch, "__getitem__")):
        try:
            first = tuple(batch[k] for k in TOKEN_KEYS if k in batch)
            rest = tuple(v for v in batch.values())
        except Exception:
            return ()
        items = first + rest
    elif isinstance(batch, (tuple, list)):
        items = tuple(batch[:8])
    else:
        return ()
    out = []
    for x in items:
        if _is_tensor(x):
            out.append(x)
        elif isinstance(x, (tuple, list)):
            out.extend(y for y in x[:8] if _is_tensor(y))
    return tuple(out)


def _is_integer(t: Any) -> bool:
    dt = t.dtype
    known = _INTEGER.get(dt)
    if known is None:
        known = _INTEGER[dt] = (getattr(dt, "is_floating_point", True) is False
                                and getattr(dt, "is_complex", False) is False and str(dt) != "torch.bool")
    return known


def batch_work(batch: Any, tokens_per_sample: int = 0) -> Tuple[int, int]:
    """(samples, tokens) of one batch; (0, 0) when it holds no tensor with a first dimension. One
    pass over the batch's tensors, stopping at the token tensor."""
    if _TENSOR_TYPES.get(type(batch)):  # the batch is one tensor (a type seen before): the loop below, unrolled
        shape = batch.shape
        if not shape:
            return 0, 0
        samples = int(shape[0])
        if tokens_per_sample:
            return samples, samples * tokens_per_sample
        if len(shape) >= 2:
            known = _INTEGER.get(batch.dtype)
            if known or (known is None and _is_integer(batch)):
                return samples, samples * int(shape[1])
        return samples, 0
    samples = -1
    for t in _tensors(batch):
        shape = t.shape
        if not shape:
            continue
        if samples < 0:
            samples = int(shape[0])
            if tokens_per_sample:
                return samples, samples * tokens_per_sample
        if len(shape) >= 2 and _is_integer(t):
            return samples, int(shape[0]) * int(shape[1])
    return (samples, 0) if samples >= 0 else (0, 0)
