"""ranksight.common.plumbing.Proc, the one process handle: real child processes (each under a
second), their logs, their environment, a daemon found again by its pid file, a group stop."""
from __future__ import annotations

import os
import signal
import sys
import time

from ranksight.common.plumbing import Proc, pid_alive, wait_for

SLEEPER = [sys.executable, "-c", "import os, time; print('up', os.environ.get('X_RS', '-'), flush=True); "
                                 "time.sleep(60)"]


def test_start_log_env_and_stop(tmp_path):
    log = tmp_path / "p.log"
    log.write_text("old\n")
    p = Proc(SLEEPER, log, {**os.environ, "X_RS": "1"}, fresh_log=True).start()
    try:
        wait_for(lambda: "up 1" in p.text(), 10, "the child's first line")
        assert p.alive() and p.exited() is None and "old" not in p.text() and p.tail(4) == "p 1\n"
    finally:
        p.stop(2.0)
    assert not p.alive() and p.exited() == -signal.SIGTERM


def test_wait_and_signal(tmp_path):
    p = Proc([sys.executable, "-c", "import sys; sys.exit(3)"], tmp_path / "x.log").start()
    assert p.wait(10) == 3 and not p.alive()
    q = Proc(SLEEPER, tmp_path / "q.log").start()
    q.signal(signal.SIGKILL)
    assert q.wait(10) == -signal.SIGKILL


def test_a_daemon_is_found_again_by_its_pid_file(tmp_path):
    pid_file = tmp_path / "d.pid"
    p = Proc(SLEEPER, tmp_path / "d.log", name="sleeper", pid_file=pid_file, marker="time.sleep(60)").start(daemon=True)
    pid = p.popen.pid
    try:
        again = Proc([], tmp_path / "d.log", name="sleeper", pid_file=pid_file, marker="time.sleep(60)")
        assert again.pid() == pid and Proc([], tmp_path / "d.log", pid_file=pid_file, marker="other").pid() is None
        again.stop(2.0)
        assert not pid_alive(pid) and not pid_file.exists()
    finally:
        p.stop(1.0)


def test_group_stop_ends_the_children_too(tmp_path):
    child = tmp_path / "child.pid"
    code = (f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(child)!r}, 'w').write(str(c.pid)); time.sleep(60)")
    p = Proc([sys.executable, "-c", code], tmp_path / "g.log", group=True).start()
    wait_for(lambda: child.exists() and child.read_text(), 10, "the grandchild's pid")
    grandchild = int(child.read_text())
    p.stop(2.0)
    deadline = time.monotonic() + 5
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not pid_alive(grandchild)
