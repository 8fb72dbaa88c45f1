"""Per-rank state, driven datagram by datagram with an explicit clock: counters and
histograms, the windowed quantiles, heartbeat misses, rank_up, goodbye, TTL, restarts,
stalls and their blame, caps and lints."""
from __future__ import annotations

import math
import random

import pytest

from ranksight import catalog as C
from ranksight.exporter.ingest import Ingest
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.ranks import RECEIVE_DELAY_MAX, RankSettings, RankTable
from ranksight.exporter.stats import WindowQuantile

from test_exporter_helpers import dgram, hb, ident, one, parse, series, step


class World:
    def __init__(self, gpu_labels=None, **settings):
        self.now = 1000.0
        self.table = RankTable(RankSettings(**settings))
        self.ingest = Ingest(self.table, clock=lambda: self.now)
        self.col = RanksCollector(self.table, clock=lambda: self.now, gpu_labels=gpu_labels)

    def send(self, identity: dict, body: dict) -> str:
        return self.ingest.handle(dgram(identity, body), self.now)

    def tick(self, seconds: float, every: float = 0.25) -> None:
        """Advance the clock, running the checker as the agent does (4x per heartbeat interval)."""
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + every)
            self.table.check(self.now)

    def scrape(self):
        from ranksight.exporter.exposition import TextWriter

        return parse(TextWriter().render(self.col.collect()).decode())


def test_counters_histograms_and_gauges_add_up():
    w = World()
    i = ident(rank=1, lr=1, node="nodeA")
    durs = [0.004, 0.01, 0.03, 0.2, 0.2, 1.5, 40.0]
    for n, d in enumerate(durs, 1):
        assert w.send(i, step(seq=n, dur=d, data=d / 10, comm=d / 4, xcomm=d / 8, retries=n // 2, herr=1, mres=10 * n,
                              malloc=5 * n, micro=2)) == "ok"
    got = w.scrape()
    lab = dict(job="job", node="nodeA", rank="1", local_rank="1")
    assert one(got, C.STEPS.name, **lab) == len(durs)
    assert one(got, C.MICROBATCHES.name, **lab) == 2 * len(durs)
    assert one(got, C.STEP_SECONDS.name, **lab) == pytest.approx(sum(durs))
    assert one(got, C.DATALOADER_WAIT.name, **lab) == pytest.approx(sum(durs) / 10)
    assert one(got, C.COMM_SECONDS.name, **lab) == pytest.approx(sum(durs) / 4)
    assert one(got, C.EXPOSED_COMM_SECONDS.name, **lab) == pytest.approx(sum(durs) / 8)
    assert one(got, C.CUDA_ALLOC_RETRIES.name, **lab) == len(durs) // 2  # cumulative on the sender
    assert one(got, C.HOOK_ERRORS.name, **lab) == 1
    assert one(got, C.CUDA_RESERVED.name, **lab) == 10 * len(durs)
    assert one(got, C.CUDA_ALLOCATED.name, **lab) == 5 * len(durs)
    for b in C.STEP_BUCKETS:
        assert one(got, C.STEP_DURATION.bucket, le=repr(b), **lab) == sum(1 for d in durs if d <= b)
    assert one(got, C.STEP_DURATION.bucket, le="+Inf", **lab) == len(durs)
    assert one(got, C.STEP_DURATION.count, **lab) == len(durs)
    assert one(got, C.STEP_DURATION.sum, **lab) == pytest.approx(sum(durs))
    assert one(got, C.LAST_STEP.name, **lab) > 1e9
    assert one(got, C.RANK_UP.name, **lab) == 1


def test_window_quantile_is_within_half_a_percent_and_forgets():
    rng = random.Random(7)
    wq = WindowQuantile(300.0)
    vals = []
    t = 0.0
    for _ in range(30000):  # 100 steps/s for 5 minutes
        v = rng.lognormvariate(math.log(0.05), 0.3)
        vals.append(v)
        wq.observe(v, t)
        t += 0.01
    p50, p99 = wq.quantiles((0.5, 0.99), t)
    s = sorted(vals)
    assert p50 == pytest.approx(s[math.ceil(0.5 * len(s)) - 1], rel=0.005)
    assert p99 == pytest.approx(s[math.ceil(0.99 * len(s)) - 1], rel=0.005)
    # a new regime: after a full window only the new values count
    for _ in range(3000):
        wq.observe(2.0, t)
        t += 0.1
    p50, p99 = wq.quantiles((0.5, 0.99), t)
    assert p50 == pytest.approx(2.0, rel=0.005) and p99 == pytest.approx(2.0, rel=0.005)
    assert wq.quantiles((0.5,), t + 400) is None


