"""Goodput against what a real job measured about itself, and the run report on it.

Real parts: a ranksight agent, Debian's Prometheus running the generated rules (test profile, the
goodput group every second), and a 2-rank gloo job under torchrun elastic
(tests/goodput_workloads/train.py) that logs its own timers. Two runs of the same job name:

1. healthy: no data wait to speak of, no checkpoint, no fault, ranks forked by the job after it
   imported torch (a short startup): goodput above 0.9 and RanksightGoodputLow never pending or firing;
2. faulty: the data loader sleeps 40 ms per batch, rank 0 writes 1 s checkpoints every 4 s, and 10 s
   after its second checkpoint it SIGKILLs itself; torchrun restarts both ranks, which run 5 s more. Every category of
   the job's split is within 2 percentage points of the same split computed from the job's own log.

Then `ranksight report` on the faulty run writes its files, its PNGs decode, the plots it drew hold
series, and its comparison with the healthy run flags the data-wait share and the restart.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from ranksight import catalog as C
from ranksight import config, triage
from ranksight.alerts import generate
from ranksight.triage.goodput import GOODPUT_LOW

ROOT = Path(__file__).resolve().parents[2]
JOB = "goodput-truth"
TOLERANCE = 0.02


def _events(path: Path) -> List[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def truth(log_dir: Path, ranks: int = 2) -> Dict[str, float]:
    """The job-level split from the job's own log, by the definitions of ranksight/triage/goodput.py."""
    per: List[Dict[str, float]] = []
    rank0 = _events(log_dir / "rank0.jsonl")
    kills = [e["t"] for e in rank0 if e["ev"] == "kill"]
    ckpts = [e["t"] for e in rank0 if e["ev"] == "ckpt"]
    for r in range(ranks):
        ev = _events(log_dir / f"rank{r}.jsonl")
        procs: List[List[dict]] = []
        for e in ev:
            if e["ev"] == "start":
                procs.append([])
            procs[-1].append(e)
        steps = [[e for e in p if e["ev"] == "step"] for p in procs]
        pstart = procs[0][0]["pstart"]
        end = [e["t"] for e in procs[-1] if e["ev"] == "end"][0]
        d = dict.fromkeys(C.GOODPUT_CATEGORIES, 0.0)
        d["startup"] = steps[0][0]["t0"] - pstart
        dur = 0.0
        for p in steps:
            for s in p:
                dur += s["t1"] - s["t0"]
                d["data_wait"] += s["data"]
                d["exposed_comm"] += s["comm"]
                d["checkpoint"] += s["ckpt"]
                d["productive"] += s["t1"] - s["t0"] - s["data"] - s["comm"] - s["ckpt"]
        for k, t_kill in enumerate(kills):  # the kill ends process k; its progress since the checkpoint is lost
            safe = max([c for c in ckpts if c < t_kill], default=pstart)
            lost = sum(s["t1"] - s["t0"] - s["data"] - s["comm"] - s["ckpt"] for s in steps[k] if safe < s["t1"] <= t_kill)
            d["wasted_progress"] += lost
            d["productive"] -= lost
            d["recovery"] += steps[k + 1][0]["t0"] - t_kill
        d["wall"] = end - pstart
        d["other"] = d["wall"] - dur - d["startup"] - d["recovery"]
        per.append(d)
    job = {c: sum(p[c] for p in per) / ranks for c in C.GOODPUT_CATEGORIES}
    most = max(p["checkpoint"] for p in per)  # the longest writer blocks the job; the others waited for it
    job["exposed_comm"] -= most - job["checkpoint"]
    job["checkpoint"] = most
    total = sum(job.values())
    return {c: v / total for c, v in job.items()}


class Job:
    def __init__(self, agent, tmp: Path, name: str):
        self.dir = tmp / name
        self.dir.mkdir()
        self.agent = agent

    def run(self, *args: str, torchrun: bool = True, timeout: float = 150) -> subprocess.CompletedProcess:
        env = dict(os.environ, RANKSIGHT_AGENT=self.agent.ingest, RANKSIGHT_JOB=JOB, PYTHONUNBUFFERED="1",
                   RANKSIGHT__hooks__heartbeat_seconds="0.2", OMP_NUM_THREADS="1")
        script = [str(ROOT / "tests" / "goodput_workloads" / "train.py"), "--events", str(self.dir), *args]
        if torchrun:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                   "--max-restarts", "1", "--monitor-interval", "0.1", *script]
        else:  # the job forks its two ranks after importing torch: a short startup
            cmd = [sys.executable, *script, "--fork", "2"]
        with open(self.dir / "torchrun.log", "wb") as out:
            return subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, cwd=str(ROOT))


def _shares(prom) -> Dict[str, float]:
    q = f'last_over_time({triage.REC["goodput_share"]}{{job="{JOB}"}}[20s])'
    return {r["metric"]["category"]: float(r["value"][1]) for r in prom.query(q)}


def _gone(prom) -> bool:
    return not prom.query(f'{C.RANK_UP}{{job="{JOB}"}}')


