"""The fault suite's runner: one shared Prometheus + Alertmanager (test-profile rules, 1 s
scrape and evaluation), one node agent for the single-host cases, two network-namespace
hosts (each with its own agent) for the two-host cases, and a real 2-rank gloo DDP job per
case, each with its own job name.

A case is watched, not just checked at the end: the runner records when the expected
alert first shows in Alertmanager (detection time from the fault's start), the
Alertmanager status of the symptoms, every other alert of the job, and what
``ranksight triage`` says. The tests then assert on that record. Cases run in small
groups; a group starts when its first test asks for it, so ``-k`` runs only what it needs.
"""
from __future__ import annotations

import json
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from e2e_harness import (DETECT_EXTRA_S, Agent, AgentProcess, Job, LocalStack, am_find, host_agent, start_stack,
                         cfg_test_profile, triage_cli)
from ranksight.common.plumbing import GiveUp, wait_for
from ranksight.config import duration_seconds
from e2e_netns import Hosts

log = logging.getLogger("tests.e2e")

HERE = Path(__file__).resolve().parent
STARTUP_TIMEOUT = 90.0  # launch -> first step seen by Prometheus (torch import, gloo rendezvous)
SYMPTOM_WAIT = 30.0  # after the cause fires, how long the symptoms may take to fire (their own for:)
# A verdict on a rank's step shares (RanksightStraggler, RanksightCommBound) can first fire a
# whole rate window of steps plus its for: after a job's first step (30 + 10 s in the test profile).
_TEST_CFG = cfg_test_profile()
CROSS_RANK_FIRST_S = (duration_seconds(_TEST_CFG["windows"]["rate"])
                      + duration_seconds(_TEST_CFG["durations"]["straggler"]))
# a healthy run is watched this long after its first step: past that time, with scrapes and
# evaluations to spare
HEALTHY_WATCH = CROSS_RANK_FIRST_S + 15
FAULT_AFTER = 3.0  # kill-rank / hang: seconds after the first step
POLL = 0.5
SETTLE_LIMIT = 10.0  # at most this long for Alertmanager to hold what Prometheus fires (sent after each 1 s evaluation)


@dataclass(frozen=True)
class Case:
    name: str
    fault: str  # examples/train_ddp.py --fault
    cause: str  # the alert that must fire (and that triage must name)
    where: Mapping[str, str]  # labels the cause must carry (rank / node)
    symptoms: Tuple[Tuple[str, Mapping[str, str]], ...] = ()  # must fire and show as inhibited
    args: Tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    fault_after: float = 0.0
    two_hosts: bool = False
    drop: float = 0.0  # packet loss probability on the link (two-host cases)
    train: Optional[Path] = None
    healthy: bool = False
    dashboards: bool = False  # evaluate every dashboard query for this job while it runs
    hold: float = 0.0  # keep watching this long after the symptoms (a false page that comes late)
    also: Tuple[Tuple[str, Mapping[str, str]], ...] = ()  # compound faults: further causes, loud too
    sole: bool = False  # one cause with side effects on other signals: it alone is ever loud, triage names it alone
    world: int = 2  # ranks (single-host cases)
    detect_limit: float = 60.0  # the cause is active in Alertmanager within this many seconds of the fault