def test_quantile_series_exposed_over_the_configured_window():
    w = World(quantile_window_seconds=10.0)
    i = ident()
    for n in range(1, 101):
        w.send(i, step(seq=n, dur=0.01 * n))
        w.now += 0.05
    got = w.scrape()
    assert one(got, C.STEP_QUANTILE.name, quantile="0.5") == pytest.approx(0.5, rel=0.005)
    assert one(got, C.STEP_QUANTILE.name, quantile="0.99") == pytest.approx(0.99, rel=0.005)
    w.now += 11
    assert not series(w.scrape(), C.STEP_QUANTILE.name)


def test_heartbeat_misses_rank_up_and_recovery():
    w = World(down_after_misses=3)
    i = ident()
    w.send(i, hb(every=1.0))
    # a heartbeat may wait in the socket up to the receiver's sleep before it is stamped
    w.tick(1.25 + RECEIVE_DELAY_MAX)
    assert one(w.scrape(), C.HEARTBEAT_MISSES.name) == 0  # late by less than half an interval: not yet a miss
    w.tick(0.5)
    got = w.scrape()
    assert one(got, C.HEARTBEAT_MISSES.name) == 1
    assert one(got, C.RANK_UP.name) == 1
    w.tick(2.0)
    got = w.scrape()
    assert one(got, C.HEARTBEAT_MISSES.name) == 3
    assert one(got, C.RANK_UP.name) == 0
    w.send(i, hb(seq=2, every=1.0))
    got = w.scrape()
    assert one(got, C.RANK_UP.name) == 1
    assert one(got, C.HEARTBEAT_MISSES.name) == 3  # a counter: misses stay counted
    for k in range(10):  # on time: no more misses
        w.tick(1.0)
        w.send(i, hb(seq=3 + k, every=1.0))
    assert one(w.scrape(), C.HEARTBEAT_MISSES.name) == 3


def test_miss_interval_follows_the_senders_every():
    w = World()
    i = ident()
    w.send(i, hb(every=0.2))
    w.tick(1.0 + RECEIVE_DELAY_MAX, every=0.05)
    assert one(w.scrape(), C.HEARTBEAT_MISSES.name) == 4  # floor(1.0 / 0.2 - 0.5), after the receive delay


def test_goodbye_removes_the_rank_and_its_series_at_once():
    w = World()
    a, b = ident(rank=0), ident(rank=1)
    w.send(a, step())
    w.send(b, step())
    assert len(series(w.scrape(), C.STEPS.name)) == 2
    assert w.send(b, {"t": "bye"}) == "ok"
    got = w.scrape()
    assert set(dict(k)["rank"] for k in series(got, C.STEPS.name)) == {"0"}
    assert not series(got, C.RANK_UP.name, rank="1")
    assert w.send(b, {"t": "bye"}) == "ok"  # a second goodbye is harmless


def test_silent_rank_dropped_after_ttl():
    w = World(rank_ttl_seconds=60.0)
    w.send(ident(), hb())
    w.tick(59)
    assert series(w.scrape(), C.RANK_UP.name)
    w.tick(2)
    assert not series(w.scrape(), C.RANK_UP.name)
    assert len(w.table) == 0 and w.table.jobs == {}


def test_restarted_rank_continues_its_counters():
    w = World()
    for n in range(1, 6):
        w.send(ident(pid=111), step(seq=n, dur=1.0, retries=n, herr=n))
    for n in range(1, 4):  # new process: seq and cumulative fields start again
        w.send(ident(pid=222), step(seq=n, dur=1.0, retries=n, herr=0))
    got = w.scrape()
    assert one(got, C.STEPS.name) == 8
    assert one(got, C.STEP_SECONDS.name) == 8.0
    assert one(got, C.CUDA_ALLOC_RETRIES.name) == 5 + 3
    assert one(got, C.HOOK_ERRORS.name) == 5


