"""The CUDA allocator's peaks (hooks/memory.py) on a real GPU, in one process (rank 0 of a world of
one): a step in which rank 0 allocates and frees a temporary 512 MiB tensor (the extra logging or
checkpoint buffer of the rank-0-only OOM) puts it in the step's peak ("mpeak") and not in the
current allocated bytes ("malloc"); the background thread's reads and peak resets run under
``torch.cuda.set_sync_debug_mode("error")`` through the watched steps without a synchronizing
call and without a hook error; the values are the allocator's own (compared with
``torch.cuda.memory_stats()`` after the steps, outside the debug mode)."""
from __future__ import annotations

import time

import pytest

from gpu_fixtures import gpu_results  # noqa: F401  (fixture; puts bench/gpu on sys.path)
import gpu_workload as W

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not W.cuda_available(), reason=W.NO_CUDA)]

MiB = 1 << 20
SPIKE = 512 * MiB
HEARTBEAT = 0.05  # the background thread reads the allocator every heartbeat
WINDOW = 0.5  # hooks.memory_peak_seconds: a few peak resets happen inside the watched steps
WATCHED = 1.5  # seconds of watched steps under sync debug mode


class CountingCuda:
    """``torch.cuda`` as hooks/memory.py sees it, counting the two calls it may make."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.stats = 0
        self.resets = 0

    def memory_stats(self, device=None):
        self.stats += 1
        return self.cuda.memory_stats(device)

    def reset_peak_memory_stats(self, device=None):
        self.resets += 1
        return self.cuda.reset_peak_memory_stats(device)


def test_a_rank0_spike_inside_a_step_is_in_the_peak_not_in_the_current_reading(monkeypatch, gpu_results):
    import torch

    import ranksight
    from ranksight.hooks import sender

    for k in ("RANKSIGHT_AGENT", "RANKSIGHT_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    counting = CountingCuda(torch.cuda)
    monkeypatch.setattr(sender.Background, "cuda_api", counting)
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 8)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(256, 1024, device=dev), torch.randint(0, 8, (256,), device=dev)

    def step(spike: bool) -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if spike:  # rank 0's extra work: a temporary buffer, filled and freed within the step
            tmp = torch.empty(SPIKE, dtype=torch.uint8, device=dev)
            tmp.fill_(1)
            del tmp
        opt.step()
        opt.zero_grad()

    w = ranksight.hooks.watcher.start(model, opt, None, agent="off", config={"hooks": {
        "table_every_steps": 0, "table_every_seconds": 0, "heartbeat_seconds": HEARTBEAT,
        "memory_peak_seconds": WINDOW}})
    try:
        for _ in range(3):  # warm-up: AdamW's state and the caching allocator's blocks exist
            step(False)
        torch.cuda.synchronize()
        steady = torch.cuda.memory_allocated(dev)
        time.sleep(2 * WINDOW + 4 * HEARTBEAT)  # every window open so far closed: the warm-up's peaks are gone
        before = (counting.stats, counting.resets)
        steps = 0
        torch.cuda.set_sync_debug_mode("error")
        try:
            t_end = time.perf_counter() + WATCHED
            while time.perf_counter() < t_end:
                step(False)
                steps += 1
                time.sleep(0.005)
            step(w.identity.rank == 0)  # the last watched step carries the spike
            steps += 1
            time.sleep(6 * HEARTBEAT)  # heartbeat reads after the spike, well inside one window
            mem = dict(w.step_state())
        finally:
            torch.cuda.set_sync_debug_mode(0)
        reads, resets = counting.stats - before[0], counting.resets - before[1]
        torch.cuda.synchronize()
        now = torch.cuda.memory_stats(dev)
    finally:
        ranksight.unwatch()
    gpu_results["memory_peaks"] = {"steady_allocated": steady, "mpeak": mem["mpeak"], "malloc": mem["malloc"],
                                   "mrpeak": mem["mrpeak"], "mres": mem["mres"], "reads": reads, "resets": resets,
                                   "steps": steps}
    assert w.herr == 0, "a hook error under sync debug mode (a synchronizing read is caught and counted)"
    assert reads >= WATCHED / HEARTBEAT / 2 and resets >= 2, (reads, resets)
    # the current reading does not hold the freed temporary; the peak does, on top of the steady state
    assert mem["malloc"] < steady + SPIKE // 2, mem
    assert mem["mpeak"] >= steady + SPIKE, mem
    assert mem["mrpeak"] >= mem["mpeak"] and mem["mres"] >= SPIKE  # the cache keeps the freed block reserved
    # the allocator's own counters (no allocation happened since the last read)
    assert mem["malloc"] == now["allocated_bytes.all.current"] and mem["mres"] == now["reserved_bytes.all.current"]
