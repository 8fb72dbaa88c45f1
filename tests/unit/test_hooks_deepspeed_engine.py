"""``ranksight.watch(engine, optimizer, loader)`` with a DeepSpeed engine, the step logic only: a
stand-in engine (named ``DeepSpeedEngine``, as ``hooks/deepspeed_engine.py`` recognises one) whose
``step()`` applies the optimizer at every ``accum``-th call, as DeepSpeed's managed gradient
accumulation does. Every entry point routes an engine (``watch``, ``watcher.start``, ``watch()`` alone, which adopts it
at its first forward), and the hello names the strategy and ZeRO stage. The real engine, ZeRO 1-3
on 2 ranks, is in tests/integration/test_integrations_deepspeed.py."""
from __future__ import annotations

import json
import time

import pytest
import torch
import torch.nn as nn
import torch.optim.optimizer as oo

import ranksight
from ranksight import protocol
from ranksight.hooks import deepspeed_engine, watcher

from test_hooks_batch import Raw

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

    def zero_optimization_stage(self):
        return 2


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


@pytest.fixture(autouse=True)
def _clean_env(clean_watch_env):
    yield


def test_watcher_start_routes_an_engine():
    """The integrations' entry point: the engine's model steps are the steps, whatever optimizer."""
    engine = DeepSpeedEngine(accum=2)
    w = watcher.start(engine, engine.optimizer, None, agent="off", config=OFF)
    assert isinstance(w.optimizer, deepspeed_engine.EngineSteps)
    assert "step" in engine.__dict__ and "backward" in engine.__dict__
    _train(engine, watcher.WatchedLoader([torch.randn(2, 4) for _ in range(6)], w))
    assert w.stats()["steps"] == engine.global_steps == 3 and w._micro == 0 and w.herr == 0
    ranksight.unwatch()
    assert not any(n in engine.__dict__ for n in NAMES)


def test_watch_alone_adopts_the_engine_and_counts_each_model_step_once():
    """``watch()`` given nothing: the torch optimizer inside the engine would be counted by the
    global optimizer hooks; once the engine's first forward returns, the engine's model steps take
    over and the global hooks are gone, so each model step is one step."""
    engine = DeepSpeedEngine(accum=3)
    ranksight.watch(agent="off", config=OFF)
    w = ranksight.hooks.current()
    assert oo._global_optimizer_post_hooks
    micro = []
    w._step_end, real = (lambda t: (micro.append(w._micro), real(t))), w._step_end
    _train(engine, [torch.randn(2, 4) for _ in range(12)])
    assert isinstance(w.optimizer, deepspeed_engine.EngineSteps) and w.model is engine
    assert not oo._global_optimizer_pre_hooks and not oo._global_optimizer_post_hooks
    assert w.stats()["steps"] == engine.global_steps == 4
    assert micro == [3, 3, 3, 3] and w.herr == 0
    ranksight.unwatch()
    assert not any(n in engine.__dict__ for n in NAMES)


def _hellos(raw: Raw, until: float, strategy: bool = True):
    """The hellos' info until one names a strategy (or, ``strategy=False``, until the first)."""
    out = []
    while time.monotonic() < until:
        for d in raw.drain():
            rec = protocol.decode(d)
            if rec["t"] == "hello":
                out.append(rec["info"])
        if out and (out[-1].get("strategy") or not strategy):
            break
    return out


def test_the_hello_names_the_strategy_and_zero_stage():
    raw = Raw()
    engine = DeepSpeedEngine(accum=2)
    ranksight.watch(engine, None, None, agent=raw.url, config=OFF)
    hellos = _hellos(raw, time.monotonic() + 10)
    assert [(h["strategy"], h["zero_stage"]) for h in hellos] == [("deepspeed", "2")]
    ranksight.unwatch()
    ranksight.watch(nn.Linear(2, 2), None, None, agent=raw.url, config=OFF)
    assert [(h["strategy"], h["zero_stage"]) for h in _hellos(raw, time.monotonic() + 10)] == [("none", "")]


def test_a_model_found_later_sends_the_hello_again():
    """``watch()`` alone knows no model at its hello; the adopted engine's strategy follows in a
    second hello, which the agent keeps."""
    raw = Raw()
    engine = DeepSpeedEngine(accum=2)
    ranksight.watch(agent=raw.url, config=OFF)
    first = _hellos(raw, time.monotonic() + 10, strategy=False)
    assert first and "strategy" not in first[0]
    _train(engine, [torch.randn(2, 4) for _ in range(2)])
    again = _hellos(raw, time.monotonic() + 10)
    assert [(h["strategy"], h["zero_stage"]) for h in again] == [("deepspeed", "2")]
    assert json.dumps(again[0]["torch"]) == json.dumps(first[0]["torch"])  # the rest of the self-check as before
