"""A clean lifecycle: 100 watch/unwatch cycles in one process, alternating the zero-argument
watch() and the explicit one, over a DataLoader with persistent workers, leave no thread, file
descriptor, child process, patch, hook or Watcher behind; a DataLoader created afterwards gets
healthy workers (they exit 0); a process forked while watched holds a switched-off copy."""
from __future__ import annotations

import os
import sys

import pytest

from integration_workloads.harness import launch, worker_env  # noqa: E402

from ranksight.tools.receiver import Receiver  # noqa: E402

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/
WORKER = os.path.join(TESTS, "integration_workloads", "lifecycle_worker.py")


@pytest.mark.slow
def test_hundred_watch_unwatch_cycles_leave_nothing_behind(tmp_path):
    with Receiver() as rx:
        run = launch([sys.executable, WORKER, "--cycles", "100", "--workers", "2", "--agent", rx.url, "--tmp",
                      str(tmp_path)], worker_env(rx.url, "lifecycle"), timeout=240)
        assert run["rc"] == 0, run["err"][-4000:]
        rx.wait_for(lambda: len({r["ts"] for r in rx.of("bye")}) >= 101, 5)
        assert not rx.invalid, rx.invalid[:3]
    res = run["results"][0]
    assert res["after"] == res["before"], res  # threads (by name), fds, child processes (the persistent workers)
    assert res["state_after"] == res["state_before"]
    assert res["watchers_alive"] == 0
    assert res["steps"] == 400
    assert res["fresh_batches"] == 4 and res["fresh_worker_exitcodes"] == [0, 0]
    # every cycle said hello and bye once; the forked child sent nothing, also not at its exit
    assert len(rx.of("hello")) == 101 and {r["pid"] for r in rx.of("bye")} == {r["pid"] for r in rx.of("hello")}
    assert res["fork_child_status"] == 0
    assert not [r for r in rx.records if r["pid"] == res["fork_child"]]
    assert len(rx.of("ckpt")) == 1  # the parent's torch.save only
    assert (tmp_path / "child.pt").exists() and (tmp_path / "parent.pt").exists()


FORK_DURING_START = r"""
import os, sys, threading, time
import ranksight
from ranksight.hooks import selfcheck

held = threading.Lock()  # stands for a C library's internal lock (NVML during the self-check)
inside = threading.Event()
real = selfcheck.collect

def slow_collect(*a, **k):
    with held:
        inside.set()
        time.sleep(0.4)
        return real(*a, **k)

selfcheck.collect = slow_collect
ranksight.watch(agent="off")
assert inside.wait(5)  # the background thread is inside the "library call" now
t0 = time.monotonic()
pid = os.fork()  # a DataLoader worker starting at this moment
if pid == 0:
    os._exit(0 if held.acquire(timeout=1.0) else 7)  # the child must not inherit the lock held
waited = time.monotonic() - t0
_, status = os.waitpid(pid, 0)
ranksight.unwatch()
print("CHILD", os.waitstatus_to_exitcode(status), "WAITED %.3f" % waited)
"""


def test_a_fork_waits_for_the_background_threads_library_call(tmp_path):
    """The background thread holds a library lock in its start (the NVML self-check on a GPU
    machine); a fork at that moment waits for it, so the child never inherits the lock held."""
    import subprocess

    env = worker_env("off", "forksafe")
    p = subprocess.run([sys.executable, "-c", FORK_DURING_START], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    line = [x for x in p.stdout.splitlines() if x.startswith("CHILD")][-1]
    code, waited = int(line.split()[1]), float(line.split()[3])
    assert code == 0, line
    assert 0.1 <= waited <= 1.0 + 0.2, line  # it waited for the call, at most forksafe.FORK_WAIT
