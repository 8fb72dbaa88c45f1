"""The hooks send consecutive steps as "steps" records (as many steps as fit in one datagram,
not one per step), each with the totals after its last step. Checked with a real loop,
a real UDP receiver and the agent's own rank table fed the raw datagrams."""
from __future__ import annotations

import socket
import time

import pytest

torch = pytest.importorskip("torch")

import ranksight  # noqa: E402
from ranksight import catalog as C  # noqa: E402
from ranksight import protocol  # noqa: E402
from ranksight.exporter.ingest import Ingest  # noqa: E402
from ranksight.exporter.collectors.ranks import RanksCollector  # noqa: E402
from ranksight.exporter.ranks import RankSettings, RankTable  # noqa: E402

from test_exporter_helpers import one, parse  # noqa: E402


class Raw:
    """A UDP socket that keeps every datagram as sent."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.3)
        self.url = f"udp://127.0.0.1:{self.sock.getsockname()[1]}"

    def drain(self):
        out = []
        try:
            while True:
                out.append(self.sock.recv(65536))
        except socket.timeout:
            return out


@pytest.fixture(autouse=True)
def _clean_env(clean_watch_env):
    yield


@pytest.mark.parametrize("version", protocol.SENDABLE)
def test_fast_loop_goes_out_in_few_datagrams_and_the_agent_counts_every_step(version):
    raw = Raw()
    w = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([w], lr=0.1)
    n = 2000
    for _ in ranksight.watch(None, opt, range(n), agent=raw.url, config={
            "hooks": {"table_every_steps": 0, "table_every_seconds": 0, "protocol": version}}):
        opt.step()
    ranksight.unwatch()
    data = raw.drain()
    recs = [protocol.decode(d) for d in data]
    batches = [r for r in recs if r["t"] == "steps"]
    assert all(len(d) <= protocol.MAX_DATAGRAM for d in data)
    assert not [r for r in recs if r["t"] == "step"], "steps go out batched"
    seqs = [s["seq"] for b in batches for s in protocol.expand_steps(b)]
    assert seqs == list(range(1, n + 1)), "every step exactly once, in order"
    assert len(batches) < n / 10, f"{len(batches)} datagrams for {n} steps"
    assert max(b["n"] for b in batches) <= protocol.STEPS_MAX
    # the agent reads every one without parsing its phase lists (v3 does not send them), and keeps the same
    steps_data = [d for d, r in zip(data, recs) if r["t"] == "steps"]
    assert all(r["v"] == version for r in recs)
    assert all((protocol._cut_phases(d) is not None) == (version == 2) for d in steps_data)
    for d, r in zip(steps_data, batches):
        cut = protocol.decode(d, phases=False)
        if version == 2:
            assert cut.pop("first") == {k: r[k][0] for k in protocol.PHASE_LISTS}
        assert cut == {k: x for k, x in r.items() if k not in protocol.PHASE_LISTS}
    # the agent, fed the same datagrams, ends exact; and again with every other batch lost
    for keep in (lambda i: True, lambda i: i % 2 == 0):
        table = RankTable(RankSettings())
        ing = Ingest(table)
        k = 0
        for d, r in zip(data, recs):
            if r["t"] == "steps":
                k += 1
                if not keep(k):
                    continue
            assert ing.handle(d, time.monotonic()) == "ok"
        got = parse(__import__("ranksight.exporter.exposition", fromlist=["TextWriter"]).TextWriter().render(
            RanksCollector(table).collect()).decode())
        assert one(got, C.STEPS.name) == n
        assert one(got, C.STEP_DURATION.count) == n
        last = batches[-1]["tot"]
        assert one(got, C.STEP_SECONDS.name) == pytest.approx(last["dur"])


@pytest.mark.parametrize("bad", [
    {"dur": []}, {"dur": [0.1] * (protocol.STEPS_MAX + 1)}, {"data": [0.1]}, {"micro": [1.5, 1]},
    {"dur": [0.1, -1.0]}, {"dur": [0.1, True]}, {"tot": None}, {"seq": 0},
])
def test_bad_steps_records_are_rejected(bad):
    rec = {"v": 2, "t": "steps", "job": "j", "rank": 0, "lr": 0, "ws": 1, "node": "n", "pid": 1, "ts": 1e9,
           "sess": 1, "seq": 1, "micro": [1, 1], "tot": {"steps": 2}}
    for k in ("dur", "data", "fwd", "bwd", "opt", "b2o", "comm", "xcomm", "ckpt"):
        rec[k] = [0.1, 0]
    protocol.decode(protocol.encode(rec))  # the good one passes
    rec.update(bad)
    if rec.get("tot") is None:
        del rec["tot"]
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.decode(protocol.encode(rec))
    assert e.value.result == "rejected"
    v1 = dict(rec, v=1)
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(protocol.encode(v1))


def test_a_tick_s_steps_go_out_in_one_record_and_a_fast_loop_in_full_datagrams():
    """Each background tick's steps go out in records of as many as a datagram holds (the fill,
    measured on each record): 25 steps a tick are one record, not 24 + 1."""
    raw = Raw()
    w = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([w], lr=0.1)
    n, every = 200, 0.01  # 100 steps/s for 2 s: a 0.25 s tick holds 25
    t0 = time.perf_counter()
    for i in ranksight.watch(None, opt, range(n), agent=raw.url,
                             config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}):
        opt.step()
        time.sleep(max(0.0, t0 + (i + 1) * every - time.perf_counter()))
    from ranksight import hooks as rs_hooks

    fill = rs_hooks.current()._steps_fill
    ranksight.unwatch()
    data = raw.drain()
    batches = [protocol.decode(d) for d in data if b'"t":"steps"' in d]
    assert [s["seq"] for b in batches for s in protocol.expand_steps(b)] == list(range(1, n + 1))
    assert all(len(d) <= protocol.MAX_DATAGRAM for d in data)
    assert fill > 25, "on CPU most phase values are 0: more steps fit than the first guess"
    # about 8 ticks of steps: one record each (a late tick may carry two ticks' steps), never split
    assert len(batches) <= 11, [b["n"] for b in batches]
    # the same watch at full speed: records of `fill` steps (the last one shorter)
    raw2 = Raw()
    for _ in ranksight.watch(None, opt, range(2000), agent=raw2.url,
                             config={"hooks": {"table_every_steps": 0, "table_every_seconds": 0}}):
        opt.step()
    ranksight.unwatch()
    sizes = [protocol.decode(d)["n"] for d in raw2.drain() if b'"t":"steps"' in d]
    assert sum(sizes) == 2000 and max(sizes) <= protocol.STEPS_MAX
    assert sum(1 for s in sizes if s < protocol.STEPS_MAX * 3 // 4) <= len(sizes) // 2 + 2, sizes
