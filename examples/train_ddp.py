"""A small 2-rank DDP training job on CPU (gloo), instrumented with ranksight.

The whole integration is two lines, marked below::

    import ranksight
    loader = ranksight.watch(model, optimizer, loader)

Two optional calls add detail: ``ranksight.loss(loss)`` (loss health) and, around the
write-then-rename checkpoint, ``ranksight.checkpoint_timer`` (the rename is checkpoint time too).

Run it with torchrun (start `ranksight exporter` first to get metrics; without an
agent the hooks still print their step table)::

    torchrun --standalone --nproc-per-node 2 examples/train_ddp.py --duration 60

``--strategy`` picks how the model is parallelized (``parallel_setup.py``): ``ddp`` (default),
``fsdp`` (FSDP2, each rank writes its shard when it checkpoints) or ``deepspeed`` (a ZeRO engine on
CPU, ``--zero-stage`` 1-3, default 2; needs ``pip install deepspeed``). The two ranksight lines stay
the same: ``watch`` is given the engine in place of the model.

The model is a token classifier (an MLP over 64-dim token features). A sample is one
sequence of 256 tokens; a rank takes 16 samples (4096 tokens) per step. On a 2-core machine a step
takes about 25 ms with under 15% of it in the gradient all-reduce and under 5% in
the data loader: a healthy, compute-bound job.

Fault injection (used by `ranksight demo` and the end-to-end tests; --rank-to-fault
picks the rank, default 1; each fault but comm-heavy starts --fault-after seconds after
the first step, default 10 for kill-rank and hang, 0 for the others):

  slow-data        that rank's dataset sleeps per sample (slow storage): data-loader bound
  straggler        that rank runs extra real compute every step: --straggler-extra times its own
                   compute per step, measured on the rank (its main thread's CPU time per step), so
                   0.25 is a rank 25% slower and 1.0 one twice as slow on any machine
  comm-heavy       all ranks: a wide model (1024) on a tiny batch (32 tokens) with SGD: the gradient
                   all-reduce dominates the step (a single-threaded AdamW over 2.4 M parameters
                   would itself take longer than the all-reduce on a 2-core machine)
  kill-rank        that rank SIGKILLs itself
  hang             that rank sleeps inside a step (its peer blocks in all-reduce)
  slow-checkpoint  rank 0 checkpoints a large state every few steps to a file opened with
                   O_DSYNC (every write waits for the disk), so checkpoints eat > 5% of wall time
  long-checkpoint  rank 0 writes one checkpoint of --checkpoint-mb (default 24) to storage that takes
                   --checkpoint-mbps (default 0.4 MB/s, a saturated network filesystem): about a minute
                   in which its peer waits in the next all-reduce

Every rank agrees when to stop: the stop flag travels with the periodic loss
all-reduce, so no rank leaves while its peer waits in a collective. SIGUSR1 asks for
that stop early (``ranksight demo`` ends the job that way once it has its verdict).

Resume (``--resume``, DDP and FSDP): a checkpoint holds the model, the optimizer and its LR
schedule, the step, the sampler's epoch and position in it, the RNG state and the seconds trained
so far. A process that finds one in ``--checkpoint-dir`` continues from it: the same step, epoch
and next batch as the uninterrupted run, and ``--duration`` counts the seconds trained before it.
Under an elastic launcher that restarts failed workers, a hung job whose workers are ended
(``ranksight act``) resumes from its last checkpoint; a restarted worker injects no fault::

    torchrun --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:29400 --max-restarts 3 \
        examples/train_ddp.py --resume --checkpoint-every 50 --fault hang --fault-after 30 --duration 45
"""
from __future__ import annotations

import argparse
import collections
import copy
import io
import os
import signal
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ranksight  # ranksight line 1 of 2

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from parallel_setup import STRATEGIES, build, label  # noqa: E402

