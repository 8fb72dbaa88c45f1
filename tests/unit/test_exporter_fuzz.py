"""Property-based fuzz of the ingest path: random and mutated datagrams never crash the
agent, every datagram is counted under exactly one result, and scrapes stay valid.

Over 10,000 datagrams go through the ingest handler directly (for speed); a burst of
real datagrams goes through real UDP and unix sockets into a running agent."""
from __future__ import annotations

import json
import math
import os
import socket
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ranksight import catalog as C
from ranksight import protocol as P
from ranksight.exporter.agent import Agent, AgentSettings
from ranksight.exporter.exposition import TextWriter
from ranksight.exporter.ingest import RESULTS, Ingest
from ranksight.exporter.collectors.ranks import RanksCollector
from ranksight.exporter.ranks import RankSettings, RankTable

from test_exporter_helpers import one, parse, scrape, wait_for

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "120"))
PER_EXAMPLE = 100  # 12,000 datagrams

floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 10), st.integers(-5, 10**20))
finite = st.one_of(st.none(), st.booleans(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
scalars = st.one_of(st.none(), st.booleans(), floats, st.text(max_size=40), st.integers())
jsonish = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), kids, max_size=4)),
                       max_leaves=12)


@st.composite
def valid_record(draw):
    t = draw(st.sampled_from(P.TYPES))
    ws = draw(st.integers(1, 16))
    rec = dict(v=1, t=t, job=draw(st.sampled_from(["a", "b", "j" * 128, "ü"])), rank=draw(st.integers(0, ws - 1)),
               lr=draw(st.integers(0, 7)), ws=ws, node=draw(st.sampled_from(["h1", "h2"])),
               pid=draw(st.integers(1, 5)), ts=draw(st.floats(0, 2e9)))
    secs = st.floats(0, 100)
    if t == "step":
        rec.update({k: draw(secs) for k in P.STEP_SECONDS_FIELDS})
        rec.update({k: draw(st.integers(0, 1000)) for k in P.STEP_COUNT_FIELDS})
        rec["seq"] = draw(st.integers(1, 10**6))
    elif t == "hb":
        rec.update(seq=draw(st.integers(0, 100)), every=draw(st.floats(0.01, 10)), step=draw(st.integers(0, 100)),
                   phase=draw(st.sampled_from(P.PHASES)), coll=draw(st.floats(-1, 100)), probe=draw(secs),
                   pdur=draw(secs), herr=draw(st.integers(0, 5)))
    elif t == "ckpt":
        rec.update(dur=draw(secs), bytes=draw(st.integers(0, 10**12)), ok=draw(st.booleans()),
                   src=draw(st.sampled_from(P.CKPT_SOURCES)))
    elif t == "lint":
        rec.update(lint=draw(st.sampled_from(["sampler_epoch", "io_amplification", "bogus"])),
                   active=draw(st.booleans()), msg=draw(st.text(max_size=30)))
    elif t == "hello":
        rec.update(info=draw(st.dictionaries(st.text(max_size=5), finite, max_size=3)),
                   dirs=draw(st.dictionaries(st.sampled_from(["tmp", "log", "checkpoint"]),
                                             st.sampled_from(["", "/tmp/x", "rel/dir", "/data/ck"]))))
    return rec


def mutate(rnd, templates, junk) -> bytes:
    """One datagram from a valid template: sent as is, or with a field dropped, retyped or
    replaced by a JSON value from ``junk``, cut short, garbled, padded past the size limit,
    or replaced by junk JSON altogether."""
    rec = dict(rnd.choice(templates))
    kind = rnd.randrange(10)
    if kind <= 3:
        return json.dumps(rec, allow_nan=True).encode()
    if kind <= 6:
        key = rnd.choice(sorted(rec) + ["extra"])
        op = rnd.randrange(4)
        if op == 0:
            rec.pop(key, None)
        elif op == 1:
            rec[key] = rnd.choice(junk)
        elif op == 2:
            rec[key] = rnd.choice([float("nan"), float("inf"), -1, -1e-9, 1e300, 2**70, "1", True, None, [], {}])
        else:
            rec[key] = rnd.choice(templates).get(key, 0)  # another record's value for the same key
        return json.dumps(rec, allow_nan=True).encode()
    b = json.dumps(rec, allow_nan=True).encode()
    if kind == 7:
        if rnd.random() < 0.5:
            return b[: rnd.randrange(len(b) + 1)]
        ba = bytearray(b)
        for _ in range(rnd.randrange(1, 4)):
            ba[rnd.randrange(len(ba))] = rnd.randrange(256)
        return bytes(ba)
    if kind == 8:
        rec["pad"] = "x" * rnd.randrange(P.MAX_DATAGRAM, 3 * P.MAX_DATAGRAM)
        return json.dumps(rec).encode()
    return json.dumps(rnd.choice(junk), allow_nan=True).encode()


def expected_result(data: bytes) -> str:
    try:
        P.decode(data)
    except P.ProtocolError as e:
        return e.result
    return "accepted"


