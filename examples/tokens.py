"""The data of the framework examples (train_hf.py, train_lightning.py, train_accelerate.py):
``n`` rows of ``seq`` random token ids below ``vocab`` (the same on every rank), each costing
``sleep`` seconds to load; ``as_dict`` gives Transformers' {"input_ids", "labels"} items."""
from __future__ import annotations

import time
from typing import Any

import torch


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, sleep: float = 0.0, seq: int = 64, vocab: int = 512, as_dict: bool = False):
        self.x = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))
        self.sleep = sleep
        self.as_dict = as_dict

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        if self.sleep:
            time.sleep(self.sleep)
        return {"input_ids": self.x[i], "labels": self.x[i]} if self.as_dict else self.x[i]
