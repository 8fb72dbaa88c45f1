"""Overhead of the hooks on a real GPU training step.

    python bench/gpu/overhead.py [--reps 16] [--steps 40] [--out overhead.json]

What it does
  * The step: 8-layer 1024-wide bf16 TransformerEncoder, batch 8 x 512, AdamW
    (``bench/gpu/gpu_workload.py``), about 21 ms on an H200.
  * Plain and instrumented runs are interleaved (ABBA order), ``--reps`` pairs of
    ``--steps`` timed steps each, after ``--warm`` untimed steps per run; an instrumented run
    is ``ranksight.watch()`` with the default hooks config, sending to a real
    ``ranksight exporter`` subprocess (gpu and ranks collectors) as in production.
  * Two loop styles: ``async`` (nothing reads the loss: the host runs ahead of the GPU, as
    in a well-written loop) and ``sync`` (``loss.item()`` every step, as in a loop that logs
    the loss each step: every host microsecond of the hooks lands on the wall clock).
  * Host microseconds per step: the same interleaving on a tiny model (1 layer, width 64,
    batch 1 x 8) whose step is host-bound, so the wall-time difference is the hooks' host time.
  * CUDA events per step: counted on one instrumented run (recorded, and created: the step
    path re-records its own events once resolved, ``CudaTimeline.POOL``); the cost of one event
    (create + record, and re-recording an existing one) measured here too.
  * ``--pool-ab``: the host breakdown (``mark()`` microseconds per call inside the loop) and the
    host-bound tiny model once more with fresh events per mark (``CudaTimeline.POOL = False``),
    interleaved with the pooled runs, so the pool's saving is measured on the same machine.
  * ``--record-ab``: the same with pooled events re-recorded by torch's ``Event.record`` (A,
    ``CudaTimeline.RECORD = "torch"``, which releases the GIL) against the driver's
    ``cuEventRecord`` with the GIL held (B, the default): host breakdown of each, and the tiny
    model and the batch-8 step interleaved A/B.
  * ``--timing-ab [N|auto]``: every step timed with CUDA events (A) against one step in N or the
    automatic gap (B): host breakdown of each, the tiny model and the batch-8 step A/B.
  * ``--host-bound-ms T``: a host-bound step of about T ms too (the tiny model with as many
    layers as its plain step needs to take T ms here), ``--tiny-reps`` pairs.

Reported: median of the per-pair ratios (instrumented / plain), the ratio of the medians,
their spread, and the medians in ms. Target: ratio <= 1.005 on a >= 20 ms step.
On a machine without CUDA it prints that it skipped and exits 0.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_workload as W  # noqa: E402

DEFAULT_HOOKS = {"hooks": {}}  # the built-in defaults (heartbeat 1 s, table every 100 steps / 60 s)


class Bench:
    def __init__(self, torch: Any, device: Any, agent_url: str, steps: int, warm: int, settle: float = 0.0):
        self.settle = settle
        self.torch = torch
        self.device = device
        self.agent_url = agent_url
        self.steps = steps
        self.warm = warm

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def one_run(self, model: Any, opt: Any, x: Any, watched: bool, mode: str,
                count_events: bool = False) -> Dict[str, float]:
        import ranksight
        from ranksight import hooks as rs_hooks

        data = W.batches(x, self.warm + self.steps)
        counter = [0]
        tl = None
        if watched:
            loader = ranksight.watch(model, opt, data, agent=self.agent_url, config=DEFAULT_HOOKS)
            w = rs_hooks.current()
            tl = w._tl if w is not None else None
            if count_events and tl is not None:
                mark = tl.mark

                def counting_mark(own: bool = False) -> Any:
                    ev = mark(own)
                    counter[0] += ev is not None  # (sampled timing: a step not timed records none)
                    return ev

                w._tl.mark = counting_mark  # instance attribute: only this run counts
        else:
            loader = data
        # The hooks' start-up (self-check, lints, first heartbeat) runs on background threads for a
        # few hundred ms; both variants wait the same time so it is not billed per step.
        time.sleep(self.settle)
        self.sync()
        t0 = c0 = 0.0
        ev0 = cr0 = 0
        for i, xb in enumerate(loader):
            if i == self.warm:
                self.sync()
                t0, c0, ev0 = time.perf_counter(), time.thread_time(), counter[0]
                cr0 = tl.created if tl is not None else 0
            loss = W.train_step(model, opt, xb)
            if mode == "sync":
                loss.item()
        self.sync()
        t1, c1 = time.perf_counter(), time.thread_time()
        created = (tl.created - cr0) if tl is not None else 0
        herr = 0
        if watched:
            w = rs_hooks.current()
            herr = w.stats()["herr"] if w is not None else -1
            ranksight.unwatch()
        return {"step_s": (t1 - t0) / self.steps, "cpu_s": (c1 - c0) / self.steps,
                "events_per_step": (counter[0] - ev0) / self.steps, "created_per_step": created / self.steps,
                "herr": herr}

    def interleave(self, model: Any, opt: Any, x: Any, mode: str, reps: int,
                   baseline_pool: Optional[bool] = None, arms: Optional[Any] = None) -> Dict[str, Any]:
        """``reps`` ABBA pairs of a plain and an instrumented run. ``baseline_pool`` (True/False):
        the "plain" arm is instead an instrumented run with ``CudaTimeline.POOL`` set to it, the
        other arm the opposite (an A/B of the event pool). ``arms``: a function called with False
        (arm A) or True (arm B) before an instrumented run of each, and with None after (an A/B of
        two hooks settings; "plain" is then arm A)."""
        from ranksight.hooks.timing import CudaTimeline

        if arms is not None:
            def baseline_run(watched: bool) -> Dict[str, float]:
                arms(watched)
                try:
                    return self.one_run(model, opt, x, True, mode)
                finally:
                    arms(None)

        plain: List[float] = []
        inst: List[float] = []
        cpu_p: List[float] = []
        cpu_i: List[float] = []
        herr = 0
        for order in W.abba(reps):
            for watched in order:
                if arms is not None:
                    r = baseline_run(watched)
                elif baseline_pool is None:
                    r = self.one_run(model, opt, x, watched, mode)
                else:
                    CudaTimeline.POOL = baseline_pool if not watched else not baseline_pool
                    try:
                        r = self.one_run(model, opt, x, True, mode)
                    finally:
                        CudaTimeline.POOL = True
                (inst if watched else plain).append(r["step_s"])
                (cpu_i if watched else cpu_p).append(r["cpu_s"])
                herr = max(herr, r["herr"])
        diffs = [b - a for a, b in zip(plain, inst)]
        return {
            "mode": mode, "reps": reps, "steps_per_run": self.steps, **W.ratio_summary(plain, inst),
            "delta_us_per_step_median": W.median(diffs) * 1e6,
            "main_thread_cpu_us_per_step": {"plain": W.median(cpu_p) * 1e6, "instrumented": W.median(cpu_i) * 1e6},
            "hook_errors": herr,
        }


HOOK_PREFIXES = ("_fwd", "_bwd", "_opt")  # the step-path hook methods of Watcher (names change with the hooks)


def host_breakdown(b: "Bench", model: Any, opt: Any, x: Any) -> Dict[str, Any]:
    """Host microseconds per step in each hook, from one instrumented run with perf_counter
    wrappers around the hook methods (class attributes, patched before watch() binds them,
    restored after). The wrappers add ~0.3 us each; nested entries (mark, resolve, _step_end)
    are inside the hook that calls them. The ``torch.autograd.backward`` wrapper's own lines are
    not timed (wrapping it would time the whole backward); its mark() calls are. On a step whose
    host runs ahead of the GPU (the async batch-8 loop) the launch queue fills, and from then on
    every driver call, the hooks' event records among them, waits for a free slot: there the
    rows hold waits for the GPU too. On the host-bound tiny model they are the hooks' own time."""
    from ranksight.hooks import timing as tmod
    from ranksight.hooks import watcher as wmod

    hook_methods = sorted(n for n in dir(wmod.Watcher)
                          if n.startswith(HOOK_PREFIXES) and callable(getattr(wmod.Watcher, n)))
    targets = [(wmod.Watcher, n) for n in hook_methods + ["_step_end", "_arm_backward"]]
    targets += [(wmod._TimedIter, "__next__"), (tmod.CudaTimeline, "mark"), (tmod.CudaTimeline, "resolve")]
    acc: Dict[str, List[float]] = {}
    saved = []

    def wrap(f: Any, key: str) -> Any:
        cell = acc.setdefault(key, [0.0, 0])
        pc = time.perf_counter

        def timed(*a: Any, **k: Any) -> Any:
            t0 = pc()
            try:
                return f(*a, **k)
            finally:
                cell[0] += pc() - t0
                cell[1] += 1

        return timed

    for cls, name in targets:  # (Watcher's hooks come from its mixins: patched on Watcher, removed after)
        orig = getattr(cls, name, None)
        if orig is None:
            continue
        saved.append((cls, name, cls.__dict__.get(name)))
        setattr(cls, name, wrap(orig, f"{cls.__name__}.{name}"))
    try:
        r = b.one_run(model, opt, x, True, "async")
    finally:
        for cls, name, own in saved:
            if own is None:
                delattr(cls, name)
            else:
                setattr(cls, name, own)
    n = b.warm + b.steps
    mk = acc.get("CudaTimeline.mark")
    per = {k: {"us_per_step": v[0] / n * 1e6, "calls_per_step": v[1] / n} for k, v in sorted(acc.items())}
    top = sum(v["us_per_step"] for k, v in per.items() if k.split(".")[1] in hook_methods)
    return {"steps": n, "hooks_total_us_per_step": top, "by_function": per, "step_ms": r["step_s"] * 1e3,
            "mark_us_per_call": mk[0] / mk[1] * 1e6 if mk and mk[1] else 0.0,
            "created_per_step": r["created_per_step"]}