@pytest.mark.slow
def test_goodput_matches_the_jobs_own_accounting_and_the_report_flags_the_regression(agent, local_stack, tmp_path):
    cfg = config.load(None, "test", env={"RANKSIGHT__durations__slow_rule_interval": "1s"})
    # Two agents, both scraped: the healthy run's series go away 2 s after it ends (so the two runs
    # are apart in Prometheus at once); the faulty run's agent keeps a rank that exited cleanly for
    # 30 s, longer than torchrun takes to restart it (beyond the linger a new process is a new run).
    a = agent(env={"RANKSIGHT__agent__rank_linger_seconds": "2"}, name="agent-healthy")
    b = agent(env={"RANKSIGHT__agent__rank_linger_seconds": "30"}, name="agent-faulty")
    s = local_stack(targets=[a.target, b.target], files=generate.render(cfg))

    problems: List[str] = []  # every check of the three parts runs; the test reports them together

    def check(ok: bool, what: str) -> None:
        if not ok:
            problems.append(what)

    healthy = Job(a, tmp_path, "healthy")
    t0 = time.time()
    assert healthy.run("--seconds", "30", "--compute-sleep", "0.15", torchrun=False).returncode == 0, (healthy.dir / "torchrun.log").read_text()[-3000:]
    time.sleep(2.5)
    gp = _shares(s.prom)
    assert gp, "no goodput shares recorded"
    assert sum(gp.values()) == pytest.approx(1.0, abs=1e-9)  # the shares sum to 1 by construction
    check(gp["productive"] > 0.9, f"healthy goodput {gp['productive']:.3f} <= 0.9: {gp}; the job's own: {truth(healthy.dir)}")
    fired = s.prom.query(f'max_over_time(ALERTS{{alertname="{GOODPUT_LOW}", job="{JOB}"}}[{int(time.time() - t0) + 5}s])')
    check(fired == [], f"{GOODPUT_LOW} was pending or firing on the healthy run: {fired}")
    deadline = time.time() + 15
    while not _gone(s.prom) and time.time() < deadline:
        time.sleep(0.5)
    assert _gone(s.prom), "the healthy run's series did not go away after the linger"

    faulty = Job(b, tmp_path, "faulty")
    r = faulty.run("--seconds", "60", "--restart-seconds", "5", "--data-sleep", "0.04", "--ckpt-every", "4",
                   "--ckpt-seconds", "1", "--kill-after", "10")
    assert r.returncode == 0, (faulty.dir / "torchrun.log").read_text()[-3000:]
    time.sleep(2.5)
    got, want = _shares(s.prom), truth(faulty.dir)
    assert sum(got.values()) == pytest.approx(1.0, abs=1e-9)
    diff = {c: round(got.get(c, 0.0) - want[c], 4) for c in C.GOODPUT_CATEGORIES}
    if not all(abs(v) <= TOLERANCE for v in diff.values()):  # with the agent's per-rank ledger, to say where
        ledger = [ln for ln in b.metrics_text().splitlines() if ln.startswith((C.RANK_WALL.name, C.BADPUT.name))]
        check(False, f"measured {got}\njob's own {want}\ndiff {diff}\nagent: " + "\n".join(ledger))
    check(want["wasted_progress"] > 0.05 and want["recovery"] > 0.03 and want["data_wait"] > 0.1,
          f"the faulty job did not lose what it should have: {want}")

    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "ranksight", "report", "--prometheus", s.prom_url, "--job", JOB,
                          "--out", str(out), "--profile", "test", "--lookback", "1h", "--dashboard", "ranks"],
                         capture_output=True, text=True, timeout=120, cwd=str(ROOT),
                         env=dict(os.environ, RANKSIGHT__durations__slow_rule_interval="1s"))
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert rep.stdout.startswith("VERDICT: ")
    for name in ("report.html", "report.md", "report.json"):
        assert (out / name).stat().st_size > 0
    doc = json.loads((out / "report.json").read_text())
    import matplotlib.image as mpimg

    for plot in doc["plots"]:
        img = mpimg.imread(out / plot["file"])
        check(img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0, f"{plot['file']} is blank")
    drawn = {(p["file"], q["title"]): q for p in doc["plots"] for q in p["panels"]}
    for key in (("goodput.png", "Goodput"), ("goodput.png", "Where the wall time went"),
                ("signal-1.png", "Dataloader wait per step"), ("ranks-heatmap.png", "Step time by rank"),
                ("ranks-heatmap.png", "Busy time per step")):
        check(key in drawn and drawn[key]["series"] > 0 and drawn[key]["points"] > 1, f"{key}: {drawn.get(key)}")
    grid = [p for p in doc["plots"] if p["file"] == "dashboard-ranks.png"]
    board = json.loads((ROOT / "dashboards" / "ranksight-ranks.json").read_text())
    n_panels = sum(1 for p in board["panels"] if p["type"] != "row")
    check(len(grid) == 1 and len(grid[0]["panels"]) == n_panels and sum(q["points"] > 0 for q in grid[0]["panels"]) > 5,
          f"--dashboard ranks: {grid}")
    flagged = {f["what"] for f in doc["flags"]}
    check("data_wait share" in flagged and "restarts" in flagged, f"flags {doc['flags']}")
    check(doc["summary"]["restarts"] == 1 and (doc["baseline"] or {}).get("restarts") == 0,
          f"restarts {doc['summary']['restarts']} vs baseline {doc['baseline']}")
    check("regressed:" in rep.stdout, rep.stdout)
    none = subprocess.run([sys.executable, "-m", "ranksight", "report", "--prometheus", s.prom_url, "--job", "no-such-job",
                           "--out", str(tmp_path / "none"), "--lookback", "1h"], capture_output=True, text=True, timeout=60,
                          cwd=str(ROOT))
    check(none.returncode == 1 and len(none.stderr.strip().splitlines()) == 1 and JOB in none.stderr
          and "Traceback" not in none.stderr, f"no-data report: rc {none.returncode}: {none.stderr}")
    html = (out / "report.html").read_text()
    check(html.count("data:image/png;base64,") == len(doc["plots"]), "report.html does not embed every plot")
    assert problems == [], "\n\n".join(problems)
