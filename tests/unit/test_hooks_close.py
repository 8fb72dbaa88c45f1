"""Nothing lost at the end of a watch: every step goes out before the "bye", whatever the
background thread is doing when ``close()`` runs."""
from __future__ import annotations

import threading
import time

import torch
import torch.nn as nn

import ranksight
from ranksight.hooks import closing

from hooks_workloads.harness import Receiver, with_detail

FAST = with_detail({"hooks": {"heartbeat_seconds": 0.05, "table_every_steps": 0, "table_every_seconds": 0}})


def _make(n: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    return model, opt, [(torch.randn(8, 16), torch.randn(8, 2)) for _ in range(n)]


def test_a_send_in_progress_on_the_background_thread_ends_before_the_bye(monkeypatch):
    """The background thread is stalled inside its send of a "steps" record (a loaded machine:
    descheduled right after it took the queued steps) for longer than close() waits for it to
    stop. close() must let that send finish before its own final flush and the bye: steps sent
    after the bye, or into the closed socket, would be lost."""
    monkeypatch.setattr(closing, "JOIN_SECONDS", 0.05, raising=False)
    rx = Receiver()
    try:
        model, opt, data = _make(8)
        loader = ranksight.watch(model, opt, data, agent=rx.url, config=FAST)
        w = ranksight.hooks.current()
        real = w._send_steps
        stalled, resume = threading.Event(), threading.Event()

        def send_steps(batch):
            if threading.current_thread() is w._thread and not stalled.is_set():
                stalled.set()
                resume.wait(5.0)
            real(batch)

        w._send_steps = send_steps
        n = 0
        for x, y in loader:
            ((model(x) - y) ** 2).mean().backward()
            opt.step()
            opt.zero_grad()
            n += 1
            if n == 3:
                assert stalled.wait(5.0), "the background thread never sent a steps record"
        threading.Timer(0.3, resume.set).start()  # well after close()'s join gave up
        ranksight.unwatch()
        assert rx.wait_for(lambda: len(rx.of("bye")) >= 1)
        time.sleep(0.2)  # anything sent late would arrive now
        kinds = [(r["t"], r.get("seq")) for r in rx.records]
        first_bye = kinds.index(("bye", None))
        seqs = [s for t, s in kinds[:first_bye] if t == "step"]
        assert seqs == list(range(1, 9)), kinds
        assert not [t for t, _ in kinds[first_bye:] if t not in ("bye",)], kinds
        assert rx.of("bye")[0]["tot"]["steps"] == 8
        assert w.herr == 0
    finally:
        ranksight.unwatch()
        rx.close()