@dataclass
class Observation:
    case: str
    job: str = ""
    error: str = ""
    logs: str = ""
    first_step_s: float = float("nan")  # launch -> first step seen
    detect_s: float = float("nan")  # fault start -> cause alert in Alertmanager
    cause_alerts: List[Dict[str, Any]] = field(default_factory=list)
    symptoms: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)
    also: Dict[str, List[Dict[str, Any]]] = field(default_factory=dict)  # compound faults: the other causes
    job_alerts: List[Dict[str, Any]] = field(default_factory=list)  # every Alertmanager alert of the job, at the end
    fired: List[Dict[str, str]] = field(default_factory=list)  # healthy: any firing alert seen while watching
    triage_rc: Optional[int] = None
    triage: Dict[str, Any] = field(default_factory=dict)
    triage_text: str = ""
    triage_stderr: str = ""
    dashboards: List[Tuple[str, str, str, int]] = field(default_factory=list)  # (file, title, expr, series)
    seconds: float = 0.0  # wall time of the case
    timeline: List[str] = field(default_factory=list)  # alerts of the job as Alertmanager showed them
    seen: set = field(default_factory=set)
    cause_gaps: List[float] = field(default_factory=list)  # seconds after the fault when the cause was not active

    def explain(self) -> str:
        return (f"case {self.case} (job {self.job}): {self.error}\n"
                f"alerts since the fault: {', '.join(self.timeline) or 'none'}\n"
                f"triage rc={self.triage_rc}\n{self.triage_text}\n{self.triage_stderr}\n{self.logs}")


R0, R1 = {"rank": "0"}, {"rank": "1"}
HOST_A, HOST_B = "e2e-host-a", "e2e-host-b"

STRAGGLER_DETECT_S = CROSS_RANK_FIRST_S + 10  # first step -> RanksightStraggler in Alertmanager

