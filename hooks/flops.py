"""Model FLOPs per token: declared (``hooks.flops_per_token``) or estimated once from the model.

The estimate is the one torchtitan and Megatron-LM use for MFU: ``6·N + 12·L·H·Q·T`` FLOPs per
token, forward and backward, where N is the trainable parameters, L the layers, H·Q the hidden size
(heads times head dimension) and T the sequence length. 6·N counts the matrix multiplies of every
parameter (2 FLOPs per multiply-add, forward once and backward twice); 12·L·H·Q·T the attention
scores and their weighted sum, which have no parameters. These are model FLOPs: activation
recomputation is not counted, so MFU stays comparable across recompute settings.

- N: the sum of ``numel()`` over the watched model's parameters that require grad (a DDP/FSDP
  wrapper's or ``torch.compile``'s wrapped module). A DTensor's ``numel()`` is its global size
  (FSDP2); an FSDP1 flat parameter counts its unsharded size. The tests check DDP's shape of
  wrapper on CPU, not a sharded multi-rank FSDP run: where FSDP1 runs with
  ``use_orig_params=True`` the original parameters are views of the local shard and N would be
  short; ``hooks.flops_per_token`` declares the figure there. A DeepSpeed ZeRO-3 parameter counts
  its full size (``ds_numel``), checked with a 2-rank CPU engine.
- L and H: the model's (or its wrapped module's) Hugging Face style ``config``:
  ``num_hidden_layers`` or ``n_layer``, ``hidden_size`` or ``n_embd``. Without them there is no
  attention term (``estimate_6n``).
- T: tokens / samples of the first batch that had tokens (hooks/work.py).

Computed once: the parameters are counted when the watch starts (or when a discovered model is
first known), the attention term once T is known. Only host-side attributes are read (``numel()``,
``requires_grad``, the config): nothing touches device memory.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

DECLARED = "declared"
ESTIMATE_6N = "estimate_6n"
ESTIMATE_6N_ATTN = "estimate_6n_attn"
UNKNOWN = "unknown"  # no declaration and no model: the step records carry 0 (the rules read no MFU)

_LAYER_KEYS = ("num_hidden_layers", "n_layer")
_HIDDEN_KEYS = ("hidden_size", "n_embd")
_WRAPPED = ("_orig_mod", "module")  # torch.compile's OptimizedModule; DDP's and FSDP's wrapped module


def _inner(model: Any) -> Any:
    """The module a DDP/FSDP or torch.compile wrapper holds (through nested wrappers)."""
    for _ in range(4):
        nxt = next((getattr(model, a) for a in _WRAPPED if getattr(model, a, None) is not None), None)
        if nxt is None or nxt is model:
            break
        model = nxt
    return model


def _numel(p: Any) -> int:
    flat = getattr(p, "_unpadded_unsharded_size", None)  # an FSDP FlatParameter: its unsharded size
    if flat is not None:
        n = 1
        for d in flat:
            n *= int(d)
        return n
    ds = getattr(p, "ds_numel", None)  # a DeepSpeed ZeRO-3 parameter: its full size (numel() is 0 once partitioned)
    if ds is not None:
        return int(ds)
    return int(p.numel())


def trainable_params(model: Any) -> int:
    """N: the trainable parameters of ``model``, wrapper or not."""
    for m in (model, _inner(model)):  # the wrapper's parameters: FSDP's flat ones, DDP's the module's
        params = getattr(m, "parameters", None)
        if params is not None:
            return sum(_numel(p) for p in params() if getattr(p, "requires_grad", False))
    return 0


def _config_int(cfg: Any, keys: Tuple[str, ...]) -> int:
    for k in keys:
        v = getattr(cfg, k, None)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return 0


def layers_hidden(model: Any) -> Tuple[int, int]:
    """(L, H) from the model's Hugging Face style ``config``; (0, 0) without one."""
    for m in (model, _inner(model)):
        cfg = getattr(m, "config", None)
        if cfg is not None:
            layers, hidden = _config_int(cfg, _LAYER_KEYS), _config_int(cfg, _HIDDEN_KEYS)
            if layers and hidden:
                return layers, hidden
    return 0, 0


class FlopsPerToken:
    """The value the step records carry as "fpt", and where it comes from (``source``)."""

    def __init__(self, declared: int, model: Any):
        self.declared = int(declared)
        self.params = self.layers = self.hidden = 0
        self.seq_len = 0
        self.had_model = model is not None
        if self.declared > 0:
            self.source = DECLARED
        elif model is None:
            self.source = UNKNOWN
        else:
            self.params = trainable_params(model)
            self.layers, self.hidden = layers_hidden(model)
            self.source = ESTIMATE_6N_ATTN if self.layers else ESTIMATE_6N if self.params else UNKNOWN
        # the attention term waits for the first batch with tokens (set_seq_len)
        self._value = self.declared if self.source == DECLARED else 6 * self.params
        self._final = self.source != ESTIMATE_6N_ATTN

    def value(self, seq_len: int = 0) -> int:
        """FLOPs per token; ``seq_len`` (T, 0 while unknown) completes the attention term once."""
        if not self._final and seq_len > 0:
            self.seq_len = seq_len
            self._value = 6 * self.params + 12 * self.layers * self.hidden * seq_len
            self._final = True
        return self._value

    def describe(self) -> str:
        """The self-check log line's part: the source and its inputs."""
        if self.source == DECLARED:
            return f"FLOPs/token {self.declared} (declared)"
        if self.source == UNKNOWN:
            return "FLOPs/token unknown (no model; set hooks.flops_per_token)"
        attn = f", L={self.layers} H={self.hidden}, + 12·L·H·T at the first batch" if self.layers else ""
        return f"FLOPs/token {self.source} (6·N, N={self.params}{attn})"

    def info(self) -> dict:
        """The hello record's "info" members."""
        out = {"fpt_source": self.source}
        if self.source == DECLARED:
            out["fpt"] = self.declared
        elif self.source != UNKNOWN:
            out["fpt_params"] = self.params
            if self.layers:
                out.update(fpt_layers=self.layers, fpt_hidden=self.hidden)
        return out


def seq_len(samples: int, tokens: int) -> Optional[int]:
    """T of a batch: its tokens per sample (None without tokens)."""
    return tokens // samples if samples > 0 and tokens > 0 else None
