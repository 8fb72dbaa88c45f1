"""`ranksight bench hooks` (or ``python bench/bench_hooks.py [--json]``): what the hooks cost.

host_us_per_step   host time the hooks add per optimizer step on a trivial step (Linear 8->8,
                   batch 4, SGD; one process, no process group), sending to a real UDP receiver:
                   the median over interleaved A/B runs of (watched - plain) CPU time per step of
                   the whole process, i.e. the hooks on the training thread plus the background
                   thread that encodes and sends the records. CPU time, not wall time, so that
                   other load on the machine does not swamp a difference of microseconds; the
                   wall-time difference and the training thread's share are reported beside it.
overhead_ratio     wall-time ratio watched / plain of a 2-rank gloo DDP step of about 10 ms
                   (64->512->512->8 MLP, one thread per rank, the batch scaled on the machine so
                   a plain step takes ``--ddp-step-ms``, 10 by default): median of the per-pair
                   ratios of interleaved A/B runs. Both arms train the same DDP instance: on gloo
                   the hooks register no comm hook (they read DDP's reducer timer), and two
                   instances of the same model differed by up to 150 us of CPU per step by
                   themselves on the 2-core box (the run stops if a comm hook shows up).

Each run starts with untimed warm-up steps (after ``watch()`` for the watched runs, the same
count for the plain ones): the per-step cost is the steady state; ``watch()`` itself and the
lints' one-time first-step checks happen once per job, not per step.

Also reported: the medians behind both figures, their interquartile ranges, the trivial step's
watched / plain wall-time ratio (median of the pair ratios, interquartile, range), the run counts,
and for comparison the host cost when each step record is encoded and sent on the training thread
instead of being handed to the background thread (``host_us_per_step_inline_send``).

methods            host time in each hook method per step (``hooks_methods.table``): one watched run of the
                   trivial step with a counting timer (perf_counter_ns) around each method of
                   ``METHODS`` and around the ``torch.autograd.backward`` wrapper (the real
                   backward subtracted). A row's time is its own lines: calls nested in another
                   timed call are subtracted from it (with their timers), so the rows add up to
                   the hooks' host time per step. The timers' own cost is measured on a method
                   that does nothing and subtracted. Three tables, and two more with the step on
                   the GPU where CUDA is: the CPU step as it is, and the same step on a stand-in
                   CUDA timeline (``_StandInCuda``: events reached when recorded) with every step
                   timed and with the default timing (the automatic gap), so the step path's CUDA
                   bookkeeping (mark, push, resolve, the GPU branch of the step end, the sampled
                   shares) is measured on a machine without a GPU too; the driver calls
                   themselves are not in it. "p50" is the median call's time times the calls per step (a preempted
                   call on a shared box moves it little), "mean" every call's.

The default run is the quick one (``QUICK``: about a minute on the 2-core box, under two when it
is loaded); ``--thorough`` is the long one (``THOROUGH``), each option given overrides either.
``bench/hooks_ab.py`` runs the method tables of two commits side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # this script is loaded by its path: its sibling
import hooks_methods  # noqa: E402

DDP_WORKER = "--ddp-worker"  # argv[1] of the DDP rank processes this benchmark starts
QUIET: Dict[str, Any] = {"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}


def _quiet(no_lints: bool) -> Dict[str, Any]:
    from ranksight import config as rs_config

    cfg = {"hooks": dict(QUIET["hooks"])}
    if no_lints:
        cfg["lints"] = {k: False for k in rs_config.SCHEMA["lints"]}
    return cfg


# Run sizes: the quick default finishes in under two minutes on a loaded 2-core box; --thorough is
# the long run (the figures in bench/RESULTS.md before the quick mode were measured with it).
QUICK = {"runs": 10, "steps": 300, "ddp_runs": 7, "ddp_steps": 40, "method_steps": 1000}
THOROUGH = {"runs": 21, "steps": 1000, "ddp_runs": 81, "ddp_steps": 120, "method_steps": 4000}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--thorough", action="store_true",
                   help="the long run: %(runs)d A/B pairs x %(steps)d trivial steps, %(ddp_runs)d DDP pairs x "
                        "%(ddp_steps)d steps, %(method_steps)d steps for the per-method table" % THOROUGH)
    p.add_argument("--runs", type=int, default=None,
                   help="A/B pairs for the trivial step (default %d, --thorough %d)"
                        % (QUICK["runs"], THOROUGH["runs"]))
    p.add_argument("--steps", type=int, default=None,
                   help="steps per trivial run (default %d, --thorough %d)" % (QUICK["steps"], THOROUGH["steps"]))
    p.add_argument("--ddp-runs", type=int, default=None,
                   help="A/B pairs for the DDP step (default %d, --thorough %d: single pairs spread +-10%%%% on 2 "
                        "cores, so the median needs that many to resolve 1%%%%; 0 skips it)"
                        % (QUICK["ddp_runs"], THOROUGH["ddp_runs"]))
    p.add_argument("--ddp-steps", type=int, default=None,
                   help="steps per DDP run (default %d, --thorough %d)" % (QUICK["ddp_steps"], THOROUGH["ddp_steps"]))
    p.add_argument("--method-steps", type=int, default=None,
                   help="steps of the watched run that times each hook method (default %d, --thorough %d; 0 skips "
                        "the table)" % (QUICK["method_steps"], THOROUGH["method_steps"]))
    p.add_argument("--no-lints", action="store_true", help="measure the hooks with every setup lint off")
    p.add_argument("--ddp-step-ms", type=float, default=10.0,
                   help="scale the DDP step's batch so a plain step takes about this long (default 10, the "
                        "reference step length; 0 keeps batch 32)")


def plan(args: argparse.Namespace) -> Dict[str, int]:
    """The run sizes: each option given, else the quick default (or --thorough's)."""
    base = THOROUGH if getattr(args, "thorough", False) else QUICK
    out = {k: getattr(args, k, None) for k in base}
    return {k: (base[k] if v is None else int(v)) for k, v in out.items()}


_SINK_CODE = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
print(s.getsockname()[1], flush=True)
n = 0
s.settimeout(0.2)
while True:
    try:
        s.recv(65536)
        n += 1
    except socket.timeout:
        if sys.stdin.closed:
            break
        continue
"""


class _Sink:
    """A real UDP receiver in its own process (like the agent), on a free loopback port; it reads
    and discards. (In this process its thread would fight the training thread for the GIL.)"""

    def __init__(self) -> None:
        self._p = subprocess.Popen([sys.executable, "-c", _SINK_CODE], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, text=True)
        line = self._p.stdout.readline() if self._p.stdout is not None else ""
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError("the benchmark's UDP receiver did not start")
        self.url = f"udp://127.0.0.1:{int(line)}"
        self.n = -1  # not counted across processes

    def close(self) -> None:
        if self._p.poll() is None:
            self._p.kill()
            self._p.wait()


def _trivial(runs: int, steps: int, url: str, inline_send: bool = False, no_lints: bool = False) -> Dict[str, float]:
    import torch
    import torch.nn as nn

    import ranksight

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    warm = 50  # steps after watch() that are not timed: one-time work (lints' first-step checks) is no step cost
    data = [torch.randn(4, 8)] * (steps + warm)

    def loop(loader: Any, before: Any = None) -> Tuple[float, float, float]:
        """(process CPU, training-thread CPU, wall) seconds per step, after ``warm`` untimed steps."""
        it = iter(loader)
        for _ in range(warm):
            model(next(it)).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        p0, c0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        for x in it:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        wall = time.perf_counter() - t0
        if before is not None:
            before()  # the background thread's CPU for these steps belongs to them (not its idle wait)
        return (time.process_time() - p0) / steps, (time.thread_time() - c0) / steps, wall / steps

    def watched() -> Tuple[float, float, float]:
        loader = ranksight.watch(model, opt, data, agent=url, config=_quiet(no_lints))
        w = ranksight.hooks.current()
        while w is not None and w.stats()["sent"] < 1:
            time.sleep(0.002)  # background thread started and said hello: its start-up is not a step
        if inline_send and w is not None:
            step_end = w._step_end

            def step_end_and_send(t: float) -> None:
                step_end(t)
                w._flush()  # encode and send on the training thread

            w._step_end = step_end_and_send  # type: ignore[method-assign]

        def drained() -> None:
            while w is not None and w._queue:
                time.sleep(0.001)

        try:
            return loop(loader, drained)
        finally:
            ranksight.unwatch()

    loop(data)  # warm-up, both paths
    watched()
    plain: List[Tuple[float, float, float]] = []
    watch: List[Tuple[float, float, float]] = []
    for i in range(runs):
        if i % 2 == 0:
            plain.append(loop(data))
            watch.append(watched())
        else:
            watch.append(watched())
            plain.append(loop(data))
    med = statistics.median
    cpu = [1e6 * (w[0] - p[0]) for w, p in zip(watch, plain)]
    ratios = [w[2] / p[2] for w, p in zip(watch, plain)]
    return {"plain_us": 1e6 * med(p[2] for p in plain), "watched_us": 1e6 * med(w[2] for w in watch),
            "cpu_added_us": med(cpu), "cpu_added_iqr": _iqr(cpu),
            "main_added_us": 1e6 * med(w[1] - p[1] for w, p in zip(watch, plain)),
            "wall_added_us": 1e6 * med(w[2] - p[2] for w, p in zip(watch, plain)),
            "ratio": med(ratios), "ratio_iqr": _iqr(ratios), "ratio_range": [min(ratios), max(ratios)]}


def _iqr(xs: List[float]) -> List[float]:
    """The first and third quartiles (both the one value for a single run)."""
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return [q[0], q[2]]


# ------------------------------------------------------------------------------------ DDP
def _ddp_worker() -> None:
    """One rank of the DDP A/B benchmark (run as a subprocess)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight

    torch.set_num_threads(1)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    runs, steps = int(os.environ["RS_BENCH_RUNS"]), int(os.environ["RS_BENCH_STEPS"])
    url = os.environ["RS_BENCH_AGENT"]
    cfg = _quiet(os.environ.get("RS_BENCH_NO_LINTS") == "1")
    dist.init_process_group("gloo", rank=rank, world_size=ws)

    def make() -> Any:
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8))
        ddp = nn.parallel.DistributedDataParallel(m)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=1e-3)

    plain, plain_opt = make()
    watched, watched_opt = plain, plain_opt  # one instance for both arms (see the module docstring)
    g = torch.Generator().manual_seed(rank)
    warm = 10  # steps after watch() that are not timed: one-time work (lints' first-step checks) is no step cost

    def make_batches(batch: int) -> List[Any]:
        data = [(torch.randn(batch, 64, generator=g), torch.randn(batch, 8, generator=g)) for _ in range(8)]
        return [data[i % len(data)] for i in range(steps + warm)]

    def loop(model: Any, opt: Any, loader: Any) -> float:
        it = iter(loader)
        for _ in range(warm):
            x, y = next(it)
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        for x, y in it:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        cpu.append((time.process_time() - c0) / steps)
        return (time.perf_counter() - t0) / steps

    cpu: List[float] = []
    # the reference step is about 10 ms: scale the batch so the plain step takes that long on this
    # machine (rank 0 measures, both ranks use its batch)
    batch = 32
    batches = make_batches(batch)
    target_ms = float(os.environ.get("RS_BENCH_TARGET_MS", "10"))
    if target_ms > 0:
        for _ in range(3):  # step time = fixed + per-sample cost: a few rounds converge
            loop(plain, plain_opt, batches)
            ms = loop(plain, plain_opt, batches) * 1e3
            t = torch.tensor([min(4096, max(8, round(batch * target_ms / max(ms, 1e-3))))], dtype=torch.int64)
            dist.broadcast(t, 0)
            batch = int(t.item())
            batches = make_batches(batch)

    def run_watched() -> float:
        loader = ranksight.watch(watched, watched_opt, batches, agent=url, config=cfg)
        w = ranksight.hooks.current()
        if w is not None and w.stats()["ddp_comm_hook"]:
            raise RuntimeError("the hooks registered a DDP comm hook: the plain arm needs its own DDP instance")
        try:
            return loop(watched, watched_opt, loader)
        finally:
            ranksight.unwatch()

    loop(plain, plain_opt, batches)  # warm-up (DDP rebuilds buckets on its second iteration)
    run_watched()
    cpu.clear()
    p_s: List[float] = []
    w_s: List[float] = []
    p_c: List[float] = []
    w_c: List[float] = []
    for i in range(runs):
        for which in (("plain", "watched") if i % 2 == 0 else ("watched", "plain")):
            if which == "plain":
                p_s.append(loop(plain, plain_opt, batches))
                p_c.append(cpu[-1])
            else:
                w_s.append(run_watched())
                w_c.append(cpu[-1])
    dist.barrier()
    dist.destroy_process_group()
    print("BENCH " + json.dumps({"rank": rank, "batch": batch, "plain": p_s, "watched": w_s, "plain_cpu": p_c, "watched_cpu": w_c}),
          flush=True)


