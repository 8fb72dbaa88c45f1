"""Protocol v2 totals: the rank's cumulative totals are the truth. Lost step datagrams, an agent
restart and a restarted rank cost no count; a clean exit lingers (finished, never down); the
previous protocol version keeps its meaning and an old agent rejects the new one (version skew
in both directions); rank-to-GPU attribution."""
from __future__ import annotations

import logging
import random

import pytest

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight import record

from test_exporter_helpers import dgram, hb, ident, one, series, step
from test_exporter_ranks import World

LAB = dict(job="job", node="host", rank="0", local_rank="0")


class Sender:
    """A v2 sender: keeps totals exactly as the hooks do (hooks.watcher.Totals)."""

    def __init__(self, sess: int = 7, pid: int = 1000, **kw):
        from ranksight.totals import Totals

        self.ident = dict(ident(pid=pid, **kw), v=2, sess=sess)
        self.totals = Totals()
        self.seq = 0

    def step(self, dur: float, data: float = 0.01, micro: int = 2, ckpt: float = 0.0) -> dict:
        self.seq += 1
        rec = step(seq=self.seq, dur=dur, data=data, micro=micro, ckpt=ckpt)
        self.totals.step(record.ALL.step_tuple(self.seq, 0.0, rec))
        return rec

    def ckpt(self, dur: float, nbytes: int, ok: bool = True) -> dict:
        self.totals.checkpoint(1.7e9, dur, nbytes, ok)
        return dict(t="ckpt", dur=dur, bytes=nbytes, ok=ok, src="timer", ts=1.7e9)

    def hb(self, seq: int = 1) -> dict:
        return dict(hb(seq=seq, step_=self.seq), **self.totals.fields())

    def bye(self) -> dict:
        return dict(t="bye", **self.totals.fields())


def _run(w: World, s: Sender, durs, drop: float, rng: random.Random, hb_every: int = 10) -> None:
    for n, d in enumerate(durs, 1):
        rec = s.step(d)
        if rng.random() >= drop:
            assert w.send(s.ident, rec) == "ok"
        if n % hb_every == 0 and rng.random() >= drop:
            w.send(s.ident, s.hb(seq=n))


def _exact(got, durs, micro: int = 2) -> None:
    assert one(got, C.STEPS.name, **LAB) == len(durs)
    assert one(got, C.MICROBATCHES.name, **LAB) == micro * len(durs)
    assert one(got, C.STEP_SECONDS.name, **LAB) == pytest.approx(sum(durs), rel=1e-9)
    assert one(got, C.DATALOADER_WAIT.name, **LAB) == pytest.approx(0.01 * len(durs), rel=1e-9)
    for b in C.STEP_BUCKETS:
        assert one(got, C.STEP_DURATION.bucket, le=repr(b), **LAB) == sum(1 for d in durs if d <= b)
    assert one(got, C.STEP_DURATION.count, **LAB) == len(durs)


def test_lost_step_datagrams_cost_no_count_once_a_heartbeat_arrives():
    rng = random.Random(3)
    w, s = World(), Sender()
    durs = [rng.choice((0.004, 0.03, 0.2, 1.5)) for _ in range(400)]
    _run(w, s, durs[:300], drop=0.2, rng=rng)  # heartbeats every 10 steps, 20% of everything lost
    _run(w, s, durs[300:], drop=0.2, rng=rng, hb_every=1000)  # then only step records, 20% lost
    before = one(w.scrape(), C.STEPS.name, **LAB)
    assert before < len(durs), "20% of the datagrams were dropped: the deltas alone fall short"
    w.send(s.ident, s.hb(seq=999))
    got = w.scrape()
    _exact(got, durs)
    received = w.table.ranks[("job", 0)].recv
    assert one(got, C.STEP_RECORDS_LOST.name, **LAB) == len(durs) - received > 0, "the loss is counted"


