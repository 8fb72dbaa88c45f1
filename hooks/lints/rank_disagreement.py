"""The rank_disagreement lint: ranks disagree on sampler seed or initial parameters."""
from __future__ import annotations

import hashlib
import math
import struct
import time
from typing import Any, Dict, List, Tuple

import torch

from ranksight import catalog as C

from .core import BUCKETS, PARAM_RTOL, PEER_TIMEOUT, _LOW_PRECISION, _Task, log, register


@register(C.LINT_RANK_DISAGREEMENT)
class RankDisagreement:
    """rank_disagreement: ranks disagree on sampler seed or initial parameters.

    A mixin of ``Lints``: its state is set up in ``LintsCore.__init__``; when it runs is in
    the ``ranksight.hooks.lints`` docstring."""

    def _static_seed(self) -> None:
        ds = self.facts.dist_sampler
        if self.world <= 1 or ds is None:
            return
        own = f"{int(getattr(ds, 'seed', 0))}:{bool(getattr(ds, 'shuffle', True))}".encode()
        self._compare_with_peer("seed", own, self._seed_result)


    def _seed_result(self, own: bytes, peer: bytes, peer_rank: int) -> None:
        if own == peer:
            self.report_part(C.LINT_RANK_DISAGREEMENT, "seed", None)
            return
        s1, sh1 = own.decode().split(":")
        s2, sh2 = peer.decode().split(":")
        what = f"seed {s1} vs {s2}" if s1 != s2 else f"shuffle {sh1} vs {sh2}"
        self.report_part(C.LINT_RANK_DISAGREEMENT, "seed",
                         f"DistributedSampler {what} on rank {self.rank} vs rank {peer_rank}: the ranks' shards overlap "
                         "and miss samples; give every rank the same seed (DistributedSampler(dataset, seed=S))")


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
                self.report_part(C.LINT_RANK_DISAGREEMENT, "params",
                                 f"parameters differ between rank {self.rank} and rank {peer_rank} at the first training "
                                 f"step, e.g. {names[k]!r} ({which} norm {va_:.6g} vs {vb_:.6g}): {why}")
                return
        self.report_part(C.LINT_RANK_DISAGREEMENT, "params", None)
