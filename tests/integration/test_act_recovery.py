"""`ranksight act` ends a hang, end to end, and the time from the fault to training again.

Real parts: a 2-rank gloo DDP job under ``torchrun --max-restarts 3 --rdzv-backend c10d``
(tests/integration_workloads/elastic_worker.py) that checkpoints every 10 steps (model, Adam state,
step count, sampler epoch and position); a real node agent it sends to; Debian's Prometheus running
the generated rules (test profile) and Alertmanager whose config `ranksight rules` rendered, its
webhook receiver (``alerting.receivers``) pointed at a real `ranksight act` server with the bearer
token from its ``credentials_file``; `ranksight act` in ``auto`` for RanksightRankStalled, not a dry run,
acting through the agent's end-workers endpoint (enabled by ``agent.act_token_file``).

Rank 1 hangs at step 35 outside any collective (rank 0 blocks in the all-reduce). The agent marks it
stalled, Prometheus fires RanksightRankStalled, Alertmanager posts it, `ranksight act` asks the agent
(pids from its /api/v1/ranks) to end the job's workers on the node, torchrun restarts them, and they
resume from the step-30 checkpoint. Asserted: the resume loaded exactly the checkpoint's step, Adam
state, parameters, epoch and position; the first step after the resume trains on the batch the
sampler gives at that position; the job finishes its 60 steps; the ledger records the restart and
its recovery; goodput books the hang (stalled), the work redone (wasted_progress) and the restart
(recovery), which add up to the time the job measured. The time from the hang to the first step
after the resume is printed and must be at most 2 minutes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from ranksight import catalog as C
from ranksight import config, triage
from ranksight.alerts import generate
from ranksight.tools.act import ActServer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from integration_workloads.harness import torchrun, worker_env  # noqa: E402

pytestmark = pytest.mark.slow
WORKER = Path(__file__).resolve().parents[1] / "integration_workloads" / "elastic_worker.py"
JOB, HANG_AT, STEPS, CKPT_EVERY = "act-hang", 35, 60, 10
LIMIT_S = 120.0


def _events(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _expected_batch(rank: int, epoch: int, pos: int) -> List[int]:
    """The sample indices DistributedSampler gives rank ``rank`` at (epoch, pos): the uninterrupted order."""
    from torch.utils.data import DistributedSampler

    sys.path.insert(0, str(WORKER.parent))
    from elastic_worker import BATCH, SAMPLES, SEED

    s = DistributedSampler(range(SAMPLES), num_replicas=2, rank=rank, shuffle=True, seed=SEED)
    s.set_epoch(epoch)
    return list(s)[pos * BATCH:(pos + 1) * BATCH]


def test_a_hang_is_ended_by_act_and_the_job_resumes_from_its_checkpoint(agent, local_stack, tmp_path):
    token = tmp_path / "act-token"
    token.write_text("act-recovery-token\n")
    # the agent ends the job's workers for act: its endpoint enabled by the bearer token act sends; the
    # ranks send over UDP, so their pids are claimed, trusted on this single-user machine
    a = agent(collectors="ranks", env={"RANKSIGHT__agent__stall_min_seconds": "3",
                                       "RANKSIGHT__agent__act_token_file": str(token),
                                       "RANKSIGHT__agent__act_trust_udp_pids": "true"})
    act_env = {"RANKSIGHT__act__listen": "127.0.0.1:0", "RANKSIGHT__act__token_file": str(token),
               "RANKSIGHT__act__agent_url": a.url, "RANKSIGHT__act__agent_token_file": str(token), "RANKSIGHT__act__modes": "{RanksightRankStalled: auto}",
               "RANKSIGHT__act__dry_run": "false", "RANKSIGHT__act__kill_grace_seconds": "3"}
    server = ActServer(config.load(None, "test", env=act_env)).start()
    try:
        # `ranksight rules` renders act as a webhook receiver whose bearer token Alertmanager reads from its file
        receivers = f"{{act: {{type: webhook, url: '{server.url}/alerts', credentials_file: '{token}'}}}}"
        cfg = config.load(None, "test", env={"RANKSIGHT__alerting__receivers": receivers,
                                             "RANKSIGHT__alerting__routes": "{critical: act, warning: act, info: act, lint: none}",
                                             "RANKSIGHT__durations__slow_rule_interval": "1s"})
        files = generate.render(cfg)
        stack = local_stack(targets=[a.target], files=files)
        run = tmp_path / "job"
        run.mkdir()
        env = worker_env(a.ingest, JOB, {"RANKSIGHT__hooks__heartbeat_seconds": "0.2"})
        cmd = torchrun(2, max_restarts=3) + ["--monitor-interval", "0.5", str(WORKER), "--dir", str(run),
                                             "--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY),
                                             "--hang-at", str(HANG_AT)]
        with open(run / "torchrun.log", "wb") as out:
            job = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=str(run))
        try:
            rc = job.wait(150)
        except subprocess.TimeoutExpired:
            job.kill()
            rc = job.wait()
        log = (run / "torchrun.log").read_text(errors="replace")
        assert rc == 0, (f"{log[-3000:]}\nledger: {list(server.actor.ledger.records.values())}\n"
                         f"alerts: {[(x['labels'], x['state']) for x in stack.prom.alerts()]}\n"
                         f"agent log: {a.log_file.read_text()[-3000:]}")
        time.sleep(2.5)  # a goodput evaluation after the last step
        split = {r["metric"]["category"]: float(r["value"][1]) for r in stack.prom.query(
            f'last_over_time({triage.REC["goodput_split"]}{{job="{JOB}"}}[30s])')}
        wall = stack.prom.query(f'last_over_time({triage.REC["wall"]}{{job="{JOB}"}}[30s])')
        # the run report lists the action, its result and its time to recover
        rep = subprocess.run([sys.executable, "-m", "ranksight", "report", "--prometheus", stack.prom_url, "--job", JOB,
                              "--out", str(tmp_path / "report"), "--profile", "test", "--act", server.url],
                             capture_output=True, text=True, timeout=180,
                             env=dict(os.environ, RANKSIGHT__act__token_file=str(token)))
        assert rep.returncode == 0, rep.stdout + rep.stderr
        md = (tmp_path / "report" / "report.md").read_text()
    finally:
        server.stop()

    ev = {rank: _events(run / f"rank{rank}.jsonl") for rank in (0, 1)}
    (hang,) = [e for e in ev[1] if e["ev"] == "hang"]
    ckpts = [e for e in ev[0] if e["ev"] == "ckpt" and e["t"] < hang["t"]]
    last = ckpts[-1]
    assert last["step"] == HANG_AT // CKPT_EVERY * CKPT_EVERY, ckpts
    for rank in (0, 1):
        starts = [e for e in ev[rank] if e["ev"] == "start"]
        assert [e["restart"] for e in starts] == [0, 1], starts  # one restart, by act's signal
        (resume,) = [e for e in ev[rank] if e["ev"] == "resume"]
        assert {k: resume[k] for k in ("step", "epoch", "pos", "opt", "params")} == \
            {k: last[k] for k in ("step", "epoch", "pos", "opt", "params")}, (resume, last)
        after = [e for e in ev[rank] if e["ev"] == "step" and e["t"] > resume["t"]]
        first = after[0]
        assert first["step"] == last["step"] + 1
        assert first["idx"] == _expected_batch(rank, last["epoch"], last["pos"]), (first, last)
        assert after[-1]["step"] == STEPS and ev[rank][-1]["ev"] == "end"
    # the first step a restarted process completed (a step needs both ranks: their all-reduce)
    resumed = min(next(e["t"] for e in ev[rank] if e["ev"] == "step" and e["t"] > r_["t"])
                  for rank in (0, 1) for r_ in ev[rank] if r_["ev"] == "resume")
    recovery = resumed - hang["t"]

    recs = [x for x in server.actor.ledger.records.values() if x.verdict == "RanksightRankStalled"]
    assert recs and recs[0].action == "restart_workers" and recs[0].labels["rank"] == "1", recs
    rec = recs[0]
    assert rec.labels["job"] == JOB and rec.acted is not None and rec.state in ("recovered", "done"), rec
    assert rec.resolved is not None, "Alertmanager's resolve of the stall never reached act"
    print(f"\nfault to first step after resume: {recovery:.1f} s (hang at {hang['t']:.1f}; act acted "
          f"{rec.acted - hang['t']:.1f} s after it; act's own recovery time {rec.recover_s} s)")
    (Path(os.environ.get("RANKSIGHT_ACT_RESULT", tmp_path / "recovery.json"))).write_text(json.dumps(
        {"fault_to_training_s": round(recovery, 2), "fault_to_action_s": round(rec.acted - hang["t"], 2),
         "act_recover_s": rec.recover_s}))
    assert recovery <= LIMIT_S, recovery
    row = next((ln for ln in md.splitlines() if ln.startswith(f"| {rec.id} | RanksightRankStalled |")), "")
    assert "## Actions" in md and f"| rank 1 node {rec.labels['node']} | restart_workers | auto | " in row, md
    assert rec.state != "recovered" or f"| {rec.recover_s:.1f} s |" in row, row

    # goodput books the hang, the work redone and the restart as badput; the categories add up to the wall
    assert set(split) == set(C.GOODPUT_CATEGORIES) and wall, (split, wall)
    assert sum(split.values()) == pytest.approx(float(wall[0]["value"][1]), rel=1e-9)
    lost = split["stalled"] + split["wasted_progress"] + split["recovery"]
    print(f"goodput split (s, mean over ranks): {({k: round(v, 2) for k, v in split.items()})}")
    # recovery runs from the killed process's death to its successor's first step, so it holds at
    # least the restarted workers' start to that step, as the workers logged it (mean over ranks;
    # within a second: goodput is read from counters evaluated every second)
    restart = sum(next(e["t"] for e in ev[rank] if e["ev"] == "step" and e["t"] > r_["t"]) - r_["t"]
                  for rank in (0, 1) for r_ in ev[rank] if r_["ev"] == "start" and r_["restart"] == 1) / 2
    assert split["stalled"] > 3 and split["wasted_progress"] > 0, split
    print(f"restarted workers' start to their first step: {restart:.2f} s; goodput's recovery {split['recovery']:.2f} s")
    assert split["recovery"] > 0 and split["recovery"] >= restart - 1.0, (split, restart)
    # the hang to the resumed training, as the job measured it, is the stall and the recovery the agent booked
    assert lost == pytest.approx(recovery, abs=5.0), (lost, recovery, split)