CASES: Dict[str, Case] = {c.name: c for c in (
    Case("slow-data", "slow-data", "RanksightDataloaderBound", R1,
         symptoms=(("RanksightCommBound", R0),),
         # 6 ms per sequence read: rank 1 waits ~half its step on data, rank 0 ~half in the all-reduce
         args=("--slow-data-seconds", "0.006")),
    # The straggler matrix: the extra compute is a share of the rank's own measured compute per step,
    # so each case means the same on a faster or slower machine. Each is named within 50 s and stays
    # active while it is watched (hold): RanksightStraggler judges a rank once it has stepped for a
    # whole rate window (30 s in the test profile), then waits its for: (10 s).
    # strong: twice as slow; its peer waits about half of every step (CommBound, muted by it)
    Case("straggler", "straggler", "RanksightStraggler", R1, symptoms=(("RanksightCommBound", R0),),
         args=("--straggler-extra", "1.0"), detect_limit=STRAGGLER_DETECT_S, hold=15.0),
    # mild: 25% slower; in a job of 2 ranks and of 4 (the peers' median is then of three). Four
    # single-threaded ranks on 2 cores would share the CPU and read each other's slices as busy time
    # (healthy ranks 0.86-1.12x of each other, the straggler's extra CPU diluted to 1.1-1.2x), so the
    # 4-rank job is device-bound as on GPUs: 80 ms of each step is simulated device time (the host
    # waits), and the straggler's device is 25% slower along with its host compute.
    Case("straggler-mild", "straggler", "RanksightStraggler", R1, args=("--straggler-extra", "0.25"),
         detect_limit=STRAGGLER_DETECT_S, hold=15.0),
    Case("straggler-mild-4", "straggler", "RanksightStraggler", R1, world=4, detect_limit=STRAGGLER_DETECT_S,
         hold=15.0,
         args=("--straggler-extra", "0.25", "--device-ms", "80", "--hidden", "128", "--batch-seqs", "8")),
    # a straggler (1.5x) on a comm-heavy model (the comm-wide shape): even the straggler spends over
    # 30% of its step in collectives, so the comm share pages too, as the job's own cost (comm="own")
    Case("straggler-comm", "straggler", "RanksightCommBound", {},
         also=(("RanksightStraggler", R1),), detect_limit=STRAGGLER_DETECT_S, hold=15.0,
         args=("--straggler-extra", "0.5", "--hidden", "1280", "--batch-seqs", "1", "--seq-len", "32",
               "--optimizer", "sgd", "--checkpoint-every", "0")),
    Case("comm-heavy", "comm-heavy", "RanksightCommBound", {}),
    # Comm-bound by shape, not by fault: wide layers, a small batch, a 25-60 ms step with comm over half
    # of it on both ranks. Start-up steps and scheduling noise move the ranks' busy times apart (one
    # rank read 1.1-1.24x for the first 10-20 s); that must not page as a straggler (which would mute
    # the comm-bound page). CommBound judges a rank once it has stepped for a whole rate window, as
    # RanksightStraggler does, so both have the straggler matrix's bound; watched 40 s past detection.
    Case("comm-wide", "none", "RanksightCommBound", {}, hold=40.0, detect_limit=STRAGGLER_DETECT_S,
         args=("--hidden", "1280", "--batch-seqs", "1", "--seq-len", "32", "--optimizer", "sgd",
               "--checkpoint-every", "0")),
    Case("kill-rank", "kill-rank", "RanksightRankDown", R1, symptoms=(("RanksightHeartbeatMissed", R1),),
         fault_after=FAULT_AFTER),
    # the stack is read at half the suite's 3 s stall floor, as the default profile reads it at half of 30 s
    Case("hang", "hang", "RanksightRankStalled", R1, symptoms=(("RanksightRankBlocked", R0),),
         fault_after=FAULT_AFTER, args=("--hang-seconds", "300"), env={"RANKSIGHT__hooks__stack_after_seconds": "1.5"}),
    # rank 0 calls all_reduce where rank 1 calls broadcast, at the same sequence number: both block
    Case("desync", "desync", "RanksightCollectiveDesync", {"pg": "default_pg"},
         symptoms=(("RanksightRankBlocked", R0), ("RanksightRankBlocked", R1)), fault_after=FAULT_AFTER,
         train=HERE / "train_desync.py", env={"RANKSIGHT__hooks__stack_after_seconds": "1.5"}),
    # 96 MB per O_DSYNC save (the example's default is 48): rank 0 spends ~25% of wall time writing, so
    # rank 1's wait for it in the next all-reduce clearly crosses the 30% comm share (at 48 MB it read
    # 27% in one CI run: the symptom never fired, so there was nothing to inhibit)
    Case("slow-checkpoint", "slow-checkpoint", "RanksightCheckpointSlow", R0,
         symptoms=(("RanksightCommBound", R1),), args=("--checkpoint-mb", "96")),
    # Compound faults. Two independent causes at once: both are named, each mutes its own symptoms.
    Case("data+checkpoint", "slow-data", "RanksightDataloaderBound", R1,
         also=(("RanksightCheckpointSlow", R0),), symptoms=(("RanksightCommBound", R0),),
         args=("--slow-data-seconds", "0.006", "--checkpoint-mb", "96", "--checkpoint-sync", "--checkpoint-every", "10")),
    Case("straggler+checkpoint", "straggler", "RanksightCheckpointSlow", R0, also=(("RanksightStraggler", R1),),
         args=("--checkpoint-mb", "96", "--checkpoint-sync", "--checkpoint-every", "10")),
    # One cause with a side effect on another signal: rank 0 writes one checkpoint for about a minute
    # (24 MB at 0.4 MB/s) and rank 1 waits in the all-reduce meanwhile, past its stall limit. The
    # write pages once it passes the write limit; the blocked peer is muted by it, and nothing else
    # of the job is loud at any time (the watch ends while the write still runs).
    Case("long-checkpoint", "long-checkpoint", "RanksightCheckpointSlow", R0,
         symptoms=(("RanksightRankBlocked", R1),), fault_after=FAULT_AFTER, hold=5.0, sole=True,
         env={"RANKSIGHT__hooks__stack_after_seconds": "1.5"}),
    Case("healthy", "none", "", {}, two_hosts=True, healthy=True, dashboards=True, args=("--checkpoint-every", "40")),
    Case("packet-loss", "none", "RanksightTcpRetransmits", {"node": HOST_A},
         symptoms=(("RanksightCommBound", {"node": HOST_A}), ("RanksightCommBound", {"node": HOST_B})),
         two_hosts=True, drop=0.12, dashboards=True),
)}

