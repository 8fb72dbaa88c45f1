"""`ranksight demo`: a healthy phase, one injected fault, and the verdict.

It starts ``ranksight exporter``, the local stack (Debian's binaries,
``ranksight.tools.stack.LocalStack``) with the *test* profile rules (``for:`` 10 s, rate
windows 30 s) scraping it every 2 s, and ``examples/train_ddp.py`` as two gloo ranks
(launched like torchrun's static launch: RANK/WORLD_SIZE/MASTER_* in the env). The job runs
healthy for ``--fault-after`` seconds, then one rank misbehaves (``--fault``, default
straggler). ``--strategy`` picks how the job parallelizes its model (DDP by default, FSDP2, or a
DeepSpeed ZeRO engine on CPU: ``examples/parallel_setup.py``). Rank 0's output (the script's lines and the hooks' step table) goes to the
console line by line; everything is logged under the run dir. Every 2 s the demo reads the
alerts from Alertmanager (with inhibition) and Prometheus and prints each one as it fires or
is muted (``demo_alerts.py``). Once the injected cause fires and its symptoms are muted (or
after ``--duration``), it stops the job (SIGUSR1: both ranks stop at the same step) and
prints the verdict: the cause, the symptoms it muted, and the next check and runbook of its
triage entry. Exit 0 when the cause was named (``--fault none``: when no alert fired), 1
otherwise.

``--act`` (``demo_act.py``) shows the loop that ends a hang: ``ranksight act`` beside the agent,
Alertmanager posting to it, the job under ``torchrun --max-restarts 3`` checkpointing as it trains; the
injected hang is named, `ranksight act` ends the workers, torchrun restarts them and they resume from
the last checkpoint; it prints the time from the fault to training again.

``--keep`` runs everything on the fixed default ports (agent :9945 and udp :9946,
Prometheus :9090, Alertmanager :9093, the stack's files in ``run/stack``, where
``ranksight stack status|down`` look) and, after the verdict, keeps the agent and the
stack running until Ctrl-C or ``ranksight stack down``.

Without the Debian binaries it says so in one line and runs the agent and the job only
(alerts cannot be evaluated then). Ctrl-C stops everything it started.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from .. import catalog, config, triage
from ..common.plumbing import ApiError, free_port, port_in_use, set_pdeathsig, wait_until
from ..console import error
from . import demo_act
from .demo_alerts import EXPECTED, EXPECTED_ENTRIES, JOB, AlertLog, SeenAlert, say  # noqa: F401 (public here)
from .triage_text import runbook_path
from .stack import (DEFAULT_ALERTMANAGER_PORT, DEFAULT_PROMETHEUS_PORT, AgentProcess, LocalStack, MissingBinary,
                    StackError, render_alert_files)

log = logging.getLogger(__name__)

# fault -> what it does, for --help and the README
FAULT_HELP: Dict[str, str] = {
    "straggler": "one rank runs extra compute every step; its peer waits in the all-reduce",
    "slow-data": "one rank's dataset sleeps on every read: dataloader-bound",
    "slow-checkpoint": "rank 0 writes large O_DSYNC checkpoints every 10 steps",
    "kill-rank": "one rank SIGKILLs itself",
    "hang": "one rank sleeps inside a step; its peer blocks in the all-reduce",
    "comm-heavy": "a wide model on a tiny batch, gradients dominate (from the start: no healthy phase)",
    "none": "no fault: a healthy run, no alert may fire",
}
FAULTS = tuple(FAULT_HELP)
DEFAULT_FAULT = "straggler"
DEMO_STRAGGLER_EXTRA = 2.0  # the straggler's extra compute per step, as a share of its own measured compute
TERMINAL = ("kill-rank", "hang")  # faults after which the job cannot progress
STARTUP_SECONDS = 90.0  # at most this long from launch to the first step
SCRAPE_INTERVAL = "2s"
POLL_SECONDS = 2.0
# the agent, Prometheus and Alertmanager run at this niceness: the two CPU ranks fill a small machine,
# and a stack that takes its CPU from one of them would make that rank a straggler on a healthy run
STACK_NICE = 10
LINGER_SECONDS = 20.0  # after the cause fires, wait this long at most for the symptoms it mutes
STOP_SECONDS = 15.0  # SIGUSR1 to stop: the ranks stop at their next loss all-reduce, else TERM/KILL
STRATEGIES = ("ddp", "fsdp", "deepspeed")  # examples/parallel_setup.py's
STRATEGY_NAMES = {"ddp": "DDP", "fsdp": "FSDP", "deepspeed": "DeepSpeed ZeRO-{z}"}
OWN_CHECKPOINT_FAULTS = ("slow-checkpoint", "long-checkpoint")  # the job writes these checkpoints itself
KEEP_DIR = "run/stack"  # `ranksight stack`'s default run dir: status/down find the kept stack there


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the agent, a local Prometheus + Alertmanager (test-profile rules) and an instrumented "
                     "2-rank CPU job (DDP, FSDP or DeepSpeed ZeRO): healthy first, then one injected fault; print the alerts as they fire "
                     "and the verdict: the cause, the symptoms it muted, and the next check.")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("faults:\n" + "\n".join(f"  {k:<16} {v}" for k, v in FAULT_HELP.items()) +
                "\n\n--act: ranksight act restarts the hung job's workers (torchrun --max-restarts 3) and they resume "
                "from\nthe last checkpoint; it takes --fault hang only (its default), --strategy ddp or fsdp\n"
                "\nexit status: 0 the injected cause was named (--fault none: no alert fired; --act: the job trained "
                "again\nafter the resume and finished), 1 it was not (--act: not within "
                f"{demo_act.RECOVER_LIMIT:g} s of the fault), 2 bad usage or a\nport/binary problem, 130 interrupted")
    p.add_argument("--fault", choices=FAULTS, default=None, metavar="FAULT",
                   help=f"fault to inject (default {DEFAULT_FAULT}): {', '.join(FAULTS)}; see below (--act: hang)")
    p.add_argument("--fault-after", type=float, default=None, metavar="S",
                   help="the healthy phase: the fault starts this many seconds after the first step (default 30; "
                        f"with --act {demo_act.FAULT_AFTER:g})")
    p.add_argument("--duration", type=float, default=None, metavar="S",
                   help="at most this many seconds of training, from the first step (default 120; startup adds "
                        "~10-20 s); with a fault the job stops once the cause has fired and muted its symptoms; "
                        f"with --act the seconds the job trains in all (default --fault-after + "
                        f"{demo_act.TRAIN_AFTER_RESUME:g})")
    p.add_argument("--keep", action="store_true",
                   help="fixed ports (agent :9945, udp :9946, Prometheus :9090, Alertmanager :9093; stack files in "
                        f"{KEEP_DIR}); after the verdict keep the agent and stack running until Ctrl-C or "
                        "`ranksight stack down`")
    p.add_argument("--run-dir", default="run/demo", metavar="DIR",
                   help="logs, configs, data and checkpoints (default ./run/demo; emptied first)")
    p.add_argument("--rank-to-fault", type=int, default=1, choices=(0, 1), help="the misbehaving rank (default 1)")
    p.add_argument("--settle", type=float, default=45.0, metavar="S",
                   help="after the job, wait up to this long for the injected cause to fire (default 45)")
    p.add_argument("--config", metavar="FILE", help="YAML config file (thresholds; the test profile is applied)")
    p.add_argument("--strategy", choices=STRATEGIES, default="ddp",
                   help="how the job parallelizes its model: ddp (default), fsdp (FSDP2) or deepspeed (a ZeRO "
                        "engine on CPU, needs deepspeed installed)")
    p.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=2,
                   help="--strategy deepspeed: the ZeRO stage (default 2)")
    p.add_argument("--act", action="store_true",
                   help="end the injected hang with `ranksight act` (auto for RanksightRankStalled, not a dry run): "
                        "the job runs under torchrun --max-restarts 3, checkpoints every "
                        f"{demo_act.CHECKPOINT_EVERY} steps and resumes from the last checkpoint; prints the time from "
                        "the fault to training again")


class Job:
    """examples/train_ddp.py as 2 gloo ranks, each in its own session. Rank 0's stdout and stderr
    (the hooks' table) are pumped apart, line by line, so neither splits a line of the other."""

    def __init__(self, script: Path, run_dir: Path, args: Sequence[str], env: Mapping[str, str], world: int = 2):
        self.procs: List[subprocess.Popen] = []
        self.threads: List[threading.Thread] = []
        self.logs: List[TextIO] = []
        master_port = str(free_port())
        for rank in range(world):
            e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                     GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)
            logf = open(run_dir / f"rank{rank}.log", "w", buffering=1)
            lock = threading.Lock()
            p = subprocess.Popen([sys.executable, "-u", str(script), *args], env=e, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                 start_new_session=True, preexec_fn=set_pdeathsig)
            for src in (p.stdout, p.stderr):
                t = threading.Thread(target=self._pump, args=(src, logf, lock, rank == 0), daemon=True)
                t.start()
                self.threads.append(t)
            self.procs.append(p)
            self.logs.append(logf)

    @staticmethod
    def _pump(src: TextIO, logf: TextIO, lock: threading.Lock, echo: bool) -> None:
        for line in src:
            with lock:
                logf.write(line)
            if echo:
                say(line.rstrip("\n"))

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def returncodes(self) -> List[Optional[int]]:
        return [p.poll() for p in self.procs]

    def finish(self, grace: float = STOP_SECONDS) -> None:
        """Ask every rank to stop at the same step (SIGUSR1), then stop() what is left."""
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGUSR1)
                except ProcessLookupError:
                    pass
        wait_until(lambda: not self.running(), grace, 0.1)
        self.stop()

    def stop(self, grace: float = 5.0) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in self.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            if wait_until(lambda: not self.running(), grace, 0.05):
                break
        for p in self.procs:
            p.wait()
        for t in self.threads:
            t.join(2.0)
        for f in self.logs:
            f.close()