def event_cost_us(torch: Any, device: Any, n: int = 5000) -> Dict[str, float]:
    stream = torch.cuda.current_stream(device)
    evs = []
    t0 = time.perf_counter()
    for _ in range(n):
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        evs.append(e)
    t1 = time.perf_counter()
    torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    for e in evs:
        e.query()
    t3 = time.perf_counter()
    for a, b in zip(evs, evs[1:1001]):
        a.elapsed_time(b)
    t4 = time.perf_counter()
    for e in evs:  # re-record events that exist and have completed (the pool's path)
        e.record(stream)
    t5 = time.perf_counter()
    torch.cuda.synchronize(device)
    out = {"create_record_us": (t1 - t0) / n * 1e6, "query_us": (t3 - t2) / n * 1e6,
           "elapsed_time_us": (t4 - t3) / 1000 * 1e6, "rerecord_us": (t5 - t4) / n * 1e6}
    from ranksight.hooks.timing import driver_recorder

    rr = driver_recorder(torch, device)
    if rr is not None:  # the same re-records through the driver with the GIL held
        t6 = time.perf_counter()
        ok = sum(1 for e in evs if rr(e))
        t7 = time.perf_counter()
        torch.cuda.synchronize(device)
        out.update(rerecord_driver_us=(t7 - t6) / n * 1e6, rerecord_driver_ok=ok / n)
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=20, help="interleaved pairs per loop style (default 20)")
    p.add_argument("--steps", type=int, default=50, help="timed steps per run (default 50)")
    p.add_argument("--settle", type=float, default=0.8,
                   help="seconds each run waits after watch() (or its plain twin) before its steps (default 0.8)")
    p.add_argument("--gpu-bound-batch", type=int, default=32,
                   help="also run the async loop with this batch, which makes the step GPU-bound (0: skip)")
    p.add_argument("--warm", type=int, default=5, help="untimed steps at the start of each run (default 5)")
    p.add_argument("--modes", default="async,sync", help="loop styles: async,sync (default both)")
    p.add_argument("--tiny-reps", type=int, default=10, help="pairs for the host-bound tiny model (0: skip)")
    p.add_argument("--tiny-steps", type=int, default=200, help="timed steps per tiny run")
    p.add_argument("--host-bound-ms", type=float, default=0.0,
                   help="also a host-bound step of about this many ms (the tiny model with as many layers as "
                        "reach it, measured here), --tiny-reps pairs of --long-steps steps (0: skip, the default)")
    p.add_argument("--long-steps", type=int, default=60, help="timed steps per run of the --host-bound-ms step")
    p.add_argument("--agent", choices=("real", "off"), default="real",
                   help="send to a real `ranksight exporter` subprocess (default) or nowhere")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of this script with the tiny model (no GPU figures)")
    p.add_argument("--pool-ab", action="store_true",
                   help="also compare pooled with fresh CUDA events (host breakdown, tiny model)")
    p.add_argument("--record-ab", action="store_true",
                   help="also compare torch's Event.record with the driver's cuEventRecord for re-recorded events "
                        "(host breakdown, tiny model, batch-8 step)")
    p.add_argument("--timing-ab", type=W.timing_every, nargs="?", const=16, default=None, metavar="N|auto",
                   help="every step timed with CUDA events (A, hooks.gpu_timing_every 1) against one step in N (B, "
                        "hooks.gpu_timing_every N; N 16 when not given; auto: hooks.gpu_timing_every 0, the gap "
                        "chosen from the events' cost): the host breakdown of each, the host-bound tiny model and the "
                        "default step A/B")
    p.add_argument("--out", help="write the full result JSON here")
    return p


