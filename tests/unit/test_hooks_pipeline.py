"""``ranksight.watch(schedule, optimizer, loader)`` with a real ``torch.distributed.pipelining``
schedule in one process (a world of one on gloo, one stage): the stage's compute time against a
known host delay, the schedule's time, the step record's pipeline fields, ``dist.P2POp`` made while
the P2P functions are wrapped, and everything restored by ``unwatch()``. Several stages on real
processes: tests/integration/test_integrations_pipeline.py."""
from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

import ranksight
from ranksight import protocol
from ranksight.common.plumbing import free_port
from ranksight.hooks import pipeline

pytest.importorskip("torch.distributed.pipelining")
from torch.distributed import distributed_c10d as c10d  # noqa: E402
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, schedules  # noqa: E402

OFF = {"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}
DELAY = 0.01  # seconds the stage sleeps per micro-batch, forward and backward alike
MICRO = 2


class Sleep(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # type: ignore[override]
        time.sleep(DELAY)
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        time.sleep(DELAY)
        return g


class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return Sleep.apply(self.lin(x))


@pytest.fixture
def world_of_one():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    ranksight.unwatch()
    dist.destroy_process_group()


def _schedule():
    stage = PipelineStage(Layer(), 0, 1, torch.device("cpu"))
    return ScheduleGPipe(stage, n_microbatches=MICRO, loss_fn=lambda out, y: (out - y).pow(2).mean()), stage


def _train(schedule, opt, loader):
    for x, y in loader:
        opt.zero_grad()
        schedule.step(x, target=y)
        opt.step()


def test_a_stage_s_compute_and_schedule_time_reach_the_step_record(world_of_one):
    schedule, stage = _schedule()
    opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)
    data = [(torch.randn(4, 4), torch.randn(4, 4)) for _ in range(4)]
    _train(schedule, opt, data[:1])  # shape inference, unwatched
    own = dict(batch=schedules._batch_p2p, wait=schedules._wait_batch_p2p, check=c10d._check_op,
               init=c10d.P2POp.__init__)
    loader = ranksight.watch(schedule, opt, data[1:], agent="off", config=OFF)
    w = loader.watcher
    assert isinstance(w.pipeline, pipeline.PipelineTimer) and w.model is stage.submod
    recs = []
    w._step_end, real = (lambda t: (recs.append((w._pbusy, w._pstep, w._pwprev, w._pwnext)), real(t))), w._step_end
    _train(schedule, opt, loader)
    assert len(recs) == 3 and w.herr == 0
    for busy, step, prev, nxt in recs:
        assert 2 * MICRO * DELAY <= busy <= step, (busy, step)
        assert prev == nxt == 0.0  # no neighbour
    assert w.step_state()["pstage"] == 0 and w.step_state()["pstages"] == 1 and w.step_state()["pmb"] == MICRO
    it = w._queue[-1] if w._queue else None  # the step tuple carries them at their declared places
    if it is not None:
        lay = protocol.LAYOUTS[protocol.VERSION]
        assert it[lay.index["pbusy"]] == recs[-1][0] and it[lay.index["pstep"]] == recs[-1][1]
    # a P2POp made while dist.isend is wrapped holds the original (P2POp checks it by identity)
    op = dist.P2POp(dist.isend, torch.zeros(1), 0)
    assert op.op is c10d.isend
    ranksight.unwatch()
    assert not any(n in stage.__dict__ for n in pipeline.COMPUTE) and "step" not in schedule.__dict__
    assert own == dict(batch=schedules._batch_p2p, wait=schedules._wait_batch_p2p, check=c10d._check_op,
                       init=c10d.P2POp.__init__)
    _train(schedule, opt, data[:1])


def test_a_stage_stands_for_its_schedule(world_of_one):
    """Given the stage, the step's pipeline time is the span of its chunks."""
    schedule, stage = _schedule()
    opt = torch.optim.SGD(stage.submod.parameters(), lr=0.01)
    data = [(torch.randn(4, 4), torch.randn(4, 4)) for _ in range(3)]
    _train(schedule, opt, data[:1])
    loader = ranksight.watch(stage, opt, data[1:], agent="off", config=OFF)
    w = loader.watcher
    spans = []
    orig = w.pipeline.step_end

    def step_end():
        orig()
        spans.append((w._pbusy, w._pstep))

    w.pipeline.step_end = step_end
    _train(schedule, opt, loader)
    assert len(spans) == 2 and w.herr == 0
    for busy, step in spans:
        assert 2 * MICRO * DELAY <= busy <= step, spans


def test_is_pipeline_by_class_name(world_of_one):
    schedule, stage = _schedule()
    assert pipeline.is_pipeline(schedule) and pipeline.is_pipeline(stage)
    assert not pipeline.is_pipeline(torch.nn.Linear(2, 2)) and not pipeline.is_pipeline(None)
