"""The zero-argument ``watch()`` in one process: what it finds (optimizers through the global step
hooks, DataLoader iterators, the model), how several optimizers make one step, Lightning-style
``optimizer.step(closure)``, explicit arguments winning, broken agent addresses, and that
``unwatch()`` restores every global hook and patch. Every datagram goes to a real UDP receiver
and must pass protocol.decode. Also: importing ranksight imports no framework."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.modules.module as mm  # noqa: E402
import torch.optim.optimizer as oo  # noqa: E402
from torch.utils.data import DataLoader, Dataset  # noqa: E402
from torch.utils.data import dataloader as dl  # noqa: E402

import ranksight  # noqa: E402

from hooks_workloads.harness import REPO, with_detail  # noqa: E402

FAST = with_detail({"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0, "table_every_seconds": 0}})
ORIGINAL = (dl._BaseDataLoaderIter.__next__, dl.DataLoader.__iter__, torch.autograd.backward, torch.save)


class Sleepy(Dataset):
    def __init__(self, n: int, sleep: float):
        g = torch.Generator().manual_seed(0)
        self.x, self.y, self.sleep = torch.randn(n, 16, generator=g), torch.randn(n, 2, generator=g), sleep

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(self.sleep)
        return self.x[i], self.y[i]


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in list(os.environ):
        if k.startswith("RANKSIGHT") or k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(k, raising=False)
    torch.set_num_threads(1)
    yield
    ranksight.unwatch()
    assert_restored()


def assert_restored():
    assert (dl._BaseDataLoaderIter.__next__, dl.DataLoader.__iter__, torch.autograd.backward, torch.save) == ORIGINAL
    assert not oo._global_optimizer_pre_hooks and not oo._global_optimizer_post_hooks
    assert not mm._global_forward_pre_hooks and not mm._global_forward_hooks


def model_opt():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def steps_of(rx, n):
    assert rx.wait_for(lambda: len(rx.of("step")) >= n and rx.of("bye"), 5), len(rx.of("step"))
    return rx.of("step")


def test_zero_argument_watch_plain_loop_with_accumulation(rx):
    model, opt = model_opt()
    loader = DataLoader(Sleepy(48, 0.004), batch_size=4)  # 12 batches, 16 ms per batch
    ranksight.watch(agent=rx.url, config=FAST)
    w = ranksight.hooks.current()
    for i, (x, y) in enumerate(loader):
        (loss_of(model, x, y) / 3).backward()
        if (i + 1) % 3 == 0:
            opt.step()
            opt.zero_grad()
    assert w.model is model and w.optimizer is opt and w.loader is loader  # found
    assert mm._global_forward_pre_hooks == {}  # the global module hooks went once the model was found
    ranksight.unwatch()
    steps = steps_of(rx, 4)
    assert [s["seq"] for s in steps] == [1, 2, 3, 4]
    assert all(s["micro"] == 3 for s in steps)
    for s in steps:
        assert 0.048 * 0.9 <= s["data"] <= s["dur"], s  # 3 batches x 16 ms
        assert s["fwd"] > 0 and s["bwd"] > 0 and s["opt"] > 0
    assert w.herr == 0


def test_watch_model_only_finds_the_optimizer(rx):
    """``ranksight.watch(model)`` before a loop the user does not hold the optimizer of."""
    model, opt = model_opt()
    ranksight.watch(model, agent=rx.url, config=FAST)
    for x, y in DataLoader(Sleepy(16, 0), batch_size=4):
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
    ranksight.unwatch()
    assert [s["seq"] for s in steps_of(rx, 4)] == [1, 2, 3, 4]


def test_two_optimizers_in_one_iteration_make_one_step(rx):
    """A GAN-like loop: the discriminator and the generator step once each per batch."""
    torch.manual_seed(0)
    gen, disc = nn.Linear(16, 16), nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 1))
    og, od = torch.optim.SGD(gen.parameters(), lr=0.01), torch.optim.SGD(disc.parameters(), lr=0.01)
    ranksight.watch(agent=rx.url, config=FAST)
    for x, _ in DataLoader(Sleepy(20, 0.002), batch_size=4):
        od.zero_grad()
        disc(gen(x).detach()).mean().backward()
        od.step()
        og.zero_grad()
        (-disc(gen(x)).mean()).backward()
        og.step()
    w = ranksight.hooks.current()
    assert w.model is disc  # the root holding most of the stepping optimizers' parameters
    ranksight.unwatch()
    steps = steps_of(rx, 5)
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5]
    assert all(s["data"] >= 0.008 * 0.9 for s in steps)


def test_without_a_dataloader_the_forward_starts_the_next_step(rx):
    model, opt = model_opt()
    data = [(torch.randn(4, 16), torch.randn(4, 2)) for _ in range(5)]
    ranksight.watch(agent=rx.url, config=FAST)
    for x, y in data:
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
    ranksight.unwatch()
    steps = steps_of(rx, 5)
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5] and all(s["micro"] == 1 for s in steps)


def test_closure_step_times_the_optimizer_after_the_backward(rx):
    """Lightning's ``optimizer.step(closure)``: forward and backward run inside the step."""
    model, opt = model_opt()
    ranksight.watch(agent=rx.url, config=FAST)
    for x, y in DataLoader(Sleepy(24, 0), batch_size=4):
        def closure():
            opt.zero_grad()
            loss = loss_of(model, x, y)
            time.sleep(0.01)  # work inside the step before the backward: it must not count as optimizer time
            loss.backward()
            return loss
        opt.step(closure)
    ranksight.unwatch()
    steps = steps_of(rx, 6)
    for s in steps[1:]:
        assert s["fwd"] > 0 and s["dur"] >= 0.01 and s["opt"] < 0.005, s
        assert s["micro"] == 1 and s["b2o"] <= s["bwd"] + 0.002


