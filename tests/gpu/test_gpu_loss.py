"""``ranksight.loss`` on a CUDA loss (hooks/loss.py): the pinned copy and its event add no
synchronization (``torch.cuda.set_sync_debug_mode("error")`` around the steps), and the values
read a step or more later are the losses (compared with ``.item()`` after the steps, outside the
debug mode)."""
from __future__ import annotations

import time

import pytest

from gpu_fixtures import gpu_results  # noqa: F401  (puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]


def test_cuda_losses_are_read_without_a_synchronization(monkeypatch):
    import torch

    import ranksight

    for k in ("RANKSIGHT_AGENT", "RANKSIGHT_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    dev = torch.device("cuda", 0)
    model = torch.nn.Linear(256, 8).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(64, 256, device=dev), torch.randint(0, 8, (64,), device=dev)
    w = ranksight.hooks.watcher.start(model, opt, None, agent="off",
                                      config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})
    got = []
    w._add_loss = lambda v: got.append(v)  # each value as the step path resolves it
    w.losses._add = w._add_loss
    losses = []
    try:
        torch.cuda.set_sync_debug_mode("error")
        try:
            for i in range(12):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                if i == 5:
                    loss = loss.to(torch.bfloat16)  # a copy of another dtype: converted on the device
                loss.backward()
                ranksight.loss(loss)
                losses.append(loss.detach())
                opt.step()
                opt.zero_grad()
        finally:
            torch.cuda.set_sync_debug_mode(0)
        deadline = time.monotonic() + 5
        while w.losses.in_flight() and time.monotonic() < deadline:  # later steps resolve the rest
            time.sleep(0.01)
            w.losses.take(10 ** 9)
        want = [float(v.float().item()) for v in losses]
    finally:
        ranksight.unwatch()
    assert w.herr == 0 and w.losses.dropped == 0
    assert got == pytest.approx(want, rel=1e-6)
