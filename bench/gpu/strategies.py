"""Overhead of the hooks per parallel strategy: DDP, FSDP, DeepSpeed ZeRO-1/2/3 and a pipeline.

    python bench/gpu/strategies.py [--pairs 10] [--steps 30] [--warm 3] [--out strategies.json]
    python bench/gpu/strategies.py --device cpu --agent off --pairs 2 --steps 4   # the CPU smoke

What it does
  * Each strategy runs in its own subprocess (``--one STRATEGY``), world size 1 (torchrun's
    variables on a free loopback port; NCCL on CUDA, gloo on CPU), so process groups and
    DeepSpeed's global state never outlive one strategy.
  * The step: ``gpu_workload.ModelSpec`` (8 layers, 1024 wide, bf16, x 512 tokens, AdamW) with
    ``--batch`` rows (default 32: a GPU-bound step, as a large model's is; at 8 the host and the
    GPU are about even and the hooks' host time lands on the step) for every strategy, so the
    ratios compare; ``--device cpu`` takes ``ModelSpec.tiny()`` with batch 2 and 2 layers.
      ddp       ``DistributedDataParallel``
      fsdp      FSDP2 ``fully_shard`` on each encoder layer and on the model
      zero1..3  a DeepSpeed engine of that ZeRO stage (bf16, the client ``torch.optim.AdamW``),
                the step ``engine.backward(loss); engine.step()``
      pipeline  ``torch.distributed.pipelining``: with world size 1 one ``PipelineStage``
                (``num_stages=1``) under ``ScheduleGPipe`` with ``--micro`` micro-batches; a
                second stage would need a second rank, so the stages' P2P waits are not exercised.
      pipeline2 (only when named in ``--strategies``) the encoder's layers split into 2 stages on the
                one rank under ``ScheduleInterleaved1F1B``: torch passes activations and gradients
                between adjacent stages of one rank in memory, so there is no P2P here either.
  * In one subprocess plain and watched runs of the same model alternate in ABBA order
    (``--pairs`` pairs; a run is ``--warm`` untimed then ``--steps`` timed steps); a watched run
    is ``ranksight.watch(model_or_engine_or_schedule, optimizer, loader)`` with the default hooks
    config, ``ranksight.unwatch()`` after it. The hooks send to one real ``ranksight exporter``
    subprocess started here (``--agent off``: nowhere).
  * Each run waits ``--settle`` seconds before its first step (watched: the hooks' start-up threads
    run a few hundred ms; on the 2-core CPU box a real agent and no wait tripled a short run).
  * ``--timeout`` bounds each strategy's subprocess; its pairs stop (after a whole ABBA block)
    where the next block would pass the timeout less 45 s, and the result gives the pairs that ran.
  * Each watched run's hooks must count every step (``stats()["steps"] == warm + steps``) with no
    hook errors.

Each run's end also reads the GPU's SM clock, clock event reasons and temperature (NVML) and the
CPU the process last ran on (``run_states``, in pair order): step times that fall into groups
whatever the arm are told apart by these, or not.

Reported per strategy: the median of the per-pair ratios (watched / plain step time) with its 95%
bootstrap interval (wholly under a target: the pairs resolve it), their p25..p75 and min..max, the
medians in ms, the hook errors, whether every watched run counted its exact steps, and the
subprocess's wall time. A strategy that cannot run here (DeepSpeed not
importable, ...) is reported as skipped with the subprocess's last error line.
DeepSpeed comes from ``.devbin/py-deepspeed`` (``bench/gpu/deepspeed_prepare.sh``) when the
interpreter cannot import it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_workload as W  # noqa: E402

STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3", "pipeline")
EXTRA = ("pipeline2",)  # run only when named in --strategies
DEFAULT_HOOKS = {"hooks": {}}  # the built-in defaults, as bench/gpu/overhead.py
# the CPU smoke's batch and layers (ModelSpec.tiny() has 1 of each): the pipelines split the batch into
# 2 micro-batches, pipeline2 the layers into 2 stages
CPU_BATCH, CPU_LAYERS = 2, 2


# ---------------------------------------------------------------------- one strategy (the subprocess)
def _ds_config(stage: int, batch: int, bf16: bool) -> Dict[str, Any]:
    return {"train_micro_batch_size_per_gpu": batch, "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": stage}, "bf16": {"enabled": bf16}, "steps_per_print": 10 ** 9,
            "wall_clock_breakdown": False}


def _pipeline_loss(out: Any, _target: Any) -> Any:
    return out.float().square().mean()  # (gpu_workload.train_step's loss)


def _schedule_step(schedule: Any, opt: Any) -> Callable:
    """One training step of a pipelining schedule: its forward and backward, then the optimizer."""
    def step(xb: Any) -> None:
        schedule.step(xb, target=xb)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def setup(strategy: str, device: Any, spec: W.ModelSpec, micro: int) -> Tuple[Any, Any, Any, Callable, Callable]:
    """(watch target, optimizer, batch, step(xb), close()) of ``strategy`` on the started process group."""
    import torch

    model, opt, x = W.build(spec, device)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return ddp, opt, x, lambda xb: W.train_step(ddp, opt, xb), lambda: None
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # over the sharded parameters
        return model, opt, x, lambda xb: W.train_step(model, opt, xb), lambda: None
    if strategy.startswith("zero"):
        import deepspeed

        if device.type == "cpu":  # its shared-memory all-reduce (inference only) needs a compiler
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
        cfg = _ds_config(int(strategy[-1]), spec.batch, True)
        engine, zopt, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

        def ds_step(xb: Any) -> Any:
            loss = engine(xb).float().square().mean()
            engine.backward(loss)
            engine.step()
            return loss

        return engine, zopt, x, ds_step, engine.destroy
    if strategy == "pipeline":
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        schedule = ScheduleGPipe(PipelineStage(model, 0, 1, device), n_microbatches=micro, loss_fn=_pipeline_loss)
        return schedule, opt, x, _schedule_step(schedule, opt), lambda: None
    if strategy == "pipeline2":
        from torch import nn
        from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B

        half = len(model.layers) // 2
        parts = [nn.Sequential(*model.layers[:half]), nn.Sequential(*model.layers[half:])]
        stages = [PipelineStage(m, i, 2, device) for i, m in enumerate(parts)]
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=micro, loss_fn=_pipeline_loss)
        return schedule, opt, x, _schedule_step(schedule, opt), lambda: None
    raise ValueError(f"unknown strategy {strategy!r}")


class RunState:
    """What each run ran under, read once at its end: the GPU's SM clock (MHz), its clock event
    reasons (NVML's throttle bit mask) and temperature, and the CPU the training thread last ran
    on. Where step times fall into groups whatever the arm, these say whether the GPU's clocks or
    the host's placement tell the groups apart. Empty where NVML or psutil is missing."""

    def __init__(self, device: Any):
        self.nv = self.h = self.proc = None
        if device.type == "cuda":
            try:
                import pynvml

                pynvml.nvmlInit()
                self.nv, self.h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(device.index or 0)
            except Exception:
                pass  # no NVML: no clocks
        try:
            import psutil

            self.proc = psutil.Process()
        except Exception:
            pass  # no psutil: no CPU number

    def read(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        nv, h = self.nv, self.h
        if nv is not None:
            try:
                out["sm_mhz"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
                reasons = (getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                           or nv.nvmlDeviceGetCurrentClocksThrottleReasons)
                out["clock_reasons"] = reasons(h)
                out["temp_c"] = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
            except Exception as e:
                out["nvml_error"] = str(e)[:120]
        if self.proc is not None:
            try:
                out["cpu"] = self.proc.cpu_num()
            except Exception:
                pass
        return out


def one_run(torch: Any, device: Any, target: Any, opt: Any, x: Any, step: Callable, watched: bool,
            a: argparse.Namespace) -> Dict[str, Any]:
    """One run of ``--warm`` + ``--steps`` steps; the timed steps' seconds per step."""
    import ranksight
    from ranksight import hooks as rs_hooks

    data = W.batches(x, a.warm + a.steps)
    hooks = DEFAULT_HOOKS if a.timing_every == 0 else {"hooks": {"gpu_timing_every": a.timing_every}}
    loader = ranksight.watch(target, opt, data, agent=a.ingest, config=hooks) if watched else data
    time.sleep(a.settle)  # the hooks' start-up threads; the plain run waits the same
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = 0.0
    for i, xb in enumerate(loader):
        if i == a.warm:
            sync()
            t0 = time.perf_counter()
        step(xb)
    sync()
    dt = (time.perf_counter() - t0) / a.steps
    if not watched:
        return {"step_s": dt}
    w = rs_hooks.current()
    st = w.stats() if w is not None else {"steps": -1, "herr": -1}
    seen = {"parallel": dict(getattr(w, "parallel", {}) or {}), "pipeline": getattr(w, "pipeline", None) is not None}
    ranksight.unwatch()
    return {"step_s": dt, "steps": st["steps"], "herr": st["herr"], "seen": seen}


def run_one(a: argparse.Namespace) -> Dict[str, Any]:
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
    tiny = dataclasses.replace(W.ModelSpec.tiny(), batch=CPU_BATCH, layers=CPU_LAYERS)
    spec = W.ModelSpec(batch=a.batch) if device.type == "cuda" else tiny
    a.micro = min(a.micro, spec.batch)  # a micro-batch holds one sample at least
    t_start = time.perf_counter()
    target, opt, x, step, close = setup(a.one, device, spec, a.micro)
    state = RunState(device)
    states: Dict[str, List[Dict[str, Any]]] = {"plain": [], "watched": []}
    plain: List[float] = []
    watched: List[float] = []
    counts: List[int] = []
    herr = 0
    seen: Dict[str, Any] = {}
    # a run that would pass the time budget stops after a whole ABBA block (two pairs), so its
    # pairs still alternate: the result says how many ran ("pairs") of those asked ("pairs_asked")
    deadline = t_start + a.budget if a.budget > 0 else float("inf")
    done_pairs = 0
    t_loop = time.perf_counter()
    for i, order in enumerate(W.abba(a.pairs)):
        if i and i % 2 == 0:
            block = (time.perf_counter() - t_loop) / i * 2
            if time.perf_counter() + block > deadline:
                break
        done_pairs = i + 1
        for w in order:
            r = one_run(torch, device, target, opt, x, step, w, a)
            (watched if w else plain).append(r["step_s"])
            states["watched" if w else "plain"].append(state.read())
            if w:
                counts.append(r["steps"])
                herr = max(herr, r["herr"])
                seen = r["seen"]
    close()
    W.destroy_pg()
    res: Dict[str, Any] = {"strategy": a.one, "spec": W.spec_dict(spec), "pairs": done_pairs,
                           "pairs_asked": a.pairs, "steps": a.steps,
                           "warm": a.warm, "hook_errors": herr, "hook_steps": counts,
                           "exact_steps": all(c == a.warm + a.steps for c in counts), "hooks_saw": seen,
                           "run_states": states,
                           "setup_and_runs_s": time.perf_counter() - t_start, **W.ratio_summary(plain, watched)}
    if a.one == "pipeline":
        res["pipeline"] = f"1 stage (world size 1), ScheduleGPipe, {a.micro} micro-batches"
    if a.one == "pipeline2":
        res["pipeline"] = (f"2 stages on the one rank (world size 1, no P2P: torch hands a stage's output to the "
                           f"next in memory), ScheduleInterleaved1F1B, {a.micro} micro-batches")
    if a.one.startswith("zero"):
        import deepspeed

        res["deepspeed"] = deepspeed.__version__
    return res


# ---------------------------------------------------------------------- the parent
# the subprocess's pairs stop this long before --timeout, for its start-up (imports, the model,
# DeepSpeed's engine) and its exit
BUDGET_MARGIN_S = 45.0


def child_env(device: str) -> Dict[str, str]:
    """A one-rank torchrun environment on a free port; deepspeed from .devbin where not importable."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(W.free_port()), RANK="0", WORLD_SIZE="1",
               LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", RANKSIGHT_AGENT="off")
    if device == "cpu":
        env.setdefault("DS_ACCELERATOR", "cpu")
    env.setdefault("DS_BUILD_OPS", "0")
    return W.with_deepspeed(env)


def last_error(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if "Error" in ln or "error" in ln or "Exception" in ln]
    return (errs or lines or ["no output"])[-1][:400]


def run_all(a: argparse.Namespace, ingest: str, tmp: Path,
            save: Callable[[List[Dict[str, Any]]], None]) -> List[Dict[str, Any]]:
    """Each strategy's subprocess in turn; ``save`` gets the results so far after each."""
    results: List[Dict[str, Any]] = []
    env = child_env(a.device)
    for s in a.strategies:
        out = tmp / f"{s}.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", s, "--out", str(out), "--device", a.device,
               "--pairs", str(a.pairs), "--steps", str(a.steps), "--warm", str(a.warm), "--micro", str(a.micro),
               "--settle", str(a.settle), "--ingest", ingest, "--batch", str(a.batch),
               "--timing-every", str(a.timing_every), "--budget", str(max(0.0, a.timeout - BUDGET_MARGIN_S))]
        env["MASTER_PORT"] = str(W.free_port())
        t0 = time.perf_counter()
        W.log(f"{s}: {a.pairs} pairs of {a.warm}+{a.steps} steps")
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=a.timeout)
            rc, err = p.returncode, p.stderr
        except subprocess.TimeoutExpired as e:
            rc, err = 124, f"timed out after {a.timeout} s; {(e.stderr or b'')[-2000:]!r}"
        wall = time.perf_counter() - t0
        if rc == 0 and out.is_file():
            r = json.loads(out.read_text())
        else:
            r = {"strategy": s, "skipped": f"rc {rc}: {last_error(err)}", "stderr_tail": err[-3000:]}
        r["wall_s"] = wall
        left = len(a.strategies) - len(results) - 1
        W.log(f"{s}: {wall:.1f} s" + (f", skipped: {r['skipped']}" if "skipped" in r else "")
              + (f"; the {left} left: about {left * wall:.0f} s more at this pace" if left else ""))
        results.append(r)
        save(results)
    return results


def _saw(seen: Dict[str, Any]) -> str:
    """How the hooks read the model: its strategy (and ZeRO stage), and whether they timed a pipeline."""
    par = seen.get("parallel") or {}
    txt = "/".join(v for v in (par.get("strategy"), par.get("zero_stage")) if v) or "?"
    return txt + (" +pipeline" if seen.get("pipeline") else "")


def _clocks(states: Dict[str, List[Dict[str, Any]]]) -> str:
    """Each arm's SM clock range and the runs with a clock event reason set ("" without NVML)."""
    parts = []
    for arm in ("plain", "watched"):
        mhz = [st["sm_mhz"] for st in states.get(arm, []) if "sm_mhz" in st]
        if mhz:
            # (bit 0x1 is "GPU idle": a run's end follows a synchronize)
            held = sum(1 for st in states[arm] if (st.get("clock_reasons") or 0) & ~1)
            parts.append(f"{arm} SM {min(mhz)}..{max(mhz)} MHz, {held} of {len(mhz)} runs held back by a clock "
                         "event reason other than idle")
    return "; ".join(parts)


def render(results: List[Dict[str, Any]]) -> str:
    head = (f"{'strategy':<9} {'plain ms':>9} {'watched ms':>10} {'ratio':>7} {'95% CI':>15} {'p25..p75':>15} "
            f"{'min..max':>15} {'pairs':>5} {'herr':>4} {'steps':>6} {'wall s':>6}  hooks saw")
    rows = [head]
    for r in results:
        if "skipped" in r:
            rows.append(f"{r['strategy']:<9} skipped: {r['skipped']}")
            continue
        rows.append(f"{r['strategy']:<9} {r['plain_ms_median']:9.3f} {r['instrumented_ms_median']:10.3f} "
                    f"{r['ratio_median_of_pairs']:7.4f} {W.ci_text(r, 15)} {r['ratio_p25']:7.4f}..{r['ratio_p75']:<6.4f} "
                    f"{r['ratio_min']:7.4f}..{r['ratio_max']:<6.4f} {r['pairs']:5d} {r['hook_errors']:4d} "
                    f"{'exact' if r['exact_steps'] else 'WRONG':>6} {r['wall_s']:6.1f}  {_saw(r.get('hooks_saw', {}))}")
        if "pipeline" in r:
            rows.append(f"{'':<9} pipeline: {r['pipeline']}")
        clocks = _clocks(r.get("run_states") or {})
        if clocks:
            rows.append(f"{'':<9} {clocks}")
    return "\n".join(rows)


def agent_datagrams(text: str) -> Dict[str, float]:
    """The agent's datagrams received, by result (ok, malformed, rejected, ...)."""
    from prometheus_client.parser import text_string_to_metric_families

    from ranksight import catalog

    out: Dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == catalog.INGEST_DATAGRAMS.name:
                k = smp.labels.get("result", "")
                out[k] = out.get(k, 0.0) + smp.value
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10, help="interleaved plain/watched pairs per strategy (default 10)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per run (default 30)")
    p.add_argument("--warm", type=int, default=3, help="untimed steps at the start of each run (default 3)")
    p.add_argument("--batch", type=int, default=32, help="rows per step on cuda (default 32: GPU-bound)")
    p.add_argument("--micro", type=int, default=4, help="the pipeline's micro-batches per step (default 4)")
    p.add_argument("--settle", type=float, default=None,
                   help="seconds each run waits after watch() (or its plain twin) before its steps, so the hooks' "
                        "start-up threads are not billed per step (default 0.8 on cuda, as overhead.py; 0 on cpu)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run on gloo with ModelSpec.tiny()")
    p.add_argument("--agent", choices=("real", "off"), default="real",
                   help="send to a real `ranksight exporter` subprocess (default) or nowhere")
    p.add_argument("--strategies", default=",".join(STRATEGIES),
                   help="comma-separated (default the six: " + ",".join(STRATEGIES) + "; pipeline2 only when named)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per strategy's subprocess (default 300)")
    p.add_argument("--timing-every", type=W.timing_every, default=0, metavar="N|auto",
                   help="the watched runs' hooks.gpu_timing_every (default auto, or 0: the hooks' default, N chosen "
                        "from the events' cost; 1: every step timed; N > 1: one step in N on average)")
    p.add_argument("--out", help="write the result JSON here")
    p.add_argument("--one", choices=STRATEGIES + EXTRA, help=argparse.SUPPRESS)  # the subprocess: one strategy
    p.add_argument("--ingest", default="off", help=argparse.SUPPRESS)  # the subprocess: the agent's address
    p.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)  # the subprocess: seconds for its pairs
    return p


