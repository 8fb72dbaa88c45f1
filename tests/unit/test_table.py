"""The rank-0 console step table: cadence, legend, share moves, and whole-line writes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from ranksight import config
from ranksight.hooks import table as T
from ranksight.hooks.watcher import load_settings


def fill(t: T.StepTable, n: int, dur: float = 0.1, data: float = 0.0, comm: float = 0.0, xcomm: float = 0.0,
         ckpt: float = 0.0) -> None:
    for _ in range(n):
        t.add(t.last_seq + 1, dur, data, comm, xcomm, ckpt)


def test_defaults_are_every_100_steps_at_most_every_30_s():
    h = config.defaults()["hooks"]
    assert (h["table_every_steps"], h["table_every_seconds"], h["table_min_seconds"], h["table_share_move"]) == \
        (100, 60.0, 30.0, 0.1)
    s = load_settings({"hooks": {}})
    assert (s.table_min_seconds, s.table_share_move) == (30.0, 0.1)


def test_every_n_steps_but_never_sooner_than_min_seconds():
    t = T.make_table(100, 60, now=0.0, min_seconds=30, share_move=0.1)
    fill(t, 100, dur=0.05)  # 100 steps in 5 s
    assert not t.due(5.0) and not t.due(29.9)
    assert t.due(30.0) and t.moved == ""
    t.render("j", 30.0), t.reset(30.0)
    fill(t, 5, dur=20)  # a slow job: 5 steps, the time trigger
    assert not t.due(89.0) and t.due(90.0)
    assert T.make_table(0, 0, now=0.0) is None  # both triggers off: no table


def test_a_share_that_moves_prints_early_and_says_which():
    t = T.make_table(100, 60, now=0.0, min_seconds=30, share_move=0.1)
    fill(t, 300, dur=0.1, comm=0.02, xcomm=0.01)
    assert t.due(30.0)
    first = t.render("demo", 30.0)
    t.reset(30.0)
    fill(t, 40, dur=0.1, comm=0.02, xcomm=0.015)  # 10% -> 15%: not a move
    assert not t.due(41.0)
    fill(t, 40, dur=0.1, comm=0.06, xcomm=0.06)  # the window's x-comm is now 37.5%
    assert not t.due(35.0)  # a move needs MOVE_MIN_SECONDS of window
    assert t.due(41.0) and t.moved.startswith("x-comm 10% -> ")
    second = t.render("demo", 41.0)
    assert "(x-comm 10% -> " in second.splitlines()[0]
    # the legend once, under the first table
    assert first.splitlines()[-1] == T.LEGEND and T.LEGEND not in second
    assert "x-comm = exposed comm" in T.LEGEND and "need not sum to 100%" in T.LEGEND


def test_shares_add_up_except_comm():
    t = T.make_table(1, 0, now=0.0)
    t.add(1, 1.0, 0.1, 0.5, 0.2, 0.05)
    data, compute, comm, xcomm, ckpt = t.shares()
    assert abs(data + compute + xcomm + ckpt - 1.0) < 1e-9 and comm == 0.5
    row = t.render("j", 1.0).splitlines()[2]
    assert row.split()[-5:] == ["10.0%", "65.0%", "50.0%", "20.0%", "5.0%"]


LOAD = """
import importlib.util, sys, threading
spec = importlib.util.spec_from_file_location("table", {path!r})  # without torch's import time
table = sys.modules["table"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(table)
emit = table.emit
"""


def test_emit_keeps_the_scripts_earlier_lines_first():
    """stdout block-buffered into a pipe shared with stderr (python without -u): the lines the
    script printed before the table come out before it, not after."""
    code = LOAD.format(path=T.__file__) + textwrap.dedent("""
        for i in range(5):
            print("script line", i)
        t = threading.Thread(target=emit, args=("ranksight step time, t\\nrow\\n",))
        t.start(); t.join()
        print("script line 5")
    """)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    p = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=60, env=env)
    assert p.stdout.splitlines() == [f"script line {i}" for i in range(5)] + ["ranksight step time, t", "row",
                                                                             "script line 5"], p.stdout


def test_emit_writes_whole_lines_from_many_threads():
    """Four threads emit three-line blocks into one pipe (python -u): no line is ever split, and
    each block stays together."""
    code = LOAD.format(path=T.__file__) + textwrap.dedent("""
        block = "ranksight step time, t{i}\\n" + "x" * 300 + "\\n" + "row {i}\\n"
        def go(i):
            for _ in range(200):
                emit(block.format(i=i))
        ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    """)
    p = subprocess.run([sys.executable, "-u", "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 4 * 200 * 3
    for k in range(0, len(lines), 3):
        head, body, row = lines[k:k + 3]
        i = head.rsplit("t", 1)[1]
        assert head == f"ranksight step time, t{i}" and body == "x" * 300 and row == f"row {i}", lines[k:k + 3]