def _breakdown_of_arm_a(b: "Bench", model: Any, opt: Any, x: Any,
                        arm: Callable[[Optional[bool]], None], which: bool = False) -> Dict[str, Any]:
    """``host_breakdown`` with an A/B's arm A set (``arm(False)``; ``which`` True: arm B), then the
    default back (``arm(None)``)."""
    arm(which)
    try:
        return host_breakdown(b, model, opt, x)
    finally:
        arm(None)


TIMING_B = {"every": 16}  # --timing-ab's arm B: hooks.gpu_timing_every


def _timing_arm(b_arm: Optional[bool]) -> None:
    """A: every step timed with CUDA events (hooks.gpu_timing_every 1), B: one step in
    ``TIMING_B["every"]``; None: back to the hooks' default."""
    if b_arm is None:
        DEFAULT_HOOKS["hooks"].pop("gpu_timing_every", None)
    else:
        DEFAULT_HOOKS["hooks"]["gpu_timing_every"] = 1 if b_arm is False else TIMING_B["every"]


def _record_arm(b_arm: Optional[bool]) -> None:
    """A: torch's record, B: the driver's (the default)."""
    from ranksight.hooks.timing import CudaTimeline

    CudaTimeline.RECORD = "torch" if b_arm is False else "driver"


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    modes = [m for m in a.modes.split(",") if m]
    if any(m not in ("async", "sync") for m in modes) or a.reps < 1 or a.steps < 1:
        p.error("--modes takes async,sync; --reps and --steps must be >= 1")
    if a.host_bound_ms < 0 or a.long_steps < 1:
        p.error("--host-bound-ms must be >= 0 and --long-steps >= 1")
    if a.timing_ab is not None:
        TIMING_B["every"] = a.timing_ab
    if a.device == "cuda" and not W.cuda_available():
        print("bench/gpu/overhead.py: CUDA is not available on this machine; skipped (run it on the GPU machine: "
              "bash bench/gpu/run_all.sh)")
        return 0
    import torch

    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    agent = None
    url = "off"
    tmp = tempfile.TemporaryDirectory(prefix="rs-overhead-")
    if a.agent == "real":
        from ranksight.tools.stack import AgentProcess

        agent = AgentProcess(Path(tmp.name), collectors="gpu,ranks" if device.type == "cuda" else "ranks",
                             name="agent").start(timeout=60)
        url = agent.ingest
    out: Dict[str, Any] = {"versions": W.versions(), "agent": a.agent, "command": " ".join(sys.argv)}

    def save() -> None:  # after every section: a run cut at its time limit keeps what it measured
        if a.out:
            W.write_json(a.out, out)
    try:
        b = Bench(torch, device, url, a.steps, a.warm, a.settle)
        _default_model(a, b, torch, device, modes, out, save)
        if a.gpu_bound_batch and device.type == "cuda":
            _gpu_bound(a, b, device, out, save)
        if a.tiny_reps > 0:
            _tiny_model(a, torch, device, url, out, save)
        if a.tiny_reps > 0 and a.host_bound_ms > 0:
            _host_bound_long(a, torch, device, url, out, save)
    finally:
        if agent is not None:
            try:
                out["agent_ingest_tail"] = [ln for ln in agent.metrics_text().splitlines()
                                            if "ingest_datagrams_total" in ln and not ln.startswith("#")]
            except Exception as e:
                out["agent_ingest_tail"] = f"unreadable: {e}"
            agent.stop()
        tmp.cleanup()
    W.write_json(a.out, out)
    print(render(out))
    return 0


