"""`ranksight demo --act`: a hang, ended by `ranksight act`, and the job back to training from its
last checkpoint.

Beside the demo's agent and stack it starts ``ranksight act`` on a free loopback port (its bearer
token in ``<run dir>/act-token``, its ledger in ``<run dir>/act-ledger.jsonl``; ``auto`` for
RanksightRankStalled and not a dry run, ``propose`` for the other verdicts) and renders Alertmanager's
config with a webhook receiver that posts every verdict to it. The job is ``examples/train_ddp.py``
under ``torchrun --max-restarts 3 --rdzv-backend c10d``, checkpointing every ``CHECKPOINT_EVERY`` steps
into the run dir (``--resume``: a restarted worker continues from the last checkpoint). After the
healthy phase rank ``--rank-to-fault`` sleeps at the top of a step, outside any collective (its peer
blocks in the next all-reduce). The agent marks it stalled, Prometheus fires RanksightRankStalled,
Alertmanager posts it, `ranksight act` SIGTERMs the job's workers on the node (their pids from the
agent's /api/v1/ranks), torchrun starts new ones and they resume.

Printed as it happens: each alert (``demo_alerts.AlertLog``), each ledger record of `ranksight act`
that is more than a page (its command and pids, then its recovery), the new workers the agent sees,
and the job's own lines (the hang, the resume and its first step). At the end: the fault to the first
step after the resume (timed on the job's lines as they arrive), the goodput split of the job and the
run report. Exit 0 when the job trained again after the resume and finished; 1 when it did not train
again within ``RECOVER_LIMIT`` seconds of the fault, or did not finish within ``FINISH_LIMIT`` seconds
after that.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO

from .. import catalog, config, triage
from ..common.plumbing import ApiError, Proc, free_port, http_get, last_line, set_pdeathsig, wait_until
from .demo_alerts import JOB, AlertLog, say
from .stack import AgentProcess, LocalStack, StackError

FAULT = "hang"  # the only fault --act takes, and the one it implies
RESTARTS = 3  # torchrun --max-restarts
FAULT_AFTER = 20.0  # the default healthy phase: a few checkpoints written before the hang
CHECKPOINT_EVERY = 50  # steps between the job's checkpoints (~2-3 s on 2 busy cores)
TRAIN_AFTER_RESUME = 15.0  # default: the job trains --fault-after + this many seconds in all
STARTUP_SECONDS = 90.0  # the launch to the first step, at most
RECOVER_LIMIT = 120.0  # the fault to the first step after the resume, at most
FINISH_LIMIT = 90.0  # the first step after the resume to the job's end, at most
STOP_SECONDS = 20.0  # SIGTERM to torchrun (it ends its workers), then SIGKILL
SAME_LINE_SECONDS = 5.0  # a line the other rank printed this recently goes to the log only
TOKEN_FILE = "act-token"  # in the run dir: Alertmanager's bearer token to act, and act's to the agent
ROUTES = "{critical: act, warning: act, info: act, lint: none}"
_TORCHRUN_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # torchrun's own log lines: the log file only
_EVENTS = {  # the job's lines the demo times (examples/train_ddp.py)
    "hang": re.compile(r"^train_ddp: rank (\d+) hangs"),
    "resume": re.compile(r"^train_ddp: resumed from checkpoint step (\d+)"),
    "again": re.compile(r"^train_ddp: step (\d+) trained: training again after the resume"),
}


def check(args: argparse.Namespace) -> Optional[str]:
    """The one-line error of a combination --act cannot run, or None (and --fault set to hang)."""
    if args.fault not in (None, FAULT):
        return f"--act ends a hang: it takes --fault {FAULT} (its default), not --fault {args.fault}"
    if args.strategy == "deepspeed":
        return ("--act: the job resumes from the checkpoint files of --strategy ddp or fsdp; DeepSpeed writes its "
                "own: use --strategy ddp or fsdp")
    args.fault = FAULT
    if args.fault_after is None:
        args.fault_after = FAULT_AFTER
    if args.duration is not None and args.duration <= args.fault_after:
        return (f"--act: --duration (the seconds the job trains in all) must exceed --fault-after "
                f"({args.fault_after:g})")
    return None


def agent_env(run_dir: Path) -> Dict[str, str]:
    """The agent's settings that turn on its end-workers endpoint for `ranksight act`: the bearer token
    (``<run dir>/act-token``, written here) that act sends to it, and Alertmanager to act; and the pids
    the demo's ranks claim over UDP trusted (the demo's own machine and user)."""
    token = run_dir / TOKEN_FILE
    token.write_text(secrets.token_hex(16) + "\n")
    token.chmod(0o600)
    return {"RANKSIGHT__agent__act_token_file": str(token), "RANKSIGHT__agent__act_trust_udp_pids": "true"}


class ActProcess:
    """A real `ranksight act` on a free loopback port, beside the demo's agent (which ends the job's
    workers when act asks, with the token of ``agent_env``)."""

    def __init__(self, run_dir: Path, agent: AgentProcess, config_path: Optional[str]):
        self.token_file = run_dir / TOKEN_FILE
        self.port = free_port()
        env = dict(os.environ, PYTHONUNBUFFERED="1", **{f"RANKSIGHT__act__{k}": v for k, v in {
            "listen": f"127.0.0.1:{self.port}", "token_file": str(self.token_file), "agent_url": agent.url,
            "agent_token_file": str(self.token_file),
            "mode": "propose", "modes": "{RanksightRankStalled: auto}", "dry_run": "false", "engine": "none",
            "kill_grace_seconds": "5", "ledger_file": str(run_dir / "act-ledger.jsonl")}.items()})
        if config_path:
            env["RANKSIGHT_CONFIG"] = config_path
        self.proc = Proc([sys.executable, "-m", "ranksight", "act", "--profile", "test"], run_dir / "act.log", env,
                         name="ranksight act", marker="ranksight")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def actions(self) -> List[Dict[str, Any]]:
        req = urllib.request.Request(self.url + "/api/v1/actions")
        req.add_header("Authorization", "Bearer " + self.token_file.read_text().strip())
        with urllib.request.urlopen(req, timeout=5) as r:  # noqa: S310 - our own loopback server
            return json.load(r)["actions"]

    def start(self, timeout: float = 30.0) -> "ActProcess":
        self.proc.start()

        def ready() -> bool:
            try:
                self.actions()
                return True
            except (OSError, ValueError):
                return self.proc.exited() is not None
        wait_until(ready, timeout, 0.1)
        if self.proc.exited() is not None or not ready():
            self.stop()
            raise StackError(f"ranksight act did not start: {last_line(self.proc.log_file)} "
                             f"(log: {self.proc.log_file})")
        return self

    def stop(self) -> None:
        self.proc.stop()


def start(args: argparse.Namespace, run_dir: Path, agent: AgentProcess, started: List[object]) -> Mapping:
    """Start `ranksight act`; the config whose Alertmanager posts every verdict to it."""
    act = ActProcess(run_dir, agent, args.config)
    started.append(act)
    act.start()
    args.act_server = act
    receivers = f"{{act: {{type: webhook, url: '{act.url}/alerts', credentials_file: '{act.token_file}'}}}}"
    env = dict(os.environ, RANKSIGHT__alerting__receivers=receivers, RANKSIGHT__alerting__routes=ROUTES,
               RANKSIGHT__durations__slow_rule_interval="2s")  # goodput recorded within a scrape of the end
    return config.load(args.config, "test", env=env)


def _children(pid: int) -> List[int]:
    """The processes whose parent is ``pid`` (torchrun's workers, in their own sessions)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


class ElasticJob:
    """``examples/train_ddp.py`` under torchrun: its output (both ranks and torchrun) in
    ``torchrun.log``; the ranks' lines go to the console too (a line both ranks print, such as a
    warning, once), and the job's lines that mark the hang, the resume and the first step after it
    are timed as they arrive (``events``)."""

    def __init__(self, script: Path, run_dir: Path, args: Sequence[str], env: Mapping[str, str]):
        self.events: Dict[str, tuple] = {}  # name -> (monotonic time, Unix time, the number in the line)
        self.log = open(run_dir / "torchrun.log", "w", buffering=1)
        self.lock = threading.Lock()
        self.echoed: Dict[str, float] = {}  # line -> when it last went to the console
        self.stopping = False  # once the demo stops torchrun, its output goes to the log only
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts",
               str(RESTARTS), "--monitor-interval", "0.5", str(script), *args]
        self.proc = subprocess.Popen(cmd, env=dict(env), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, start_new_session=True,
                                     preexec_fn=set_pdeathsig)
        self.threads = [threading.Thread(target=self._pump, args=(src,), daemon=True)
                        for src in (self.proc.stdout, self.proc.stderr)]
        for t in self.threads:
            t.start()

    def _pump(self, src: TextIO) -> None:
        for line in src:
            now = time.monotonic()
            line = line.rstrip("\n")
            with self.lock:
                self.log.write(line + "\n")
                for name, rx in _EVENTS.items():
                    m = rx.match(line)
                    if m and name not in self.events:
                        self.events[name] = (now, time.time(), int(m.group(1)))
                echo = not (self.stopping or _TORCHRUN_LOG.match(line)) and \
                    now - self.echoed.get(line, -1e9) > SAME_LINE_SECONDS
                if echo:
                    self.echoed[line] = now
            if echo:
                say(line)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        workers = _children(self.proc.pid) if self.running() else []
        self.stopping = True
        if self.running():
            self.proc.send_signal(signal.SIGTERM)  # torchrun ends its workers
            if not wait_until(lambda: not self.running(), STOP_SECONDS, 0.1):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        for pid in workers:  # none is left behind, even when torchrun could not end it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for t in self.threads:
            t.join(2.0)
        self.log.close()


