"""The stalled rank's place: its main-thread stack read by the hooks' background thread,
sent as a "stack" record, kept and served by the agent (/api/v1/ranks, the where series).

Unit parts run in-process (a real thread that sleeps, real datagram encoding); the end to end
part is a real watched training process that hangs in time.sleep inside a function of its own,
with a real agent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ranksight import catalog as C
from ranksight import protocol
from ranksight.hooks import stack
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.ranks import RANKS_API, RankSettings, RankTable

BASE = {"v": 2, "job": "j", "rank": 1, "lr": 1, "ws": 2, "node": "n", "pid": 7, "sess": 3}


def _sleeper(ev: threading.Event) -> None:
    ev.set()
    time.sleep(30)  # the place


def _thread_in_sleeper():
    ev = threading.Event()
    t = threading.Thread(target=_sleeper, args=(ev,), daemon=True)
    t.start()
    ev.wait(5)
    time.sleep(0.05)
    return t


def test_stack_names_the_users_frame_and_the_call_on_its_line() -> None:
    t = _thread_in_sleeper()
    sw = stack.StackWatch(t.ident, after_s=1.0, every_s=5.0)
    assert sw.tick(0.0, idle_s=0.5, phase="data") is None  # making progress: nothing is read
    body = sw.tick(1.0, idle_s=1.5, phase="data")
    assert body is not None
    assert body["where"].startswith("test_stall_place.py:") and body["where"].endswith("in _sleeper <- time.sleep")
    assert body["frames"][0].endswith(" _sleeper")  # innermost first
    assert any("threading.py" in f for f in body["frames"])
    assert sw.tick(2.0, idle_s=2.5, phase="data") is None  # unchanged and too soon: not again
    assert sw.tick(9.0, idle_s=9.5, phase="data") is None  # unchanged: never again
    cleared = sw.tick(10.0, idle_s=0.0, phase="forward")  # progress again: one empty record
    assert cleared == {"frames": [], "where": "", "idle": 0.0, "phase": "forward"}
    assert sw.tick(11.0, idle_s=0.0, phase="forward") is None


def test_stack_goes_again_when_the_collective_position_moves_under_the_same_frames() -> None:
    """A rank blocked in one collective keeps its frames; the Flight Recorder can still retire an
    earlier collective after the rank went on. The record goes again with the new position (the
    agent's desync check compares the ranks' positions), and not while the position stays."""
    t = _thread_in_sleeper()
    sw = stack.StackWatch(t.ident, after_s=1.0, every_s=5.0)
    pos = {"op": "all_reduce", "pg": "default_pg", "seq": 362, "wait": 1.0}
    calls = []

    def waiting():
        calls.append(1)
        return dict(pos)

    assert sw.tick(0.0, idle_s=0.5, phase="backward", waiting=waiting) is None and not calls  # not read in progress
    first = sw.tick(1.0, idle_s=1.5, phase="backward", waiting=waiting)
    assert first is not None and first["cw"]["seq"] == 362
    assert sw.tick(2.0, idle_s=2.5, phase="backward", waiting=waiting) is None and len(calls) == 1  # too soon
    pos["wait"] = 6.0
    assert sw.tick(7.0, idle_s=7.5, phase="backward", waiting=waiting) is None  # same place, only longer
    pos.update(seq=363, wait=0.5)
    again = sw.tick(13.0, idle_s=13.5, phase="backward", waiting=waiting)
    assert again is not None and again["cw"] == pos and again["frames"] == first["frames"]
    assert sw.tick(19.0, idle_s=19.5, phase="backward", waiting=lambda: None) is not None  # the position gone
    assert sw.tick(25.0, idle_s=25.5, phase="backward", waiting=lambda: None) is None


def test_library_frames_are_not_the_place() -> None:
    places = stack.Places()
    assert not places.is_user(threading.__file__)
    assert not places.is_user(stack.__file__)  # ranksight's own wrappers
    import torch

    assert not places.is_user(torch.nn.modules.module.__file__)
    assert places.is_user(__file__)
    frames = [(threading.__file__, 10, "wait"), (__file__, 20, "load_batch"), (__file__, 30, "main")]
    assert places.where(frames).startswith("test_stall_place.py:20 in load_batch")


def test_a_deep_stack_is_capped_to_one_datagram_and_decodes() -> None:
    deep = [(f"/very/long/path/to/some/package/module_{i}.py:{i} " + "f" * 140)[:protocol.MAX_STACK_FRAME] for i in range(40)]
    body = {"frames": deep[:protocol.MAX_STACK_FRAMES], "where": "x.py:1 in f", "idle": 3.0, "phase": "other"}
    data = stack.fit(dict(BASE, t="stack", ts=time.time()), body)
    assert len(data) <= protocol.STACK_DATAGRAM <= protocol.MAX_DATAGRAM
    rec = protocol.decode(data)
    assert 0 < len(rec["frames"]) < protocol.MAX_STACK_FRAMES and rec["frames"][0] == deep[0]


@pytest.mark.parametrize("bad", [{"frames": "x"}, {"frames": ["a" * 500]}, {"frames": ["a"] * 99},
                                 {"frames": [], "where": 3}, {"frames": [1]}, {"frames": [], "phase": "nap"},
                                 {"frames": [], "cw": "all_reduce"}, {"frames": [], "cw": {"op": "x", "pg": "y", "seq": -1}},
                                 {"frames": [], "cw": {"op": "x" * 65, "pg": "y", "seq": 1}}])
def test_bad_stack_records_are_rejected(bad) -> None:
    rec = dict(BASE, t="stack", ts=1.0, where="", idle=1.0, phase="other")
    rec.update(bad)
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.decode(protocol.encode(rec))
    assert e.value.result == "rejected"


def test_a_stack_record_with_its_collective_decodes() -> None:
    cw = {"op": "all_reduce", "pg": "default_pg", "seq": 1234, "wait": 46.0}
    rec = protocol.decode(protocol.encode(dict(BASE, t="stack", ts=1.0, frames=["a.py:1 f"], where="a.py:1 in f",
                                               idle=2.0, phase="other", cw=cw)))
    assert rec["cw"] == cw and rec["frames"] == ["a.py:1 f"]


def _exposed(table: RankTable, now: float):
    fams = {f.name: f for f in RanksCollector(table, clock=lambda: now).collect()}
    return [(s.labels, s.value) for s in fams[C.RANK_STALL_WHERE.name].samples]


def test_agent_keeps_the_stack_and_exposes_where_only_while_stalled() -> None:
    from ranksight import config

    agent_cfg = dict(config.load(env={})["agent"], stall_min_seconds=3.0)
    table = RankTable(RankSettings.from_config(agent_cfg))
    hb = dict(BASE, t="hb", ts=1.0, seq=1, every=1.0, step=5, phase="data", coll=-1.0, probe=0.0)
    table.apply(protocol.decode(protocol.encode(hb)), 0.0)
    st = dict(BASE, t="stack", ts=2.0, frames=["train.py:53 load_batch", "train.py:90 main"],
              where="train.py:53 in load_batch <- time.sleep", idle=1.5, phase="data")
    table.apply(protocol.decode(protocol.encode(st)), 1.5)
    table.check(1.6)
    assert _exposed(table, 1.6) == []  # not stalled yet: no where series
    [r] = table.describe(1.6)
    assert r["stack"]["where"] == st["where"] and r["stack"]["frames"] == st["frames"]
    for i in range(2, 6):  # heartbeats keep coming, no step: stalled after 3 s
        table.apply(protocol.decode(protocol.encode(dict(hb, seq=i, probe=float(i)))), float(i))
    table.check(5.0)
    [(labels, value)] = _exposed(table, 5.0)
    assert labels["where"] == st["where"] and labels["phase"] == "data" and labels["rank"] == "1"
    assert value == pytest.approx(1.5 + 3.5)
    table.apply(protocol.decode(protocol.encode(dict(st, frames=[], where="", idle=0.0))), 5.5)
    assert table.describe(5.5)[0]["stack"] is None


HANG = textwrap.dedent("""
    import time, torch, ranksight
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ranksight.watch(model, opt)

    def load_batch():
        time.sleep(60)

    for i in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    load_batch()