FAULTS = ("none", "slow-data", "straggler", "comm-heavy", "kill-rank", "hang", "slow-checkpoint", "long-checkpoint")


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=0, help="stop after this many optimizer steps (0: no limit)")
    p.add_argument("--duration", type=float, default=60.0, help="stop after this many seconds (0: no limit)")
    p.add_argument("--batch-seqs", type=int, default=16, help="samples (sequences) per rank per step")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per sequence")
    p.add_argument("--hidden", type=int, default=256, help="MLP hidden width")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    p.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="optimizer (default adamw)")
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp",
                   help="ddp (default), fsdp (FSDP2) or deepspeed (a ZeRO engine on CPU)")
    p.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=2, help="--strategy deepspeed: the ZeRO stage")
    p.add_argument("--log-every", type=int, default=100, help="rank 0 prints the loss every N steps (0: never)")
    p.add_argument("--checkpoint-every", type=int, default=200, help="rank 0 checkpoints every N steps (0: never)")
    p.add_argument("--checkpoint-dir", default="run/checkpoints", help="where rank 0 writes last.pt")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint-dir's checkpoint when there is one (DDP, FSDP; see above)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device-ms", type=float, default=0.0, metavar="MS",
                   help="simulated device time per step: the host waits this long in each step, as for a GPU's "
                        "kernels (more ranks than cores then do not contend for the CPU; a straggler's device "
                        "is --straggler-extra slower too)")
    p.add_argument("--timeout", type=float, default=1800.0, help="collective timeout in seconds (gloo)")
    g = p.add_argument_group("fault injection")
    g.add_argument("--fault", choices=FAULTS, default="none")
    g.add_argument("--rank-to-fault", type=int, default=1, help="the rank that misbehaves (default 1)")
    g.add_argument("--fault-after", type=float, default=None, metavar="S",
                   help="the fault starts this many seconds after the first step (default 10 for kill-rank and hang, "
                        "0 for the others; comm-heavy is the model's shape and always on)")
    g.add_argument("--slow-data-seconds", type=float, default=0.003, help="slow-data: sleep per sequence read")
    g.add_argument("--straggler-extra", type=float, default=1.0,
                   help="straggler: extra compute per step, as a share of the rank's own measured compute per "
                        "step (0.25: 25%% slower; 1.0: twice as slow)")
    g.add_argument("--hang-seconds", type=float, default=3600.0, help="hang: how long the rank sleeps")
    g.add_argument("--checkpoint-mb", type=float, default=0.0,
                   help="extra state saved with each checkpoint, in MB (slow-checkpoint: 48, long-checkpoint: 24)")
    g.add_argument("--checkpoint-sync", action="store_true",
                   help="open checkpoint files with O_DSYNC (slow-checkpoint turns it on)")
    g.add_argument("--checkpoint-mbps", type=float, default=0.0, metavar="MB/S",
                   help="checkpoint storage throughput in MB/s, 0: the disk's own (long-checkpoint: 0.4)")
    args = p.parse_args(argv)
    if args.fault_after is None:
        args.fault_after = 10.0 if args.fault in ("kill-rank", "hang") else 0.0
    if args.fault_after < 0:
        p.error("--fault-after must be 0 or more")
    if args.checkpoint_mbps < 0:
        p.error("--checkpoint-mbps must be 0 or more")
    if args.strategy == "deepspeed" and args.fault in ("slow-checkpoint", "long-checkpoint"):
        p.error(f"--fault {args.fault} writes its own checkpoint file; DeepSpeed writes its own: use --strategy ddp")
    if args.strategy == "deepspeed" and args.resume:
        p.error("--resume reads the checkpoint files of --strategy ddp or fsdp")
    if args.fault == "long-checkpoint" and not args.checkpoint_mbps:
        args.checkpoint_mbps = 0.4
    if args.fault == "comm-heavy":  # large gradients, tiny compute
        args.hidden, args.batch_seqs, args.seq_len, args.optimizer = 1024, 1, 32, "sgd"
    return args


def say(line: str) -> None:
    """One write per line, so another thread's output (the hooks' table) never lands inside it."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class TokenSequences(Dataset):
    """Synthetic token classification: each item is a (seq_len, 64) sequence of token features
    and seq_len labels given by a fixed random linear map, so the loss really goes down."""

    def __init__(self, n: int, seq_len: int = 256, dim: int = 64, classes: int = 8, seed: int = 0,
                 read_delay: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, seq_len, dim, generator=g)
        self.y = (self.x @ torch.randn(dim, classes, generator=g)).argmax(-1)
        self.read_delay = read_delay  # simulated slow storage (fault slow-data)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        if self.read_delay:
            time.sleep(self.read_delay)
        return self.x[i], self.y[i]


class ResumableSampler(DistributedSampler):
    """DistributedSampler that can start an epoch part-way: ``skip`` samples of this rank's share
    of the epoch (the batches trained before a checkpoint) are left out, so the next batch is the
    one the uninterrupted run would take. Set it after a resume, back to 0 for the next epoch."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.skip = 0

    def __iter__(self):
        return iter(list(super().__iter__())[self.skip:])

    def __len__(self) -> int:
        return super().__len__() - self.skip


