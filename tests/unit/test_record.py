"""The step record is declared once (ranksight/record.py), and the encoder, the decoder and the
exposition follow the declaration: recorded datagrams of every version decode through the real
decoder to what was recorded and reach the exposition; every field of every version round-trips;
a field added to a copy of the declaration goes from the hooks' encoder to its metric."""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import replace

import pytest

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight import record
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ranks import Kept, RankSettings, RankTable

from test_exporter_helpers import FIXTURES, parse, series

RECORDED = FIXTURES / "protocol"
IDENT = {"job": "j", "rank": 0, "lr": 0, "ws": 1, "node": "n", "pid": 7}


def recorded(v: int):
    """Version ``v``'s recorded datagrams, each with what the decoder returned for it."""
    datagrams = (RECORDED / f"v{v}.datagrams").read_bytes().split(b"\n")[:-1]
    decoded = [json.loads(line) for line in (RECORDED / f"v{v}.decoded.jsonl").read_text().splitlines()]
    assert len(datagrams) == len(decoded) > 0
    return list(zip(datagrams, decoded))


def scrape(table: RankTable) -> dict:
    return parse(TextWriter().render(RanksCollector(table, clock=lambda: 1000.0).collect()).decode())


def value(samples: dict, metric: C.Metric) -> float:
    name = metric.name + ("_total" if metric.type == "counter" and not metric.name.endswith("_total") else "")
    got = series(samples, name)
    assert len(got) == 1, (name, got)
    return next(iter(got.values()))


# ---------------------------------------------------------------- recorded datagrams
@pytest.mark.parametrize("v", P.ACCEPTED)
def test_recorded_datagrams_of_every_version_decode_as_recorded(v):
    """The real decoder, not a copy of an old one, reads each version's datagrams; the agent's
    cut of the phase lists (v2) gives the same record without them, with the first step's values."""
    for data, want in recorded(v):
        assert P.decode(data) == want
        cut = P.decode(data, phases=False)
        if "first" in cut and "first" not in want:
            assert cut.pop("first") == {k: want[k][0] for k in P.PHASE_LISTS}
            want = {k: x for k, x in want.items() if k not in P.PHASE_LISTS}
        assert cut == want


@pytest.mark.parametrize("v", P.ACCEPTED)
def test_recorded_datagrams_of_every_version_reach_their_metrics(v):
    """Each recorded version's step fields end up in the metric the declaration names: the sums
    of the per-step fields (the last totals for v2, the records' sum for v1), the cumulative
    fields as counters, the current ones as gauges (a v1 sender's checkpoint time: its checkpoint
    records', as v1 meant it). The first watch session recorded."""
    table = RankTable(RankSettings())
    datagrams = [data for data, want in recorded(v) if want.get("sess") == recorded(v)[0][1].get("sess")]
    recs = [P.decode(data, phases=False) for data in datagrams]
    recs = [r for r in recs if r["t"] != "bye"]  # v1's bye forgets the rank
    for r in recs:
        assert table.apply(r, 1000.0) == "ok"
    got = scrape(table)
    full = [P.decode(data) for data in datagrams]
    steps = [s for r in full if r["t"] in ("step", "steps") for s in (P.expand_steps(r) if r["t"] == "steps" else [r])]
    tot = [r["tot"] for r in recs if "tot" in r]
    last = steps[-1]
    for f in record.FIELDS:
        if f.metric is None:
            continue
        if f.key == P.TOTAL_STEP_CKPT and not tot:  # v1: checkpoint time is the checkpoint records'
            want = sum(r["dur"] for r in recs if r["t"] == "ckpt")
        elif not f.on(v):  # a field the version does not carry
            want = P.LAYOUTS[v].missing[f.key]
        elif f.kind == record.PER_STEP:
            want = tot[-1][f.key] if tot else sum(s[f.key] for s in steps)
        else:
            want = last[f.key]
        if f.gate and not (last[f.gate] if f.on(v) else 0):  # exposed only for ranks whose gate reads non-zero
            assert not series(got, f.metric.name), f.key
            continue
        assert value(got, f.metric) == pytest.approx(want), f.key
    assert value(got, C.STEPS) == (tot[-1]["steps"] if tot else len(steps))