def test_stall_no_progress_vs_waiting_in_collective_and_checkpoint_exempt():
    w = World(stall_min_seconds=30.0, stall_p99_factor=5.0)
    culprit, waiter, saver = ident(rank=0), ident(rank=1), ident(rank=2, ws=3)
    for r in (culprit, waiter, saver):
        r["ws"] = 3
    for n in range(1, 50):
        for r in (culprit, waiter, saver):
            w.send(r, step(seq=n, dur=0.5))
        w.now += 0.5
    # from here no step: heartbeats only
    for k in range(40):
        w.send(culprit, hb(seq=k, step_=49, phase="forward", coll=-1.0, probe=k))
        w.send(waiter, hb(seq=k, step_=49, phase="backward", coll=float(k), probe=k))
        w.send(saver, hb(seq=k, step_=49, phase="checkpoint", coll=-1.0, probe=k, pdur=float(k)))
        w.tick(1.0)
        got = w.scrape()
        stalled = {(dict(k2)["rank"], dict(k2)["reason"]): v for k2, v in series(got, C.RANK_STALLED.name).items()}
        if k < 29:
            assert not any(stalled.values()), (k, stalled)
    assert stalled == {("0", "no_progress"): 1, ("0", "waiting_in_collective"): 0,
                       ("1", "no_progress"): 0, ("1", "waiting_in_collective"): 1,
                       ("2", "no_progress"): 0, ("2", "waiting_in_collective"): 0}
    assert one(got, C.CHECKPOINT_IN_PROGRESS.name, rank="2") == pytest.approx(39 + 1.0)
    assert one(got, C.CHECKPOINT_IN_PROGRESS.name, rank="0") == 0
    # a step clears the stall
    w.send(culprit, step(seq=50, dur=20.0))
    w.tick(0.25)
    assert one(w.scrape(), C.RANK_STALLED.name, rank="0", reason="no_progress") == 0


def test_stall_limit_scales_with_p99_and_probe_counts():
    w = World(stall_min_seconds=1.0, stall_p99_factor=5.0)
    r = ident()
    for n in range(1, 20):
        w.send(r, step(seq=n, dur=2.0))
    w.send(r, hb(step_=19, probe=0.0))
    w.tick(5.0)  # limit = max(1, 5 x 2.0) = 10 s: heartbeats keep it alive
    for k in range(4):
        w.send(r, hb(seq=k, step_=19, probe=0.0))
        w.tick(1.0)
    assert one(w.scrape(), C.RANK_STALLED.name, reason="no_progress") == 0
    w.tick(0.5)
    w.send(r, hb(seq=9, step_=19, probe=0.0))
    w.tick(1.0)
    assert one(w.scrape(), C.RANK_STALLED.name, reason="no_progress") == 1
    # the main-thread probe alone (steps still arriving in the datagrams' view) also counts
    w2 = World(stall_min_seconds=1.0)
    w2.send(r, step(seq=1, dur=0.1))
    w2.send(r, hb(step_=1, probe=5.0, coll=3.0))
    w2.tick(0.25)
    assert one(w2.scrape(), C.RANK_STALLED.name, reason="waiting_in_collective") == 1


def test_dead_rank_is_down_not_stalled():
    w = World(stall_min_seconds=1.0)
    r = ident()
    w.send(r, step())
    w.send(r, hb())
    w.tick(10)
    got = w.scrape()
    assert one(got, C.RANK_UP.name) == 0
    assert not any(series(got, C.RANK_STALLED.name).values())


def test_caps_on_ranks_and_jobs_count_overflow():
    w = World(max_ranks=5, max_jobs=2)
    res = [w.send(ident(job="a", rank=r, ws=10), step()) for r in range(4)]
    res += [w.send(ident(job="b", rank=0), step()), w.send(ident(job="c", rank=0), step())]
    res += [w.send(ident(job="b", rank=1), step())]
    assert res == ["ok"] * 5 + ["overflow", "overflow"]
    assert w.ingest.counts["overflow"] == 2
    w.send(ident(job="a", rank=0, ws=10), {"t": "bye"})
    assert w.send(ident(job="b", rank=1), step()) == "ok"


def test_lints_and_hello_dirs():
    w = World()
    r = ident()
    assert w.send(r, {"t": "lint", "lint": "sampler_epoch", "active": True, "msg": "set_epoch never called"}) == "ok"
    assert w.send(r, {"t": "lint", "lint": "made_up_lint", "active": True}) == "rejected"
    assert w.send(r, {"t": "hello", "info": {}, "dirs": {"checkpoint": "/data/ck/", "log": "relative/logs", "tmp": ""}}) == "ok"
    assert w.send(r, {"t": "lint", "lint": "numa_binding", "active": False, "msg": ""}) == "ok"  # checked, fine
    got = w.scrape()
    assert one(got, C.LINT_ACTIVE.name, lint="sampler_epoch") == 1
    assert not series(got, C.LINT_ACTIVE.name, lint="made_up_lint")
    assert not series(got, C.LINT_ACTIVE.name, lint="numa_binding"), "a lint found fine has no series"
    assert len(series(got, C.LINT_ACTIVE.name)) == 1
    assert w.table.watched_dirs() == {"/data/ck"}
    other = ident(rank=1)
    assert w.send(other, {"t": "lint", "lint": "sampler_epoch", "active": True, "msg": ""}) == "ok"
    w.send(r, {"t": "lint", "lint": "sampler_epoch", "active": False})  # clears on rank 0 only
    got = w.scrape()
    assert not series(got, C.LINT_ACTIVE.name, rank="0"), "a cleared lint disappears from the exposition"
    assert one(got, C.LINT_ACTIVE.name, rank="1", lint="sampler_epoch") == 1
    w.send(r, {"t": "lint", "lint": "sampler_epoch", "active": True})  # and comes back when it applies again
    assert one(w.scrape(), C.LINT_ACTIVE.name, rank="0", lint="sampler_epoch") == 1