def _ddp(runs: int, steps: int, url: str, no_lints: bool = False, timeout: float = 600.0,
         target_ms: float = 10.0) -> Dict[str, Any]:
    from ranksight.common.plumbing import free_port

    port = free_port()
    procs = []
    for r in range(2):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", RS_BENCH_RUNS=str(runs), RS_BENCH_STEPS=str(steps),
                   RS_BENCH_AGENT=url, RS_BENCH_NO_LINTS="1" if no_lints else "0", RANKSIGHT_JOB="bench-hooks",
                   RS_BENCH_TARGET_MS=str(target_ms))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), DDP_WORKER],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"DDP benchmark rank exited {p.returncode}: {err.strip().splitlines()[-1:]}")
    res = [json.loads(next(l for l in o.splitlines() if l.startswith("BENCH "))[len("BENCH "):]) for o, _ in outs]
    p_s, w_s = res[0]["plain"], res[0]["watched"]  # wall time: rank 0 (DDP steps are synchronous)
    ratios = [w / p for w, p in zip(w_s, p_s)]
    # CPU time of both ranks per step: insensitive to other load on the machine
    p_c = [a + b for a, b in zip(res[0]["plain_cpu"], res[1]["plain_cpu"])]
    w_c = [a + b for a, b in zip(res[0]["watched_cpu"], res[1]["watched_cpu"])]
    q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else [ratios[0]] * 3
    return {"plain_ms": 1e3 * statistics.median(p_s), "watched_ms": 1e3 * statistics.median(w_s),
            "ratio": statistics.median(ratios), "ratio_of_medians": statistics.median(w_s) / statistics.median(p_s),
            "ratio_iqr": [round(q[0], 4), round(q[2], 4)], "ratios": [round(r, 4) for r in ratios],
            "cpu_ratio": statistics.median(w / p for w, p in zip(w_c, p_c)),
            "cpu_us_added": 1e6 * statistics.median(w - p for w, p in zip(w_c, p_c)) / 2,
            "batch": res[0].get("batch")}