def _where(labels: Mapping[str, str]) -> str:
    return " ".join(f"{k}={labels[k]}" for k in ("job", "rank", "node") if k in labels)


class Watch:
    """What the demo prints while the job runs, beside the alerts: the ledger's records of verdicts
    with an action (not a page), and the job's new workers as the agent lists them."""

    def __init__(self, act: ActProcess, agent: AgentProcess) -> None:
        self.act, self.agent = act, agent
        self.told: Dict[str, str] = {}  # record id -> the state printed
        self.records: Dict[str, Dict[str, Any]] = {}
        self.pids: Optional[List[int]] = None  # the job's worker pids the agent lists
        self.restarts = 0

    def tick(self, t: str) -> None:
        self._workers(t)
        try:
            records = self.act.actions()
        except (OSError, ValueError):
            return
        for r in records:
            if r["action"] == triage.ACT_PAGE or self.told.get(r["id"]) == r["state"]:
                continue
            self.told[r["id"]] = r["state"]
            self.records[r["id"]] = r
            if r["state"] == "recovered":
                say(f"ranksight demo {t:>6}: act     {r['action']} {r['id']} {r['state']}: {r['detail']}")
                continue
            pids = f", pids {r['pids']}" if r["pids"] else ""
            say(f"ranksight demo {t:>6}: act     {r['verdict']} on {_where(r['labels'])}: {r['action']} "
                f"({r['mode']}) {r['state']}{pids}" + (f" ({r['detail']})" if r["detail"] else ""))
            if r["command"]:
                say(f"ranksight demo {t:>6}: act     command: {r['command']}")

    def _workers(self, t: str) -> None:
        try:
            ranks = json.loads(http_get(self.agent.url + "/api/v1/ranks"))["ranks"]
        except (OSError, ValueError, KeyError):
            return
        pids = sorted(int(x["pid"]) for x in ranks if x.get("job") == JOB and x.get("up") and not x.get("finished"))
        if len(pids) == 2 and pids != self.pids:
            # a set only replaces the last one when all of it is new: while the agent has seen one new
            # worker's hello and not yet the other's, it lists one new and one old pid
            if self.pids is None:
                self.pids = pids
            elif not set(pids) & set(self.pids):
                self.restarts += 1
                say(f"ranksight demo {t:>6}: restart torchrun started new workers, pids {pids} (were {self.pids}; "
                    f"restart {self.restarts} of at most {RESTARTS})")
                self.pids = pids


