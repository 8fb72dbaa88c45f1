"""Slurm: the systemd unit of the node agent passes `systemd-analyze verify` and its ExecStart
serves /healthz, and a real one-node Slurm cluster (Debian's munge and slurm-wlm: munged,
slurmctld and slurmd started here on free ports, config in a tmp dir) runs a 2-rank gloo DDP job
with `srun -N1 -n2` next to a real agent. The agent must show both ranks under the Slurm job id
with their Slurm ranks and exact step counts, and after `scancel` report them down with their
heartbeat misses counted."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Dict, List, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ranksight import catalog
from ranksight.common.plumbing import Proc, free_port, last_line, set_pdeathsig, wait_until

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "ranksight-exporter.service"
WORKER = Path(__file__).resolve().parents[1] / "support" / "slurm_worker.py"
STEPS = 20
DOWN_AFTER = 3  # agent.down_after_misses (default)
PACKAGES = {"munged": "munge", "mungekey": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd",
            "srun": "slurm-client", "scancel": "slurm-client", "squeue": "slurm-client", "sinfo": "slurm-client"}


def _which(name: str, package: str) -> str:
    for path in (shutil.which(name), f"/usr/sbin/{name}", f"/usr/bin/{name}"):
        if path and os.access(path, os.X_OK):
            return path
    pytest.fail(f"{name} not found: apt-get install {package} (scripts/setup installs slurm-wlm and munge)",
                pytrace=False)


# ------------------------------------------------------------------ systemd
@pytest.mark.slow
def test_systemd_unit_verifies_and_its_command_serves(tmp_path):
    analyze = _which("systemd-analyze", "systemd")
    # verify resolves ExecStart: point it at this checkout's ranksight in a copy of the unit
    exe = shutil.which("ranksight", path=os.path.dirname(sys.executable)) or shutil.which("ranksight")
    assert exe, "the ranksight entry point is not installed next to this Python"
    text = UNIT.read_text()
    assert "\nExecStart=/usr/local/bin/ranksight exporter\n" in text
    unit = tmp_path / UNIT.name
    unit.write_text(text.replace("/usr/local/bin/ranksight", exe))
    r = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and not r.stderr.strip(), r.stdout + r.stderr
    # the ExecStart line itself starts an agent (on free ports here, through the config's env overrides)
    (line,) = [ln for ln in text.splitlines() if ln.startswith("ExecStart=")]
    argv = line.split("=", 1)[1].replace("/usr/local/bin/ranksight", exe).split()
    port = free_port()
    env = {**os.environ, "RANKSIGHT__agent__listen": f"127.0.0.1:{port}", "RANKSIGHT__agent__collectors": "ranks",
           "RANKSIGHT__agent__ingest": f"udp://127.0.0.1:{free_port(udp=True)}"}
    agent = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig)
    try:
        ok = wait_until(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2).status == 200,
                        30)
    finally:
        agent.terminate()
        out = agent.communicate(timeout=15)[0].decode(errors="replace")
    assert ok and agent.returncode == 0, f"ExecStart {argv}: ready={bool(ok)} rc={agent.returncode}: {out[-2000:]}"
    broken = tmp_path / "broken.service"
    broken.write_text(unit.read_text().replace("Restart=", "Restrat="))
    r = subprocess.run([analyze, "verify", str(broken)], capture_output=True, text=True, timeout=60)
    assert "Restrat" in r.stderr, "systemd-analyze verify accepted a misspelled key"


# ------------------------------------------------------------------ a one-node Slurm cluster
class SlurmCluster:
    """munged, slurmctld and slurmd in the foreground, everything under one tmp dir."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.procs: List[Proc] = []
        self.bins: Dict[str, str] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for k in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_PROCID", "SLURM_NTASKS", "RANKSIGHT_JOB",
                  "TORCHELASTIC_RUN_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            self.env.pop(k, None)

    def _start(self, name: str, argv: List[str]) -> None:
        self.procs.append(Proc(argv, self.root / "log" / f"{name}.out", self.env, name=name).start())

    def _why(self, name: str) -> str:
        logs = [self.root / "log" / f"{name}.log", self.root / "log" / f"{name}.out",
                self.root / "munge" / "munged.log"]
        for path in logs:
            if path.name.startswith(name) and path.exists():
                line = last_line(path)
                if line:
                    return line
        return "no log line"

    def start(self) -> "SlurmCluster":
        self.bins = bins = {n: _which(n, pkg) for n, pkg in PACKAGES.items()}
        if os.geteuid() != 0:
            pytest.skip(f"Slurm cannot start here: slurmd must run as root to start job steps (uid {os.geteuid()})")
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700, parents=True, exist_ok=True)
        (r / "munge").chmod(0o755)  # munged wants its socket folder searchable by all
        key, sock = r / "munge" / "munge.key", r / "munge" / "munge.socket"
        subprocess.run([bins["mungekey"], "-c", "-b", "1024", "-k", str(key)], check=True, capture_output=True)
        key.chmod(0o400)
        self._start("munged", [bins["munged"], "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'munge' / 'munged.log'}",
                               f"--seed-file={r / 'munge' / 'munged.seed'}"])
        if not wait_until(sock.exists, 10, 0.05):
            pytest.skip(f"Slurm cannot start here: munged did not create its socket: {self._why('munged')}")
        host = socket.gethostname().split(".")[0]  # Slurm matches the short host name
        self.conf.write_text("\n".join([
            "ClusterName=ranksight-test",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={free_port()}",
            f"SlurmdPort={free_port()}",
            "SlurmUser=root", "SlurmdUser=root",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            # no cgroups: processes are tracked through /proc, tasks are not bound
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "MpiDefault=none", "ReturnToService=2", "KillWait=2", "MinJobAge=5",
            "SlurmdParameters=config_overrides",  # the node as configured, whatever slurmd detects
            "SlurmctldTimeout=10", "SlurmdTimeout=10", "InactiveLimit=0",
            f"NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count() or 1} State=UNKNOWN",
            f"PartitionName=test Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE",
            ""]))
        self._start("slurmctld", [bins["slurmctld"], "-D", "-c", "-f", str(self.conf)])
        self._start("slurmd", [bins["slurmd"], "-D", "-N", host, "-f", str(self.conf)])

        def idle() -> bool:
            for p in self.procs:
                if p.exited() is not None:
                    pytest.skip(f"Slurm cannot start here: {p.name} exited with code {p.exited()}: {self._why(p.name)}")
            out = subprocess.run([bins["sinfo"], "-h", "-o", "%T"], env=self.env, capture_output=True, text=True,
                                 timeout=10)
            return out.stdout.strip() == "idle"

        if not wait_until(idle, 20, 0.2):
            pytest.skip(f"Slurm cannot start here: the node did not become idle within 20 s: "
                        f"slurmctld: {self._why('slurmctld')}; slurmd: {self._why('slurmd')}")
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            p.stop(10.0)


