"""The training loss (hooks/loss.py): ``ranksight.loss(loss)`` on a real CPU watch, and the CUDA
path's ordering (copy, event, read a step or more later) with a stand-in for the device copy."""
from __future__ import annotations

import math
import os
import socket
import time
from types import SimpleNamespace

import pytest

from ranksight import protocol as P

torch = pytest.importorskip("torch")

import ranksight  # noqa: E402
from ranksight.hooks.loss import LossReader  # noqa: E402


def _watch_losses(monkeypatch, losses, step_detail=True):
    """A real watch of ``len(losses)`` steps; step i records ``losses[i]`` (a float, a list of
    floats, or None for the real cross-entropy). Returns (expanded steps, last "steps" record,
    the real losses)."""
    for k in list(os.environ):
        if k.startswith("RANKSIGHT"):
            monkeypatch.delenv(k, raising=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.3)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
    real = []
    try:
        loader = ranksight.watch(model, opt, [(x, y)] * len(losses), agent=f"udp://127.0.0.1:{sock.getsockname()[1]}",
                                 config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0,
                                                   "step_detail": step_detail}})
        for i, (xb, yb) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            given = losses[i]
            if given is None:
                ranksight.loss(loss)
                real.append(loss.item())
            else:
                for v in (given if isinstance(given, list) else [given]):
                    ranksight.loss(v)
            opt.step()
        time.sleep(0.3)
    finally:
        ranksight.unwatch()
    steps, last = [], None
    try:
        while True:
            rec = P.decode(sock.recv(65536))
            if rec["t"] == "steps":
                steps += P.expand_steps(rec)
                last = rec
    except socket.timeout:
        sock.close()
    return steps, last, real


def test_cpu_losses_reach_the_step_record(monkeypatch):
    steps, last, real = _watch_losses(monkeypatch, [None] * 5)
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5]
    assert [s["lossn"] for s in steps] == [1] * 5
    assert [s["loss"] for s in steps] == pytest.approx(real, rel=1e-5)  # each in its own step
    assert last["tot"]["lossn"] == 5 and last["tot"]["loss"] == pytest.approx(sum(real), rel=1e-9)
    assert last["lnan"] == 0 and last["lnanstep"] == 0


def test_a_nan_loss_is_counted_and_its_step_named_never_sent(monkeypatch):
    losses = [1.0, 2.0, float("nan"), 4.0, [float("inf"), 5.0], float("nan")]
    steps, last, _ = _watch_losses(monkeypatch, losses)
    assert [s["seq"] for s in steps] == [1, 2, 3, 4, 5, 6]  # no record was dropped by the encoder
    assert [s["loss"] for s in steps] == [1.0, 2.0, 0.0, 4.0, 5.0, 0.0]
    assert [s["lossn"] for s in steps] == [1, 1, 0, 1, 1, 0]
    assert last["lnan"] == 3 and last["lnanstep"] == 3  # the first one's step
    assert last["tot"]["loss"] == 12.0 and last["tot"]["lossn"] == 4


def test_without_step_detail_the_totals_carry_the_loss(monkeypatch):
    steps, last, real = _watch_losses(monkeypatch, [None] * 3, step_detail=False)
    assert "loss" not in last and last["tot"]["lossn"] == 3
    assert last["tot"]["loss"] == pytest.approx(sum(real), rel=1e-9)


def test_loss_never_raises_and_does_nothing_unwatched(monkeypatch):
    ranksight.loss(torch.tensor(1.0))  # no watch: nothing happens
    steps, last, _ = _watch_losses(monkeypatch, ["not a number", -1.0, 1e9, 2.0])
    assert [s["lossn"] for s in steps] == [0, 0, 0, 1]  # a bad value, a negative, one above a week: not sent
    assert last["herr"] == 1 and last["lnan"] == 0


# ---------------------------------------------------------------- the CUDA path, with a stand-in copy
class FakeEvent:
    def __init__(self):
        self.done = False
        self.queries = 0

    def query(self) -> bool:
        self.queries += 1
        return self.done


class FakeCopy:
    """``CudaCopy``'s interface over a list: ``start`` keeps the tensor's value for ``read``
    (the stand-in reads it through the test's own handle, never the reader)."""

    def __init__(self, slots=2):
        self.free_slots = list(range(slots))
        self.vals = {}
        self.events = []

    def start(self, t):
        if not self.free_slots:
            return None
        i = self.free_slots.pop()
        self.vals[i] = t.value
        ev = FakeEvent()
        self.events.append(ev)
        return i, ev

    def read(self, slot):
        return self.vals.pop(slot)

    def free(self, slot):
        self.free_slots.append(slot)


