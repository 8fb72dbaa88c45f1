"""A broken resume across real processes: a 2-rank gloo DDP job (tests/hooks_workloads/resume_worker.py)
checkpoints and exits, and a new 2-rank job resumes from the checkpoint against the same node agent.
When rank 1 restores the model but not its optimizer and LR scheduler, the partial_resume lint names
rank 1 (not rank 0, which restored everything), and with a real Prometheus on the test profile
RanksightLossJumpAfterResume fires for rank 1 within 30 s of the restore, comparing its loss since
the restore with the loss Prometheus kept from the process before the restart. A full resume on
both ranks reports the restore (its time and step) and stays quiet. The rule's windows are tested
with promtool in alerts/tests/loss.yml."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Dict, List

import pytest

pytest.importorskip("torch")

from ranksight import catalog as C  # noqa: E402
from ranksight.common.plumbing import wait_for  # noqa: E402
from ranksight.triage import REC  # noqa: E402

from hooks_workloads.harness import per_rank as harness_per_rank, run_ranks  # noqa: E402

JOB = "hooks-test"  # the harness's RANKSIGHT_JOB
ALERT = "RanksightLossJumpAfterResume"
PACE = ["--step-sleep", "0.05", "--total", "200"]  # 40 steps a phase: about 2 s of records; 200 in all
# The first phase's 40 steps over about 6 s: the steady loss is a rate of the loss counters, which
# Prometheus (a scrape a second) must see rise at least once while the ranks run; over 2 s it
# sometimes saw them only at their final values (the hooks send records in batches), and the
# steady loss never appeared
FIRST_PACE = ["--step-sleep", "0.15", "--total", "200"]


def per_rank(text: str, metric: C.Metric, extra: str = "") -> Dict[int, float]:
    return harness_per_rank(text, metric, JOB, extra)


def ok(res: List[dict]) -> None:
    for r in res:
        assert r["rc"] == 0 and r["result"], r["err"][-3000:]
        assert r["result"]["herr"] == 0, r["result"]


@pytest.mark.slow
def test_a_resume_without_optimizer_state_is_named_and_fires_the_jump_alert(agent, local_stack, tmp_path):
    a = agent()
    s = local_stack(targets=[a.target])  # the test profile: loss_short 1m, loss_resume 2m, for: 10s
    ck = str(tmp_path / "ckpt.pt")
    ok(run_ranks("resume_worker.py", ["--phase", "first", "--ckpt", ck, *FIRST_PACE], 2, a.ingest, timeout=120))
    # the "before": each rank's short mean, recorded while no restore is recent
    wait_for(lambda: len(s.prom.query(f'{REC["loss_steady"]}{{job="{JOB}"}}')) == 2, 30, "the steady loss of both ranks")
    seen: Dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:  # when Prometheus first shows the alert firing, per rank
        while not stop.is_set():
            try:
                for al in s.prom.alerts():
                    lab = al["labels"]
                    if lab.get("alertname") == ALERT and lab.get("job") == JOB:
                        seen.setdefault(f'{lab["rank"]}:{al["state"]}', time.time())
            except Exception:
                pass
            time.sleep(0.25)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        res = run_ranks("resume_worker.py", ["--phase", "resume", "--broken-rank", "1", "--ckpt", ck, *PACE], 2,
                        a.ingest, timeout=120)
        ok(res)
        text = a.metrics_text()
        resumed = per_rank(text, C.LAST_RESUME)
        assert set(resumed) == {0, 1} and all(v > 0 for v in resumed.values()), resumed
        assert per_rank(text, C.RESUME_STEP) == {0: 40, 1: 40}
        wait_for(lambda: "1:firing" in seen, max(1.0, min(resumed.values()) + 40 - time.time()),
                 f"{ALERT} firing for rank 1")
    finally:
        stop.set()
        t.join(5)
    # the lint on the rank whose restore was partial, with the parts it missed; none on rank 0
    by_rank = {r["result"]["rank"]: r["result"] for r in res}
    assert by_rank[0]["lint"] == [False, ""]
    active, msg = by_rank[1]["lint"]
    assert active and "restored the model but not the optimizer (AdamW" in msg and "LR scheduler (LambdaLR)" in msg
    assert per_rank(a.metrics_text(), C.LINT_ACTIVE, 'lint="partial_resume"').get(1) == 1
    assert per_rank(a.metrics_text(), C.LINT_ACTIVE, 'lint="partial_resume"').get(0, 0) == 0
    # within 30 s of the restore; rank 0 (full restore, the same weights) never pending or firing
    latency = seen["1:firing"] - min(resumed.values())
    ratio = {r: s.prom.value(REC["loss_resume_jump"] + '{job="%s",rank="%d"}' % (JOB, r)) for r in (0, 1)}
    print(f"{ALERT} fired for rank 1 {latency:.1f} s after its restore; loss ratios {ratio}")
    assert latency < 30, latency
    assert not [k for k in seen if k.startswith("0:")], seen
    assert ratio[0] < 1.3 < ratio[1], ratio
    # the run report: its ETA (200 steps in all, 80 done) and, at a price per GPU-hour, its cost
    cfg = tmp_path / "cost.yml"
    cfg.write_text("cost:\n  gpu_hour_price: 2.5\n  currency: USD\n")
    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "ranksight", "report", "--prometheus", s.prom_url, "--job", JOB,
                          "--out", str(out), "--profile", "test", "--config", str(cfg)],
                         capture_output=True, text=True, timeout=120)
    assert rep.returncode == 0, rep.stderr[-3000:]
    summary = json.loads((out / "report.json").read_text())["summary"]
    assert summary["eta"] > 0 and summary["gpu_hours"] > 0 and summary["gpu_hours_to_finish"] > 0, summary
    assert summary["cost_spent"] == pytest.approx(summary["gpu_hours"] * 2.5), summary
    md = (out / "report.md").read_text()
    assert "| ETA at the end |" in md and "| cost spent (USD) |" in md and "| cost to finish (USD) |" in md, md


@pytest.mark.slow
def test_a_full_resume_is_reported_and_stays_quiet(agent, tmp_path):
    a = agent()
    ck = str(tmp_path / "ckpt.pt")
    first = run_ranks("resume_worker.py", ["--phase", "first", "--ckpt", ck], 2, a.ingest, timeout=120)
    ok(first)
    assert per_rank(a.metrics_text(), C.LAST_RESUME) == {0: 0, 1: 0}
    res = run_ranks("resume_worker.py", ["--phase", "resume", "--ckpt", ck], 2, a.ingest, timeout=120)
    ok(res)
    for r in res:
        got = r["result"]
        assert got["lint"] == [False, ""] and got["resume_step"] == 40, got
        # the loss continues where it stopped (a model-only restore runs several times above it)
        assert got["mean_loss"] < 2 * min(f["result"]["mean_loss_last10"] for f in first) + 0.01, (got, first)
    text = a.metrics_text()
    assert per_rank(text, C.RESUME_STEP) == {0: 40, 1: 40}
    assert all(v > 1.7e9 for v in per_rank(text, C.LAST_RESUME).values())
    assert per_rank(text, C.LINT_ACTIVE, 'lint="partial_resume"').get(0, 0) == 0
    assert per_rank(text, C.LINT_ACTIVE, 'lint="partial_resume"').get(1, 0) == 0
