"""Detection times under the default profile's limits: the production `for:` durations in the
rules and the agent's default stall floor (30 s) and stack trigger (15 s), with Prometheus
scraping and evaluating every second. A real 2-rank gloo job hangs (rank 1 sleeps in the
training loop), another loses rank 1 to SIGKILL.

- the hang must page within 2 minutes of the fault with the culprit's place in the page;
- the dead rank must page within 30 s.

The figures print at the end (bench/RESULTS.md records them).
Run: ``.venv/bin/python -m pytest -q -s -m e2e tests/e2e/test_detection_default.py``.
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Dict, Iterator

import pytest

from e2e_harness import Job, am_find, host_agent, start_stack
from ranksight.common.plumbing import wait_for
from ranksight import config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

FAULT_AFTER = 3.0
HANG_LIMIT = 120.0
DOWN_LIMIT = 30.0


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dict[str, object]]:
    d: Path = tmp_path_factory.mktemp("detect-default")
    cfg = config.load(env={})  # the default profile
    stack = start_stack(d / "stack", cfg)
    agent = host_agent(d, "host")  # the agent's default stall limits
    out: Dict[str, object] = {}
    try:
        stack.set_targets([agent.target])
        jobs = {f: Job(name=f"detect-{f}", workdir=d, agent_ingest=(agent.ingest,),
                       args=["--duration", "300", "--fault", f, "--fault-after", str(FAULT_AFTER),
                             "--hang-seconds", "600"]) for f in ("hang", "kill-rank")}
        alert = {"hang": "RanksightRankStalled", "kill-rank": "RanksightRankDown"}

        def watch(fault: str) -> None:
            job = jobs[fault].start()
            try:
                wait_for(lambda: stack.prom.query(
                    f'ranksight_steps_total{{job="{job.name}"}} > 0'), 120, f"{job.name}: first step", 0.5)
                start = time.monotonic() - 1.0 + FAULT_AFTER  # the scrape that saw the first step, plus the delay
                got = wait_for(lambda: [
                    a for a in am_find(stack, alert[fault], job=job.name, rank="1") if not a["status"]["inhibitedBy"]],
                    HANG_LIMIT + 60, f"{alert[fault]} for {job.name}", 0.5)
                out[fault] = (time.monotonic() - start, got[0]["annotations"]["description"])
            except AssertionError as e:
                out[fault] = (float("nan"), str(e))
            finally:
                job.stop()

        threads = [threading.Thread(target=watch, args=(f,)) for f in jobs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        yield out
    finally:
        agent.stop()
        stack.stop()
        for k, (s, desc) in out.items():  # type: ignore[misc]
            print(f"\ndefault profile: {k} paged after {s:.1f} s: {desc}")


def test_hang_pages_with_its_place_within_2_minutes(measured) -> None:
    seconds, desc = measured["hang"]
    assert seconds <= HANG_LIMIT, (seconds, desc)
    assert re.search(r"stalled \d+ s at train_ddp\.py:\d+ in main <- time\.sleep\.$", desc), desc


def test_dead_rank_pages_within_30_s(measured) -> None:
    seconds, desc = measured["kill-rank"]
    assert seconds <= DOWN_LIMIT, (seconds, desc)