def _default_model(a: argparse.Namespace, b: "Bench", torch: Any, device: Any, modes: List[str],
                   out: Dict[str, Any], save: Callable[[], None]) -> None:
    """The default model: events per step, the event and host costs, then each loop style's pairs."""
    spec = W.ModelSpec() if device.type == "cuda" else W.ModelSpec.tiny()
    model, opt, x = W.build(spec, device)
    out["spec"] = W.spec_dict(spec)
    out["params"] = W.n_params(model)
    for _ in range(5):
        W.train_step(model, opt, x)
    b.sync()
    counted = b.one_run(model, opt, x, True, "async", count_events=True)
    out["events_per_step"] = counted["events_per_step"]
    out["events_created_per_step"] = counted["created_per_step"]
    if device.type == "cuda":
        out["event_cost"] = event_cost_us(torch, device)
    out["host_breakdown"] = host_breakdown(b, model, opt, x)
    save()
    if a.pool_ab:
        from ranksight.hooks.timing import CudaTimeline

        CudaTimeline.POOL = False
        try:
            out["host_breakdown_fresh_events"] = host_breakdown(b, model, opt, x)
        finally:
            CudaTimeline.POOL = True
        save()
    if a.record_ab and device.type == "cuda":
        out["host_breakdown_torch_record"] = _breakdown_of_arm_a(b, model, opt, x, _record_arm)
        save()
        W.log(f"overhead: batch-8 step, torch (A) vs driver (B) re-records, {a.reps} pairs")
        out["step_async_record_ab"] = b.interleave(model, opt, x, "async", a.reps, arms=_record_arm)
        save()
    if a.timing_ab is not None and device.type == "cuda":
        out["timing_ab_every"] = a.timing_ab
        out["host_breakdown_every_step"] = _breakdown_of_arm_a(b, model, opt, x, _timing_arm)
        out["host_breakdown_sampled"] = _breakdown_of_arm_a(b, model, opt, x, _timing_arm, True)
        save()
        for mode in modes:
            W.log(f"overhead: {mode} loop, every step (A) vs one in {a.timing_ab or 'auto'} (B) CUDA timing, "
                  f"{a.reps} pairs")
            out[f"step_{mode}_timing_ab"] = b.interleave(model, opt, x, mode, a.reps, arms=_timing_arm)
            save()
    for mode in modes:
        W.log(f"overhead: {mode} loop, {a.reps} pairs x {a.steps} steps")
        out[f"step_{mode}"] = b.interleave(model, opt, x, mode, a.reps)
        save()


