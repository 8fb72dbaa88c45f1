"""A stand-in for the part of ``torch.cuda`` that ``hooks/memory.py`` calls: ``memory_stats`` and
``reset_peak_memory_stats``, serving the samples of ``tests/fixtures/cuda_memory/memory_stats.json``.

It answers nothing else: any other attribute (``synchronize``, ``current_stream``, ``Event``, ...)
raises, so a test through it shows the reader calls only the allocator's host-side counters.
``reset_peak_memory_stats`` sets every ``*.peak`` to its ``*.current``, as the allocator does."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

SAMPLES = Path(__file__).resolve().parents[1] / "fixtures" / "cuda_memory" / "memory_stats.json"


def load(name: str) -> Dict[str, int]:
    """One recorded ``memory_stats`` dict ("steady" or "spike")."""
    return dict(json.loads(SAMPLES.read_text())[name])


class CudaMemoryStandin:
    """``torch.cuda``'s allocator counters of one device, set by the test (``play``)."""

    def __init__(self, sample: str = "steady"):
        self.calls: List[str] = []
        self.stats = load(sample)

    def play(self, sample: str) -> None:
        """The allocator's counters become those of ``sample`` (a step that reached them), peaks
        kept where a reset left them higher (the allocator never lowers a peak by itself)."""
        new = load(sample)
        for k, v in new.items():
            if k.endswith(".peak"):
                new[k] = max(v, self.stats.get(k, 0))
        self.stats = new

    def memory_stats(self, device: Any = None) -> Dict[str, int]:
        self.calls.append("memory_stats")
        return dict(self.stats)

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        self.calls.append("reset_peak_memory_stats")
        for k in list(self.stats):
            if k.endswith(".peak"):
                self.stats[k] = self.stats[k[: -len(".peak")] + ".current"]

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"hooks/memory.py called torch.cuda.{name}: only the allocator's counters may be read")