def _has_numpy() -> bool:
    import importlib.util

    return importlib.util.find_spec("numpy") is not None


def _stepping(agent: AgentProcess) -> bool:
    """True once the agent has seen a step of the demo job."""
    try:
        text = agent.metrics_text()
    except OSError:
        return False
    return any(ln.startswith(f"{catalog.STEPS}{{") and f'job="{JOB}"' in ln for ln in text.splitlines())


def _collectors() -> str:
    """Only collectors that can run on this machine, so a healthy run raises no CollectorDown."""
    names = ["network", "disk", "ranks"]
    try:
        import pynvml  # nvidia-ml-py, a dependency

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        names.insert(0, "gpu")
    except Exception:  # noqa: BLE001 - no driver / no GPU: no gpu collector
        pass
    ib = Path("/sys/class/infiniband")
    if ib.is_dir() and any(ib.iterdir()):
        names.insert(-1, "rdma")
    return ",".join(names)


def _script() -> Path:
    for p in (Path(__file__).resolve().parents[2] / "examples" / "train_ddp.py",
              Path.cwd() / "examples" / "train_ddp.py"):
        if p.is_file():
            return p
    raise StackError("examples/train_ddp.py not found: run from a ranksight checkout")


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def report_path(run_dir: Path, stack: Optional[LocalStack],
                act: Optional["demo_act.ActProcess"] = None) -> Optional[Path]:
    """Write the run report of this demo (``ranksight report`` on the demo's job, from its
    Prometheus; with ``act``, its Actions section) and return its report.html; None, with one line
    saying why, when it cannot."""
    if stack is None:
        return None
    try:
        from ranksight.report.cli import write_report
        from ranksight.report.make import ReportError
    except ImportError as e:  # the report extra (matplotlib) is not installed
        say(f"report        not written: {e} (pip install 'ranksight[report]')")
        return None
    try:
        _, html = write_report(stack.prom_url, JOB, out=str(run_dir / "report"), profile="test",
                               act=act.url if act is not None else None,
                               act_token_file=str(act.token_file) if act is not None else None)
    except (ReportError, ApiError) as e:
        say(f"report        not written: {e}")
        return None
    return Path(html)


