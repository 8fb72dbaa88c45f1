"""GPU loads for the NVML checks: steady, sawtooth (compute bursts separated by host sleeps),
and a fast sawtooth whose period is shorter than NVML's sample period.

Each load runs for ``seconds`` and calls ``at_end()`` (if given) while the GPU is still busy
in its last burst, so a snapshot taken there sees only that load in its window.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Optional

MATMUL = 8192  # bf16 8192^3: ~1.1 TFLOP, about 1.4 ms on an H200


class Loads:
    def __init__(self, device: Any = None, size: int = MATMUL):
        import torch

        self.torch = torch
        self.device = device or torch.device("cuda", 0)
        self.a = torch.randn(size, size, device=self.device, dtype=torch.bfloat16)
        self.b = torch.randn(size, size, device=self.device, dtype=torch.bfloat16)
        self.c = torch.empty(size, size, device=self.device, dtype=torch.bfloat16)
        self.burst(0.2)  # cuBLAS init and clocks up

    def burst(self, seconds: float) -> int:
        """Back-to-back matmuls for about ``seconds`` (synchronizing every 8)."""
        torch = self.torch
        n = 0
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(8):
                torch.matmul(self.a, self.b, out=self.c)
            torch.cuda.synchronize(self.device)
            n += 8
        return n

    def steady(self, seconds: float, at_end: Optional[Callable[[], None]] = None) -> None:
        self.burst(seconds - 0.3)
        if at_end is not None:
            at_end()
        self.burst(0.3)

    def sawtooth(self, seconds: float, busy: float = 0.3, idle: float = 0.45,
                 at_end: Optional[Callable[[], None]] = None) -> int:
        """``busy`` s of matmuls, then ``idle`` s of host sleep (an input-bound loop). Returns cycles."""
        end = time.perf_counter() + seconds
        cycles = 0
        while True:
            last = time.perf_counter() + busy + idle >= end
            if last and at_end is not None:
                self.burst(busy / 2)
                at_end()
                self.burst(busy / 2)
            else:
                self.burst(busy)
            cycles += 1
            if last:
                return cycles
            time.sleep(idle)

    @staticmethod
    def idle(seconds: float) -> None:
        time.sleep(seconds)