def test_every_accepted_version_has_recorded_datagrams():
    assert sorted(int(p.name[1:].split(".")[0]) for p in RECORDED.glob("v*.datagrams")) == sorted(P.ACCEPTED)


# ---------------------------------------------------------------- round trip
def values(lay: record.Layout, i: int) -> dict:
    """Distinct values for every field of step ``i``."""
    return {f.key: (round(0.001 * (j + 1) * (i + 1), 6) if f.type is float else j + i + 2)
            for j, f in enumerate(lay.fields)}


def encode_steps(lay: record.Layout, n: int, ident: dict = IDENT) -> bytes:
    """A "steps" record of ``n`` steps as the hooks write it: lists, last values and totals."""
    from ranksight.hooks.sender import enc_fields
    from ranksight.totals import Totals

    batch = [lay.step_tuple(10 + i, 0.0, values(lay, i)) for i in range(n)]
    totals = Totals(lay)
    for it in batch:
        totals.step(it)
    prefix = P.encode(dict(ident, v=lay.version, sess=5, t="steps")).decode()[:-1] + ","
    last = [values(lay, n - 1)[k] for k in lay.last]
    return lay.encode_steps(prefix, 1.7e9, 10, lay.encode_lists(batch), last, enc_fields(totals.fields())).encode()


@pytest.mark.parametrize("v", P.ACCEPTED)
def test_every_field_round_trips_in_every_version(v):
    lay = P.LAYOUTS[v]
    want = values(lay, 0)
    data = P.encode(dict(IDENT, v=v, t="step", ts=1.7e9, seq=3, **({"sess": 5} if v >= 2 else {}),
                         **{k: want[k] for k in lay.seconds + lay.counts + lay.last}))
    got = P.decode(data)
    for f in lay.fields:
        assert got[f.key] == (want[f.key] if f.on(v) else lay.missing[f.key]), f.key
    if v < 2:
        return
    steps = P.expand_steps(P.decode(encode_steps(lay, 3)))
    assert [s["seq"] for s in steps] == [10, 11, 12]
    for i, s in enumerate(steps):
        for f in lay.fields:
            w = values(lay, i if f.kind == record.PER_STEP else 2)[f.key] if f.on(v) else lay.missing[f.key]
            assert s[f.key] == (float(record.STEP_DIGITS % w) if f.type is float else w), f.key


def test_the_declaration_is_well_formed():
    from ranksight.hooks import timing

    keys = [f.key for f in record.FIELDS]
    assert len(keys) == len(set(keys))
    for f in record.FIELDS:
        assert f.kind in record.KINDS and f.unit in ("seconds", "count", "bytes", "loss") and f.help
        assert min(P.ACCEPTED) <= f.since <= P.VERSION, f.key
        if f.metric is not None:  # a sum or a counter is a counter; a reading is a gauge
            assert f.metric.type == ("gauge" if f.kind == record.CURRENT else "counter"), f.key
            assert f.metric.unit == f.unit, f.key
    assert set(record.ALL.gpu) == {timing.FWD, timing.BWD, timing.OPT, timing.COMM, timing.XCOMM, timing.PBUSY}
    for f in record.FIELDS:  # step detail: a per-step list the agent does not read; "first": one it reads once
        assert f.detail is None or (f.kind == record.PER_STEP and f.detail in P.ACCEPTED), f.key
        assert not f.first or f.detail is not None, f.key
    assert not record.FIELDS[0].detail and record.FIELDS[0].key == "dur"  # the agent's window reads each step's
    assert P.LAYOUTS[P.VERSION].first == ("data", "xcomm", "ckpt")  # what goodput splits a stalled step with


