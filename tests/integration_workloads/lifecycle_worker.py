"""Many watch/unwatch cycles in one process over one DataLoader with persistent workers, then a
new DataLoader with fresh workers. Prints RESULT with threads, fds and child processes before
and after, the workers' exit codes, and whether every Watcher was freed."""
from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import threading
import weakref

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import SleepyTokens, hooks_state, result  # noqa: E402

import psutil  # noqa: E402
import torch  # noqa: E402

import ranksight  # noqa: E402


def census() -> dict:
    me = psutil.Process()
    return {"threads": sorted(t.name for t in threading.enumerate()), "fds": len(os.listdir("/proc/self/fd")),
            "children": sorted(c.pid for c in me.children(recursive=True))}


def one_epoch(model: torch.nn.Module, opt: torch.optim.Optimizer, loader) -> int:
    n = 0
    dev = next(model.parameters()).device
    for ids in loader:
        ids = ids.to(dev)
        loss = torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), ids.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        n += 1
    return n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--agent", default=None)
    ap.add_argument("--tmp", default="/tmp")
    ap.add_argument("--device", default="cpu", help="where the model lives (cuda on the GPU machine)")
    ap.add_argument("--fresh-every", type=int, default=0,
                    help="also iterate a new DataLoader (fresh forked workers) every N cycles, right after watch()")
    a = ap.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 8), torch.nn.Linear(8, 64)).to(a.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    # first, before any DataLoader worker exists: a plain os.fork() while watched: the child's copy
    # is off (no records, no "bye" at its exit)
    ranksight.watch(model, opt, None, agent=a.agent)
    pid = os.fork()
    if pid == 0:
        ok = ranksight.hooks.current() is None
        torch.save({"x": 1}, os.path.join(a.tmp, "child.pt"))  # patched in the parent: passes through here
        atexit._run_exitfuncs()  # what a normal exit runs (the watch registered its close() there)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    torch.save({"x": 1}, os.path.join(a.tmp, "parent.pt"))
    ranksight.unwatch()
    ds = SleepyTokens(8, sleep=0.0, dict_items=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=a.workers, persistent_workers=True)
    one_epoch(model, opt, loader)  # the persistent workers start here, before the baseline
    state0, before = hooks_state(), census()
    refs, steps = [], 0
    fresh_runs: list = []
    fresh_codes: list = []
    for i in range(a.cycles):
        # alternate the front doors: nothing given (discovery), and everything given
        watched = ranksight.watch(agent=a.agent) if i % 2 == 0 else ranksight.watch(model, opt, loader, agent=a.agent)
        w = ranksight.hooks.current()
        refs.append(weakref.ref(w))
        if a.fresh_every and i % a.fresh_every == 0:  # workers forked while the new watch's thread starts
            extra = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=a.workers)
            it = iter(extra)
            fresh_runs.append(sum(1 for _ in it))
            fresh_codes.extend(p.exitcode for p in it._workers)
            del it, extra
        steps += one_epoch(model, opt, loader if i % 2 == 0 else watched)
        seen = w.stats()["steps"]
        ranksight.unwatch()
        assert w.stats()["steps"] == 4 and seen >= 3, (i, seen, w.stats())
        del w, watched
    gc.collect()
    after = census()
    alive = sum(1 for r in refs if r() is not None)
    # a later DataLoader: fresh workers forked after the cycles
    fresh = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=a.workers, persistent_workers=True)
    it = iter(fresh)
    pids = [p.pid for p in it._workers]
    got = sum(1 for _ in it)
    workers = it._workers
    del it
    fresh._iterator._shutdown_workers()
    codes = [p.exitcode for p in workers]
    result(fork_child=pid, fork_child_status=os.waitstatus_to_exitcode(status), before=before, after=after,
           state_before=state0, state_after=hooks_state(), watchers_alive=alive, steps=steps, fresh_batches=got,
           cycle_fresh_batches=fresh_runs, cycle_fresh_exitcodes=fresh_codes, fresh_worker_exitcodes=codes,
           fresh_workers=len(pids))


if __name__ == "__main__":
    main()