def job_args(args: argparse.Namespace, run_dir: Path) -> List[str]:
    duration = args.duration if args.duration is not None else args.fault_after + TRAIN_AFTER_RESUME
    return ["--duration", f"{duration:g}", "--fault", FAULT, "--rank-to-fault", str(args.rank_to_fault),
            "--fault-after", f"{args.fault_after:g}", "--checkpoint-dir", str(run_dir / "checkpoints"),
            "--checkpoint-every", str(CHECKPOINT_EVERY), "--resume", "--strategy", args.strategy]


def run(args: argparse.Namespace, run_dir: Path, agent: AgentProcess, stack: LocalStack, script: Path,
        env: Mapping[str, str], started: List[object], stepping: Any) -> int:
    """The job under torchrun until it ends or a limit passes; the summary; the exit status."""
    job = ElasticJob(script, run_dir, job_args(args, run_dir), env)
    started.append(job)
    alerts, watch = AlertLog(), Watch(args.act_server, agent)
    alerts.fault_planned = True
    launched, first, why = time.monotonic(), None, ""
    while job.running():
        now = time.monotonic()
        if first is None and stepping(agent):
            first = alerts.t0 = now
        ev = dict(job.events)
        alerts.fault_started = alerts.fault_started or "hang" in ev
        alerts.tick(stack)
        watch.tick(f"t+{now - alerts.t0:.0f}s" if alerts.t0 is not None else "startup")
        if first is None and now - launched > STARTUP_SECONDS:
            why = f"the job took no step within {STARTUP_SECONDS:g} s of its launch"
        elif "hang" in ev and "again" not in ev and now - ev["hang"][0] > RECOVER_LIMIT:
            why = f"the job did not train again within {RECOVER_LIMIT:g} s of the fault"
        elif "again" in ev and now - ev["again"][0] > FINISH_LIMIT:
            why = f"the job did not finish within {FINISH_LIMIT:g} s of training again"
        elif first is not None and "hang" not in ev and now - first > args.fault_after + 60:
            why = f"no hang within {args.fault_after + 60:g} s of the first step"
        if why:
            say(f"ranksight demo: {why}: stopping the job")
            break
        time.sleep(1.0)
    job.stop()
    return _summary(args, stack, alerts, watch, job, why)


