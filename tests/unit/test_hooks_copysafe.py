"""A watched model copied (``copy.deepcopy``: an EMA or teacher copy) or pickled whole
(``torch.save(model)``): the copy works and carries the watch's hooks as no-ops, so its forward
passes are not the watched model's, and the watch goes on undisturbed (hooks/copysafe.py)."""
from __future__ import annotations

import copy
import io
import time

import pytest

torch = pytest.importorskip("torch")

import ranksight  # noqa: E402
from ranksight import protocol as P  # noqa: E402
from ranksight.hooks.copysafe import CopySafe  # noqa: E402

from test_hooks_batch import Raw  # noqa: E402


class Sleepy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.delay = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay:
            time.sleep(self.delay)
        return self.lin(x)


@pytest.fixture(autouse=True)
def _clean_env(clean_watch_env):
    yield


def test_a_copy_of_a_watched_model_is_not_watched():
    n, delay = 8, 0.05
    raw = Raw()
    model = Sleepy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = [(torch.randn(4, 8), torch.randn(4, 8)) for _ in range(n)]
    cfg = {"hooks": {"heartbeat_seconds": 0.2, "table_every_steps": 0, "table_every_seconds": 0,
                     "step_detail": True}}
    loader = ranksight.watch(model, opt, data, agent=raw.url, config=cfg)
    teacher = copy.deepcopy(model)  # the watch's hooks hold locks: a plain copy of them fails
    teacher.delay = delay
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    for m in (teacher, loaded):
        hooks = list(m._forward_pre_hooks.values()) + list(m._forward_hooks.values())
        assert hooks and all(isinstance(h, CopySafe) and h.fn is None for h in hooks), hooks
    for x, y in loader:
        target = teacher(x).detach()  # the copy's forward: delay seconds a step, not the model's
        loss = ((model(x) - y) ** 2).mean() + ((model(x) - target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ranksight.unwatch()
    recs = [P.decode(d) for d in raw.drain()]
    steps = [s for r in recs if r["t"] == "steps" for s in P.expand_steps(r)]
    bye = [r for r in recs if r["t"] == "bye"][-1]
    assert bye["tot"]["steps"] == n and steps[-1]["herr"] == 0, (bye["tot"], steps[-1])
    fwd = sum(r["fwd"] for r in steps)
    assert 0 < fwd < 0.5 * n * delay, (fwd, n * delay)