def run(args: argparse.Namespace) -> int:
    if args.act:
        problem = demo_act.check(args)
        if problem:
            return error(problem)
    args.fault = args.fault or DEFAULT_FAULT
    if args.fault_after is None:
        args.fault_after = 30.0
    if args.duration is None and not args.act:
        args.duration = 120.0
    if args.strategy == "deepspeed":
        if args.fault in OWN_CHECKPOINT_FAULTS:
            return error(f"--fault {args.fault} writes its own checkpoint file, DeepSpeed writes its own: "
                         "use --strategy ddp or fsdp for it")
        if importlib.util.find_spec("deepspeed") is None:
            return error("--strategy deepspeed: deepspeed is not installed (pip install deepspeed; "
                         "DS_BUILD_OPS=0 needs no compiler)")
    for flag, v, lo in (("--duration", args.duration, 0.0), ("--fault-after", args.fault_after, -1e-9),
                        ("--settle", args.settle, -1e-9)):
        if v is not None and (not v > lo or v != v):
            return error(f"{flag} must be {'positive' if lo == 0 else '0 or more'}")
    started: List[object] = []

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)  # `kill` cleans up like Ctrl-C
    state: Dict[str, int] = {}
    try:
        return _run(args, started, state)
    except StackError as e:
        return error(str(e))
    except KeyboardInterrupt:
        if "verdict" in state:  # Ctrl-C ends a kept stack: the normal way out
            say("\nranksight demo: stopping the kept agent and stack")
            return state["verdict"]
        say("\nranksight demo: interrupted, stopping everything")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        for thing in reversed(started):
            try:
                thing.stop()  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping %s: %s", type(thing).__name__, e)