@pytest.fixture
def slurm(tmp_path_factory):
    c = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield c.start()
    finally:
        c.stop()


def _ranks(text: str) -> Dict[Tuple[str, str, str], Dict[str, float]]:
    """(job, rank, local_rank) -> {metric name: value} for steps, rank_up and heartbeat misses."""
    want = {catalog.STEPS.name: "steps", catalog.RANK_UP.name: "up", catalog.HEARTBEAT_MISSES.name: "misses"}
    out: Dict[Tuple[str, str, str], Dict[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in want:
                key = (s.labels["job"], s.labels["rank"], s.labels["local_rank"])
                out.setdefault(key, {})[want[s.name]] = s.value
    return out


@pytest.mark.slow
def test_srun_ddp_job_is_seen_by_the_agent_and_scancel_is_reported(slurm, agent, tmp_path):
    a = agent(collectors="ranks")
    env = {**slurm.env, "RANKSIGHT_AGENT": a.ingest, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "PYTHONPATH": str(ROOT)}
    out = tmp_path / "srun.out"
    with open(out, "wb") as f:
        srun = subprocess.Popen([slurm.bins["srun"], "-N1", "-n2", "--kill-on-bad-exit=1", "--job-name=ranksight-ddp",
                                 sys.executable, str(WORKER), "--steps", str(STEPS)],
                                cwd=tmp_path, env=env, stdout=f, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig)
    try:
        ready = wait_until(lambda: out.read_text().count("READY") == 2 or srun.poll() is not None, 45, 0.2)
        text = out.read_text()
        assert ready and text.count("READY") == 2, f"the job did not reach its {STEPS} steps: {text[-2000:]}"
        job_ids = {line.split()[1] for line in text.splitlines() if line.startswith("READY")}
        squeue = subprocess.run([slurm.bins["squeue"], "-h", "-o", "%i %j %T"], env=slurm.env, capture_output=True,
                                text=True, timeout=10)
        assert squeue.stdout.split() == [*job_ids, "ranksight-ddp", "RUNNING"], squeue.stdout
        (job,) = job_ids
        seen = wait_until(lambda: (lambda r: r if all(v.get("steps") == STEPS for v in r.values())
                                   and len(r) == 2 else None)(_ranks(a.metrics_text())), 10)
        assert seen, _ranks(a.metrics_text())
        assert sorted(seen) == [(f"slurm_worker-{job}", "0", "0"), (f"slurm_worker-{job}", "1", "1")]
        assert all(v["up"] == 1 and v["misses"] == 0 for v in seen.values()), seen

        subprocess.run([slurm.bins["scancel"], job], env=slurm.env, check=True, timeout=10)
        assert srun.wait(20) != 0
        gone = wait_until(lambda: (lambda r: r if all(v.get("up") == 0 for v in r.values()) and len(r) == 2
                                   else None)(_ranks(a.metrics_text())), 15)
        assert gone, _ranks(a.metrics_text())
        assert all(v["misses"] >= DOWN_AFTER and v["steps"] == STEPS for v in gone.values()), gone
    finally:
        if srun.poll() is None:
            srun.kill()
            srun.wait()