# ---------------------------------------------------------------- step detail (v3)
def test_v3_without_step_detail_carries_dur_first_and_totals():
    """The hooks' default encoder: "dur" per step, the first step's declared values, the last
    values and the totals of every field; no other list. With step detail, every list too."""
    lay = P.SENDER_LAYOUTS[3, False]
    data = encode_steps(lay, 4)
    got = P.decode(data)
    assert [k for k in lay.detail if k in got] == [] and b'"fwd":[' not in data
    assert got["dur"] == [values(lay, i)["dur"] for i in range(4)]
    assert got["first"] == {k: values(lay, 0)[k] for k in ("data", "xcomm", "ckpt")}
    assert got["tot"]["fwd"] == pytest.approx(sum(values(lay, i)["fwd"] for i in range(4)))
    assert P.decode(data, phases=False) == got
    steps = P.expand_steps(got)
    assert [s["dur"] for s in steps] == got["dur"] and "fwd" not in steps[0] and steps[-1]["wrss"] == got["wrss"]
    detail = P.decode(encode_steps(P.SENDER_LAYOUTS[3, True], 4))
    assert detail["first"] == got["first"] and detail["fwd"] == [values(lay, i)["fwd"] for i in range(4)]
    assert {k: x for k, x in detail.items() if k not in lay.detail} == got


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("key", ["fwd", "data"])
def test_v3_checks_the_values_it_does_not_write(key, bad):
    """A list a record does not carry still goes in the totals: a NaN, an infinity or a negative
    value in it raises like one in a written list (the hooks count the error and keep those steps
    out of the totals)."""
    lay = P.SENDER_LAYOUTS[3, False]
    batch = [lay.step_tuple(1, 0.0, {"dur": 0.5}), lay.step_tuple(2, 0.0, {"dur": 0.5, key: bad})]
    with pytest.raises(ValueError):
        lay.encode_lists(batch)
    with pytest.raises(ValueError):
        lay.encode_lists(batch[::-1])


@pytest.mark.parametrize("cut", ["fwd", "micro", "first"])
def test_v3_step_detail_is_all_the_lists_or_none(cut):
    """A v3 record with some of the detail lists, or without "first", is rejected."""
    rec = json.loads(encode_steps(P.SENDER_LAYOUTS[3, True], 3))
    del rec[cut]
    with pytest.raises(P.ProtocolError) as e:
        P.decode(P.encode(rec))
    assert e.value.result == C.INGEST_REJECTED and str(e.value) == f"bad {cut}"


@pytest.mark.parametrize("new", [v for v in P.ACCEPTED if v >= 3])
def test_an_agent_older_than_a_version_rejects_it_and_reads_the_one_before(new):
    """Version skew: an agent that reads only the versions before ``new`` (the same code, its checks
    for those) rejects every recorded datagram of ``new`` as an unknown version, and reads the ones
    of the version before it."""
    old = {v: P.CHECKS[v] for v in P.ACCEPTED if v < new}
    for data, _ in recorded(new):
        with pytest.raises(P.ProtocolError) as e:
            P.decode(data, checks=old)
        assert str(e.value) == "version"
    for data, want in recorded(new - 1):
        assert P.decode(data, checks=old) == want


@pytest.mark.parametrize("keys", [((2, True), (3, False), (3, True)), ((4, False), (4, True))])
def test_the_exposition_is_the_same_with_and_without_step_detail(keys):
    """The same steps sent as v2, v3 and v3 with step detail (and as v4 with and without it): the
    agent exposes the same series."""
    got = []
    for key in keys:
        table = RankTable(RankSettings())
        data = encode_steps(P.SENDER_LAYOUTS[key], 5)
        assert table.apply(P.decode(data, phases=False), 1000.0) == "ok"
        got.append(scrape(table))
    assert all(g == got[0] for g in got)


# ---------------------------------------------------------------- a new field
DROPS = C.Metric("test_drops_total", "counter", "count", C.RANK_LABELS, "Dropped tokens (a test's field).")