def _keep_ports() -> Dict[str, int]:
    """--keep: the fixed default ports, checked free (StackError, one line, if not)."""
    d = config.defaults()["agent"]
    ports = {"listen_port": _port(d["listen"]), "ingest_port": _port(d["ingest"]),
             "prometheus_port": DEFAULT_PROMETHEUS_PORT, "alertmanager_port": DEFAULT_ALERTMANAGER_PORT}
    if any(LocalStack.attach(Path(KEEP_DIR)).pids().values()):
        raise StackError(f"a stack already runs in {KEEP_DIR}: `ranksight stack down` first, or drop --keep")
    for what, port in (("the agent", ports["listen_port"]), ("Prometheus", ports["prometheus_port"]),
                       ("Alertmanager", ports["alertmanager_port"])):
        if port_in_use(port):
            raise StackError(f"--keep: port 127.0.0.1:{port} for {what} is in use (is another demo, "
                             "`ranksight exporter` or `ranksight stack up` running?)")
    return ports


def _start(args: argparse.Namespace, cfg: Mapping, run_dir: Path, ports: Dict[str, int],
           started: List[object]) -> Tuple[AgentProcess, Optional[LocalStack], Mapping]:
    """The agent, with --act `ranksight act`, and the stack: free ports, or with --keep the fixed
    default ones in run/stack. The config the stack runs (with --act, its webhook receiver)."""
    stack_dir = run_dir / "stack"
    if args.keep:
        stack_dir = Path(KEEP_DIR).resolve()
        for old in ("prometheus-data", "alertmanager-data"):  # a kept stack starts empty
            shutil.rmtree(stack_dir / old, ignore_errors=True)
    # a hang must be called within seconds, not the production 30 s
    env = {"RANKSIGHT__agent__stall_min_seconds": "10", "RANKSIGHT__agent__stall_p99_factor": "5",
           **(demo_act.agent_env(run_dir) if args.act else {})}  # --act: the agent ends workers for act
    agent = AgentProcess(run_dir, listen_port=ports.get("listen_port", 0), ingest_port=ports.get("ingest_port", 0),
                         collectors=_collectors(), env=env, nice=STACK_NICE)
    started.append(agent)
    agent.start()
    if args.act:
        cfg = demo_act.start(args, run_dir, agent, started)
    stack: Optional[LocalStack] = None
    try:
        stack = LocalStack(stack_dir, targets=[agent.target], files=render_alert_files(cfg), cfg=cfg,
                           prometheus_port=ports.get("prometheus_port", 0),
                           alertmanager_port=ports.get("alertmanager_port", 0), scrape_interval=SCRAPE_INTERVAL,
                           nice=STACK_NICE)
        if args.keep:
            stack.owner = f"ranksight demo --keep (pid {os.getpid()}, agent on :{agent.listen_port})"
        started.append(stack)
        stack.start()
    except MissingBinary as e:
        stack = None
        if args.keep or args.act:
            raise
        say(f"ranksight demo: no local stack ({e}); running the agent and the job only")
    return agent, stack, cfg