def test_counters_move_between_heartbeats_and_never_go_down():
    w, s = World(), Sender()
    seen = []
    for n in range(1, 61):
        w.send(s.ident, s.step(0.05))
        if n % 20 == 0:
            w.send(s.ident, s.hb(seq=n))
        seen.append(one(w.scrape(), C.STEPS.name, **LAB))
    assert seen == list(range(1, 61))
    old = s.hb(seq=1)  # a reordered, older heartbeat: behind what the agent already counted
    old["tot"] = dict(old["tot"], steps=10, dur=0.5)
    w.send(s.ident, old)
    assert one(w.scrape(), C.STEPS.name, **LAB) == 60


def test_agent_restart_comes_back_at_the_true_count():
    w, s = World(), Sender()
    durs = [0.02] * 150
    _run(w, s, durs[:100], drop=0.0, rng=random.Random(1))
    w2 = World()  # a fresh agent: the first heartbeat restores everything
    _run(w2, s, durs[100:], drop=0.0, rng=random.Random(1), hb_every=1000)
    assert one(w2.scrape(), C.STEPS.name, **LAB) == 50
    w2.send(s.ident, s.hb(seq=500))
    _exact(w2.scrape(), durs)


def test_new_session_or_process_continues_the_counters():
    w = World()
    a = Sender(sess=1, pid=1000)
    for _ in range(30):
        w.send(a.ident, a.step(0.1))
    w.send(a.ident, a.bye())
    b = Sender(sess=2, pid=1000)  # a second watch() in the same process (e.g. train() again)
    for _ in range(20):
        w.send(b.ident, b.step(0.1))
    w.send(b.ident, b.hb(seq=1))
    got = w.scrape()
    assert one(got, C.STEPS.name, **LAB) == 50
    assert one(got, C.STEP_DURATION.count, **LAB) == 50
    assert not series(got, C.RANK_FINISHED.name), "a new session ends the linger"
    c = Sender(sess=2, pid=2000)  # a restarted process (same sess by chance: the pid tells it apart)
    for _ in range(5):
        w.send(c.ident, c.step(0.1))
    w.send(c.ident, c.hb(seq=1))
    assert one(w.scrape(), C.STEPS.name, **LAB) == 55


def test_checkpoint_totals_survive_lost_records():
    """Three blocking saves, each inside a step: the steps' checkpoint time and the writes come
    back whole with the heartbeat, though two saves' records and steps were lost."""
    w, s = World(), Sender()
    for dur, nbytes, ok, sent in ((2.0, 1000, True, False), (3.0, 500, True, True), (1.0, 0, False, False)):
        st, ck = s.step(dur + 0.5, ckpt=dur), s.ckpt(dur, nbytes, ok)
        if sent:
            w.send(s.ident, st)
            w.send(s.ident, ck)
    got = w.scrape()
    assert one(got, C.CHECKPOINT_SECONDS.name, **LAB) == pytest.approx(3.0)  # the one step that arrived
    w.send(s.ident, s.hb())
    got = w.scrape()
    assert one(got, C.CHECKPOINT_SECONDS.name, **LAB) == pytest.approx(6.0)
    assert one(got, C.CHECKPOINT_WRITE.sum, **LAB) == pytest.approx(6.0)
    assert one(got, C.CHECKPOINT_BYTES.name, **LAB) == 1500
    assert one(got, C.CHECKPOINT_FAILURES.name, **LAB) == 1
    assert one(got, C.CHECKPOINT_WRITE.count, **LAB) == 3
    assert one(got, C.CHECKPOINT_WRITE.bucket, le="5.0", **LAB) == 3
    assert one(got, C.LAST_CHECKPOINT.name, **LAB) == pytest.approx(1.7e9)