def init_distributed(timeout_s: float) -> int:
    """The gloo process group; the launcher's restart count (0 outside an elastic launcher). Under
    torchrun the ranks meet on the launcher's store under one key prefix per restart: the store
    keeps the keys of the round before, where a restarted rank would read its dead peer's address."""
    timeout = timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if restart is None:
        dist.init_process_group("gloo", timeout=timeout)
        return 0
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=master,
                          timeout=timedelta(seconds=min(timeout_s, 300)))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{restart}", store), rank=rank,
                            world_size=world, timeout=timeout)
    return int(restart)


def make_model(dim: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, classes))


class SlowStorage(io.RawIOBase):
    """A file on storage that takes ``rate`` bytes per second (a saturated network filesystem):
    each write goes to the real file in 1 MiB pieces, each held to the rate."""

    PIECE = 1 << 20

    def __init__(self, f: io.RawIOBase, rate: float) -> None:
        super().__init__()
        self.f, self.rate, self.name = f, rate, f.name

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        for i in range(0, len(view), self.PIECE):
            piece, t0 = view[i:i + self.PIECE], time.monotonic()
            while piece:
                piece = piece[self.f.write(piece):]
            time.sleep(max(0.0, min(self.PIECE, len(view) - i) / self.rate - (time.monotonic() - t0)))
        return len(view)

    def tell(self) -> int:
        return self.f.tell()

    def flush(self) -> None:
        self.f.flush()


