"""`ranksight act` drains a node in a real Slurm: the one-node cluster of tests/integration/test_slurm.py
(Debian's munge and slurm-wlm, started on free ports; skipped with the reason where Slurm cannot start,
as there). Node-level verdicts posted to a real `ranksight act` server (auto, not a dry run, engine
slurm) as Alertmanager's webhook JSON:

1. while a job runs on the node, RanksightGpuXidError is refused: draining it would leave the job no
   undrained node (act.job_min_nodes 1), and the node stays idle/allocated;
2. with the job gone, RanksightDiskFilling drains the node: `sinfo` shows it drained with the reason
   "ranksight: RanksightDiskFilling"; a repeat of the webhook does nothing more.
"""
from __future__ import annotations

import socket
import subprocess

import pytest

from ranksight import config
from ranksight.common.plumbing import set_pdeathsig, wait_until
from ranksight.tools.act import ActServer
from ranksight.tools.act_engines import SlurmEngine

from support.alertmanager_webhook import TOKEN, am_alert, am_webhook, post
from test_slurm import slurm  # noqa: F401  (the one-node cluster fixture)

pytestmark = pytest.mark.slow


def _state(slurm, host: str) -> str:
    out = subprocess.run([slurm.bins["sinfo"], "-h", "-N", "-n", host, "-o", "%T|%E"], env=slurm.env,
                         capture_output=True, text=True, timeout=10)
    return out.stdout.strip()


def test_a_node_verdict_drains_the_node_in_slurm_but_never_a_jobs_last_node(slurm, tmp_path):
    host = socket.gethostname().split(".")[0]
    tok = tmp_path / "token"
    tok.write_text(TOKEN)
    cfg = config.load(None, "test", env={"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__token_file": str(tok),
                                         "RANKSIGHT__act__mode": "auto", "RANKSIGHT__act__dry_run": "false",
                                         "RANKSIGHT__act__engine": "slurm"})
    server = ActServer(cfg, engine=SlurmEngine(env=slurm.env)).start()
    job = subprocess.Popen([slurm.bins["srun"], "-N1", "-n1", "--job-name=act-victim", "sleep", "120"],
                           env=slurm.env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=set_pdeathsig)
    try:
        squeue = [slurm.bins["squeue"], "-h", "-t", "RUNNING", "-o", "%i"]
        running = wait_until(lambda: subprocess.run(squeue, env=slurm.env, capture_output=True, text=True,
                                                    timeout=10).stdout.split(), 30, 0.2)
        assert running, "the job did not start"
        code, body = post(server, am_webhook(am_alert("RanksightGpuXidError", node=host, gpu="0", xid="79")))
        assert code == 200 and body["results"][0]["state"] == "last_nodes", body
        assert not _state(slurm, host).startswith("drain"), _state(slurm, host)

        subprocess.run([slurm.bins["scancel"], *running], env=slurm.env, check=True, timeout=10)
        job.wait(20)
        assert wait_until(lambda: not subprocess.run(squeue, env=slurm.env, capture_output=True, text=True,
                                                     timeout=10).stdout.split(), 20, 0.2)
        doc = am_webhook(am_alert("RanksightDiskFilling", node=host, path="/ckpt"))
        code, body = post(server, doc)
        assert code == 200 and body["results"][0]["state"] == "done", body
        assert wait_until(lambda: _state(slurm, host) == "drained|ranksight: RanksightDiskFilling", 10, 0.2), \
            _state(slurm, host)
        assert post(server, doc)[1]["results"][0]["state"] == "done"  # the repeat: the ledger's record, unchanged
        rec = [r for r in server.actor.ledger.records.values() if r.verdict == "RanksightDiskFilling"]
        assert len(rec) == 1 and rec[0].command == (f"scontrol update NodeName={host} State=DRAIN "
                                                    f"Reason='ranksight: RanksightDiskFilling'"), rec
    finally:
        server.stop()
        if job.poll() is None:
            job.kill()
            job.wait()
