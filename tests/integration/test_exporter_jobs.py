"""Real 2-rank gloo DDP jobs instrumented with ranksight.watch, against a real agent process:

- one rank SIGKILLed: a heartbeat miss is counted within 5 s and rank_up drops;
- one rank stops stepping but stays alive: it is stalled with reason no_progress (the
  culprit) while its peer, blocked in the gradient all-reduce, is waiting_in_collective;
- the agent is killed and restarted mid-run: training is unaffected (every step done, exit 0)
  and the metrics resume on the new agent.

Run as a script (``python tests/integration/test_exporter_jobs.py job ...``) this file is one rank.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

if __name__ != "__main__":
    import pytest

    from ranksight import catalog as C

    from test_exporter_helpers import started, agent_cmd, free_port, http_get, one, parse, series, wait_for


# ------------------------------------------------------------------ one rank (script mode)
def job_main(argv) -> int:
    import argparse
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn as nn

    import ranksight

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-sleep", type=float, default=0.03)
    p.add_argument("--hang-rank", type=int, default=-1)
    p.add_argument("--hang-step", type=int, default=-1)
    p.add_argument("--hang-secs", type=float, default=0.0)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def batches():
        for _ in range(a.steps):
            time.sleep(a.step_sleep)  # input-bound, light on CPU: the CI box is shared
            yield torch.randn(8, 16), torch.randn(8, 4)

    done = 0
    for i, (x, y) in enumerate(ranksight.watch(model, opt, batches())):
        if i == a.hang_step and rank == a.hang_rank:
            time.sleep(a.hang_secs)  # alive (the heartbeat thread beats) but stuck outside any collective
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        done += 1
        if i == 0:
            print("STEPPING", flush=True)
    ranksight.unwatch()
    dist.barrier()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "steps": done}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["job"]:
        sys.exit(job_main(sys.argv[2:]))
    sys.exit(2)


# ------------------------------------------------------------------ tests
class Job:
    """Two rank processes of one job."""

    def __init__(self, tmp: Path, ingest: str, name: str, *args: str):
        master = free_port()
        self.ranks = []
        for r in range(2):
            env = {"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master),
                   "RANKSIGHT_AGENT": ingest, "RANKSIGHT_JOB": name, "RANKSIGHT__hooks__table_every_steps": "0",
                   "RANKSIGHT__hooks__table_every_seconds": "0", "OMP_NUM_THREADS": "1"}
            self.ranks.append(started([sys.executable, __file__, "job", *args], tmp / f"{name}-rank{r}.log", env))

    def stop(self) -> None:
        for p in self.ranks:
            if p.popen.poll() is None:
                p.popen.kill()
            p.stop()


class Agent:
    def __init__(self, tmp: Path, name: str, port: int, uport: int, env=None):
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.proc = started(agent_cmd("--listen", f"127.0.0.1:{port}", "--ingest", f"udp://127.0.0.1:{uport}",
                                   "--collectors", "ranks"), tmp / f"{name}.log", env)
        wait_for(lambda: http_get(self.url), 30, f"agent {name} serving")

    def metrics(self):
        return parse(http_get(self.url))


@pytest.fixture
def cleanup():
    things = []
    yield things
    for t in reversed(things):
        t.stop()


def steps_by_rank(got, job: str):
    return {dict(k)["rank"]: v for k, v in series(got, C.STEPS.name, job=job).items()}


def test_sigkilled_rank_misses_within_5s_and_goes_down(tmp_path, cleanup):
    port, uport = free_port(), free_port(udp=True)
    agent = Agent(tmp_path, "agent", port, uport)
    cleanup.append(agent.proc)
    job = Job(tmp_path, f"udp://127.0.0.1:{uport}", "killjob", "--steps", "100000")
    cleanup.append(job)
    wait_for(lambda: len([v for v in steps_by_rank(agent.metrics(), "killjob").values() if v >= 3]) == 2, 90,
             "both ranks stepping")
    got = agent.metrics()
    assert one(got, C.HEARTBEAT_MISSES.name, job="killjob", rank="1") == 0
    assert one(got, C.RANK_UP.name, job="killjob", rank="1") == 1
    job.ranks[1].popen.send_signal(signal.SIGKILL)
    wait_for(lambda: one(agent.metrics(), C.HEARTBEAT_MISSES.name, job="killjob", rank="1") >= 1, 5,
             "a heartbeat miss counted within 5 s of SIGKILL")
    wait_for(lambda: one(agent.metrics(), C.RANK_UP.name, job="killjob", rank="1") == 0, 10, "rank_up 0")
    got = agent.metrics()
    assert one(got, C.HEARTBEAT_MISSES.name, job="killjob", rank="1") >= 3
    assert one(got, C.STEPS.name, job="killjob", rank="1") >= 3, "no goodbye from a SIGKILLed rank: it stays tracked"
    # (rank 0 sees gloo fail its all-reduce at once and exits with the error; its hooks say goodbye)


def test_rank_that_stops_stepping_is_stalled_and_its_peer_waits(tmp_path, cleanup):
    port, uport = free_port(), free_port(udp=True)
    agent = Agent(tmp_path, "agent", port, uport, env={"RANKSIGHT__agent__stall_min_seconds": "2",
                                                       "RANKSIGHT__agent__rank_linger_seconds": "10"})
    cleanup.append(agent.proc)
    job = Job(tmp_path, f"udp://127.0.0.1:{uport}", "hangjob", "--steps", "50", "--hang-rank", "1",
              "--hang-step", "20", "--hang-secs", "6")
    cleanup.append(job)

    def stalled():
        got = agent.metrics()
        st = {(dict(k)["rank"], dict(k)["reason"]): v for k, v in series(got, C.RANK_STALLED.name, job="hangjob").items()}
        return st if st.get(("1", "no_progress")) == 1 and st.get(("0", "waiting_in_collective")) == 1 else None

    st = wait_for(stalled, 60, "rank 1 stalled (no_progress) and rank 0 waiting_in_collective")
    assert st[("1", "waiting_in_collective")] == 0 and st[("0", "no_progress")] == 0
    got = agent.metrics()
    assert one(got, C.RANK_UP.name, job="hangjob", rank="1") == 1, "alive: heartbeats arrive"
    for p in job.ranks:  # the hang ends, the job finishes
        assert p.wait(90) == 0, p.text()[-2000:]
    assert all('"steps": 50' in p.text() for p in job.ranks)
    # goodbye: the finished ranks linger with their exact final counts, up and not stalled, then go
    got = wait_for(lambda: (lambda g: g if len(series(g, C.RANK_FINISHED.name, job="hangjob")) == 2 else None)(
        agent.metrics()), 5, "both ranks finished")
    assert steps_by_rank(got, "hangjob") == {"0": 50, "1": 50}
    assert all(v == 1 for v in series(got, C.RANK_UP.name, job="hangjob").values())
    assert all(v == 0 for v in series(got, C.RANK_STALLED.name, job="hangjob").values())
    wait_for(lambda: not series(agent.metrics(), C.RANK_UP.name, job="hangjob"), 20, "the linger ends")


def test_agent_restart_mid_run(tmp_path, cleanup):
    port, uport = free_port(), free_port(udp=True)
    agent = Agent(tmp_path, "agent1", port, uport)
    cleanup.append(agent.proc)
    steps = 300
    job = Job(tmp_path, f"udp://127.0.0.1:{uport}", "restartjob", "--steps", str(steps), "--step-sleep", "0.03")
    cleanup.append(job)
    wait_for(lambda: len([v for v in steps_by_rank(agent.metrics(), "restartjob").values() if v >= 20]) == 2, 90,
             "both ranks stepping")
    agent.proc.popen.send_signal(signal.SIGKILL)  # the hardest restart: no cleanup at all
    agent.proc.popen.wait(10)
    time.sleep(1.0)
    agent2 = Agent(tmp_path, "agent2", port, uport)
    cleanup.append(agent2.proc)
    first = wait_for(lambda: (lambda s: s if len(s) == 2 and min(s.values()) >= 5 else None)(
        steps_by_rank(agent2.metrics(), "restartjob")), 30, "metrics resume on the new agent")
    later = wait_for(lambda: (lambda s: s if min(s[r] - first[r] for r in first) >= 5 else None)(
        steps_by_rank(agent2.metrics(), "restartjob")), 30, "steps keep counting")
    got = agent2.metrics()
    for r in ("0", "1"):
        assert one(got, C.RANK_UP.name, job="restartjob", rank=r) == 1
        assert one(got, C.HEARTBEAT_MISSES.name, job="restartjob", rank=r) == 0  # the gap is not the rank's fault
        n = one(got, C.STEPS.name, job="restartjob", rank=r)
        assert one(got, C.STEP_DURATION.count, job="restartjob", rank=r) == n
        assert later[r] <= n <= steps
    for p in job.ranks:
        assert p.wait(120) == 0, p.text()[-2000:]
        assert f'"steps": {steps}' in p.text(), "training unaffected: every step ran"
    assert "Traceback" not in job.ranks[0].text() + job.ranks[1].text()
    # the rank's totals are the truth: the new agent ends at the exact count, the steps it missed included
    got = wait_for(lambda: (lambda g: g if len(series(g, C.RANK_FINISHED.name, job="restartjob")) == 2 else None)(
        agent2.metrics()), 10, "both ranks finished")
    assert steps_by_rank(got, "restartjob") == {"0": steps, "1": steps}
    for r in ("0", "1"):
        assert one(got, C.STEP_DURATION.count, job="restartjob", rank=r) == steps