def _summary(args: argparse.Namespace, stack: LocalStack, alerts: AlertLog, watch: Watch, job: ElasticJob,
             why: str) -> int:
    ev, bad = job.events, args.rank_to_fault
    if "hang" in ev and alerts.named(FAULT, bad) is None:
        wait_until(lambda: alerts.tick(stack) or alerts.named(FAULT, bad) is not None, args.settle, 2.0)
    time.sleep(3.0)  # a scrape and a goodput evaluation after the last step
    alerts.tick(stack)
    watch.tick("end")
    say()
    say(f"torchrun exit code: {job.proc.returncode} (workers restarted {watch.restarts} time(s))")
    seen = ", ".join(f"rank {r}: {n}" for r, n in sorted(alerts.steps.items())) or "none"
    say(f"steps Prometheus saw: {seen}")
    alerts.report(sys.stdout)
    acted = [r for r in watch.records.values() if r["action"] == triage.ACT_RESTART]
    say("actions of ranksight act (its ledger):" if watch.records else "actions of ranksight act: none")
    for r in watch.records.values():
        pids = f", pids {r['pids']}" if r["pids"] else ""
        say(f"  {r['id']} {r['verdict']:<22} {_where(r['labels'])}  {r['action']} ({r['mode']}): {r['state']}{pids}")
    hit = alerts.named(FAULT, bad)
    ok = "again" in ev and job.proc.returncode == 0 and not why
    if hit is not None:
        say(f"verdict: {hit.name} on {hit.where} named the hang (rank {bad} sleeps inside a step)")
    else:
        say(f"verdict: the hang on rank {bad} was NOT named (expected RanksightRankStalled)")
    if acted:
        r = acted[0]
        say(f"         ranksight act ended the job's workers, pids {r['pids']} ({r['state']}); torchrun restarted "
            "them")
    if "resume" in ev:
        say(f"         the job resumed from checkpoint step {ev['resume'][2]}")
    if "hang" in ev and "again" in ev:
        to_act = f"; ranksight act acted {acted[0]['acted'] - ev['hang'][1]:.1f} s after it" \
            if acted and acted[0].get("acted") else ""
        say(f"fault to training again: {ev['again'][0] - ev['hang'][0]:.1f} s (the hang to the first step after "
            f"the resume, step {ev['again'][2]}{to_act})")
    _goodput(stack)
    if not ok:
        say(f"ranksight demo --act: FAILED: {why or 'the job did not train again after the resume and finish'}")
    return 0 if ok else 1


def _goodput(stack: LocalStack) -> None:
    """The job's goodput split (seconds per rank), productive first, from the recording rules."""
    try:
        rows = stack.prom.query(f'last_over_time({triage.REC["goodput_split"]}{{job="{JOB}"}}[1m])')
    except (ApiError, OSError, ValueError) as e:
        say(f"goodput       not read: {e}")
        return
    split = {r["metric"].get("category", "?"): float(r["value"][1]) for r in rows}
    if not split or sum(split.values()) <= 0:
        say("goodput       not recorded yet")
        return
    wall = sum(split.values())
    parts = [f"{c} {split[c]:.1f}" for c in catalog.GOODPUT_CATEGORIES if split.get(c, 0.0) >= 0.05]
    share = split.get("productive", 0.0) / wall
    say(f"goodput       {share:.0%} of {wall:.0f} s per rank; seconds: {', '.join(parts)}")