def test_clean_exit_lingers_finished_then_goes():
    w, s = World(rank_linger_seconds=30.0, down_after_misses=3), Sender()
    w.send(s.ident, s.hb())
    durs = [0.05] * 12
    for d in durs[:-3]:
        w.send(s.ident, s.step(d))
    for d in durs[-3:]:
        s.step(d)  # the last steps' records are lost; the bye's totals carry them
    assert w.send(s.ident, s.bye()) == "ok"
    w.tick(29.0)
    got = w.scrape()
    _exact(got, durs)
    assert one(got, C.RANK_FINISHED.name, **LAB) == 1
    assert one(got, C.RANK_UP.name, **LAB) == 1, "a finished rank is not down"
    assert one(got, C.HEARTBEAT_MISSES.name, **LAB) == 0, "no heartbeat is missed after a clean exit"
    assert all(v == 0 for v in series(got, C.RANK_STALLED.name).values())
    w.tick(2.0)
    assert not series(w.scrape(), C.STEPS.name) and len(w.table) == 0


def test_bye_from_a_rank_the_agent_never_saw_lands_with_its_final_counts():
    w, s = World(), Sender()  # a job shorter than the agent's uptime gap: only the bye arrives
    durs = [0.01] * 7
    for d in durs:
        s.step(d)
    w.send(s.ident, s.bye())
    _exact(w.scrape(), durs)


def test_version_1_keeps_its_meaning():
    w = World(rank_linger_seconds=30.0)
    i = ident()  # v=1: deltas summed, bye forgets at once
    for n in range(1, 6):
        w.send(i, step(seq=n))
    assert one(w.scrape(), C.STEPS.name, **LAB) == 5
    w.send(i, hb(tot={"steps": 100}))  # v1 has no totals: a stray field changes nothing
    assert one(w.scrape(), C.STEPS.name, **LAB) == 5
    w.send(i, {"t": "bye"})
    assert not series(w.scrape(), C.STEPS.name)


def test_unknown_version_is_rejected_and_logged_once(caplog):
    w = World()
    caplog.set_level(logging.WARNING, logger="ranksight.exporter.ingest")
    for _ in range(3):
        assert w.send(dict(ident(), v=99), step()) == "rejected"
    assert w.ingest.counts["rejected"] == 3
    lines = [r.getMessage() for r in caplog.records if "version" in r.getMessage()]
    assert len(lines) == 1 and "99" in lines[0], lines


def test_an_agent_reading_only_version_1_rejects_the_new_version():
    """The decoder of an agent that reads version 1 only (the same code, its checks for that one
    version) rejects every version 2 record as an unknown version, and still reads its own."""
    v1_only = {1: P.CHECKS[1]}
    s = Sender()
    for rec in (s.step(0.1), s.hb(), s.bye()):
        with pytest.raises(P.ProtocolError) as e:
            P.decode(dgram(s.ident, rec), checks=v1_only)
        assert e.value.result == "rejected" and str(e.value) == "version"
    P.decode(dgram(ident(), step()), checks=v1_only)


def test_v2_heartbeat_and_bye_fit_a_datagram_with_the_longest_identity():
    s = Sender(job="j" * P.MAX_STR, node="n" * P.MAX_STR)
    for _ in range(1000):
        s.step(random.random() * 100)
    s.ckpt(1e6, P.MAX_BYTES)
    for rec in (s.hb(seq=P.MAX_COUNT), s.bye()):
        data = dgram(dict(s.ident, pid=1 << 31, ws=P.MAX_WORLD, rank=P.MAX_WORLD - 1, lr=4095), rec)
        assert len(data) < P.MAX_DATAGRAM
        P.decode(data)


@pytest.mark.parametrize("bad", [
    {"tot": []}, {"tot": {"steps": -1}}, {"tot": {"dur": float("inf")}}, {"hist": {"step": [1, 2]}},
    {"hist": {"data": ["x"] * 11}}, {"hist": []},
])
def test_bad_totals_are_rejected(bad):
    s = Sender()
    rec = dict(s.hb(), **bad)
    data = P.encode(dict(s.ident, **rec)) if "inf" not in repr(bad) else \
        dgram(s.ident, dict(s.hb())).replace(b'"dur":0.0', b'"dur":1e999', 1)
    w = World()
    assert w.ingest.handle(data, w.now) == "rejected"