""")


# A data-pipeline hang: the dataset's read blocks inside next() on the loader (phase data).
HANG_DATA = textwrap.dedent("""
    import time, torch, ranksight
    from torch.utils.data import DataLoader, Dataset

    class Shards(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            if i >= 6:
                time.sleep(60)
            return torch.randn(4)

    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x in ranksight.watch(model, opt, DataLoader(Shards(), batch_size=2)):
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()
""")
PLACES = {"hang": (HANG, "hang_train.py:8 in load_batch <- time.sleep", "hang_train.py:8 load_batch", "other"),
          "data": (HANG_DATA, "hang_train.py:10 in __getitem__ <- time.sleep", "hang_train.py:10 __getitem__", "data")}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PLACES))
def test_a_hung_process_shows_its_place_on_the_agents_api(agent, tmp_path: Path, kind: str) -> None:
    src, where, innermost, phase = PLACES[kind]
    a = agent(env={"RANKSIGHT__agent__stall_min_seconds": "1"})
    script = tmp_path / "hang_train.py"
    script.write_text(src)
    env = dict(os.environ, RANKSIGHT_AGENT=a.ingest, RANKSIGHT_JOB="hangs", RANKSIGHT__hooks__stack_after_seconds="0.5",
               RANKSIGHT__hooks__stack_every_seconds="0.5", OMP_NUM_THREADS="1")
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline, got = time.monotonic() + 40, None
        while time.monotonic() < deadline and got is None:
            time.sleep(0.3)
            with urllib.request.urlopen(a.url + RANKS_API, timeout=5) as r:
                doc = json.load(r)
            got = next((x for x in doc["ranks"] if x["job"] == "hangs" and x["stack"]), None)
        assert got is not None, doc
        assert got["stack"]["where"] == where and got["stack"]["phase"] == phase, got
        assert got["stack"]["frames"][0].endswith(innermost), got
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and f'where="{where}"' not in a.metrics_text():
            time.sleep(0.3)
        assert f'where="{where}"' in a.metrics_text() and f'phase="{phase}"' in a.metrics_text()
        assert where in a.log_file.read_text()
    finally:
        p.kill()
        p.wait()


def test_the_wrappers_count_each_groups_collectives_for_the_blocked_position() -> None:
    from ranksight.hooks.comm import CommTracker

    tr = CommTracker(lambda what, e: None, threading.get_ident())
    a = tr.launch(event=False, op="all_reduce")  # the default group
    b = tr.launch(event=False, op="broadcast")
    tr.launch(event=False)  # no op (a comm hook that says nothing): counted nowhere
    got = tr.waiting(a[1] + 2.0)
    assert got == {"op": "all_reduce", "pg": "default_pg", "seq": 1, "wait": 2.0}
    tr.complete(a[0], a[1], None)
    got = tr.waiting(b[1] + 1.0)
    assert (got["op"], got["seq"]) == ("broadcast", 2)
    tr.complete(b[0], b[1], None)
    assert tr.waiting(b[1] + 1.0) is None


def test_agent_exposes_a_blocked_ranks_collective_position() -> None:
    from ranksight import config

    table = RankTable(RankSettings.from_config(dict(config.load(env={})["agent"], stall_min_seconds=3.0)))
    hb = dict(BASE, t="hb", ts=1.0, seq=1, every=1.0, step=5, phase="backward", coll=0.5, probe=0.0)
    cw = {"op": "all_reduce", "pg": "default_pg", "seq": 1234, "wait": 1.5}
    st = dict(BASE, t="stack", ts=2.0, frames=["reducer.py:9 wait"], where="train.py:40 in main <- loss.backward",
              idle=1.5, phase="backward", cw=cw)
    for i in range(0, 6):
        table.apply(protocol.decode(protocol.encode(dict(hb, seq=i + 1, coll=0.5 + i, probe=float(i)))), float(i))
        if i == 1:
            table.apply(protocol.decode(protocol.encode(st)), 1.5)
    table.check(5.0)
    fams = {f.name: f for f in RanksCollector(table, clock=lambda: 5.0).collect()}
    [seq] = fams[C.RANK_COLLECTIVE_SEQ.name].samples
    [wait] = fams[C.RANK_COLLECTIVE_WAIT.name].samples
    assert (seq.labels["op"], seq.labels["pg"], seq.value) == ("all_reduce", "default_pg", 1234.0)
    assert wait.value == pytest.approx(1.5 + 3.5)
    assert table.describe(5.0)[0]["stack"]["collective"]["seq"] == 1234