def _run(args: argparse.Namespace, started: List[object], state: Dict[str, int]) -> int:
    cfg = config.load(args.config, "test")
    script = _script()
    ports = _keep_ports() if args.keep else {}
    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    agent, stack, cfg = _start(args, cfg, run_dir, ports, started)
    fault, bad = args.fault, args.rank_to_fault
    after = 0.0 if fault in ("none", "comm-heavy") else args.fault_after
    what = STRATEGY_NAMES[args.strategy].format(z=args.zero_stage)
    if args.act:
        say(f"ranksight demo: a 2-rank CPU {what} job under torchrun --max-restarts {demo_act.RESTARTS}, healthy for "
            f"{after:g} s, then fault hang ({EXPECTED[fault][2].format(r=bad)}); ranksight act restarts its workers "
            "and they resume from the last checkpoint")
    elif fault == "none":
        say(f"ranksight demo: a 2-rank CPU {what} job, healthy for up to {args.duration:g} s (no fault)")
    else:
        phase = f"healthy for {after:g} s, then" if after else "from the start:"
        say(f"ranksight demo: a 2-rank CPU {what} job, {phase} fault {fault} ({EXPECTED[fault][2].format(r=bad)})")
    say(f"agent         {agent.url}/metrics   (ingest {agent.ingest})")
    if stack is not None:
        say(f"prometheus    {stack.prom_url}/alerts")
        say(f"alertmanager  {stack.am_url}")
    if args.act:
        say(f"act           {args.act_server.url}   (auto for RanksightRankStalled; token {args.act_server.token_file})")
    say(f"logs          {run_dir}")
    say()

    env = dict(os.environ, RANKSIGHT_AGENT=agent.ingest, RANKSIGHT_JOB=JOB, OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    if not _has_numpy():  # torch warns at import when numpy is absent; harmless for this job
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"),
                                                       "ignore:Failed to initialize NumPy:UserWarning"]))
    if args.act and stack is not None:
        verdict = demo_act.run(args, run_dir, agent, stack, script, env, started, _stepping)
        return _end(args, run_dir, agent, stack, state, verdict)
    job_args = ["--duration", f"{args.duration:g}", "--fault", fault, "--rank-to-fault", str(bad),
                "--fault-after", f"{after:g}", "--checkpoint-dir", str(run_dir / "checkpoints"),
                "--strategy", args.strategy, "--zero-stage", str(args.zero_stage)]
    if fault == "straggler":
        # the straggler at 3x its compute: its peer then waits about half of every step, well over
        # CommBound's 30% even when the machine's other load slows both ranks (the verdict shows the
        # CommBound the straggler mutes)
        job_args += ["--straggler-extra", f"{DEMO_STRAGGLER_EXTRA:g}"]
    job = Job(script, run_dir, job_args, env)
    started.append(job)
    alerts = AlertLog()
    alerts.fault_planned = after > 0
    launched = time.monotonic()
    first_step: Optional[float] = None
    named_at: Optional[float] = None
    why = f"after {args.duration:g} s"
    while job.running():
        now = time.monotonic()
        if first_step is None and _stepping(agent):
            first_step = alerts.t0 = now
        if first_step is not None and now >= first_step + after:
            alerts.fault_started = True
        if stack is not None:
            alerts.tick(stack)
        # --duration counts from the first step (imports and DDP setup take ~10 s on 2 cores)
        if now > (first_step if first_step is not None else launched + STARTUP_SECONDS) + args.duration + 30:
            break
        if fault != "none" and stack is not None:
            hit = alerts.named(fault, bad, True)
            told = hit is not None and alerts.muted_by(hit.name) and not alerts.unexplained(EXPECTED[fault][0])
            if hit is not None and (fault in TERMINAL or told or named_at is not None and
                                    now - named_at > LINGER_SECONDS):
                why = f"{hit.name} named the cause"  # and muted its symptoms: the story is told
                break
            if hit is not None and named_at is None:
                named_at = now
        time.sleep(POLL_SECONDS)
    if job.running():
        running = [r for r, c in enumerate(job.returncodes()) if c is None]
        how = "SIGTERM: it cannot progress" if fault in TERMINAL else "SIGUSR1: they stop at the same step"
        say(f"ranksight demo: {why}: stopping the job (ranks still running: {running}; {how})")
    if fault in TERMINAL:
        job.stop()
    else:
        job.finish()
    codes = job.returncodes()
    return _end(args, run_dir, agent, stack, state, _verdict(args, cfg, stack, alerts, codes))


