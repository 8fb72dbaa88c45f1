"""Nearest-rank quantiles, shared by the hooks' step table and the agent's step-time window (torch-free).

``rank_of(n, q) -> int``: the 1-based rank of the q-quantile among n ordered values,
``ceil(q * n)`` clamped to [1, n]. ``nearest_rank(sorted_values, q) -> float``: that value of an
already sorted list (0.0 for an empty one).
"""
from __future__ import annotations

import math
from typing import Sequence


def rank_of(n: int, q: float) -> int:
    """The 1-based nearest rank of quantile q among n >= 1 ordered values."""
    return max(1, min(n, math.ceil(q * n)))


def nearest_rank(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank q-quantile of an already sorted sequence; 0.0 when it is empty."""
    if not sorted_values:
        return 0.0
    return sorted_values[rank_of(len(sorted_values), q) - 1]
