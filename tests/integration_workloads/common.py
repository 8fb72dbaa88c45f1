"""What the framework workers share: a dataset that sleeps a known time per item (the injected
data wait), the environment that keeps the frameworks offline and quiet, and the RESULT line."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any, Dict

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402

torch.set_num_threads(1)


class SleepyTokens(torch.utils.data.Dataset):
    """``n`` token sequences; each item sleeps ``sleep`` seconds (num_workers=0: on the training thread)."""

    def __init__(self, n: int, seq: int = 8, vocab: int = 64, sleep: float = 0.02, dict_items: bool = True):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, vocab, (n, seq), generator=g)
        self.sleep = sleep
        self.dict_items = dict_items

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        time.sleep(self.sleep)
        ids = self.x[i]
        return {"input_ids": ids, "labels": ids} if self.dict_items else ids


def tiny_gpt2() -> Any:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2))


def hooks_state() -> Dict[str, Any]:
    """What a watch leaves patched or hooked, to compare before and after."""
    import torch.nn.modules.module as mm
    import torch.optim.optimizer as oo
    from torch.utils.data import dataloader as dl

    return {"backward": getattr(torch.autograd.backward, "__ranksight__", False) or
            hasattr(torch.autograd.backward, "__wrapped__"),
            "save": hasattr(torch.save, "__wrapped__"),
            "next": hasattr(dl._BaseDataLoaderIter.__next__, "__wrapped__"),
            "iter": hasattr(dl.DataLoader.__iter__, "__wrapped__"),
            "opt_hooks": len(oo._global_optimizer_pre_hooks) + len(oo._global_optimizer_post_hooks),
            "module_hooks": len(mm._global_forward_pre_hooks) + len(mm._global_forward_hooks),
            "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("ranksight"))}


def result(**kw: Any) -> None:
    """One RESULT line on its own line: ranks under torchrun share stdout, and the framework's
    output may have left a line unfinished; one write, so it cannot interleave with a peer's."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), ("\nRESULT " + json.dumps(kw) + "\n").encode())
