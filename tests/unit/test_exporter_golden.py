"""Golden /metrics: the real agent (every collector) on the fixture procfs/sysfs trees, the NVML
stand-in on a frozen clock and a fixed list of hooks datagrams sent over a real UDP socket; its
/metrics page, scraped over HTTP, must equal tests/fixtures/golden/metrics.txt line for line.

Only sample values that differ from run to run or machine to machine are replaced, by metric
name (``VARYING`` below); every family, HELP/TYPE line, series name, label set and the order of
the exposition are compared exactly. ``RANKSIGHT_UPDATE_GOLDEN=1`` rewrites the golden file.
"""
from __future__ import annotations

import difflib
import os
import re
import socket
import tempfile
import time
import urllib.request
from bisect import bisect_left
from typing import Dict, List, Sequence, Tuple

import pytest

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.exporter.agent import Agent, AgentSettings
from support.nvml_standin import NvmlStandin

from test_exporter_helpers import FIXTURES, LOCAL, NE, ROOT

GOLDEN = FIXTURES / "golden" / "metrics.txt"
UPDATE_ENV = "RANKSIGHT_UPDATE_GOLDEN"
NODE = "golden-node"
T0 = 4_000_000_000.0  # the senders' wall clock and the NVML stand-in's frozen clock: far in the future, so the
# agent never takes these timestamps for its own time (it clamps them to its clock: see exporter/goodput.py)
PLACEHOLDER = "<varies>"
DIFF_LINES = 60

# Sample values replaced by PLACEHOLDER (metric name -> why it varies); the series stay.
VARYING: Dict[str, str] = {
    # perf_counter time of each collector's pass (the gpu one: its sampler's last pass)
    C.COLLECTOR_DURATION.name: "scrape timing",
    # statvfs of the filesystems under "/" and the hello's dirs: this machine's disk
    C.DISK_FREE.name: "this machine's disk",
    C.DISK_TOTAL.name: "this machine's disk",
    # the agent's monotonic time since the rank's first record: elapsed wall time of the test
    C.RANK_WALL.name: "elapsed wall time",
}
# Label values replaced by PLACEHOLDER (metric name -> label): the interpreter running the test.
VARYING_LABELS: Dict[str, Tuple[str, ...]] = {
    C.BUILD_INFO.name: ("python",),
}


# ---------------------------------------------------------------- the datagrams
def _hist(values: Sequence[float], buckets: Sequence[float]) -> List[int]:
    """Non-cumulative bucket counts, +Inf last: the "hist" lists the hooks send (ranksight/totals.py)."""
    out = [0] * (len(buckets) + 1)
    for v in values:
        out[bisect_left(buckets, v)] += 1
    return out


def _totals(durs: Sequence[float], data: float, fwd: float, bwd: float, opt: float, b2o: float, comm: float,
            xcomm: float, micro: int, ckpts: Sequence[Tuple[float, int, bool]] = (),
            step_ckpt: float = 0.0) -> dict:
    """The "tot" and "hist" fields after these steps and checkpoints, as the hooks add them up
    (``step_ckpt``: the steps' checkpoint time, their "ckpt" summed)."""
    n = len(durs)
    ok = [c for c in ckpts if c[2]]
    tot = {"steps": n, "micro": micro * n, "dur": sum(durs), "data": data * n, "fwd": fwd * n, "bwd": bwd * n,
           "opt": opt * n, "b2o": b2o * n, "comm": comm * n, "xcomm": xcomm * n,
           "ckpt": step_ckpt, "ckpt_s": sum(c[0] for c in ckpts), "ckpt_bytes": sum(c[1] for c in ok), "ckpt_n": len(ckpts),
           "ckpt_fail": len(ckpts) - len(ok)}
    if ok:
        tot["lck"], tot["lckd"] = T0, ok[-1][0]
    hist = {"step": _hist(durs, C.STEP_DURATION.buckets), "data": _hist([data] * n, C.DATALOADER_WAIT_HIST.buckets),
            "b2o": _hist([b2o] * n, C.BACKWARD_TO_OPTIMIZER.buckets),
            "ckpt": _hist([c[0] for c in ckpts], C.CHECKPOINT_WRITE.buckets)}
    return {"tot": tot, "hist": hist}