def test_global_batch_change_without_lr_change_across_restarts():
    """The agent keeps each job's global batch and base LR across restarts (a clean exit too) and
    raises global_batch_lr when the batch changed but the LR did not; the sender's flag is ignored."""
    w = World()
    lint = lambda gb, lr: {"t": "lint", "lint": "global_batch_lr", "active": True, "msg": "", "gbatch": gb, "lrate": lr}
    r = ident(ws=4)
    assert w.send(r, lint(4096, 1e-3)) == "ok"  # first start: nothing to compare with
    assert not series(w.scrape(), C.LINT_ACTIVE.name), "the sender's active flag is ignored"
    w.send(r, {"t": "bye"})
    r2 = ident(ws=2, pid=4242)  # restarted on half the ranks, same job, same LR
    assert w.send(r2, lint(2048, 1e-3)) == "ok"
    assert one(w.scrape(), C.LINT_ACTIVE.name, lint="global_batch_lr") == 1
    assert w.send(r2, lint(2048, 1e-3)) == "ok"  # same batch as last time: fine again
    assert not series(w.scrape(), C.LINT_ACTIVE.name)
    assert w.send(r2, lint(1024, 1e-3)) == "ok"  # changed again, LR still the same
    assert one(w.scrape(), C.LINT_ACTIVE.name, lint="global_batch_lr") == 1
    assert w.send(r2, lint(4096, 2e-3)) == "ok"  # batch and LR scaled together: fine
    assert not series(w.scrape(), C.LINT_ACTIVE.name)
    other = ident(job="other")
    assert w.send(other, lint(1024, 2e-3)) == "ok"  # another job's history is its own
    assert not series(w.scrape(), C.LINT_ACTIVE.name, job="other")
    assert w.send(other, lint(512, 2e-3)) == "ok"
    assert one(w.scrape(), C.LINT_ACTIVE.name, job="other", lint="global_batch_lr") == 1
    assert not series(w.scrape(), C.LINT_ACTIVE.name, job="job")
    assert w.send(r2, {"t": "lint", "lint": "global_batch_lr", "active": True, "gbatch": -1, "lrate": 1e-3}) == "rejected"


def test_checkpoint_records():
    w = World()
    r = ident()
    w.send(r, {"t": "ckpt", "dur": 3.0, "bytes": 1000, "ok": True, "src": "torch.save"})
    w.send(r, step(seq=1, dur=3.5, ckpt=3.0))  # the step the blocking save held
    w.send(r, {"t": "ckpt", "dur": 70.0, "bytes": 5, "ok": False, "src": "atomic_save"})
    got = w.scrape()
    assert one(got, C.CHECKPOINT_SECONDS.name) == 73.0  # a v1 sender: the records' seconds, once
    assert one(got, C.CHECKPOINT_WRITE.sum) == 73.0
    assert one(got, C.CHECKPOINT_BYTES.name) == 1000
    assert one(got, C.CHECKPOINT_FAILURES.name) == 1
    assert one(got, C.LAST_CHECKPOINT_DURATION.name) == 70.0
    assert one(got, C.CHECKPOINT_WRITE.count) == 2
    assert one(got, C.CHECKPOINT_WRITE.bucket, le="5.0") == 1
    assert one(got, C.LAST_CHECKPOINT.name) > 1e9


def test_before_the_first_step_only_the_probe_counts():
    """Compiling or loading for minutes before step 1 is not a stall; a main thread stuck is."""
    w = World(stall_min_seconds=2.0)
    busy, stuck = ident(rank=0), ident(rank=1)
    for k in range(10):
        w.send(busy, hb(seq=k, step_=0, phase="forward", probe=0.1))
        w.send(stuck, hb(seq=k, step_=0, phase="other", coll=float(k), probe=float(k)))
        w.tick(1.0)
    got = w.scrape()
    assert one(got, C.RANK_STALLED.name, rank="0", reason="no_progress") == 0
    assert one(got, C.RANK_STALLED.name, rank="1", reason="waiting_in_collective") == 1