class ExtraCompute:
    """A straggler's real extra work, sized by the rank's own compute: after each step the rank
    measures its main thread's CPU time for the step (forward, backward, optimizer, data; a wait in
    a collective costs none), and before each faulty step it runs the shadow model's forward and
    backward until its CPU time has grown by ``share`` times the median of its last steps'. The
    magnitude then means the same on a fast or a slow machine, and under CPU contention."""

    WARMUP = 5  # steps measured before the first extra work

    def __init__(self, shadow: nn.Module, share: float, device_s: float = 0.0) -> None:
        self.shadow, self.share, self.device_s = shadow, share, device_s
        self.recent: "collections.deque[float]" = collections.deque(maxlen=21)
        self.mark = time.thread_time()
        self.spent = 0.0

    def step_done(self) -> None:
        now = time.thread_time()
        self.recent.append(now - self.mark - self.spent)
        self.mark, self.spent = now, 0.0

    def run(self, x: torch.Tensor) -> None:
        if len(self.recent) < self.WARMUP:
            return
        time.sleep(self.share * self.device_s)  # its device is as much slower (--device-ms)
        target = self.share * statistics.median(self.recent)
        chunk = x[:max(1, len(x) // 8)]
        t0 = time.thread_time()
        while time.thread_time() - t0 < target:
            self.shadow(chunk).sum().backward()
        self.shadow.zero_grad(set_to_none=True)
        self.spent += time.thread_time() - t0


def save_checkpoint(path: Path, state: Dict, sync: bool, mbps: float = 0.0) -> None:
    """Write-then-rename, the usual durable pattern. With sync, every write goes through
    O_DSYNC, like a sync-mounted network filesystem; with mbps, at most that many MB/s.

    The timer spans the whole write, not only the ``torch.save`` inside it (which alone would be
    timed too): ``os.replace`` over the last checkpoint frees the old file's blocks, about 17 ms
    for 96 MB on ext4 with ``discard``, a sixth of the save. Left outside, that time counts as the
    writing rank's compute and makes it look slower than its peers."""
    tmp = path.with_suffix(".tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (os.O_DSYNC if sync else 0)
    with ranksight.checkpoint_timer(path, obj=state):  # obj: what the checkpoint lints inspect
        with open(tmp, "wb", buffering=0, opener=lambda p, _: os.open(p, flags, 0o644)) as f:
            torch.save(state, SlowStorage(f, mbps * 1e6) if mbps else f)
        os.replace(tmp, path)


def resume(par, ckpt_dir: Path, rank: int, sampler: ResumableSampler, batch: int, restart: int) -> tuple:
    """(step, epoch, batches into the epoch, seconds trained) of the checkpoint in ``ckpt_dir``,
    loaded into the model, optimizer, LR schedule, RNG and sampler; zeros without one. The ranks
    check that they restored the same step."""
    state = par.load(ckpt_dir, rank)
    if state is None:
        at = (0, 0, 0, 0.0)
    else:
        torch.set_rng_state(state["rng"])
        at = (state["step"], state["sampler"]["epoch"], state["sampler"]["pos"], state["trained_s"])
    steps = torch.tensor([at[0], -at[0]])
    dist.all_reduce(steps, op=dist.ReduceOp.MIN)
    if steps[0] != -steps[1]:
        raise SystemExit(f"train_ddp: the ranks' checkpoints hold different steps ({steps[0]} to {-steps[1]})")
    sampler.skip = at[2] * batch
    again = f", worker restart {restart}" if restart else ""
    if rank == 0 and state is not None:
        say(f"train_ddp: resumed from checkpoint step {at[0]} (epoch {at[1]}, batch {at[2]} of the epoch, "
            f"{at[3]:.0f} s trained before){again}")
    elif rank == 0 and restart:
        say(f"train_ddp: no checkpoint in {ckpt_dir} yet: starting over from step 0{again}")
    return at


def main(argv: Optional[list] = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per rank
    # Denormal floats are flushed to zero, as on GPUs: as this small model fits its data, its
    # activations and gradients sink into the subnormal range, where each CPU float op costs tens of
    # cycles, and the step time would creep 4x within two minutes (21 ms -> 88 ms) for no reason a
    # real job shares.
    torch.set_flush_denormal(True)
    restart = init_distributed(args.timeout)
    if restart and args.fault != "comm-heavy":
        args.fault = "none"  # a restarted worker injects no fault (comm-heavy is the model's shape)
    rank, world = dist.get_rank(), dist.get_world_size()
    faulty = args.fault != "none" and rank == args.rank_to_fault % world
    torch.manual_seed(args.seed)  # same initial weights on every rank

    data = TokenSequences(n=16 * world * args.batch_seqs, seq_len=args.seq_len, seed=args.seed)
    sampler = ResumableSampler(data, shuffle=True, seed=args.seed, drop_last=True)
    loader = DataLoader(data, batch_size=args.batch_seqs, sampler=sampler, drop_last=True)
    plain = make_model(64, args.hidden, 8)
    shadow = copy.deepcopy(plain)  # the straggler's extra compute, outside the parallel model
    planned = args.steps or 10_000  # the run's length: the LR schedule's, and its ETA's (total_steps)
    par = build(args.strategy, plain, args.optimizer, args.lr, args.batch_seqs, args.zero_stage, t_max=planned)
    model, optimizer = par.model, par.optimizer  # with deepspeed, model is the engine

    loader = ranksight.watch(model, optimizer, loader, total_steps=planned)  # ranksight line 2 of 2

    device_s = args.device_ms / 1000
    extra = (ExtraCompute(shadow, args.straggler_extra, device_s)
             if faulty and args.fault == "straggler" else None)
    slow_ckpt = args.fault == "slow-checkpoint"  # from its start: large O_DSYNC checkpoints every <= 10 steps
    long_ckpt = args.fault == "long-checkpoint"  # one slow write, --fault-after s in
    ckpt_dir = Path(args.checkpoint_dir)
    writes = rank == 0 or par.sharded  # DDP: rank 0 writes the checkpoint; sharded: every rank its part
    if writes and (args.checkpoint_every or slow_ckpt or long_ckpt):
        ckpt_dir.mkdir(parents=True, exist_ok=True)
    pad_mb = args.checkpoint_mb or (48.0 if slow_ckpt else 24.0 if long_ckpt else 0.0)
    pad = torch.zeros(int(pad_mb * 2**20 / 4))  # e.g. EMA weights of a bigger model
    bad = args.rank_to_fault % world
    if rank == 0:
        when = f" from {args.fault_after:g} s in" if args.fault_after and args.fault != "comm-heavy" else ""
        fault = "" if args.fault == "none" else f", fault {args.fault} on rank {bad}{when}"
        g = world * args.batch_seqs
        say(f"train_ddp: {world} ranks ({label(args.strategy, args.zero_stage)}){fault}, global batch {g} samples of {args.seq_len} tokens "
            f"({g * args.seq_len} tokens), lr {args.lr}")

    asked: list = []  # SIGUSR1: stop at the next loss all-reduce, on every rank
    signal.signal(signal.SIGUSR1, lambda signum, frame: asked.append(signum))
    step, epoch, pos, trained = (resume(par, ckpt_dir, rank, sampler, args.batch_seqs, restart) if args.resume
                                 else (0, 0, 0, 0.0))
    resumed, per_epoch = step, len(data) // world // args.batch_seqs
    loss_sum, start, stop = 0.0, None, False
    fault_on = args.fault == "comm-heavy"  # the model's shape: on from the start
    long_done = False
    while not stop:
        sampler.set_epoch(epoch)
        for x, y in loader:
            now = time.monotonic()
            if start is None:
                start = now
            if not fault_on and args.fault != "none" and now - start >= args.fault_after:
                fault_on = True
                if rank == 0 and args.fault_after > 0:
                    say(f"train_ddp: fault {args.fault} on rank {bad} starts now, {now - start:.0f} s after "
                        f"the first step")
                if faulty and args.fault == "slow-data":
                    data.read_delay = args.slow_data_seconds  # slow storage from now on
            if faulty and fault_on and args.fault in ("kill-rank", "hang"):
                if args.fault == "kill-rank":
                    os.kill(os.getpid(), signal.SIGKILL)
                say(f"train_ddp: rank {rank} hangs for {args.hang_seconds:.0f} s (fault)")
                time.sleep(args.hang_seconds)
            if device_s:  # the host waits for its device's share of the step
                time.sleep(device_s)
            if extra is not None and fault_on:  # a slower rank: real extra compute outside DDP
                extra.run(x)

            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            ranksight.loss(loss)  # optional: the loss, recorded without a device sync (loss health alerts)
            par.backward_step(loss)  # zero_grad, backward, optimizer and LR steps (DeepSpeed: its engine's)
            step, pos = step + 1, pos + 1
            loss_sum += loss.item()
            if rank == 0 and (resumed or restart) and step == resumed + 1:
                say(f"train_ddp: step {step} trained: training again after the resume")

            slow = slow_ckpt and fault_on
            every = min(args.checkpoint_every or 10, 10) if slow else args.checkpoint_every
            long_now = long_ckpt and fault_on and not long_done
            if writes and (long_now or (every and step % every == 0)):
                if long_now and rank == 0:
                    say(f"train_ddp: rank 0 writes a {pad_mb:g} MB checkpoint at {args.checkpoint_mbps:g} MB/s (fault)")
                own = not (slow_ckpt or long_ckpt)  # no checkpoint fault: every write as the flags say
                sync, mbps = args.checkpoint_sync or slow, args.checkpoint_mbps if own or long_now else 0.0
                at = (epoch + 1, 0) if pos == per_epoch else (epoch, pos)  # where the next batch comes from
                par.save(ckpt_dir, rank, {
                    "step": step, "epoch": at[0], "sampler": {"epoch": at[0], "pos": at[1], "seed": args.seed},
                    "trained_s": trained + time.monotonic() - start,
                    "rng": torch.get_rng_state(), "extra": pad if own or slow or long_now else pad[:0]},
                    lambda path, state: save_checkpoint(path, state, sync=sync, mbps=mbps))
            long_done = long_done or long_now

            if extra is not None:
                extra.step_done()
            stop = bool(args.steps) and step >= args.steps  # the same on every rank
            if step % 10 == 0:  # every rank takes part: average loss and the shared "time is up" flag
                elapsed = time.monotonic() - start
                time_up = bool(args.duration) and trained + elapsed >= args.duration
                t = torch.tensor([loss_sum / 10, float(time_up or bool(asked))])
                dist.all_reduce(t)
                loss_sum, stop = 0.0, stop or bool(t[1] > 0)
                if rank == 0 and args.log_every and (step % args.log_every == 0 or stop):
                    done = step - resumed
                    say(f"train_ddp: step {step} loss {t[0].item() / world:.4f} ({done / elapsed:.1f} steps/s, "
                        f"{done * world * args.batch_seqs / elapsed:.0f} samples/s)")
            if stop:
                break
        epoch, pos, sampler.skip = epoch + 1, 0, 0
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