class DeviceLoss:
    """A CUDA loss as the reader sees it: a device, and no host read allowed."""

    def __init__(self, value):
        self.device = SimpleNamespace(type="cuda")
        self.value = value

    def item(self):
        raise AssertionError(".item() on a CUDA loss synchronizes the device")

    def __float__(self):
        raise AssertionError("float() on a CUDA loss synchronizes the device")


def test_cuda_losses_are_read_once_their_event_completed_a_step_later():
    got = []
    copy = FakeCopy(slots=2)
    r = LossReader(got.append, copy)
    r.record(DeviceLoss(1.5), step=1)
    r.take(1)  # the end of step 1: its own loss waits for a later step
    assert got == [] and copy.events[0].queries == 0
    r.take(2)  # step 2 ends, the copy is not done: not read
    assert got == [] and copy.events[0].queries == 1
    r.record(DeviceLoss(float("nan")), step=2)
    r.record(DeviceLoss(3.0), step=2)  # every slot in flight: dropped
    assert r.dropped == 1
    copy.events[1].done = True  # the later copy is done, the earlier not: nothing out of order
    r.take(3)
    assert got == [] and r.in_flight() == 2
    copy.events[0].done = True
    r.take(3)
    assert got == [1.5] and r.nonfinite == 1 and r.first_bad == 2 and r.in_flight() == 0
    r.record(DeviceLoss(2.5), step=3)  # slots were freed
    copy.events[2].done = True
    r.take(4)
    assert got == [1.5, 2.5] and r.dropped == 1


def test_the_reader_values():
    got = []
    r = LossReader(got.append)
    r.record(torch.tensor([1.0, 3.0]), 1)  # an unreduced loss: its mean
    r.record(torch.tensor(0.5, dtype=torch.bfloat16, requires_grad=True) * 1, 1)
    r.record(2, 1)
    r.record(float("-inf"), 7)
    r.record(float("nan"), 8)
    assert got == [2.0, 0.5, 2.0] and r.nonfinite == 2 and r.first_bad == 7
    r.record(-0.5, 9)
    assert r.out_of_range == 1 and not math.isnan(sum(got))


# ---------------------------------------------------------------- the framework integrations pass the loss
def _started(monkeypatch):
    for k in list(os.environ):
        if k.startswith("RANKSIGHT"):
            monkeypatch.delenv(k, raising=False)
    from ranksight.hooks import watcher

    return watcher.start(torch.nn.Linear(2, 1), None, None, agent="off",
                         config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})


def test_lightning_and_transformers_callbacks_record_the_loss(monkeypatch):
    pytest.importorskip("lightning")
    pytest.importorskip("transformers")
    from ranksight.integrations.lightning import RanksightCallback as LightningCallback
    from ranksight.integrations.transformers import RanksightCallback as HFCallback

    w = _started(monkeypatch)
    try:
        lcb, hcb = LightningCallback(), HFCallback()
        lcb._own.w = hcb._own.w = w
        trainer = SimpleNamespace(accumulate_grad_batches=2)
        lcb.on_train_batch_end(trainer, SimpleNamespace(automatic_optimization=True), {"loss": torch.tensor(0.25)},
                               None, 0)  # Lightning divided it by 2
        lcb.on_train_batch_end(trainer, SimpleNamespace(automatic_optimization=False), torch.tensor(3.0), None, 1)
        lcb.on_train_batch_end(trainer, SimpleNamespace(), None, None, 2)  # training_step returned nothing
        hcb.on_log(None, None, None, logs={"loss": 1.5, "learning_rate": 0.1})
        hcb.on_log(None, None, None, logs={"eval_loss": 9.0})  # not the training loss
        hcb.on_log(None, None, None, logs={"loss": float("nan")})
        assert (w._loss, w._lossn) == (5.0, 3) and w.losses.nonfinite == 1 and w.herr == 0
    finally:
        ranksight.unwatch()


def test_accelerate_backward_records_the_loss(monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate import Accelerator

    from ranksight.integrations import accelerate as ra

    orig = Accelerator.backward
    for k in list(os.environ):
        if k.startswith("RANKSIGHT"):
            monkeypatch.delenv(k, raising=False)
    w = ra.watch(agent="off", config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}})
    try:
        acc = Accelerator(cpu=True)
        p = torch.nn.Parameter(torch.ones(2))
        acc.backward((p * 2).sum())
        assert (w._loss, w._lossn) == (4.0, 1) and p.grad.tolist() == [2.0, 2.0]
    finally:
        ranksight.unwatch()
    assert Accelerator.backward is orig  # restored by unwatch()