def run(args: argparse.Namespace) -> int:
    from ranksight.console import error

    n = plan(args)
    for name in ("runs", "steps", "ddp_steps"):
        if n[name] < 1:
            return error(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("ddp_runs", "method_steps"):
        if n[name] < 0:
            return error(f"--{name.replace('_', '-')} must be 0 or more")
    import logging

    hooks_log = logging.getLogger("ranksight.hooks")
    level = hooks_log.level
    hooks_log.setLevel(logging.WARNING)  # one self-check line per A/B run is noise here
    sink = _Sink()
    try:
        triv = _trivial(n["runs"], n["steps"], sink.url, no_lints=args.no_lints)
        inline = _trivial(max(5, n["runs"] // 2), n["steps"], sink.url, inline_send=True, no_lints=args.no_lints)
        methods = [hooks_methods.table(n["method_steps"], sink.url, _quiet(args.no_lints), tl)
                   for tl in hooks_methods.timelines()] if n["method_steps"] else []
        ddp: Optional[Dict[str, Any]] = (_ddp(n["ddp_runs"], n["ddp_steps"], sink.url, args.no_lints,
                                              target_ms=args.ddp_step_ms) if n["ddp_runs"] else None)
    except RuntimeError as e:
        return error(str(e), 1)
    finally:
        sink.close()
        hooks_log.setLevel(level)
    out: Dict[str, Any] = {
        "mode": "thorough" if args.thorough else "quick",
        "host_us_per_step": round(triv["cpu_added_us"], 2),
        "overhead_ratio": round(ddp["ratio"], 4) if ddp else None,
        "host_us_per_step_iqr": [round(x, 2) for x in triv["cpu_added_iqr"]],
        "host_us_per_step_training_thread": round(triv["main_added_us"], 2),
        "host_wall_us_per_step": round(triv["wall_added_us"], 2),
        "host_us_per_step_inline_send": round(inline["cpu_added_us"], 2),
        "trivial_step_us": {"plain": round(triv["plain_us"], 2), "watched": round(triv["watched_us"], 2)},
        "trivial_ratio": round(triv["ratio"], 4), "trivial_ratio_iqr": [round(x, 4) for x in triv["ratio_iqr"]],
        "trivial_ratio_range": [round(x, 4) for x in triv["ratio_range"]],
        "trivial_runs": n["runs"], "trivial_steps_per_run": n["steps"], "inline_runs": max(5, n["runs"] // 2),
        "lints": not args.no_lints, "load_average": [round(x, 2) for x in os.getloadavg()],
        "methods": methods,
    }
    if ddp:
        out.update({"ddp_step_ms": {"plain": round(ddp["plain_ms"], 3), "watched": round(ddp["watched_ms"], 3)},
                    "ddp_ratio_of_medians": round(ddp["ratio_of_medians"], 4), "ddp_ratio_iqr": ddp["ratio_iqr"],
                    "ddp_pair_ratios": ddp["ratios"], "ddp_cpu_ratio": round(ddp["cpu_ratio"], 4),
                    "ddp_cpu_us_added_per_rank_step": round(ddp["cpu_us_added"], 1),
                    "ddp_runs": n["ddp_runs"], "ddp_steps_per_run": n["ddp_steps"], "ddp_batch": ddp["batch"]})
    if args.json:
        print(json.dumps(out))
        return 0
    iqr = out["host_us_per_step_iqr"]
    print(f"host cost per step (trivial step, CPU time of the process): {out['host_us_per_step']:.1f} us "
          f"(interquartile {iqr[0]:.1f}..{iqr[1]:.1f}; training thread "
          f"{out['host_us_per_step_training_thread']:.1f} us, wall {out['host_wall_us_per_step']:.1f} us; "
          f"median of {n['runs']} interleaved A/B runs x {n['steps']} steps)")
    print(f"  trivial step {out['trivial_step_us']['plain']:.1f} -> {out['trivial_step_us']['watched']:.1f} us: "
          f"ratio {out['trivial_ratio']:.4f} (median of pair ratios; interquartile {out['trivial_ratio_iqr']}, "
          f"range {out['trivial_ratio_range']})")
    print(f"  with encode+send on the training thread instead: {out['host_us_per_step_inline_send']:.1f} us")
    for m in methods:
        hooks_methods.print_table(m)
    if ddp:
        print(f"2-rank gloo DDP step: ratio {out['overhead_ratio']:.4f}, interquartile {ddp['ratio_iqr']} "
              f"(plain {ddp['plain_ms']:.2f} ms, watched {ddp['watched_ms']:.2f} ms; median of {n['ddp_runs']} "
              f"A/B pair ratios x {n['ddp_steps']} steps); CPU time ratio {ddp['cpu_ratio']:.4f} "
              f"(+{ddp['cpu_us_added']:.0f} us per rank-step)")
    more = "" if args.thorough else "; --thorough for the long one"
    print(f"load average {out['load_average']} ({out['mode']} run{more})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [DDP_WORKER]:
        _ddp_worker()
        sys.exit(0)
    _p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(_p)
    sys.exit(run(_p.parse_args()))