def _gpu_bound(a: argparse.Namespace, b: "Bench", device: Any, out: Dict[str, Any], save: Callable[[], None]) -> None:
    """The async loop with a batch that makes the step GPU-bound."""
    _warm_and_measure(b, W.ModelSpec(batch=a.gpu_bound_batch), device, a.reps, out, "gpu_bound_async", save,
                      f"overhead: GPU-bound batch {a.gpu_bound_batch}, async loop, {a.reps} pairs x {a.steps} steps")


def _warm_and_measure(b: "Bench", spec: Any, device: Any, reps: int, out: Dict[str, Any], key: str,
                      save: Callable[[], None], what: str) -> Tuple[Any, Any, Any]:
    """Build the model, run 5 warm-up steps, then the async loop's interleaved pairs into out[key].
    Returns the model, optimizer and batch for further A/Bs on the same model."""
    m, o, x = W.build(spec, device)
    for _ in range(5):
        W.train_step(m, o, x)
    W.log(what)
    r = b.interleave(m, o, x, "async", reps)
    r["spec"] = W.spec_dict(spec)
    out[key] = r
    save()
    return m, o, x


def _tiny_model(a: argparse.Namespace, torch: Any, device: Any, url: str, out: Dict[str, Any],
                save: Callable[[], None]) -> None:
    """The host-bound tiny model (and its fresh vs pooled events, torch vs driver re-record A/Bs)."""
    tb = Bench(torch, device, url, a.tiny_steps, a.warm, a.settle)
    tspec = W.ModelSpec.tiny()
    tm, to, tx = _warm_and_measure(tb, tspec, device, a.tiny_reps, out, "host_bound_tiny", save,
                                   f"overhead: host-bound tiny model, {a.tiny_reps} pairs x {a.tiny_steps} steps")
    # the per-method table where the launch queue never fills: its rows are the hooks' own host time
    out["host_breakdown_tiny"] = host_breakdown(tb, tm, to, tx)
    if a.timing_ab is not None and device.type == "cuda":
        out["host_breakdown_tiny_every_step"] = _breakdown_of_arm_a(tb, tm, to, tx, _timing_arm)
    save()
    if a.pool_ab:
        W.log(f"overhead: host-bound tiny model, fresh (A) vs pooled (B) events, {a.tiny_reps} pairs")
        t = tb.interleave(tm, to, tx, "async", a.tiny_reps, baseline_pool=False)
        t["spec"] = W.spec_dict(tspec)
        out["host_bound_tiny_pool_ab"] = t
        save()
    if a.record_ab and device.type == "cuda":
        W.log(f"overhead: host-bound tiny model, torch (A) vs driver (B) re-records, {a.tiny_reps} pairs")
        t = tb.interleave(tm, to, tx, "async", a.tiny_reps, arms=_record_arm)
        t["spec"] = W.spec_dict(tspec)
        out["host_bound_tiny_record_ab"] = t
        save()
    if a.timing_ab is not None and device.type == "cuda":
        W.log(f"overhead: host-bound tiny model, every step (A) vs one in {a.timing_ab or 'auto'} (B) CUDA timing, "
              f"{a.tiny_reps} pairs")
        t = tb.interleave(tm, to, tx, "async", a.tiny_reps, arms=_timing_arm)
        t["spec"] = W.spec_dict(tspec)
        out["host_bound_tiny_timing_ab"] = t
        save()