# No shrinking phase: 100-datagram examples shrink for minutes; a failure prints the whole batch.
# Hypothesis draws the templates and junk values; a seeded Random (also drawn) mutates them,
# so that generating 10,000+ datagrams costs seconds, not minutes.
@settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(templates=st.lists(valid_record(), min_size=4, max_size=4), junk=st.lists(jsonish, min_size=4, max_size=4),
       rnd=st.randoms(use_true_random=True))
def test_fuzz_handler_never_crashes_and_counts_add_up(templates, junk, rnd):
    batch = [mutate(rnd, templates, junk) for _ in range(PER_EXAMPLE)]
    table = RankTable(RankSettings(max_ranks=24, max_jobs=3, quantile_window_seconds=5.0, stall_min_seconds=0.5))
    clock = [100.0]
    ingest = Ingest(table, clock=lambda: clock[0])
    col = RanksCollector(table, clock=lambda: clock[0])
    for data in batch:
        res = ingest.handle(data, clock[0])
        assert res in RESULTS
        exp = expected_result(data)
        if exp != "accepted":
            assert res == exp  # decode's verdict is the counter's
        else:
            assert res in ("ok", "rejected", "overflow")
        clock[0] += 0.05
        if rnd.random() < 0.2:
            table.check(clock[0])
    assert ingest.bugs == 0
    assert sum(ingest.counts.values()) == len(batch)
    assert len(table) <= 24 and len(table.jobs) <= 3
    text = TextWriter().render(col.collect()).decode()
    got = parse(text)  # prometheus_client's parser accepts it: no NaN durations, no bad labels
    for (name, _), v in got.items():
        if name.endswith("_total") or name.endswith("_count") or name.endswith("_bucket"):
            assert v >= 0 and math.isfinite(v), name


def burst(sock_family, address, datagrams):
    s = socket.socket(sock_family, socket.SOCK_DGRAM)
    try:
        for i, d in enumerate(datagrams):
            s.sendto(d, address)
            if i % 200 == 199:
                time.sleep(0.002)  # a burst, paced enough not to overrun a loaded CI box
    finally:
        s.close()


def fixed_corpus(n: int):
    base = dict(v=1, job="burst", ws=4, node="h", pid=os.getpid(), ts=time.time())  # the unix socket checks the pid
    out = []
    for i in range(n):
        k = i % 6
        r = i % 4
        if k == 0:
            out.append(P.encode(dict(base, t="step", rank=r, lr=r, seq=i + 1, dur=0.01, data=0.001, fwd=0.0, bwd=0.0,
                                     opt=0.0, b2o=0.0, comm=0.0, xcomm=0.0, ckpt=0.0, micro=1)))
        elif k == 1:
            out.append(P.encode(dict(base, t="hb", rank=r, lr=r, seq=i, every=1.0)))
        elif k == 2:
            out.append(b"{not json")
        elif k == 3:
            out.append(P.encode(dict(base, t="step", rank=r, lr=r, seq=1, dur=-1.0)))  # rejected
        elif k == 4:
            out.append(P.encode(dict(base, t="hb", rank=r, lr=r, seq=i, pad="x" * (P.MAX_DATAGRAM + i % 500))))
        else:
            out.append(json.dumps({"v": 1, "t": "hb", "job": "burst", "rank": r, "ws": 4, "lr": 0, "node": "h",
                                   "pid": 1, "ts": float("nan")}, allow_nan=True).encode())
    return out


def test_real_socket_burst_udp_and_unix(tmp_path):
    path = str(tmp_path / "ingest.sock")
    results = {}
    for kind in ("udp", "unix"):
        ingest = "udp://127.0.0.1:0" if kind == "udp" else f"unix://{path}"
        a = Agent(AgentSettings(node="n", listen="127.0.0.1:0", ingest=ingest, collectors=("ranks",),
                                ranks=RankSettings(max_ranks=3)))
        a.start()
        try:
            data = fixed_corpus(3000)
            addr = ("127.0.0.1", a.receiver.bound.port) if kind == "udp" else path
            burst(socket.AF_INET if kind == "udp" else socket.AF_UNIX, addr, data)
            wait_for(lambda: sum(a.ingest.counts.values()) == len(data), 20, f"{kind}: all {len(data)} counted")
            got = scrape(a)
            counts = {r: one(got, C.INGEST_DATAGRAMS.name, result=r) for r in RESULTS}
            assert sum(counts.values()) == len(data)
            # per kind of datagram: 500 each; 2 of 4 ranks fit under max_ranks=3 ... the cap shows as overflow
            assert counts["malformed"] == 500
            assert counts["oversize"] == 500
            assert counts["rejected"] == 1000  # negative duration, NaN timestamp
            assert counts["overflow"] > 0 and counts["ok"] > 0
            assert a.ingest.bugs == 0
            results[kind] = counts
        finally:
            a.stop()
    assert not os.path.exists(path), "the unix socket is removed on stop"
    assert results["udp"] == results["unix"]
