"""How the watched model is parallelized: the hello's ``info`` members "strategy" (one of
``catalog.PARALLEL_STRATEGIES``) and "zero_stage" (DeepSpeed's ZeRO stage, "" otherwise), exposed
by the agent as ``ranksight_rank_parallel_info``. Read from the model's type when the watch knows
its model: at ``watch()`` for a given one, when discovery finds it otherwise (the hello is sent
again then, ``Background._hello_again``). A framework that knows better (a pipeline schedule) sets
it with ``Watcher.set_parallel``."""
from __future__ import annotations

from typing import Any, Dict

from . import deepspeed_engine


def _wrapper_kind(model: Any) -> str:
    inner = getattr(model, "_orig_mod", model)  # torch.compile's OptimizedModule
    try:
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(inner, DistributedDataParallel):
            return "ddp"
    except Exception:
        pass
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if isinstance(inner, FullyShardedDataParallel):
            return "fsdp"
    except Exception:
        pass
    try:
        from torch.distributed.fsdp import FSDPModule  # FSDP2 (fully_shard)

        if isinstance(inner, FSDPModule):
            return "fsdp"
    except Exception:
        pass
    return "none"


def describe(model: Any) -> Dict[str, str]:
    """{"strategy": ..., "zero_stage": ...} of ``model``; {} when there is no model yet."""
    if model is None:
        return {}
    if deepspeed_engine.is_engine(model):
        stage = ""
        try:
            stage = str(int(model.zero_optimization_stage()))
        except Exception:
            pass
        return {"strategy": "deepspeed", "zero_stage": stage}
    return {"strategy": _wrapper_kind(model), "zero_stage": ""}