def _step_ms(torch: Any, device: Any, spec: Any, steps: int = 12) -> float:
    """The median plain step time of ``spec`` (its model built and warmed here), ms."""
    m, o, x = W.build(spec, device)
    times = []
    for i in range(3 + steps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        W.train_step(m, o, x)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    del m, o, x
    return W.median(times)


def _layers_for(torch: Any, device: Any, target_ms: float, most: int = 256) -> Tuple[Any, float]:
    """The tiny model's layer count whose plain step takes about ``target_ms`` (a line through 1
    and 4 layers, then one correction), and that step's measured time."""
    base = W.ModelSpec.tiny()
    one, four = _step_ms(torch, device, base), _step_ms(torch, device, replace(base, layers=4))
    per = max((four - one) / 3, 1e-3)
    layers = int(min(most, max(1, round(1 + (target_ms - one) / per))))
    got = _step_ms(torch, device, replace(base, layers=layers))
    if got > 0 and abs(got - target_ms) > 0.1 * target_ms:
        layers = int(min(most, max(1, round(layers * target_ms / got))))
        got = _step_ms(torch, device, replace(base, layers=layers))
    return replace(base, layers=layers), got


def _host_bound_long(a: argparse.Namespace, torch: Any, device: Any, url: str, out: Dict[str, Any],
                     save: Callable[[], None]) -> None:
    """A longer host-bound step (the tiny model, deeper): the hooks' cost against a step the host
    sets the pace of, at about --host-bound-ms."""
    spec, got = _layers_for(torch, device, a.host_bound_ms)
    lb = Bench(torch, device, url, a.long_steps, a.warm, a.settle)
    _warm_and_measure(lb, spec, device, a.tiny_reps, out, "host_bound_long", save,
                      f"overhead: host-bound step of {spec.layers} tiny layers ({got:.1f} ms plain, target "
                      f"{a.host_bound_ms:g}), {a.tiny_reps} pairs x {a.long_steps} steps")
    out["host_bound_long"]["target_ms"] = a.host_bound_ms
    save()


def render(out: Dict[str, Any]) -> str:
    lines = [f"ranksight hooks overhead on {out['versions'].get('gpu', 'CPU')} "
             f"(torch {out['versions'].get('torch')}, driver {out['versions'].get('driver')})",
             f"CUDA events per step: {out.get('events_per_step', 0):.1f} recorded, "
             f"{out.get('events_created_per_step', 0):.2f} created"]
    ec = out.get("event_cost")
    if ec:
        lines.append(f"one event: create+record {ec['create_record_us']:.2f} us, query {ec['query_us']:.2f} us, "
                     f"elapsed_time {ec['elapsed_time_us']:.2f} us, re-record {ec['rerecord_us']:.2f} us"
                     + (f", re-record by the driver {ec['rerecord_driver_us']:.2f} us" if "rerecord_driver_us" in ec else ""))
    lines.append(f"{'loop':<26}{'plain ms':>10}{'hooks ms':>10}{'ratio (med of pairs)':>22}{'its 95% CI':>16}"
                 f"{'p25..p75':>16}{'delta us':>10}")
    for key in ("step_async", "step_sync", "gpu_bound_async", "host_bound_tiny", "host_bound_long",
                "host_bound_tiny_pool_ab",
                "step_async_record_ab", "host_bound_tiny_record_ab", "step_async_timing_ab", "step_sync_timing_ab",
                "host_bound_tiny_timing_ab"):
        r = out.get(key)
        if not r:
            continue
        lines.append(f"{key:<26}{r['plain_ms_median']:>10.3f}{r['instrumented_ms_median']:>10.3f}"
                     f"{r['ratio_median_of_pairs']:>22.4f}{W.ci_text(r, 16)}{r['ratio_p25']:>8.4f}..{r['ratio_p75']:<6.4f}"
                     f"{r['delta_us_per_step_median']:>10.1f}")
    for key in ("host_breakdown", "host_breakdown_fresh_events", "host_breakdown_torch_record",
                "host_breakdown_every_step", "host_breakdown_sampled", "host_breakdown_tiny",
                "host_breakdown_tiny_every_step"):
        hb = out.get(key)
        if hb:
            lines.append(f"{key}: mark() {hb['mark_us_per_call']:.2f} us per call in the loop, "
                         f"{hb['created_per_step']:.2f} events created per step")
    n = out.get("timing_ab_every")
    sampled = "the gap chosen from the events' cost" if n == 0 else f"one step in {n} timed"
    for key, what in (("host_breakdown", "the default timing"), ("host_breakdown_every_step", "every step timed"),
                      ("host_breakdown_sampled", sampled),
                      ("host_breakdown_tiny", "host-bound tiny model, the default timing"),
                      ("host_breakdown_tiny_every_step", "host-bound tiny model, every step timed")):
        hb = out.get(key)
        if not hb:
            continue
        lines.append(f"hooks' host time per step, {what} (one instrumented run, {hb['steps']} steps): "
                     f"{hb['hooks_total_us_per_step']:.1f} us in the hook methods")
        for k, v in hb["by_function"].items():
            lines.append(f"  {k:<34}{v['us_per_step']:>8.1f} us/step  {v['calls_per_step']:>5.1f} calls/step")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
