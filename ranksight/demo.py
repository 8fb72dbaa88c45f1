"""`ranksight demo`: the agent, a local Prometheus + Alertmanager and a 2-rank CPU DDP job.

It starts ``ranksight exporter`` on free loopback ports, the local stack (Debian's
binaries, ``ranksight.stack.LocalStack``) with the *test* profile rules (``for:`` 10 s,
rate windows 30 s) scraping it every 2 s, and ``examples/train_ddp.py`` as two gloo
ranks (launched like torchrun's static launch: RANK/WORLD_SIZE/MASTER_* in the env),
optionally with an injected fault. Rank 0's output (the hooks' step table) goes to
the console; everything is logged under the run dir. Every 2 s it reads the alerts
from Alertmanager (with inhibition) and Prometheus; at the end it prints the alerts
that fired, marks the muted ones, and says whether the injected cause was named:
exit 0 when it was (or, for ``--fault none``, when no alert fired), 1 otherwise.
Without the Debian binaries it says so in one line and runs the agent and the job
only (alerts cannot be evaluated then). Ctrl-C stops everything it started.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Set, TextIO, Tuple

from . import catalog, config, triage
from .stack import (AgentProcess, ApiError, LocalStack, MissingBinary, StackError, free_port, render_alert_files,
                    set_pdeathsig, wait_until)

log = logging.getLogger(__name__)

FAULTS = ("none", "slow-data", "straggler", "kill-rank", "hang", "slow-checkpoint", "comm-heavy")
# fault -> (alerts that name it, does the alert sit on the faulty rank?, what was injected)
EXPECTED: Dict[str, Tuple[Tuple[str, ...], bool, str]] = {
    "slow-data": (("RanksightDataloaderBound",), True, "rank {r}'s dataset sleeps on every read"),
    "straggler": (("RanksightStraggler",), True, "rank {r} runs extra compute every step"),
    "kill-rank": (("RanksightRankDown", "RanksightHeartbeatMissed"), True, "rank {r} SIGKILLed itself"),
    "hang": (("RanksightRankStalled",), True, "rank {r} sleeps inside a step"),
    "slow-checkpoint": (("RanksightCheckpointSlow",), False, "rank 0 writes large O_DSYNC checkpoints"),
    "comm-heavy": (("RanksightCommBound",), False, "a wide model on a tiny batch: gradients dominate"),
}
JOB = "demo"
TERMINAL = ("kill-rank", "hang")  # faults after which the job cannot progress
STARTUP_SECONDS = 90.0  # at most this long from launch to the first step
SCRAPE_INTERVAL = "2s"
POLL_SECONDS = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the agent, a local Prometheus + Alertmanager (test-profile rules) and an instrumented "
                     "2-rank CPU DDP job with an optional injected fault; print the alerts that fired and "
                     "whether they name the injected cause.")
    p.epilog = ("exit status: 0 the injected cause was named (--fault none: no alert fired), 1 it was not, "
                "2 bad usage or a port/binary problem, 130 interrupted")
    p.add_argument("--fault", choices=FAULTS, default="none",
                   help="fault to inject (default none): slow-data, straggler, comm-heavy: one rank slow or a "
                        "comm-bound model; kill-rank, hang: one rank dies or hangs --fault-after s in; "
                        "slow-checkpoint: large synchronous checkpoints on rank 0")
    p.add_argument("--duration", type=float, default=120.0, metavar="S",
                   help="seconds of training, counted from the first step (default 120; startup adds ~10-20 s)")
    p.add_argument("--run-dir", default="run/demo", metavar="DIR",
                   help="logs, configs, data and checkpoints (default ./run/demo; emptied first)")
    p.add_argument("--rank-to-fault", type=int, default=1, choices=(0, 1), help="the misbehaving rank (default 1)")
    p.add_argument("--fault-after", type=float, default=10.0, metavar="S",
                   help="kill-rank / hang: seconds after the first step (default 10)")
    p.add_argument("--settle", type=float, default=45.0, metavar="S",
                   help="after the job, wait up to this long for the injected cause to fire (default 45)")
    p.add_argument("--config", metavar="FILE", help="YAML config file (thresholds; the test profile is applied)")


@dataclass
class SeenAlert:
    name: str
    labels: Dict[str, str]
    severity: str
    summary: str
    active: bool = False  # seen firing and not muted at least once
    muted_by: Set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        keys = ("job", "rank", "node", "gpu", "device", "path", "collector")
        return " ".join(f"{k}={self.labels[k]}" for k in keys if k in self.labels) or \
            f"instance={self.labels.get('instance', '?')}"


class AlertLog:
    """Alerts seen during the run, from Alertmanager (with inhibition) and Prometheus."""

    def __init__(self) -> None:
        self.seen: Dict[Tuple[Tuple[str, str], ...], SeenAlert] = {}
        self.steps: Dict[str, int] = {}  # rank -> highest steps_total Prometheus saw

    def _get(self, labels: Mapping[str, str], annotations: Mapping[str, str]) -> SeenAlert:
        key = tuple(sorted(labels.items()))
        if key not in self.seen:
            self.seen[key] = SeenAlert(labels.get("alertname", "?"), dict(labels), labels.get("severity", ""),
                                       annotations.get("summary", ""))
        return self.seen[key]

    def poll(self, stack: LocalStack) -> None:
        try:
            am_alerts = stack.am.alerts()
            prom_alerts = stack.prom.alerts()
            for r in stack.prom.query(f'max by (rank) ({catalog.STEPS}{{job="{JOB}"}})'):
                rank = r["metric"].get("rank", "?")
                self.steps[rank] = max(self.steps.get(rank, 0), int(float(r["value"][1])))
        except (ApiError, OSError, ValueError) as e:
            log.debug("alert poll failed: %s", e)
            return
        by_fp = {a["fingerprint"]: a["labels"].get("alertname", "?") for a in am_alerts}
        for a in am_alerts:
            s = self._get(a["labels"], a.get("annotations", {}))
            muters = a["status"].get("inhibitedBy") or []
            if muters:
                s.muted_by.update(by_fp.get(fp, "another alert") for fp in muters)
            elif a["status"].get("state") == "active":
                s.active = True
        for a in prom_alerts:  # firing in Prometheus but not (yet) in Alertmanager
            if a["state"] == "firing":
                self._get(a["labels"], a.get("annotations", {}))

    def named(self, fault: str, rank: int, primary_only: bool = False) -> Optional[SeenAlert]:
        """The alert that names the injected cause: seen firing unmuted (on the faulty rank where
        the fault is a rank's). The first listed name is preferred (RankDown over HeartbeatMissed)."""
        names, on_rank, _ = EXPECTED[fault]
        for name in names[:1] if primary_only else names:
            for s in self.seen.values():
                if s.name == name and s.active and (not on_rank or s.labels.get("rank") == str(rank)):
                    return s
        return None

    def problems(self) -> List[SeenAlert]:
        """Alerts that flag a problem (severity info is information, e.g. the global-batch lint line)."""
        return [s for s in self.seen.values() if s.severity != "info"]

    def report(self, out: TextIO) -> None:
        info = sorted(s.name for s in self.seen.values() if s.severity == "info")
        if not self.problems():
            print("alerts: none fired" + (f" (information only: {', '.join(info)})" if info else ""), file=out)
            return
        print("alerts that fired (test profile):", file=out)
        order = {e.alert: i for i, e in enumerate(triage.table(config.load(env={})))}
        for s in sorted(self.problems(), key=lambda s: (not s.active, order.get(s.name, 999), s.where)):
            if s.active:
                state = "FIRING"
            elif s.muted_by:
                state = "muted"
            else:
                state = "firing"  # seen in Prometheus only
            why = f"  [inhibited by {', '.join(sorted(s.muted_by))}]" if s.muted_by and not s.active else ""
            print(f"  {state:<7} {s.name:<28} {s.severity:<8} {s.where}{why}", file=out)
            if s.summary and s.active:
                print(f"          {s.summary}", file=out)
        if info:
            print(f"  information (severity info, not a problem): {', '.join(info)}", file=out)


class Job:
    """examples/train_ddp.py as 2 gloo ranks, each in its own session; rank 0 echoes to the console."""

    def __init__(self, script: Path, run_dir: Path, args: Sequence[str], env: Mapping[str, str], world: int = 2):
        self.procs: List[subprocess.Popen] = []
        self.threads: List[threading.Thread] = []
        master_port = str(free_port())
        for rank in range(world):
            e = dict(env, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                     GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=master_port)
            logf = open(run_dir / f"rank{rank}.log", "w", buffering=1)
            p = subprocess.Popen([sys.executable, "-u", str(script), *args], env=e, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                 start_new_session=True, preexec_fn=set_pdeathsig)
            t = threading.Thread(target=self._pump, args=(p.stdout, logf, rank == 0), daemon=True)
            t.start()
            self.procs.append(p)
            self.threads.append(t)

    @staticmethod
    def _pump(src: TextIO, logf: TextIO, echo: bool) -> None:
        with logf:
            for line in src:
                logf.write(line)
                if echo:
                    sys.stdout.write(line)
                    sys.stdout.flush()

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def returncodes(self) -> List[Optional[int]]:
        return [p.poll() for p in self.procs]

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
    for p in (Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py",
              Path.cwd() / "examples" / "train_ddp.py"):
        if p.is_file():
            return p
    raise StackError("examples/train_ddp.py not found: run from a ranksight checkout")


def run(args: argparse.Namespace) -> int:
    if args.duration <= 0:
        print("ranksight: error: --duration must be positive", file=sys.stderr)
        return 2
    started: List[object] = []

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)  # `kill` cleans up like Ctrl-C
    try:
        return _run(args, started)
    except StackError as e:
        print(f"ranksight: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nranksight demo: interrupted, stopping everything", flush=True)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
        for thing in reversed(started):
            try:
                thing.stop()  # type: ignore[attr-defined]
            except Exception as e:  # noqa: BLE001 - keep stopping the rest
                log.warning("stopping %s: %s", type(thing).__name__, e)