def test_an_optimizer_stepping_inside_another_counts_once(rx):
    model, opt = model_opt()

    class Wrapper(torch.optim.Optimizer):  # e.g. a lookahead-style wrapper that is an Optimizer too
        def __init__(self, inner):
            super().__init__(inner.param_groups[0]["params"], {"lr": 0.0})
            self.inner = inner

        def step(self, closure=None):
            return self.inner.step(closure)

    wrapped = Wrapper(opt)
    ranksight.watch(agent=rx.url, config=FAST)
    for x, y in DataLoader(Sleepy(12, 0), batch_size=4):
        loss_of(model, x, y).backward()
        wrapped.step()
        wrapped.zero_grad()
    ranksight.unwatch()
    assert [s["seq"] for s in steps_of(rx, 3)] == [1, 2, 3]


def test_an_optimizer_step_that_raises_does_not_stop_counting(rx):
    model, opt = model_opt()
    ranksight.watch(agent=rx.url, config=FAST)
    for i, (x, y) in enumerate(DataLoader(Sleepy(16, 0), batch_size=4)):
        loss_of(model, x, y).backward()
        if i == 1:
            with pytest.raises(RuntimeError):
                opt.step(lambda: (_ for _ in ()).throw(RuntimeError("closure failed")))
        else:
            opt.step()
        opt.zero_grad()
    ranksight.unwatch()
    assert [s["seq"] for s in steps_of(rx, 3)] == [1, 2, 3]


def test_explicit_arguments_win(rx):
    """A given optimizer and loader are the only ones timed: no global hooks, no DataLoader patch."""
    model, opt = model_opt()
    other = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    loader = DataLoader(Sleepy(16, 0), batch_size=4)
    watched = ranksight.watch(model, opt, loader, agent=rx.url, config=FAST)
    assert not oo._global_optimizer_pre_hooks and dl._BaseDataLoaderIter.__next__ is ORIGINAL[0]
    assert not mm._global_forward_pre_hooks
    for x, y in watched:
        loss_of(model, x, y).backward()
        opt.step()
        other.step()  # not the watched optimizer: no step of its own
        opt.zero_grad()
    ranksight.unwatch()
    assert [s["seq"] for s in steps_of(rx, 4)] == [1, 2, 3, 4]


@pytest.mark.parametrize("address", ["udp://256.1.1.1:1", "unix:///nonexistent/ranksight.sock", "udp://localhost:1"])
def test_a_broken_agent_address_does_not_stop_training(address, caplog):
    model, opt = model_opt()
    ranksight.watch(agent=address, config=FAST)
    w = ranksight.hooks.current()
    n = 0
    for x, y in DataLoader(Sleepy(16, 0), batch_size=4):
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        n += 1
    time.sleep(0.1)  # a few heartbeats go nowhere
    ranksight.unwatch()
    assert n == 4 and w.stats()["steps"] == 4 and w.herr == 0


def test_unwatch_in_the_middle_of_a_loop_restores_everything(rx):
    model, opt = model_opt()
    loader = DataLoader(Sleepy(16, 0), batch_size=4)
    ranksight.watch(agent=rx.url, config=FAST)
    it = iter(loader)
    x, y = next(it)
    loss_of(model, x, y).backward()  # in the middle of discovery: global module hooks are still on
    assert mm._global_forward_pre_hooks
    ranksight.unwatch()
    assert_restored()
    for x, y in it:  # the iterator keeps working unwatched
        loss_of(model, x, y).backward()
        opt.step()


def test_the_fsdp2_module_is_the_model_found(rx):
    """fully_shard (FSDP2) on a 1-rank gloo group: the sharded root is the model, not a submodule."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from ranksight.common.plumbing import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        model, _ = model_opt()
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ranksight.watch(agent=rx.url, config=FAST)
        for x, y in DataLoader(Sleepy(16, 0), batch_size=4):
            loss_of(model, x, y).backward()
            opt.step()
            opt.zero_grad()
        w = ranksight.hooks.current()
        assert w.model is model and isinstance(w.model, FSDPModule)
        ranksight.unwatch()
        steps = steps_of(rx, 4)
        assert [s["seq"] for s in steps] == [1, 2, 3, 4] and all(s["micro"] == 1 for s in steps)
        assert w.herr == 0
    finally:
        dist.destroy_process_group()


def test_importing_ranksight_imports_no_framework():
    code = ("import sys, json, ranksight, ranksight.integrations, ranksight.cli; "
            "print(json.dumps(sorted(m for m in ('torch', 'transformers', 'lightning', 'pytorch_lightning', "
            "'accelerate') if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO,
                         env=dict(os.environ, PYTHONPATH=REPO))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_fetches_under_no_grad_are_no_data_wait(rx):
    """An evaluation loop between training steps (under no_grad) is not training data wait."""
    model, opt = model_opt()
    val = DataLoader(Sleepy(8, 0.01), batch_size=4)  # 40 ms per evaluation pass
    ranksight.watch(agent=rx.url, config=FAST)
    for x, y in DataLoader(Sleepy(16, 0), batch_size=4):
        loss_of(model, x, y).backward()
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            for vx, vy in val:
                loss_of(model, vx, vy)
    ranksight.unwatch()
    steps = steps_of(rx, 4)
    assert all(s["data"] < 0.02 for s in steps), [s["data"] for s in steps]  # an evaluation pass is 40 ms
    assert all(s["dur"] >= 0.04 for s in steps[1:])  # the evaluation's time stays in the steps