# Run together; groups run one after the other. kill-rank and hang go idle after 3 s and the
# slow-data job mostly sleeps in its loader, so they share a group; the CPU-bound cases run
# alone on the 2 cores so that one job does not distort another's step-time shares.
GROUPS: Tuple[Tuple[str, ...], ...] = (
    ("slow-data", "kill-rank", "hang", "desync"), ("straggler",), ("straggler-mild",), ("straggler-mild-4",),
    ("straggler-comm",), ("comm-heavy",), ("comm-wide",), ("slow-checkpoint",),
    ("data+checkpoint",), ("straggler+checkpoint",), ("long-checkpoint",),
    ("healthy", "packet-loss"),  # the two-host cases, one after the other on the same hosts
)


# The suite's stall floor is 3 s where the default config's is 30 (hangs of seconds, not minutes); the
# one-write limit of RanksightCheckpointSlow scales with it, 6 s for 60, so that a write which keeps
# the peers blocked past their stall limit pages as the cause before the blocked peers page, as it
# does with the default limits (a write pages at 60 s, a blocked peer at 30 s + the 1m `for:`).
# The rules and `ranksight triage` both read it.
SUITE_CONFIG = {"RANKSIGHT__thresholds__checkpoint_write_seconds": "6"}


def _labels_match(labels: Mapping[str, str], want: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


class Suite:
    """Shared stack and agents; runs case groups on demand and keeps their observations."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.cfg = cfg_test_profile(SUITE_CONFIG)
        self.stack: Optional[LocalStack] = None
        self.agent: Optional[AgentProcess] = None
        self.results: Dict[str, Observation] = {}
        self.lock = threading.Lock()
        self.t0 = time.monotonic()

    # -------------------------------------------------------------- lifecycle
    def start(self) -> "Suite":
        self.stack = start_stack(self.dir / "stack", self.cfg)
        self.agent = host_agent(self.dir, "host", env=self._agent_env())
        self.stack.set_targets([self.agent.target])
        return self

    @staticmethod
    def _agent_env() -> Dict[str, str]:
        # the suite's hangs last seconds, not minutes: the default 30 s stall floor is for production
        return {"RANKSIGHT__agent__stall_min_seconds": "3"}

    def close(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        if self.stack is not None:
            self.stack.stop()

    # -------------------------------------------------------------- entry point for tests
    def observe(self, name: str) -> Observation:
        with self.lock:
            if name not in self.results:
                group = next(g for g in GROUPS if name in g)
                self._run_group(group)
            return self.results[name]

    def _run_group(self, group: Sequence[str]) -> None:
        if CASES[group[0]].two_hosts:
            self._run_two_hosts(group)
            return
        threads = [threading.Thread(target=self._guard, args=(n, self._run_single_host), name=n) for n in group]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _guard(self, name: str, fn: Callable[[Case, Observation], None]) -> None:
        obs = Observation(name)
        start = time.monotonic()
        try:
            fn(CASES[name], obs)
        except BaseException as e:  # recorded; the test reports it with the logs
            obs.error = obs.error or f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
        obs.seconds = time.monotonic() - start
        self.results[name] = obs

    # -------------------------------------------------------------- single host
    def _run_single_host(self, case: Case, obs: Observation) -> None:
        assert self.agent is not None
        job = Job(name=f"e2e-{case.name}", workdir=self.dir, args=self._args(case), world=case.world,
                  agent_ingest=(self.agent.ingest,), env=dict(case.env), train=case.train or Job.train)
        self._run_job(case, job, obs)

    @staticmethod
    def _args(case: Case) -> List[str]:
        a = ["--duration", "150", *case.args]
        if case.fault != "none":
            a += ["--fault", case.fault]
        if case.fault_after:
            a += ["--fault-after", str(case.fault_after)]
        return a

    def _run_job(self, case: Case, job: Job, obs: Observation, nodes: Sequence[str] = (),
                 inject: Optional[Callable[[], None]] = None) -> None:
        obs.job = job.name
        job.start()
        try:
            if case.healthy:
                self._watch_healthy(case, job, obs, nodes)
            else:
                self._watch_fault(case, job, obs, nodes, inject)
        finally:
            obs.logs = job.logs()
            job.stop()

    def _first_step(self, job: Job) -> float:
        """Monotonic time of the job's first step, at the latest: the scrape that saw it minus one interval."""
        assert self.stack is not None

        dead_since: Dict[int, float] = {}

        def seen() -> bool:
            if self.stack.prom.query(f'ranksight_steps_total{{job="{job.name}"}} > 0'):
                return True
            # a rank that stops FAULT_AFTER s after its first step may go before the store shows that step
            # (the VictoriaMetrics layout's writes land a few seconds late): give up once that lag has passed
            for i, p in enumerate(job.procs):
                if not p.alive() and time.monotonic() - dead_since.setdefault(i, time.monotonic()) > 1.0 + DETECT_EXTRA_S:
                    raise GiveUp(f"rank {i} of {job.name} exited before its first step")
            return False
        wait_for(seen, STARTUP_TIMEOUT, f"{job.name}: first step in Prometheus", POLL)
        return time.monotonic() - 1.0

    def _watch_fault(self, case: Case, job: Job, obs: Observation, nodes: Sequence[str],
                     inject: Optional[Callable[[], None]] = None) -> None:
        assert self.stack is not None
        first = self._first_step(job)
        obs.first_step_s = first - job.launched
        fault_start = first + case.fault_after
        if inject is not None:  # a fault the test injects from outside, once the job trains
            inject()
            fault_start = time.monotonic()
        want = {"job": job.name, **case.where}

        def active(alerts: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
            return [a for a in alerts if a["labels"]["alertname"] == case.cause
                    and all(a["labels"].get(k) == v for k, v in want.items()) and not a["status"]["inhibitedBy"]]

        def cause() -> List[Dict[str, Any]]:
            alerts = self._job_alerts(job.name)
            self._note(obs, alerts, fault_start)
            return active(alerts)
        try:
            obs.cause_alerts = wait_for(cause, case.detect_limit + DETECT_EXTRA_S + 15 - (time.monotonic() - fault_start),
                                         f"{case.cause} {want} in Alertmanager", POLL)
            obs.detect_s = time.monotonic() - fault_start
        except AssertionError as e:
            obs.error = str(e)
            obs.job_alerts = self._job_alerts(job.name)
            return
        def find(alert: str, sel: Mapping[str, str]) -> List[Dict[str, Any]]:
            alerts = self._job_alerts(job.name)
            self._note(obs, alerts, fault_start)  # the timeline misses nothing while the symptoms come
            if not active(alerts):  # the fault goes on: its cause must stay active
                obs.cause_gaps.append(round(time.monotonic() - fault_start, 1))
            return [a for a in alerts if a["labels"]["alertname"] == alert and _labels_match(a["labels"], sel)]

        # a peer's RanksightCommBound is judged once it has stepped for a whole rate window, as a
        # straggler is: not before the straggler matrix's bound from the first step
        deadline = max(time.monotonic() + SYMPTOM_WAIT, first + STRAGGLER_DETECT_S + 10)
        also_deadline = fault_start + case.detect_limit + DETECT_EXTRA_S + 15  # each further cause has the same bound as the first
        for alert, labels in case.also:  # the other causes of a compound fault: loud
            sel = {"job": job.name, **labels}
            key = f"{alert} {json.dumps(labels, sort_keys=True)}"
            try:
                obs.also[key] = wait_for(lambda: [a for a in find(alert, sel) if not a["status"]["inhibitedBy"]],
                                          max(1.0, also_deadline - time.monotonic()),
                                          f"cause {alert} {sel} active in Alertmanager", POLL)
            except AssertionError:
                obs.also[key] = am_find(self.stack, alert, **sel)
        for alert, labels in case.symptoms:
            sel = {"job": job.name, **labels}
            key = f"{alert} {json.dumps(labels, sort_keys=True)}"
            try:
                obs.symptoms[key] = wait_for(lambda: [a for a in find(alert, sel) if a["status"]["inhibitedBy"]],
                                              max(1.0, deadline - time.monotonic()),
                                              f"symptom {alert} {sel} inhibited in Alertmanager", POLL)
            except AssertionError:
                obs.symptoms[key] = am_find(self.stack, alert, **sel)  # absent or not inhibited: the test says which
        hold_until = time.monotonic() + case.hold
        while time.monotonic() < hold_until:  # the timeline keeps every alert seen meanwhile
            find(case.cause, want)
            time.sleep(POLL)
        obs.job_alerts = self._consistent_triage(job.name, obs, fault_start)
        if case.dashboards:
            obs.dashboards = self._dashboard_queries(job.name, nodes)

    def _consistent_triage(self, job: str, obs: Observation, t0: float) -> List[Dict[str, Any]]:
        """Alertmanager's alerts of the job and `ranksight triage` of one moment: settled before and
        after the triage, the same both times. A job-wide cause's second instance (the other rank)
        can fire while the triage runs; the triage then read a state that Alertmanager's first
        snapshot predates, so both are read again (at most three times)."""
        def state(alerts: List[Dict[str, Any]]) -> set:
            return {(tuple(sorted(a["labels"].items())), bool(a["status"]["inhibitedBy"])) for a in alerts}

        held = self._settled_alerts(job, obs, t0)
        for _ in range(3):
            self._triage(job, obs)
            after = self._settled_alerts(job, obs, t0)
            if state(after) == state(held):
                return after
            held = after
        return held

    @staticmethod
    def _note(obs: Observation, alerts: List[Dict[str, Any]], t0: float) -> None:
        """Timeline of the job's alerts in Alertmanager (first time each is seen in each state)."""
        now = time.monotonic() - t0
        for a in alerts:
            lab = a["labels"]
            key = (lab["alertname"], lab.get("rank", lab.get("node", "")), bool(a["status"]["inhibitedBy"]))
            if key not in obs.seen:
                obs.seen.add(key)
                obs.timeline.append(f"{now:+6.1f}s {key[0]}[{key[1]}]{' inhibited' if key[2] else ''}")

    def _settled_alerts(self, job: str, obs: Observation, t0: float) -> List[Dict[str, Any]]:
        """The job's alerts in Alertmanager once it holds every alert Prometheus fires for the job
        (at most SETTLE_LIMIT): Prometheus sends a newly firing alert after its evaluation, so for a
        moment `ranksight triage`, which reads Prometheus, can name an instance (the other rank of
        a job-wide cause) that Alertmanager does not hold yet."""
        assert self.stack is not None
        end = time.monotonic() + SETTLE_LIMIT
        while True:
            held = self._job_alerts(job)
            self._note(obs, held, t0)
            firing = [a["labels"] for a in self.stack.prom.alerts()
                      if a["state"] == "firing" and a["labels"].get("job") == job]
            if time.monotonic() >= end or all(any(f.items() <= a["labels"].items() for a in held) for f in firing):
                return held
            time.sleep(POLL)

    def _job_alerts(self, job: str) -> List[Dict[str, Any]]:
        assert self.stack is not None
        return [a for a in self.stack.am.alerts() if a["labels"].get("job") == job]

    def _triage(self, job: str, obs: Observation) -> None:
        assert self.stack is not None
        args = ("--profile", "test", "--job", job)
        runs: Dict[str, Any] = {}
        both = [threading.Thread(target=lambda k=k, a=a: runs.__setitem__(
                    k, triage_cli(self.stack.prom_url, *a, env=SUITE_CONFIG)))
                for k, a in (("json", args + ("--json",)), ("text", args))]
        for t in both:
            t.start()
        for t in both:
            t.join()
        r, text = runs["json"], runs["text"]
        obs.triage_rc = r.returncode
        obs.triage_stderr = r.stderr
        try:
            obs.triage = json.loads(r.stdout) if r.stdout else {}
        except ValueError:
            obs.triage = {"unparsable": r.stdout[-2000:]}
        obs.triage_text = text.stdout
        (self.dir / f"triage-{job}.txt").write_text(f"$ ranksight triage --job {job} (exit {text.returncode})\n"
                                                    f"{text.stdout}{text.stderr}")
        log.info("triage of %s (exit %d):\n%s", job, text.returncode, text.stdout)

    # -------------------------------------------------------------- healthy
    def _watch_healthy(self, case: Case, job: Job, obs: Observation, nodes: Sequence[str]) -> None:
        assert self.stack is not None
        first = self._first_step(job)
        obs.first_step_s = first - job.launched
        seen: Dict[Tuple, Dict[str, str]] = {}
        end = first + HEALTHY_WATCH
        while time.monotonic() < end:  # any alert of this job or its hosts that fires while it runs
            for a in self.stack.prom.alerts():
                lab = a["labels"]
                if a["state"] == "firing" and (lab.get("job") == job.name or lab.get("node") in nodes):
                    seen[tuple(sorted(lab.items()))] = lab
            for i, p in enumerate(job.procs):
                if not p.alive():
                    raise AssertionError(f"rank {i} of the healthy job exited early")
            time.sleep(POLL)
        obs.fired = list(seen.values())
        obs.job_alerts = self._job_alerts(job.name)
        self._triage(job.name, obs)
        if case.dashboards:
            obs.dashboards = self._dashboard_queries(job.name, nodes)

    def _dashboard_queries(self, job: str, nodes: Sequence[str]) -> List[Tuple[str, str, str, int]]:
        from ranksight.dashboards.generate import queries, substitute

        assert self.stack is not None
        out = []
        for fname, title, expr in queries(self.cfg):
            q = substitute(expr, job=[job], node=list(nodes) or ".*", rank=".*", rate_interval="15s", range_="5m")
            out.append((fname, title, expr, len(self.stack.prom.query(q))))
        return out

    # -------------------------------------------------------------- two hosts
    def _run_two_hosts(self, group: Sequence[str]) -> None:
        assert self.stack is not None and self.agent is not None
        with Hosts([HOST_A, HOST_B]) as hosts:
            agents: List[Agent] = []
            try:
                for h in hosts.hosts:
                    agents.append(Agent(self.dir, h.hostname, argv_prefix=hosts.argv(h, []), listen_host="0.0.0.0",
                                        scrape_host=h.mgmt_addr, env=self._agent_env()).wait_ready())
                self.stack.set_targets([self.agent.target] + [a.target for a in agents])
                for name in group:
                    self._guard(name, lambda case, obs: self._run_two_host_case(case, obs, hosts, agents))
            finally:
                try:  # before the hosts go: no scrape of a vanished agent, no RanksightExporterDown
                    self.stack.set_targets([self.agent.target])
                finally:
                    for a in agents:
                        a.stop()

    def _run_two_host_case(self, case: Case, obs: Observation, hosts: Hosts, agents: List[Agent]) -> None:
        a, b = hosts.hosts
        inject = (lambda: hosts.drop_incoming(b, case.drop)) if case.drop else None  # B loses what A sends
        try:
            job = Job(name=f"e2e-{case.name}", workdir=self.dir, args=self._args(case),
                      agent_ingest=tuple(ag.ingest for ag in agents), master_addr=a.link_addr,
                      argv_prefix=(hosts.argv(a, []), hosts.argv(b, [])), local_ranks=(0, 0),
                      rank_env=({"GLOO_SOCKET_IFNAME": a.link_if}, {"GLOO_SOCKET_IFNAME": b.link_if}),
                      env=dict(case.env), train=case.train or Job.train)
            self._run_job(case, job, obs, nodes=[a.hostname, b.hostname], inject=inject)
        finally:
            if case.drop:
                hosts.clear_drops(b)
