"""How ``train_ddp.py --strategy`` parallelizes its model on CPU (gloo): DDP, FSDP2 (``fully_shard``
on each linear layer and the root) or a DeepSpeed ZeRO engine (``DS_ACCELERATOR=cpu``, the client
optimizer given to ``deepspeed.initialize``; ``--zero-stage`` 1, 2 or 3). ``Parallel`` gives the
training loop one shape for all three: the module to call, the optimizer to give
``ranksight.watch``, one ``backward_step(loss)`` and one ``save(...)``.

DeepSpeed's engine steps its optimizer itself (``engine.backward``, ``engine.step``) and writes its
checkpoint on every rank (``engine.save_checkpoint``: each rank its ZeRO shard); DDP and FSDP step
the optimizer and the LR schedule in the loop, and rank 0 (DDP) or every rank (FSDP: its shard)
writes the checkpoint file; ``load`` reads it back (DDP and FSDP) for a resume."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch
import torch.nn as nn

STRATEGIES = ("ddp", "fsdp", "deepspeed")


@dataclass
class Parallel:
    strategy: str
    model: nn.Module  # what the loop calls: the DDP or FSDP module, or the DeepSpeed engine
    module: nn.Module  # the model inside (its weights)
    optimizer: Any  # what ranksight.watch is given
    scheduler: Any = None
    engine: Any = None

    @property
    def sharded(self) -> bool:
        """Every rank holds a part of the state, so every rank writes its own checkpoint."""
        return self.strategy != "ddp"

    def backward_step(self, loss: torch.Tensor) -> None:
        if self.engine is not None:
            self.engine.backward(loss)
            self.engine.step()
            return
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()

    def save(self, ckpt_dir: Path, rank: int, extra: Dict[str, Any], write: Callable[[Path, Dict], None]) -> None:
        """One checkpoint: ``write(path, state)`` of rank 0's state (DDP) or each rank's shard (FSDP);
        DeepSpeed's own ``save_checkpoint`` (``extra`` in its client state)."""
        if self.engine is not None:
            self.engine.save_checkpoint(str(ckpt_dir), tag="last", client_state={"step": extra.get("step", 0)})
            return
        state = {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(), **extra}
        write(ckpt_dir / (f"last-rank{rank}.pt" if self.sharded else "last.pt"), state)

    def load(self, ckpt_dir: Path, rank: int) -> Optional[Dict[str, Any]]:
        """The checkpoint ``save`` wrote (DDP: rank 0's file, read by every rank; FSDP: this rank's
        shard), loaded into the model, the optimizer and the LR schedule; the whole state, or None
        when there is none. DeepSpeed's own checkpoints are not read here."""
        path = ckpt_dir / (f"last-rank{rank}.pt" if self.sharded else "last.pt")
        if self.engine is not None or not path.is_file():
            return None
        state = torch.load(path, weights_only=not self.sharded)  # FSDP's shards are DTensors
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        return state


def _optimizer(kind: str, params: Any, lr: float) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr)


def _deepspeed(model: nn.Module, optimizer: torch.optim.Optimizer, batch: int, stage: int) -> Any:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU backend builds its shared-memory all-reduce (inference only) with a C++
    # compiler when it starts; training on gloo does not use it
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")  # takes the process group already started
    cfg = {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg)
    return engine


def build(strategy: str, model: nn.Module, optimizer_kind: str, lr: float, batch: int,
          zero_stage: int = 2, t_max: int = 10_000) -> Parallel:
    """``model`` parallelized by ``strategy`` over the started process group."""
    if strategy == "deepspeed":
        opt = _optimizer(optimizer_kind, model.parameters(), lr)
        engine = _deepspeed(model, opt, batch, zero_stage)
        return Parallel(strategy, engine, engine.module, opt, engine=engine)
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        wrapped: nn.Module = fully_shard(model)
        module = wrapped
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapped = DDP(model)
        module = model
    opt = _optimizer(optimizer_kind, wrapped.parameters(), lr)
    return Parallel(strategy, wrapped, module, opt, torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=t_max))


def label(strategy: str, zero_stage: Optional[int]) -> str:
    """"DDP", "FSDP", "DeepSpeed ZeRO-2"."""
    return {"ddp": "DDP", "fsdp": "FSDP"}.get(strategy, f"DeepSpeed ZeRO-{zero_stage}")
