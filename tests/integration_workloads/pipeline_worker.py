"""A ``torch.distributed.pipelining`` loop watched with ``ranksight.watch(schedule, optimizer,
loader)``: one pipeline stage per rank (``--per-rank`` stages per rank with the interleaved
schedule), gloo on CPU, ``--micro`` micro-batches per step, ``--schedule`` gpipe, 1f1b or
interleaved. Run one process per rank under torchrun.

Each stage's compute is a fixed host delay: its layer sleeps ``--fwd`` seconds in forward and
``--bwd`` seconds in backward (a custom autograd Function), ``--slow-factor`` times longer on stage
``--slow-stage``. Sleeping leaves the CPU free, so four ranks on a two-core machine keep the timing
of the schedule itself (computing on the CPU they would take turns on the cores and the measured
bubble would be the machine's, not the schedule's). The first step runs unwatched (the stages'
shape inference and P2P set-up happen in it), and the ranks start the watched steps together. Prints RESULT per rank."""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import hooks_state, result  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ranksight  # noqa: E402

WIDTH = 8


def start_together(name: str) -> None:
    """Every rank leaves here at the same moment, after its ``watch()``: a barrier on the
    rendezvous store, not a collective, so the hooks record nothing for it. Started one after the
    other, a stage that finished ``watch()`` late would find its first inputs already sent and its
    first step's bubble would read short of the schedule's."""
    store = dist.distributed_c10d._get_default_store()
    store.add(name, 1)
    deadline = time.monotonic() + 60
    while int(store.add(name, 0)) < dist.get_world_size():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name}: not every rank arrived in 60 s")
        time.sleep(0.001)


class Sleep(torch.autograd.Function):
    """Identity that sleeps ``fwd`` seconds in forward and ``bwd`` seconds in backward."""

    @staticmethod
    def forward(ctx, x, fwd, bwd):  # type: ignore[override]
        ctx.bwd = bwd
        time.sleep(fwd)
        return x.clone()

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        time.sleep(ctx.bwd)
        return g, None, None


class Layer(torch.nn.Module):
    def __init__(self, fwd: float, bwd: float):
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)
        self.fwd, self.bwd = fwd, bwd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return Sleep.apply(self.lin(x), self.fwd, self.bwd)


def deepspeed_main(a: argparse.Namespace) -> None:
    """The same stages as a DeepSpeed ``PipelineModule`` (one Layer per stage), its engine watched
    with ``ranksight.watch(engine, None, None)``; ``engine.train_batch`` runs --micro micro-batches
    (gradient accumulation steps) through DeepSpeed's 1F1B schedule."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import deepspeed.ops
    from deepspeed.pipe import PipelineModule

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no compiler needed (README)
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    layers = [Layer(a.fwd * (a.slow_factor if i == a.slow_stage else 1.0),
                    a.bwd * (a.slow_factor if i == a.slow_stage else 1.0)) for i in range(world)]
    net = PipelineModule(layers=layers, num_stages=world, loss_fn=torch.nn.MSELoss(), partition_method="uniform")
    cfg = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": a.micro, "steps_per_print": 10 ** 9,
           "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
    engine, _, _, _ = deepspeed.initialize(model=net, model_parameters=[p for p in net.parameters()], config=cfg)
    g = torch.Generator().manual_seed(0)

    def data():
        while True:
            yield torch.randn(2, WIDTH, generator=g), torch.randn(2, WIDTH, generator=g)

    it = data()
    engine.train_batch(data_iter=it)  # unwatched: the P2P set-up
    dist.barrier()
    before = hooks_state()
    ranksight.watch(engine, None, None)
    start_together("ds-watched")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        engine.train_batch(data_iter=it)
    wall = time.perf_counter() - t0
    ranksight.unwatch()
    restored = "_INSTRUCTION_MAP" not in engine.__dict__ and "train_batch" not in engine.__dict__
    result(rank=rank, steps=a.steps, wall=wall, before=before, after=hooks_state(), restored=restored,
           stage=engine.stage_id)
    dist.barrier()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deepspeed", action="store_true", help="a DeepSpeed PipelineModule instead")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--micro", type=int, default=4)
    ap.add_argument("--schedule", default="gpipe", choices=("gpipe", "1f1b", "interleaved"))
    ap.add_argument("--per-rank", type=int, default=1, help="stages per rank (interleaved)")
    ap.add_argument("--fwd", type=float, default=0.02)
    ap.add_argument("--bwd", type=float, default=0.02)
    ap.add_argument("--slow-stage", type=int, default=-1, help="this pipeline rank's delays are --slow-factor longer")
    ap.add_argument("--slow-factor", type=float, default=2.0)
    a = ap.parse_args()
    if a.deepspeed:
        return deepspeed_main(a)
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    k = a.slow_factor if rank == a.slow_stage else 1.0
    v = a.per_rank if a.schedule == "interleaved" else 1
    n_stages = world * v
    stages = [PipelineStage(Layer(a.fwd * k, a.bwd * k), rank + j * world, n_stages, torch.device("cpu"))
              for j in range(v)]

    def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.mse_loss(out, y)

    if a.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=a.micro, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if a.schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], n_microbatches=a.micro, loss_fn=loss_fn)
    params = [p for s in stages for p in s.submod.parameters()]
    opt = torch.optim.SGD(params, lr=0.01)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(a.micro * 2, WIDTH, generator=g), torch.randn(a.micro * 2, WIDTH, generator=g))
               for _ in range(a.steps + 1)]
    first = any(s.is_first for s in stages)
    last = any(s.is_last for s in stages)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad()
        kw = {"target": y, "losses": []} if last else {}
        if first:
            schedule.step(x, **kw)
        else:
            schedule.step(**kw)
        opt.step()

    step(*batches[0])  # unwatched: shape inference and the P2P set-up
    dist.barrier()
    before = hooks_state()
    loader = ranksight.watch(schedule, opt, batches[1:])
    start_together("watched")
    t0 = time.perf_counter()
    for x, y in loader:
        step(x, y)
    wall = time.perf_counter() - t0
    ranksight.unwatch()
    restored = all("forward_one_chunk" not in s.__dict__ for s in stages) and "step" not in schedule.__dict__
    result(rank=rank, steps=a.steps, wall=wall, before=before, after=hooks_state(), restored=restored)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
