"""A 2-rank gloo training job that measures itself, for the goodput truth tests.

Run under torchrun (``--max-restarts 1``). Each process appends JSON lines to ``--events DIR/rank<R>.jsonl``
(one line per event, flushed at once, so a killed process leaves its record up to the kill):

  {"ev": "start", "pstart": unix, "restart": n}          the process start (from /proc, not from ranksight)
  {"ev": "step", "t0": unix, "t1": unix, "data": s, "comm": s, "ckpt": s}   one optimizer step, its own timers
  {"ev": "ckpt", "t": unix}                               a checkpoint written (rank 0), at its end
  {"ev": "kill", "t": unix}                               rank 0 is about to SIGKILL itself
  {"ev": "end", "t": unix}                                the training loop returned

The data loader sleeps ``--data-sleep`` seconds per batch; rank 0 writes a checkpoint of
``--ckpt-seconds`` every ``--ckpt-every`` seconds (inside ``ranksight.checkpoint_timer``), and with
``--kill-after N`` the first process of rank 0 kills itself N seconds after its second checkpoint
(and writes no third). Each forward waits ``--compute-sleep`` (a device kernel the host waits for),
so step times do not depend on how loaded this machine's CPUs are.
Gradients are averaged with one explicit ``all_reduce`` per step, timed by the job itself; the
same all_reduce carries rank 0's decision to stop, so both ranks stop after the same step.

``--fork 2`` launches the two ranks itself (a static launch: RANK, WORLD_SIZE and MASTER_* in the
environment) by forking this process after torch is imported: a job whose startup is short.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path


def _pstart() -> float:
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[19])  # field 22, starttime, in clock ticks since boot
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


PSTART = _pstart()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import ranksight  # noqa: E402


class Log:
    def __init__(self, path: Path):
        self.f = open(path, "a", buffering=1)

    def __call__(self, **ev) -> None:
        self.f.write(json.dumps(ev) + "\n")
        self.f.flush()


class Device(torch.nn.Module):
    """Waits ``seconds`` in forward: the host waiting for a kernel (compute, from the job's view)."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, x):
        if self.seconds:
            time.sleep(self.seconds)
        return x


def batches(n: int, sleep: float):
    g = torch.Generator().manual_seed(dist.get_rank())
    while True:
        if sleep:
            time.sleep(sleep)
        yield torch.randn(n, 64, generator=g), torch.randn(n, 8, generator=g)


def main(child: bool = False) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", required=True)
    ap.add_argument("--seconds", type=float, default=30.0, help="training time of the first process")
    ap.add_argument("--restart-seconds", type=float, default=10.0, help="training time of a restarted process")
    ap.add_argument("--data-sleep", type=float, default=0.0)
    ap.add_argument("--ckpt-every", type=float, default=0.0)
    ap.add_argument("--ckpt-seconds", type=float, default=1.0)
    ap.add_argument("--kill-after", type=float, default=0.0)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--compute-sleep", type=float, default=0.08,
                    help="seconds each forward waits, like a device kernel the host waits for: the step's wall "
                         "time does not depend on how busy this machine's CPUs are")
    ap.add_argument("--fork", type=int, default=0, help="launch this many ranks by fork (no torchrun)")
    a = ap.parse_args()
    if a.fork and not child:
        launch(a.fork)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    # One key prefix per launcher round: under torchrun's agent store the previous round's keys stay,
    # and a restarted rank would read its dead peer's address from them.
    from datetime import timedelta

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    master = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=master,
                          timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"round{restart}", store), rank=rank, world_size=world)
    log = Log(Path(a.events) / f"rank{rank}.jsonl")
    log(ev="start", pstart=PSTART, restart=restart)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), Device(a.compute_sleep),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = iter(ranksight.watch(model, opt, batches(a.batch, a.data_sleep)))
    ckpt_path = Path(a.events) / "ckpt.json"
    t_prev = time.time()
    t_end = t_prev + (a.seconds if restart == 0 else a.restart_seconds)
    last_ckpt = t_prev
    ckpts = 0
    done = False
    while not done:
        t = time.time()
        x, y = next(loader)
        data = time.time() - t
        ckpt = 0.0
        dying = restart == 0 and a.kill_after > 0  # this process is killed 10 s after its second checkpoint
        if rank == 0 and a.ckpt_every and time.time() - last_ckpt >= a.ckpt_every and not (dying and ckpts >= 2):
            c0 = time.time()
            with ranksight.checkpoint_timer(str(ckpt_path)):
                time.sleep(a.ckpt_seconds)
                ckpt_path.write_text(json.dumps({"t": time.time()}))
            last_ckpt = time.time()
            ckpt = last_ckpt - c0
            ckpts += 1
            log(ev="ckpt", t=last_ckpt)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        stop = torch.tensor([1.0 if rank == 0 and time.time() >= t_end else 0.0])
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()] + [stop])
        c = time.time()
        dist.all_reduce(flat)
        comm = time.time() - c
        done = bool(flat[-1] > 0)
        flat = flat[:-1] / world
        i = 0
        for p in model.parameters():
            n = p.numel()
            p.grad.copy_(flat[i:i + n].view_as(p))
            i += n
        opt.step()
        now = time.time()
        log(ev="step", t0=t_prev, t1=now, data=data, comm=comm, ckpt=ckpt)
        t_prev = now
        if rank == 0 and restart == 0 and a.kill_after and ckpts >= 2 and now - last_ckpt >= a.kill_after:
            log(ev="kill", t=time.time())
            os.kill(os.getpid(), signal.SIGKILL)
    log(ev="end", t=time.time())
    ranksight.unwatch()
    dist.destroy_process_group()


def launch(n: int) -> None:
    """Fork ``n`` ranks of main() and exit with the worst exit status (the parent only waits)."""
    import socket
    import sys

    # what every rank would import on its first step (torch.optim pulls in torch._dynamo), done once here
    m = torch.nn.Linear(2, 2)
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    m(torch.randn(1, 2)).sum().backward()
    o.step()
    import ranksight.hooks  # noqa: F401
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    pids = []
    for r in range(n):
        pid = os.fork()
        if pid == 0:
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
            global PSTART
            PSTART = _pstart()
            try:
                main(child=True)
                code = 0
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    worst = 0
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        worst = max(worst, os.waitstatus_to_exitcode(status) != 0)
    sys.exit(worst)


if __name__ == "__main__":
    main()