def test_rank_gpu_info_joins_a_rank_to_the_agents_gpu_label():
    w = World(gpu_labels=lambda: {"gpu-0a1b2c3d-0000-1111-2222-333344445555": "3"})
    s = Sender()
    w.send(s.ident, {"t": "hello", "info": {}, "dirs": {}, "pstart": 1.7e9,
                     "gpu": "GPU-0A1B2C3D-0000-1111-2222-333344445555"})
    got = w.scrape()
    assert one(got, C.RANK_GPU_INFO.name, gpu="3", uuid="gpu-0a1b2c3d-0000-1111-2222-333344445555", **LAB) == 1
    assert one(got, C.PROCESS_START.name, **LAB) == 1.7e9
    w2 = World(gpu_labels=lambda: {})  # a UUID this node's NVML does not list: no attribution
    w2.send(s.ident, {"t": "hello", "info": {}, "dirs": {}, "gpu": "GPU-ffff"})
    assert not series(w2.scrape(), C.RANK_GPU_INFO.name)


def test_an_async_save_counts_its_staging_as_checkpoint_time_and_its_write_as_the_write():
    """An async save staged for 0.5 s in a step and written in 12 s: the steps' checkpoint time
    (checkpoint_seconds_total, what the step arithmetic and goodput subtract) is the 0.5 s; the
    write histogram and the last duration hold the 12 s."""
    w, s = World(), Sender()
    w.send(s.ident, s.step(0.6, ckpt=0.5))
    for _ in range(3):
        w.send(s.ident, s.step(0.1))
    w.send(s.ident, s.ckpt(12.0, 1 << 20))
    w.send(s.ident, s.hb())
    got = w.scrape()
    assert one(got, C.CHECKPOINT_SECONDS.name, **LAB) == pytest.approx(0.5)
    assert one(got, C.CHECKPOINT_WRITE.sum, **LAB) == pytest.approx(12.0)
    assert one(got, C.LAST_CHECKPOINT_DURATION.name, **LAB) == pytest.approx(12.0)


def _old_fields(s: "Sender") -> dict:
    """The totals as hooks before the steps' checkpoint time sent them (no tot["ckpt"])."""
    fields = s.totals.fields()
    del fields["tot"]["ckpt"]
    return fields


def test_totals_without_the_steps_checkpoint_time_count_the_records():
    """A v2 sender whose totals carry no "ckpt" (hooks before it): checkpoint_seconds_total is
    the checkpoint records' seconds, as those hooks meant it, from the record on; its single step
    records' "ckpt" is not added to them (a heartbeat between a save's record and the step that
    held it would count the save twice)."""
    w, s = World(), Sender()
    w.send(s.ident, s.step(0.1))
    w.send(s.ident, dict(hb(seq=1, step_=s.seq), **_old_fields(s)))
    for k in range(5):  # five blocking 2 s saves, a heartbeat between each record and its step
        w.send(s.ident, s.ckpt(2.0, 10))
        assert one(w.scrape(), C.CHECKPOINT_SECONDS.name, **LAB) == pytest.approx(2.0 * (k + 1))
        w.send(s.ident, dict(hb(seq=k + 2, step_=s.seq), **_old_fields(s)))
        w.send(s.ident, s.step(2.1, ckpt=2.0))
    w.send(s.ident, dict(hb(seq=9, step_=s.seq), **_old_fields(s)))
    got = w.scrape()
    assert one(got, C.CHECKPOINT_SECONDS.name, **LAB) == pytest.approx(10.0)
    assert one(got, C.CHECKPOINT_WRITE.sum, **LAB) == pytest.approx(10.0)