def _end(args: argparse.Namespace, run_dir: Path, agent: AgentProcess, stack: Optional[LocalStack],
         state: Dict[str, int], verdict: int) -> int:
    """The run report, then with --keep the kept agent and stack; the exit status."""
    path = report_path(run_dir, stack, getattr(args, "act_server", None))
    if path is not None:
        say(f"report        {path}")
    if args.keep and stack is not None:
        state["verdict"] = verdict
        _keep(agent, stack)
    return verdict


def _verdict(args: argparse.Namespace, cfg: Mapping, stack: Optional[LocalStack], alerts: AlertLog,
             codes: List[Optional[int]]) -> int:
    fault, bad = args.fault, args.rank_to_fault
    if stack is None:
        say(f"\njob exit codes: {codes}")
        say("alerts: not evaluated (Prometheus and Alertmanager did not run)")
        return 0 if fault == "none" else 1
    if fault != "none" and not alerts.named(fault, bad, primary_only=True):
        say(f"ranksight demo: waiting up to {args.settle:g} s for the alerts to settle")
        wait_until(lambda: alerts.tick(stack) or alerts.named(fault, bad, primary_only=True), args.settle,
                   POLL_SECONDS)
    alerts.tick(stack)
    say()
    say(f"job exit codes: {codes}")
    seen = ", ".join(f"rank {r}: {n}" for r, n in sorted(alerts.steps.items())) or "none"
    say(f"steps Prometheus saw: {seen}")
    par = ", ".join(f"rank {r}: {p}" for r, p in sorted(alerts.parallel.items())) or "none"
    say(f"strategy Prometheus saw: {par}")
    alerts.report(sys.stdout)
    if fault == "none":
        ok = not alerts.problems()
        say("verdict: healthy run, no alert fired" if ok else "verdict: alerts fired on a healthy run")
        return 0 if ok else 1
    names, _, what = EXPECTED[fault]
    injected = what.format(r=bad)
    hit = alerts.named(fault, bad)
    if hit is None:
        say(f"verdict: the injected cause ({fault}: {injected}) was NOT named; expected {' or '.join(names)}")
        return 1
    say(f"verdict: {hit.name} on {hit.where} names the injected cause ({fault}: {injected})")
    muted = alerts.muted_by(hit.name)
    if muted:
        say(f"         it mutes: {', '.join(sorted(f'{s.name} on {s.where}' for s in muted))}")
    entry = triage.by_alert(cfg).get(hit.name)
    if entry is not None:
        say(f"         next: {entry.next_check}")
        local = runbook_path(entry)
        say(f"         runbook: {entry.runbook}{f' (local copy: {local})' if local else ''} ({entry.diagnosis})")
    return 0


def _keep(agent: AgentProcess, stack: LocalStack) -> None:
    """Keep the agent and the stack until Ctrl-C or `ranksight stack down` (it stops the stack in
    KEEP_DIR; the demo sees that and stops the agent)."""
    say()
    say(f"kept running until Ctrl-C here or `ranksight stack down` (in {Path.cwd()}; elsewhere add "
        f"--run-dir {stack.run_dir}):")
    say(f"  prometheus    {stack.prom_url}   (alerts: {stack.prom_url}/alerts)")
    say(f"  alertmanager  {stack.am_url}")
    say(f"  agent         {agent.url}/metrics   (ingest {agent.ingest}, where ranksight.watch() sends by default)")
    say(f"  triage        ranksight triage --prometheus {stack.prom_url} --profile test --since 10m")
    while all(stack.pids().values()):
        time.sleep(1.0)
    say("ranksight demo: the stack was stopped; stopping the agent")