def test_a_field_added_to_the_declaration_flows_through():
    """One line in a copy of the declaration: a per-step "drops" from version 2 on. The hooks'
    encoder writes it, the decoder checks and returns it (0 from a version 1 sender), the totals
    carry its sum and the rank table exposes that sum as its metric."""
    fields = record.FIELDS + (record.Field("drops", int, "count", record.PER_STEP, "drops", DROPS, since=2),)
    lays = record.layouts(P.ACCEPTED, fields)
    checks = {v: P.Checks(lay) for v, lay in lays.items()}
    data = encode_steps(lays[2], 4)
    assert b'"drops":[' in data
    rec = P.decode(data, checks=checks)
    assert rec["drops"] == [values(lays[2], i)["drops"] for i in range(4)]
    assert rec["tot"]["drops"] == sum(rec["drops"])
    with pytest.raises(P.ProtocolError) as e:  # the decoder checks it like any count
        P.decode(data.replace(b'"drops":[', b'"drops":[-', 1), checks=checks)
    assert str(e.value) == "bad drops"
    old = P.decode(P.encode(dict(IDENT, v=1, t="step", ts=1.7e9, seq=1, dur=0.5)), checks=checks)
    assert old["drops"] == 0
    table = RankTable(RankSettings(), kept=Kept(record.Layout(fields)))
    table.apply(rec, 1000.0)
    assert value(scrape(table), DROPS) == rec["tot"]["drops"]
    assert value(scrape(table), C.DATALOADER_WAIT) == pytest.approx(rec["tot"]["data"])


def test_a_field_a_newer_version_drops_still_decodes_from_the_old_one():
    """``until``: the newest version stops carrying a field; older senders' values still count."""
    fields = tuple(replace(f, until=1) if f.key == "wrss" else f for f in record.FIELDS)
    lays = record.layouts(P.ACCEPTED, fields)
    checks = {v: P.Checks(lay) for v, lay in lays.items()}
    data = encode_steps(lays[2], 2)
    assert b'"wrss"' not in data and P.decode(data, checks=checks)["wrss"] == 0
    old = P.encode(dict(IDENT, v=1, t="step", ts=1.7e9, seq=1, dur=0.5, wrss=1 << 30))
    assert P.decode(old, checks=checks)["wrss"] == 1 << 30


# ---------------------------------------------------------------- the hooks' step tuple
def test_the_hooks_step_tuple_follows_the_declaration(monkeypatch):
    """A real watch: each measured value arrives under its declared key (a loader that waits
    10 ms per batch, two forwards per optimizer step)."""
    torch = pytest.importorskip("torch")
    import ranksight

    for k in list(os.environ):
        if k.startswith("RANKSIGHT"):
            monkeypatch.delenv(k, raising=False)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(0.3)

    def slow(n):
        for _ in range(n):
            time.sleep(0.01)
            yield torch.ones(2, 4), torch.zeros(2, 5, dtype=torch.long)  # features, per-token labels

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for x, _ in ranksight.watch(model, opt, slow(3), agent=f"udp://127.0.0.1:{sock.getsockname()[1]}",
                                 config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0,
                                                   "step_detail": True}}):
            model(x).sum().backward()
            model(x).sum().backward()
            opt.step()
    finally:
        ranksight.unwatch()
    steps = []
    try:
        while True:
            rec = P.decode(sock.recv(65536))
            if rec["t"] == "steps":
                steps += P.expand_steps(rec)
    except socket.timeout:
        sock.close()
    assert [s["seq"] for s in steps] == [1, 2, 3]
    for s in steps:
        assert s["data"] >= 0.009 and s["micro"] == 2 and s["ckpt"] == 0.0 and s["comm"] == 0.0
        assert s["samples"] == 2 and s["tokens"] == 10  # one batch of 2 samples of 5 tokens a step
        assert s["dur"] >= s["data"] + s["fwd"] and s["fwd"] > 0 and s["bwd"] > 0 and s["opt"] > 0