def datagrams() -> List[dict]:
    """Two ranks of one job and a finished single-rank job, every record type the hooks send,
    plus one record the agent must reject and one that is not JSON (appended as bytes by send)."""
    uuid0 = "GPU-standin-00000000-0000-0000-0000-000000000000"  # the stand-in's GPU 0 (rank -> GPU join)
    ids = [dict(v=2, job="train", rank=r, lr=r, ws=2, node=NODE, pid=4000 + r, sess=11 + r, ts=T0) for r in (0, 1)]
    solo = dict(v=2, job="eval", rank=0, lr=0, ws=1, node=NODE, pid=5000, sess=21, ts=T0)
    step_kw = dict(data=0.02, fwd=0.3, bwd=0.6, opt=0.1, b2o=0.7, comm=0.25, xcomm=0.05, micro=2)
    durs = [1.25, 1.5, 4.0]
    ckpt = (12.0, 1 << 30, True)
    out: List[dict] = []
    for r, i in enumerate(ids):
        out.append(dict(i, t="hello", info={"torch": "2.13.0", "gpus": 1, "strategy": "deepspeed", "zero_stage": "2"}, dirs={"checkpoint": "/data/ckpt",
                        "log": "/var/log/train", "tmp": ""}, pstart=T0 - 30.0, gpu=uuid0 if r == 0 else ""))
        out.append(dict(i, t="hb", seq=1, every=30.0, step=0, phase="data", coll=-1.0, probe=0.0))
    r0, r1 = ids
    # rank 0: a batched "steps" record (what the hooks send), an async checkpoint (staged for 0.5 s
    # in the last step, written in 12 s), a heartbeat with totals
    out.append(dict(r0, t="steps", seq=1, dur=durs, ckpt=[0.0, 0.0, 0.5],
                    **{k: [v] * len(durs) for k, v in step_kw.items()},
                    retries=1, ooms=0, mres=8 << 30, malloc=6 << 30, herr=0, hdrop=2, wrss=1 << 28, restart=0,
                    **_totals(durs, **step_kw, step_ckpt=0.5)))
    out.append(dict(r0, t="ckpt", dur=ckpt[0], bytes=ckpt[1], ok=True, src="dcp"))
    out.append(dict(r0, t="hb", seq=2, every=30.0, step=3, phase="forward", coll=-1.0, probe=0.1, pdur=0.1,
                    herr=0, **_totals(durs, **step_kw, ckpts=[ckpt], step_ckpt=0.5)))
    out.append(dict(r0, t="lint", lint=C.LINT_SAMPLER_EPOCH, active=True,
                    msg="DistributedSampler.set_epoch never called"))
    # rank 1: v1-style single step records, a failed checkpoint, a stack while it waits
    for seq, d in enumerate(durs[:2], 1):
        out.append(dict(r1, t="step", seq=seq, dur=d, ckpt=0.25 * (seq - 1), retries=0, ooms=0, mres=0, malloc=0, herr=0,
                        hdrop=0, wrss=0, restart=0, **step_kw))
    out.append(dict(r1, t="ckpt", dur=2.5, bytes=0, ok=False, src="atomic_save"))
    out.append(dict(r1, t="lint", lint=C.LINT_NUMA_BINDING, active=False, msg=""))
    out.append(dict(r1, t="stack", frames=["train.py:53 load_batch", "train.py:80 main"],
                    where="train.py:53 in load_batch <- time.sleep", idle=2.0, phase="data"))
    out.append(dict(r1, t="lint", lint="not_a_lint", active=True, msg=""))  # rejected: unknown lint id
    # a finished job: hello, one step, bye with its totals
    out.append(dict(solo, t="hello", info={}, dirs={}, pstart=T0 - 10.0, gpu=""))
    out.append(dict(solo, t="steps", seq=1, dur=[2.0], ckpt=[0.0], **{k: [v] for k, v in step_kw.items()},
                    **_totals([2.0], **step_kw)))
    out.append(dict(solo, t="bye", **_totals([2.0], **step_kw)))
    return out


# ---------------------------------------------------------------- the agent
def scrape_agent(recs: Sequence[dict], monkeypatch: pytest.MonkeyPatch) -> str:
    """Start the agent, send ``recs`` (and one malformed datagram) over UDP, scrape /metrics once."""
    monkeypatch.setattr(tempfile, "tempdir", "/")  # the disk collector always watches the temp dir: a fixed path
    s = AgentSettings(node=NODE, listen="127.0.0.1:0", ingest="udp://127.0.0.1:0", procfs=str(LOCAL / "proc"),
                      sysfs=str(NE / "sys"), watch_paths=[])
    agent = Agent(s, nvml=NvmlStandin(count=3, clock=lambda: T0))  # steady, sawtooth, idle; frozen clock
    agent.start()
    try:
        assert agent.receiver is not None and agent.receiver.sock is not None
        addr = agent.receiver.sock.getsockname()
        payloads = [P.encode(r) for r in recs] + [b"{not json"]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            for b in payloads:
                u.sendto(b, addr)
        deadline = time.monotonic() + 10.0
        while sum(agent.ingest.snapshot().values()) < len(payloads):
            assert time.monotonic() < deadline, f"agent handled {agent.ingest.snapshot()} of {len(payloads)}"
            time.sleep(0.005)
        with urllib.request.urlopen(f"http://{agent.listen_address}/metrics", timeout=10) as resp:
            return resp.read().decode()
    finally:
        agent.stop()


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})? (?P<value>\S+)$")


