"""``ranksight.watch(engine, optimizer, loader)`` with a DeepSpeed engine, the step logic only: a
stand-in engine (named ``DeepSpeedEngine``, as ``hooks/deepspeed_engine.py`` recognises one) whose
``step()`` applies the optimizer at every ``accum``-th call, as DeepSpeed's managed gradient
accumulation does. The real engine, ZeRO 1-3 on 2 ranks, is in
tests/integration/test_integrations_deepspeed.py."""
from __future__ import annotations

import torch
import torch.nn as nn

import ranksight
from ranksight.hooks import deepspeed_engine

OFF = {"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}
NAMES = ("step", "_take_model_step", "backward", "save_checkpoint")


class DeepSpeedEngine(nn.Module):
    def __init__(self, accum: int):
        super().__init__()
        self.module = nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.module.parameters(), lr=0.1)
        self.accum = accum
        self.micro_steps = self.global_steps = 0
        self.saved = []

    def forward(self, x):
        return self.module(x)

    def backward(self, loss):
        (loss / self.accum).backward()

    def is_gradient_accumulation_boundary(self):
        return (self.micro_steps + 1) % self.accum == 0

    def _take_model_step(self, lr_kwargs=None):
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.global_steps += 1

    def step(self, lr_kwargs=None):
        if self.is_gradient_accumulation_boundary():
            self._take_model_step(lr_kwargs)
        self.micro_steps += 1

    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True):
        self.saved.append((save_dir, tag))


def _train(engine, loader):
    for x in loader:
        engine.backward(engine(x).pow(2).mean())
        engine.step()


def test_is_engine_by_class_name():
    assert deepspeed_engine.is_engine(DeepSpeedEngine(2))
    assert not deepspeed_engine.is_engine(nn.Linear(2, 2))
    assert not deepspeed_engine.is_engine(None)


def test_a_step_is_a_model_step_and_every_forward_a_micro_batch(tmp_path):
    engine = DeepSpeedEngine(accum=3)
    data = [torch.randn(2, 4) for _ in range(12)]
    loader = ranksight.watch(engine, engine.optimizer, data, agent="off", config=OFF)
    w = loader.watcher
    assert isinstance(w.optimizer, deepspeed_engine.EngineSteps)
    assert w.optimizer.param_groups is engine.optimizer.param_groups  # read through to the engine's optimizer
    micro = []
    w._step_end, real = (lambda t: (micro.append(w._micro), real(t))), w._step_end
    _train(engine, loader)
    engine.save_checkpoint(str(tmp_path), tag="t")
    assert engine.saved == [(str(tmp_path), "t")]
    assert w.stats()["steps"] == engine.global_steps == 4
    assert micro == [3, 3, 3, 3]
    assert w.herr == 0
    ranksight.unwatch()
    assert not any(n in engine.__dict__ for n in NAMES)  # the engine's own methods again
    _train(engine, data[:3])
    assert engine.global_steps == 5


def test_a_raising_hook_never_reaches_the_loop():
    engine = DeepSpeedEngine(accum=2)
    loader = ranksight.watch(engine, None, [torch.randn(2, 4) for _ in range(4)], agent="off", config=OFF)
    w = loader.watcher

    def boom(*_):
        raise RuntimeError("boom")

    w.optimizer.register_step_pre_hook(boom)
    w.optimizer.register_step_post_hook(boom)
    _train(engine, loader)
    assert engine.global_steps == 2 and w.stats()["steps"] == 2
    assert w.herr >= 2
    ranksight.unwatch()