def _run(args: argparse.Namespace, started: List[object]) -> int:
    cfg = config.load(args.config, "test")
    script = _script()
    run_dir = Path(args.run_dir).resolve()
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    out = sys.stdout

    # a hang must be called within seconds, not the production 30 s
    agent = AgentProcess(run_dir, collectors=_collectors(),
                         env={"RANKSIGHT__agent__stall_min_seconds": "10", "RANKSIGHT__agent__stall_p99_factor": "5"})
    started.append(agent)
    agent.start()
    stack: Optional[LocalStack] = None
    try:
        stack = LocalStack(run_dir / "stack", targets=[agent.target], files=render_alert_files(cfg), cfg=cfg,
                           scrape_interval=SCRAPE_INTERVAL)
        started.append(stack)
        stack.start()
    except MissingBinary as e:
        stack = None
        print(f"ranksight demo: no local stack ({e}); running the agent and the job only", file=out)
    print(f"agent         {agent.url}/metrics   (ingest {agent.ingest})", file=out)
    if stack is not None:
        print(f"prometheus    {stack.prom_url}/alerts", file=out)
        print(f"alertmanager  {stack.am_url}", file=out)
    print(f"logs          {run_dir}", file=out, flush=True)

    job_args = ["--duration", f"{args.duration:g}", "--fault", args.fault, "--rank-to-fault", str(args.rank_to_fault),
                "--fault-after", f"{args.fault_after:g}", "--checkpoint-dir", str(run_dir / "checkpoints")]
    env = dict(os.environ, RANKSIGHT_AGENT=agent.ingest, RANKSIGHT_JOB=JOB, OMP_NUM_THREADS="1",
               PYTHONUNBUFFERED="1")
    if not _has_numpy():  # torch warns at import when numpy is absent; harmless for this job
        env["PYTHONWARNINGS"] = ",".join(filter(None, [env.get("PYTHONWARNINGS"),
                                                       "ignore:Failed to initialize NumPy:UserWarning"]))
    what = "no fault" if args.fault == "none" else f"fault {args.fault} on rank {args.rank_to_fault}"
    print(f"training      2 ranks for {args.duration:g} s with {what}; the alerts and the verdict follow the run",
          file=out, flush=True)
    job = Job(script, run_dir, job_args, env)
    started.append(job)
    alerts = AlertLog()
    launched = time.monotonic()
    first_step: Optional[float] = None
    while job.running():
        now = time.monotonic()
        if stack is not None:
            alerts.poll(stack)
        if first_step is None and _stepping(agent):
            first_step = now
        # --duration counts from the first step (imports and DDP setup take ~10 s on 2 cores)
        if now > (first_step if first_step is not None else launched + STARTUP_SECONDS) + args.duration + 30:
            break
        if args.fault in TERMINAL and stack is not None and alerts.named(args.fault, args.rank_to_fault, True):
            break  # the job cannot make progress any more and the cause is named
        time.sleep(POLL_SECONDS)
    codes = job.returncodes()
    if job.running():
        print(f"ranksight demo: stopping the job after {args.duration:g} s (ranks still running: "
              f"{[r for r, c in enumerate(codes) if c is None]})", file=out, flush=True)
    job.stop()
    codes = job.returncodes()

    if stack is None:
        print(f"\njob exit codes: {codes}", file=out)
        print("alerts: not evaluated (Prometheus and Alertmanager did not run)", file=out)
        return 0 if args.fault == "none" else 1
    if args.fault != "none" and not alerts.named(args.fault, args.rank_to_fault, primary_only=True):
        print(f"ranksight demo: waiting up to {args.settle:g} s for the alerts to settle", file=out, flush=True)
        wait_until(lambda: alerts.poll(stack) or alerts.named(args.fault, args.rank_to_fault, primary_only=True),
                   args.settle, POLL_SECONDS)
    alerts.poll(stack)
    print(file=out)
    print(f"job exit codes: {codes}", file=out)
    seen = ", ".join(f"rank {r}: {n}" for r, n in sorted(alerts.steps.items())) or "none"
    print(f"steps Prometheus saw: {seen}", file=out)
    alerts.report(out)
    if args.fault == "none":
        ok = not alerts.problems()
        print("verdict: healthy run, no alert fired" if ok else "verdict: alerts fired on a healthy run", file=out)
        return 0 if ok else 1
    names, _, what = EXPECTED[args.fault]
    injected = what.format(r=args.rank_to_fault)
    hit = alerts.named(args.fault, args.rank_to_fault)
    if hit is None:
        print(f"verdict: the injected cause ({args.fault}: {injected}) was NOT named; expected {' or '.join(names)}",
              file=out)
        return 1
    entry = triage.by_alert(cfg).get(hit.name)
    print(f"verdict: {hit.name} on {hit.where} names the injected cause ({args.fault}: {injected})", file=out)
    if entry is not None:
        print(f"         next: {entry.next_check}; runbook {entry.runbook}", file=out)
    return 0