def normalise(text: str) -> str:
    """Replace the VARYING sample values and VARYING_LABELS label values; everything else as served."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line) if not line.startswith("#") else None
        if m is not None:
            name, labels, value = m.group("name"), m.group("labels") or "", m.group("value")
            if name in VARYING:
                value = PLACEHOLDER
            for label in VARYING_LABELS.get(name, ()):
                labels = re.sub(rf'([{{,]{label}=)"(?:[^"\\]|\\.)*"', rf'\1"{PLACEHOLDER}"', labels)
            line = f"{name}{labels} {value}"
        out.append(line)
    return "\n".join(out) + "\n"


def golden_diff(got: str, want: str) -> List[str]:
    return list(difflib.unified_diff(want.splitlines(), got.splitlines(), str(GOLDEN.relative_to(ROOT)),
                                     "/metrics (normalised)", lineterm="", n=1))


def check_golden(got: str) -> None:
    if os.environ.get(UPDATE_ENV) == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(got)
        return
    assert GOLDEN.exists(), f"{GOLDEN} is missing: run with {UPDATE_ENV}=1 to write it"
    diff = golden_diff(got, GOLDEN.read_text())
    if diff:
        more = len(diff) - DIFF_LINES
        shown = "\n".join(diff[:DIFF_LINES]) + (f"\n... {more} more diff lines" if more > 0 else "")
        pytest.fail(f"/metrics differs from the golden file (set {UPDATE_ENV}=1 to rewrite it if the change "
                    f"is meant):\n{shown}", pytrace=False)


# ---------------------------------------------------------------- tests
def test_metrics_page_matches_the_golden_file(monkeypatch):
    got = normalise(scrape_agent(datagrams(), monkeypatch))
    check_golden(got)
    # the scenario reaches what it is meant to: every collector up, the records counted as sent
    for name in ("disk", "gpu", "network", "ranks", "rdma"):
        assert f'{C.COLLECTOR_UP.name}{{collector="{name}",node="{NODE}"}} 1.0' in got
    assert f'{C.INGEST_DATAGRAMS.name}{{node="{NODE}",result="malformed"}} 1.0' in got
    assert f'{C.INGEST_DATAGRAMS.name}{{node="{NODE}",result="rejected"}} 1.0' in got


def _changed(recs: List[dict], monkeypatch) -> List[str]:
    assert GOLDEN.exists(), f"{GOLDEN} is missing: run with {UPDATE_ENV}=1 to write it"
    return golden_diff(normalise(scrape_agent(recs, monkeypatch)), GOLDEN.read_text())


def test_a_changed_label_value_shows_in_the_diff(monkeypatch):
    """One lint datagram with another lint id: the lint_active series' label set differs."""
    recs = datagrams()
    i = next(k for k, r in enumerate(recs) if r["t"] == "lint" and r["lint"] == C.LINT_SAMPLER_EPOCH)
    recs[i] = dict(recs[i], lint=C.LINT_IO_AMPLIFICATION)
    diff = _changed(recs, monkeypatch)
    removed = [ln for ln in diff if ln.startswith("-") and not ln.startswith("---")]
    added = [ln for ln in diff if ln.startswith("+") and not ln.startswith("+++")]
    assert any(C.LINT_ACTIVE.name in ln and f'lint="{C.LINT_SAMPLER_EPOCH}"' in ln for ln in removed), diff
    assert any(C.LINT_ACTIVE.name in ln and f'lint="{C.LINT_IO_AMPLIFICATION}"' in ln for ln in added), diff


def test_a_missing_series_shows_in_the_diff(monkeypatch):
    """Without rank 1's checkpoint record its last-checkpoint series is gone from the page."""
    recs = [r for r in datagrams() if not (r["t"] == "ckpt" and r["rank"] == 1)]
    diff = _changed(recs, monkeypatch)
    series = f'{C.LAST_CHECKPOINT_DURATION.name}{{job="train",local_rank="1",node="{NODE}",rank="1"}}'
    assert f"-{series} 2.5" in diff, diff
    assert not [ln for ln in diff if ln.startswith(f"+{series}")], diff


def test_normalise_keeps_names_and_labels_and_replaces_only_the_listed_values():
    text = (f'# HELP {C.COLLECTOR_DURATION.name} x\n'
            f'{C.COLLECTOR_DURATION.name}{{collector="gpu",node="n"}} 0.00123\n'
            f'{C.COLLECTOR_UP.name}{{collector="gpu",node="n"}} 1.0\n'
            f'{C.BUILD_INFO.name}{{node="n",python="3.11.7",version="0.1.0"}} 1.0\n')
    assert normalise(text).splitlines() == [
        f'# HELP {C.COLLECTOR_DURATION.name} x',
        f'{C.COLLECTOR_DURATION.name}{{collector="gpu",node="n"}} {PLACEHOLDER}',
        f'{C.COLLECTOR_UP.name}{{collector="gpu",node="n"}} 1.0',
        f'{C.BUILD_INFO.name}{{node="n",python="{PLACEHOLDER}",version="0.1.0"}} 1.0',
    ]