def main(argv: Optional[List[str]] = None) -> int:
    p = _parser()
    a = p.parse_args(argv)
    a.strategies = [s for s in a.strategies.split(",") if s]
    if a.pairs < 1 or a.steps < 1 or a.warm < 0 or a.micro < 1 or a.batch < 1:
        p.error("--pairs, --steps, --micro and --batch must be >= 1, --warm >= 0")
    bad = [s for s in a.strategies if s not in STRATEGIES + EXTRA]
    if bad or not a.strategies:
        p.error(f"--strategies takes some of {','.join(STRATEGIES + EXTRA)}; got {bad or 'none'}")
    if a.settle is None:
        a.settle = 0.8 if a.device == "cuda" else 0.0
    if a.one:
        W.write_json(a.out, run_one(a))
        return 0
    if a.device == "cuda" and not W.cuda_available():
        print("bench/gpu/strategies.py: CUDA is not available on this machine; skipped (--device cpu: the smoke)")
        return 0
    tmp = tempfile.TemporaryDirectory(prefix="rs-strategies-")
    agent = None
    ingest = "off"
    if a.agent == "real":
        from ranksight.tools.stack import AgentProcess

        agent = AgentProcess(Path(tmp.name), collectors="gpu,ranks" if a.device == "cuda" else "ranks",
                             name="agent").start(timeout=60)
        ingest = agent.ingest
    t0 = time.perf_counter()
    datagrams: Dict[str, float] = {}
    head = {"versions": W.versions(), "agent": a.agent, "device": a.device, "command": " ".join(sys.argv),
            "timing_every": a.timing_every}
    try:  # the JSON after each strategy: a run cut at its time limit keeps what it measured
        results = run_all(a, ingest, Path(tmp.name), lambda rs: W.write_json(a.out, dict(head, strategies=rs)))
        if agent is not None:
            datagrams = agent_datagrams(agent.metrics_text())
    finally:
        if agent is not None:
            agent.stop()
    out = dict(head, wall_s=time.perf_counter() - t0, strategies=results, agent_datagrams=datagrams)
    W.write_json(a.out, out)
    print(render(results))
    if agent is not None:
        print("agent's datagrams by result: " + (", ".join(f"{k} {v:.0f}" for k, v in sorted(datagrams.items()))
                                                or "none"))
    print(f"total wall time {out['wall_s']:.1f} s; ratio = median over pairs of watched / plain step time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
